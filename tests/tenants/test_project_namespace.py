"""A project's namespace is fixed at creation and checked against reserved names (docs/ownership.md);
archiving starts the namespace's retention, restoring cancels it. No cluster registered here: the
live-cluster checks are in tests/quotas/test_ownership.py."""

from __future__ import annotations

import pytest

from portal.exceptions import Invalid
from tenants import services
from tenants.models import Project

pytestmark = pytest.mark.django_db


def test_namespace_is_computed_once_and_unique(cast) -> None:
    alice = cast.actor("alice")
    project = services.project_create(actor=alice, tenant=cast.acme, name="Speech", slug="speech")
    assert project.cluster_namespace == "acme-speech" and project.namespace == "acme-speech"
    with pytest.raises(Invalid) as err:  # would land in the same namespace
        services.project_create(actor=alice, tenant=cast.acme, name="Speech 2", slug="acme-speech")
    assert err.value.field == "slug" and "acme-speech is not available" in err.value.message
    with pytest.raises(Invalid) as err:
        services.project_create(actor=alice, tenant=cast.acme, name="Long", slug="x" * 60)
    assert err.value.field == "slug" and "longer than 63" in err.value.message


@pytest.mark.parametrize("slug", ["default", "kube-system", "gpu-operator", "hami-system"])
def test_reserved_slugs_are_refused(cast, slug: str) -> None:
    with pytest.raises(Invalid) as err:
        services.project_create(actor=cast.actor("alice"), tenant=cast.acme, name=slug, slug=slug)
    assert err.value.field == "slug" and "reserved" in err.value.message


def test_archiving_starts_retention_and_restoring_cancels_it(cast) -> None:
    alice = cast.actor("alice")
    services.project_update(actor=alice, project=cast.nlp, status=Project.Status.ARCHIVED)
    nlp = Project.objects.get(pk=cast.nlp.pk)
    assert nlp.archived_at is not None and nlp.namespace_released_at is None
    services.project_update(actor=alice, project=nlp, status=Project.Status.ACTIVE)
    nlp.refresh_from_db()
    assert nlp.archived_at is None and nlp.namespace_released_at is None

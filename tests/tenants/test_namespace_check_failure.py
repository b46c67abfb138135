"""The namespace checks a new project passes are enforcing extension slots (portal/extensions.py,
docs/extending.md): quotas answers them, and a check that fails refuses the project with the slot's sentence
(503 from the API, a form error on the page) instead of letting it take a namespace nobody checked.

The reserved-name check fails for real (a malformed ``PORTAL_RESERVED_NAMESPACES`` entry); the cluster check is
made to fail by registering a raising function through the slot's own API (``Slot.registered``), which puts
quotas' function back afterwards. The refusals themselves (reserved, existing on the cluster) are in
tests/tenants/test_project_namespace.py and tests/quotas/test_ownership.py."""

from __future__ import annotations

import pytest
from django.urls import reverse

from portal.exceptions import ExtensionUnavailable
from portal.extensions import ENFORCING, namespace_check, reserved_name
from quotas.namespaces import is_reserved, namespace_problem
from tenants import services
from tenants.models import Project

pytestmark = pytest.mark.django_db
API = "/api/v1"


def test_quotas_answers_both_slots_and_both_are_enforcing() -> None:
    assert reserved_name.policy == ENFORCING and reserved_name.field == "slug"
    assert namespace_check.policy == ENFORCING and namespace_check.field == "slug"
    assert reserved_name.call("kube-system") is True and reserved_name.call("acme-fine") is False
    # No cluster is registered here, so nothing is in the way.
    assert namespace_check.call("acme-fine", project_slug="fine") is None
    assert reserved_name.provider is is_reserved and namespace_check.provider is namespace_problem


def test_a_broken_reserved_names_setting_refuses_the_project(cast, api, as_user, settings) -> None:
    settings.PORTAL_RESERVED_NAMESPACES = ["acme-secret", None]  # what a bad environment parse leaves
    response = api("alice").post(f"{API}/projects/", {"tenant": "acme", "name": "Fine", "slug": "fine"}, format="json")
    assert response.status_code == 503, response.content
    assert response.json()["error"] == "unavailable"
    assert response.json()["detail"] == reserved_name.unavailable
    page = as_user("alice").post(reverse("project-create", args=["acme"]), {"project-name": "Fine", "project-slug": "fine"})
    assert page.status_code == 200
    assert "Namespace check unavailable: whether this slug is a reserved namespace could not be checked" in page.content.decode()
    assert not Project.objects.filter(slug="fine").exists()


def test_a_failing_cluster_check_refuses_the_project_with_the_slot_sentence(cast, api) -> None:
    def broken(namespace: str, *, project_slug: str | None = None) -> str | None:
        raise RuntimeError("the cluster answered something we cannot read")

    with namespace_check.registered(broken):
        response = api("alice").post(f"{API}/projects/", {"tenant": "acme", "name": "Data", "slug": "data"}, format="json")
        assert response.status_code == 503, response.content
        assert response.json() == {"error": "unavailable", "detail": namespace_check.unavailable}
        with pytest.raises(ExtensionUnavailable) as err:
            services.project_create(actor=cast.actor("alice"), tenant=cast.acme, name="Data", slug="data")
        assert err.value.field == "slug" and err.value.message.startswith("Namespace check unavailable")
    assert not Project.objects.filter(slug="data").exists()
    # quotas' own check is back: the same project is created.
    assert namespace_check.provider is namespace_problem
    response = api("alice").post(f"{API}/projects/", {"tenant": "acme", "name": "Data", "slug": "data"}, format="json")
    assert response.status_code == 201, response.content

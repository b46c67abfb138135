"""The demo seed is create-only: `make run` seeds again on every start, and a quota changed since (by ops, a tenant
admin or a MIG change) must survive it, with no silent write. The sandbox is not running here: the seed uses the
demo profile's flavors, as it does when the cluster cannot be reached."""

from __future__ import annotations

import io
from decimal import Decimal

import pytest
from django.core.management import call_command

from quotas.models import Quota
from quotas.services import quota_set
from tenants.access import Actor
from tenants.models import Project

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(240)]


def test_seeding_again_keeps_a_changed_quota(settings, tmp_path) -> None:
    settings.KUBECONFIG = str(tmp_path / "no-cluster.kubeconfig")
    call_command("seed_demo", stdout=io.StringIO())
    vision = Project.objects.get(slug="acme-vision")
    row = Quota.objects.select_related("flavor").get(project=vision, flavor__name="h100-80gb-offline", resource="nvidia.com/gpu")
    assert row.nominal == Decimal(6)
    from django.contrib.auth import get_user_model

    ops = Actor(user=get_user_model().objects.get(username="ops"))
    quota_set(actor=ops, flavor=row.flavor, resource=row.resource, project=vision, nominal=Decimal(2),
              borrowing_limit=Decimal(0))
    rows_before = Quota.objects.count()
    Quota.objects.filter(project=vision, flavor__name="cpu", resource="cpu").delete()  # one row gone: seeded again

    call_command("seed_demo", stdout=io.StringIO())

    row.refresh_from_db()
    assert (row.nominal, row.borrowing_limit) == (Decimal(2), Decimal(0))
    assert Quota.objects.count() == rows_before
    assert Quota.objects.get(project=vision, flavor__name="cpu", resource="cpu").nominal == Decimal(96)


def test_seeding_a_database_of_an_older_demo_promises_no_more_than_the_cluster_has(settings, tmp_path) -> None:
    """An older demo gave Globex all 8 online H100s (Acme none); the demo now gives each 4. Seeding that database
    again adds no Acme row over Globex's 8 (12 promised of 8), and no project row without its tenant's."""
    settings.KUBECONFIG = str(tmp_path / "no-cluster.kubeconfig")
    call_command("seed_demo", stdout=io.StringIO())
    online = Quota.objects.filter(flavor__name="h100-80gb-online", resource="nvidia.com/gpu")
    assert {(q.tenant.slug, q.project.slug if q.project else None): q.nominal for q in online} == {
        ("acme", None): 4, ("acme", "acme-vision"): 4, ("globex", None): 4, ("globex", "globex-serving"): 4}
    online.filter(tenant__slug="acme").delete()  # the older demo's rows, as its seed wrote them: Globex has all 8
    online.filter(tenant__slug="globex").update(nominal=8)

    call_command("seed_demo", stdout=io.StringIO())

    assert {(q.tenant.slug, q.project.slug if q.project else None): q.nominal for q in online.all()} == {
        ("globex", None): 8, ("globex", "globex-serving"): 8}

"""A MIG change that cuts a tenant's quota tells that tenant: its admins are emailed when it is approved (what will
be cut, and when) and when the cut is applied, and their quota pages show it; no other tenant hears of it."""

from __future__ import annotations

import pytest
from django.core import mail

from maintenance import services
from maintenance.models import MigChange

from .conftest import drive, window

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(180)]


def _text(response) -> str:
    assert response.status_code == 200
    return response.content.decode()


def test_the_tenant_whose_quota_is_cut_is_told_and_sees_it_on_its_quota_page(
        cast, ops2, demo, as_user, django_capture_on_commit_callbacks) -> None:
    change = services.mig_change_propose(actor=cast.actor("ops"), pool=demo.pool, to_layout="all-1g.10gb",
                                         reason="inference needs small slices", **window())
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        services.mig_change_approve(actor=services.Actor(user=ops2), change=change, comment="go")
    planned = [m for m in mail.outbox if "will cut your quota" in m.subject]
    assert [m.to for m in planned] == [[cast.erin.email]]  # globex's tenant admin; nobody of acme
    body = planned[0].body
    assert planned[0].subject == f"[GPU portal] A MIG change will cut your quota: pool {demo.pool.name}"
    assert "the tenant: " in body and "nvidia.com/mig-3g.40gb 8 → 0" in body
    assert "http://" in body and "/tenants/globex/quotas/" in body

    globex = _text(as_user("erin").get("/tenants/globex/quotas/"))
    assert 'id="quota-notices"' in globex and f"MIG change #{change.pk}" in globex and "it will cut this quota" in globex
    assert 'id="quota-notices"' not in _text(as_user("alice").get("/tenants/acme/quotas/"))

    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        change = drive(demo.sb, change, lambda c: c.status in ("succeeded", "rolled_back", "failed"))
    assert change.status == MigChange.Status.SUCCEEDED, change.status_reason
    cut = [m for m in mail.outbox if "Your quota was cut" in m.subject]
    assert [m.to for m in cut] == [[cast.erin.email]] and "nvidia.com/mig-3g.40gb 8 → 0" in cut[0].body
    globex = _text(as_user("erin").get("/tenants/globex/quotas/"))
    assert f"MIG change #{change.pk}" in globex and "cut this quota on" in globex
    assert 'id="quota-notices"' not in _text(as_user("alice").get("/tenants/acme/quotas/"))

"""The navigation's approval counts are kept per user in the shared cache (``approvals_waiting_counts_kept``) and read
again after every write that changes what waits: a page of an approver or ops asks no count query while nothing
changed, and the badge follows submissions, decisions, extension and quota requests, memberships and the ops group.

Committed transactions (``transaction=True``): inside a transaction the counts are never kept.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from quotas.models import QuotaRequest
from tenants.access import Actor
from tenants.models import Membership
from tenants.services import membership_delete, ops_user_ensure
from workloads import extensions, services
from workloads.models import RequestState

from .test_approvers import nav_count, submit

pytestmark = pytest.mark.django_db(transaction=True)

COUNT_SQL = "SELECT count(*) FROM ("


def page(client) -> tuple[str, str, str, int]:
    """The requests page: its requests badge, its quota badge, and how many count queries it made."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get("/requests/")
    assert response.status_code == 200
    body = response.content.decode()
    counted = sum(COUNT_SQL in q["sql"] for q in ctx.captured_queries)
    return nav_count(body, "requests"), nav_count(body, "quota"), body, counted


def badge(n: int) -> str:
    return f'<span class="nav-badge" aria-hidden="true">{n}</span>'


def test_the_counts_are_kept_until_something_waiting_changes(as_user, cast, cat) -> None:
    first = submit(cast, cat, gpus=4)  # waits for bob's decision in acme-vision
    bob = as_user("bob")
    requests, _, _, counted = page(bob)
    assert badge(1) in requests and counted == 1
    requests, _, _, counted = page(bob)
    assert badge(1) in requests and counted == 0  # kept: no count query

    second = submit(cast, cat, gpus=4)
    requests, _, _, counted = page(bob)
    assert badge(2) in requests and counted == 1

    # A decision in place (the inbox's htmx POST), then the navigation's own refresh.
    response = bob.post(f"/requests/{first.pk}/decide/", {"decision": "approve"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    response = bob.get("/approvals/waiting/", HTTP_HX_REQUEST="true")
    assert badge(1) in nav_count(response.content.decode(), "requests")
    services.request_reject(actor=cast.actor("bob"), request=second, comment="no")
    requests, _, _, counted = page(bob)
    assert "nav-badge" not in requests and counted == 1
    assert page(bob)[3] == 0


def test_extension_and_quota_requests_and_a_cancel_change_the_counts(as_user, cast, cat) -> None:
    from .factories import make_request

    running = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING)
    bob = as_user("bob")
    requests, quota, _, _ = page(bob)
    assert "nav-badge" not in requests and "nav-badge" not in quota

    ext = extensions.extension_request_create(actor=cast.actor("carol"), request=running, hours=2, reason="more")
    requests, _, _, counted = page(bob)
    assert badge(1) in requests and counted == 1
    extensions.extension_request_cancel(actor=cast.actor("carol"), extension=ext)
    assert "nav-badge" not in page(bob)[0]

    QuotaRequest.objects.create(project=cast.vision, flavor=cat.h100, resource="nvidia.com/gpu", amount=Decimal(1),
                                reason="more", requested_by=cast.carol, approver=QuotaRequest.Approver.PROJECT_ADMIN)
    _, quota, _, counted = page(bob)
    assert badge(1) in quota and counted == 1

    waiting = submit(cast, cat, gpus=4)
    assert badge(1) in page(bob)[0]
    services.request_cancel(actor=cast.actor("carol"), request=waiting)
    assert "nav-badge" not in page(bob)[0]


def test_memberships_and_the_ops_group_change_the_counts(as_user, cast, cat) -> None:
    submit(cast, cat, gpus=4)
    bob = as_user("bob")
    assert badge(1) in page(bob)[0]
    membership_delete(actor=Actor.system(), membership=Membership.objects.get(user=cast.bob, project=cast.vision))
    body = bob.get("/requests/").content.decode()
    assert "nav-count-requests" not in body  # no longer an approver anywhere: no badge at all

    frank = as_user("frank")  # a member in globex: decides nothing
    assert "nav-count" not in frank.get("/requests/").content.decode()
    ops_user_ensure(actor=Actor.system(), user=cast.frank)
    assert badge(1) in page(frank)[0]  # ops decide everywhere

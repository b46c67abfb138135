"""``GET /api/v1/quota-requests/`` counts a person's unfiltered list through the kept count the quota requests page
uses (``quotas.selectors.quota_request_counts_kept``, under ``tenants.access.APPROVALS``; ``portal.api.Pagination``
asks the view's ``kept_count``): no COUNT query once warm, the right total, a new request counted as it commits; a
filtered list and a token's list count as before.

Committed transactions, as in production: inside a transaction nothing is kept."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from quotas import selectors, services
from quotas.models import QuotaRequest

from .factories import GPU

pytestmark = [pytest.mark.django_db(transaction=True)]

API = "/api/v1/quota-requests/"


def _counts(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper() and "quotas_quotarequest" in q["sql"]]


def _ask(cast, fleet, who: str, n: int) -> None:
    QuotaRequest.objects.bulk_create([
        QuotaRequest(project=cast.vision, flavor=fleet.h100, resource=GPU, amount=1, reason=f"more {i}",
                     requested_by=getattr(cast, who), approver=QuotaRequest.Approver.PROJECT_ADMIN) for i in range(n)])


def test_a_persons_list_counts_through_the_kept_count(api, cast, fleet, token_client) -> None:
    _ask(cast, fleet, "carol", 5)
    _ask(cast, fleet, "dave", 2)
    client = api("bob")
    client.get(API)  # read (and kept) once
    with CaptureQueriesContext(connection) as read:
        body = client.get(f"{API}?page_size=2").json()
    assert _counts(read) == []
    seen = selectors.quota_requests_for(actor=cast.actor("bob")).count()
    assert body["count"] == seen == 7 and len(body["results"]) == 2
    # A filter counts what it filters.
    with CaptureQueriesContext(connection) as read:
        body = client.get(f"{API}?project={cast.vision.slug}&page_size=2").json()
    assert len(_counts(read)) == 1 and body["count"] == 7
    # A new request, through the service, is counted as it commits.
    services.quota_request_create(actor=cast.actor("carol"), project=cast.vision, flavor=fleet.h100, resource=GPU,
                                  amount=1, reason="one more")
    assert client.get(f"{API}?page_size=2").json()["count"] == 8
    # carol sees her own six only.
    assert api("carol").get(f"{API}?page_size=2").json()["count"] == 6


def test_a_tokens_list_counts_as_before(cast, fleet, token_client) -> None:
    _ask(cast, fleet, "carol", 3)
    client, _ = token_client("carol", cast.vision)
    client.get(API)
    with CaptureQueriesContext(connection) as read:
        body = client.get(f"{API}?page_size=1").json()
    assert len(_counts(read)) == 1
    assert body["count"] == 3 and len(body["results"]) == 1

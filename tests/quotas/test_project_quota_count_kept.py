"""The project quota page's list of quota requests counts through a kept count (``quotas.selectors.
project_quota_request_count_kept``, under ``tenants.access.APPROVALS``), asked only when the list is longer than a
page: no COUNT query once warm, the right total for each reader, and a new request counted at once.

Committed transactions, as in production: inside a transaction nothing is kept."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from quotas.models import QuotaRequest

from .factories import GPU

pytestmark = [pytest.mark.django_db(transaction=True)]


def _ask(cast, split, who: str, n: int) -> None:
    QuotaRequest.objects.bulk_create([
        QuotaRequest(project=cast.vision, flavor=split.h100, resource=GPU, amount=1, reason=f"more {i}",
                     requested_by=getattr(cast, who), approver=QuotaRequest.Approver.PROJECT_ADMIN) for i in range(n)])


def _total(body: str) -> str:
    found = re.search(r"1–25 of (\d+)", body)
    assert found, body[-3000:]
    return found.group(1)


def _counts(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper() and "quotas_quotarequest" in q["sql"]]


def test_the_list_counts_through_the_kept_count(as_user, cast, split) -> None:
    _ask(cast, split, "carol", 27)
    _ask(cast, split, "dave", 3)  # bulk_create sends no signal: the counts below are read for the first time anyway
    path = f"/projects/{cast.vision.slug}/quota/"
    for who, total in (("carol", "27"), ("bob", "30"), ("alice", "30"), ("ops", "30")):
        client = as_user(who)
        assert _total(client.get(path).content.decode()) == total, who  # counted once, kept
        with CaptureQueriesContext(connection) as ctx:
            body = client.get(path).content.decode()
        assert _total(body) == total, who
        assert _counts(ctx) == [], (who, _counts(ctx))
    # A new request (a save: the approvals' version moves) is counted at once, for its requester and the approver.
    QuotaRequest.objects.create(project=cast.vision, flavor=split.h100, resource=GPU, amount=1, reason="one more",
                                requested_by=cast.carol, approver=QuotaRequest.Approver.PROJECT_ADMIN)
    assert _total(as_user("carol").get(path).content.decode()) == "28"
    assert _total(as_user("bob").get(path).content.decode()) == "31"
    # Filtered, the list counts through the ORM.
    assert _total(as_user("carol").get(path + "?status=pending").content.decode()) == "28"
    assert "0 results" in as_user("bob").get(path + "?mine=true").content.decode()  # bob asked for none


def test_a_short_list_asks_no_count_at_all(as_user, cast, split) -> None:
    _ask(cast, split, "carol", 3)
    client = as_user("carol")
    client.get(f"/projects/{cast.vision.slug}/quota/")
    with CaptureQueriesContext(connection) as ctx:
        body = client.get(f"/projects/{cast.vision.slug}/quota/").content.decode()
    assert "1–3 of 3" in body
    assert _counts(ctx) == []

"""The approvals inbox reads only the columns its rows show (``views.INBOX_COLUMNS``, ``INBOX_EXTENSION_COLUMNS``;
docs/performance.md). A column left out that a row reads would be loaded one query per row: the page's query count
must not grow with its rows, requests and extension requests, priced (the cost estimate reads the flavor, the
template's kind, the parameters) or not."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from workloads.extensions import extension_request_create
from workloads.models import RequestState

from .factories import make_request
from .test_approvers import submit

pytestmark = [pytest.mark.django_db]


def _page(client: Client) -> tuple[str, int]:
    client.get("/approvals/")  # the frame's caches (badges, memberships) warm
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/approvals/")
    assert response.status_code == 200
    return response.content.decode(), len(queries)


def _add(cast, cat, first: int, n: int) -> None:
    for i in range(first, first + n):
        submit(cast, cat, gpus=4, name=f"big-{i}", cpu=Decimal("2.5"), memory_gib=8,
               parameters={"command": "python train.py", "distributed": True, "workers": 2})
        running = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING, name=f"run-{i}")
        extension_request_create(actor=cast.actor("carol"), request=running, hours=2 + i, reason=f"more <{i}>")


@pytest.mark.parametrize("priced", [False, True])
def test_no_column_of_a_row_is_read_one_query_per_row(cast, cat, priced) -> None:
    if priced:
        from billing import services as billing

        jan = datetime(2026, 1, 1, tzinfo=UTC)
        for unit, amount, key in (("gpu", "2.00", cat.h100.gpu_model or cat.h100.gpu_product or cat.h100.name),
                                  ("cpu", "0.05", ""), ("memory", "0.01", ""), ("storage", "7.30", "")):
            billing.price_create(actor=cast.actor("ops"), unit=unit, key=key, amount=Decimal(amount), effective_from=jan)
    client = Client()
    client.force_login(cast.bob)
    _add(cast, cat, 0, 1)
    one, few_queries = _page(client)
    _add(cast, cat, 1, 3)
    four, many_queries = _page(client)
    assert many_queries == few_queries, "a deferred column is read per row"
    assert four.count('class="card inbox-item" id="approval-') == 4
    assert four.count('class="card inbox-item" id="extension-') == 4
    for i in range(4):
        assert f"big-{i}" in four and f"run-{i}" in four and f"more &lt;{i}&gt;" in four
    assert "Vision" in four or cast.vision.name in four
    assert ("Billing not configured." in four) is not priced


def test_the_pages_context_queries_are_the_selectors_annotations(cast, cat) -> None:
    """The page reads its rows without ``approvals_inbox_for``'s subqueries and prefetch, then their context in two
    queries (``with_approval_context``): the same ``waiting_ahead``, ``in_use`` and quota rows, in the same order,
    for rows of several projects and flavors, with and without anything queued, running or any quota row."""
    from quotas.models import Quota
    from workloads import selectors

    for project in (cast.vision, cast.nlp, cast.llm):
        for flavor in (cat.h100, cat.mig):
            make_request(cat, project, cast.carol, flavor=flavor)
    for state, replicas, gpus in ((RequestState.RUNNING, 2, 3), (RequestState.RUNNING, 1, 1), (RequestState.QUEUED, 1, 2),
                                  (RequestState.APPROVED, 1, 1), (RequestState.PREEMPTED, 1, 1), (RequestState.SUCCEEDED, 1, 8)):
        make_request(cat, cast.vision, cast.carol, state=state, replicas=replicas, gpus=gpus)
    make_request(cat, cast.nlp, cast.carol, state=RequestState.RUNNING, flavor=cat.mig, gpus=2)
    Quota.objects.create(tenant=cast.acme, project=cast.vision, flavor=cat.h100, resource="cpu", nominal=Decimal("16"))
    actor = cast.actor("ops")
    annotated = list(selectors.approvals_inbox_for(actor=actor))
    plain = selectors.with_approval_context(list(selectors.approvals_inbox_for(actor=actor, context=False)))
    assert [r.pk for r in plain] == [r.pk for r in annotated] and len(plain) == 6

    def seen(req) -> tuple:
        return (req.waiting_ahead, req.in_use,
                [(q.pk, q.resource, q.nominal) for q in req.project.quota_rows if q.flavor_id == req.flavor_id],
                selectors.approval_context(req))

    assert [seen(r) for r in plain] == [seen(r) for r in annotated]
    assert {(r.waiting_ahead, r.in_use) for r in plain} >= {(3, 7), (0, 0)}
    assert any(len([q for q in r.project.quota_rows if q.flavor_id == r.flavor_id]) == 2 for r in plain)
    assert selectors.with_approval_context([]) == []


def test_the_api_inbox_reads_rows_with_the_same_context(api, cast, cat, token_client) -> None:
    """``GET /api/v1/approvals/`` reads its page as rows (``request_rows``) and their context after it
    (``with_approval_context_rows``): each row's ``context`` is ``approval_context`` of the request read with the
    selectors' annotations, for rows of several projects and flavors; filters, orders and pages apply; a token of an
    approver sees its own project's only."""
    from quotas.models import Quota
    from workloads import selectors

    for project in (cast.vision, cast.nlp, cast.llm):
        for flavor in (cat.h100, cat.mig):
            make_request(cat, project, cast.carol, flavor=flavor)
    for state, replicas, gpus in ((RequestState.RUNNING, 2, 3), (RequestState.QUEUED, 1, 2)):
        make_request(cat, cast.vision, cast.carol, state=state, replicas=replicas, gpus=gpus)
    Quota.objects.create(tenant=cast.acme, project=cast.vision, flavor=cat.h100, resource="cpu", nominal=Decimal("16"))
    annotated = {r.pk: r for r in selectors.approvals_inbox_for(actor=cast.actor("ops"))}
    body = api("ops").get("/api/v1/approvals/").json()
    assert body["count"] == len(body["results"]) == 6
    assert [row["id"] for row in body["results"]] == list(annotated)
    for row in body["results"]:
        assert row["context"] == selectors.approval_context(annotated[row["id"]])
        assert row["project"] == annotated[row["id"]].project.slug
    assert any(row["context"]["in_use"] == 6 and row["context"]["waiting_ahead"] == 1 for row in body["results"])
    page = api("ops").get("/api/v1/approvals/?page_size=2&page=2&ordering=-created_at").json()
    assert [row["id"] for row in page["results"]] == list(annotated)[::-1][2:4] and page["count"] == 6
    mig = api("ops").get(f"/api/v1/approvals/?flavor={cat.mig.name}").json()
    assert len(mig["results"]) == 3 and {row["flavor"] for row in mig["results"]} == {cat.mig.name}
    # bob approves vision only; erin, globex's admin, none of acme's.
    assert {row["project"] for row in api("bob").get("/api/v1/approvals/").json()["results"]} == {cast.vision.slug}
    assert {row["project"] for row in api("erin").get("/api/v1/approvals/").json()["results"]} == {cast.llm.slug}
    client, _ = token_client("alice", cast.nlp)
    assert {row["project"] for row in client.get("/api/v1/approvals/").json()["results"]} <= {cast.nlp.slug}

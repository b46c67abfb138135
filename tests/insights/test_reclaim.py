"""Reclaim latency on a constructed history with a known answer, its scoping, the API, and who lent (borrowing).

A lender's run starts waiting (``queued_at``); Kueue evicts borrowers in its cohort for it (``Reclaim`` rows, as the
status follower writes them); the lender is admitted. Latency: waiting -> last eviction, waiting -> admission.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from insights.models import QueueSample
from insights.registry import METRICS, Query
from insights.samples import fill_lent
from tenants.access import scope_of
from workloads.models import Reclaim, RequestState

from ..workloads.factories import make_request

pytestmark = pytest.mark.django_db
S = RequestState
T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 8, tzinfo=UTC)
SEC = timedelta(seconds=1)


def q(cast: Any, who: str, **kwargs: Any) -> Query:
    kwargs.setdefault("start", START)
    kwargs.setdefault("end", END)
    return Query(scope=scope_of(cast.actor(who)), **kwargs)


def row_map(result: Any) -> dict[str, dict[str, Any]]:
    return {r.group: r.values for r in result.rows}


def reclaim(cat: Any, lender_project: Any, borrower_project: Any, user: Any, *, queued: datetime,
            evicted: list[float], admitted: float | None) -> Any:
    """A lender run queued at ``queued`` that evicted borrowers after ``evicted`` seconds and was admitted after
    ``admitted`` seconds (None: not yet)."""
    lender = make_request(cat, lender_project, user, state=S.RUNNING if admitted is not None else S.QUEUED,
                          queued_at=queued, approved_at=queued - SEC,
                          admitted_at=None if admitted is None else queued + admitted * SEC,
                          workload_uid=f"uid-{lender_project.slug}-{queued:%H%M%S}")
    for seconds in evicted:
        borrower = make_request(cat, borrower_project, user, state=S.QUEUED)
        Reclaim.objects.create(borrower=borrower, evicted_at=queued + seconds * SEC, preemptor_uid=lender.workload_uid,
                               lender=lender, lender_queued_at=queued,
                               lender_admitted_at=None if admitted is None else queued + admitted * SEC)
    return lender


@pytest.fixture
def history(cast, cat) -> None:
    # acme: nlp lent to vision and takes it back three times; vision once from nlp.
    reclaim(cat, cast.nlp, cast.vision, cast.alice, queued=T0, evicted=[2, 5], admitted=30)  # two borrowers: last at 5
    reclaim(cat, cast.nlp, cast.vision, cast.alice, queued=T0 + timedelta(hours=1), evicted=[1], admitted=60)
    reclaim(cat, cast.nlp, cast.vision, cast.alice, queued=T0 + timedelta(days=1), evicted=[3], admitted=None)
    reclaim(cat, cast.vision, cast.nlp, cast.alice, queued=T0, evicted=[10], admitted=120)
    # globex: one reclaim (another tenant: never in acme's figures)
    reclaim(cat, cast.llm, cast.llm, cast.erin, queued=T0, evicted=[4], admitted=600)
    # before the period: left out
    reclaim(cat, cast.nlp, cast.vision, cast.alice, queued=START - timedelta(hours=1), evicted=[1], admitted=2)


def test_reclaim_latency_per_lender_run_with_a_known_answer(cast, history) -> None:
    rows = row_map(METRICS["reclaim-latency"].compute(q(cast, "ops", group_by="project")))
    assert set(rows) == {"acme-nlp", "acme-vision", "globex-llm"}
    nlp = rows["acme-nlp"]
    # three lender runs, four borrowers evicted; to the reclaim: 5, 1, 3 s; to admission: 30, 60 s (one waits still)
    assert (nlp["reclaims"], nlp["evictions"], nlp["not_admitted"]) == (3, 4, 1)
    assert nlp["reclaim_p50"] == round(3 / 60, 2) and nlp["reclaim_p95"] == round(4.8 / 60, 2)
    assert nlp["admit_p50"] == round(45 / 60, 2) and nlp["admit_p95"] == round(58.5 / 60, 2)
    assert rows["acme-vision"]["admit_p50"] == 2.0 and rows["acme-vision"]["reclaim_p95"] == round(10 / 60, 2)
    assert rows["globex-llm"]["admit_p95"] == 10.0

    tenants = METRICS["reclaim-latency"].compute(q(cast, "ops", group_by="tenant", bucket="day"))
    acme = row_map(tenants)["acme"]
    assert (acme["reclaims"], acme["evictions"]) == (4, 5)
    # admissions 30, 60, 120 s: P50 60 s, P95 114 s; the chart: P95 of the admitted lender runs per day
    assert acme["admit_p50"] == 1.0 and acme["admit_p95"] == 1.9
    assert [(p.at, p.series, p.value) for p in tenants.points if p.series == "acme"] == [
        (datetime(2026, 11, 2, tzinfo=UTC), "acme", 1.9)]
    for group in ("cluster", "flavor", "queue"):
        assert METRICS["reclaim-latency"].compute(q(cast, "ops", group_by=group)).rows, group


def test_reclaim_latency_is_scoped_to_the_askers_tenant(cast, history) -> None:
    alice = METRICS["reclaim-latency"].compute(q(cast, "alice", group_by="project"))
    assert set(row_map(alice)) == {"acme-nlp", "acme-vision"}
    assert {p.series for p in alice.points} <= {"acme-nlp", "acme-vision"}
    erin = row_map(METRICS["reclaim-latency"].compute(q(cast, "erin", group_by="tenant")))
    assert list(erin) == ["globex"] and erin["globex"]["reclaims"] == 1
    # a tenant admin asking for another tenant's project gets nothing of it
    assert METRICS["reclaim-latency"].compute(q(cast, "alice", group_by="project", project_id=cast.llm.pk)).rows == []
    empty = METRICS["reclaim-latency"].compute(q(cast, "ops", start=END, end=END + timedelta(days=1)))
    assert empty.rows == [] and "No lender reclaimed" in empty.note


def test_the_api_serves_reclaim_latency_with_its_definition(api, cast, history) -> None:
    listed = api("alice").get("/api/v1/metrics/", {"page_size": 100}).json()["results"]
    assert "reclaim-latency" in {m["key"] for m in listed}
    body = api("alice").get("/api/v1/metrics/reclaim-latency/", {"start": "2026-11-01", "end": "2026-11-07",
                                                                "group_by": "project"})
    assert body.status_code == 200, body.content
    data = body.json()
    assert {r["group"] for r in data["rows"]} == {"acme-nlp", "acme-vision"}
    assert "lent to its cohort" in data["definition"] or "cohort" in data["definition"]
    other = api("erin").get("/api/v1/metrics/reclaim-latency/", {"start": "2026-11-01", "end": "2026-11-07",
                                                                "group_by": "project"}).json()
    assert {r["group"] for r in other["rows"]} == {"globex-llm"}


def sample(cat: Any, project: Any, slot: int, *, nominal: int, admitted: int, borrowed: int = 0) -> None:
    QueueSample.objects.create(at=T0 + slot * timedelta(minutes=5), cluster=cat.cluster, tenant=project.tenant,
                               project=project, flavor=cat.h100, nominal=Decimal(nominal), admitted=Decimal(admitted),
                               borrowed=Decimal(borrowed), pending=Decimal(0), pending_count=0,
                               pending_smallest=Decimal(0))


def test_borrowing_says_who_lent(cast, cat) -> None:
    for slot in range(12):  # an hour: vision runs 10 on a nominal of 8 (borrows 2); nlp (nominal 2) uses none
        sample(cat, cast.vision, slot, nominal=8, admitted=10, borrowed=2)
        sample(cat, cast.nlp, slot, nominal=2, admitted=0)
    sample(cat, cast.llm, 0, nominal=4, admitted=1)  # unused, but nobody in globex borrows: lends nothing
    # The sampler computes each slot's lent shares as it writes the slot; a second run changes nothing.
    assert fill_lent(T0, T0 + timedelta(hours=1)) == 12
    assert fill_lent(T0, T0 + timedelta(hours=1)) == 0
    assert QueueSample.objects.get(project=cast.nlp, at=T0).lent == Decimal(2)
    result = METRICS["borrowing"].compute(q(cast, "ops", group_by="project"))
    rows = row_map(result)
    assert rows["acme-nlp"]["lent_gpu_hours"] == 2.0 and rows["acme-nlp"]["lending_projects"] == 1
    assert rows["acme-vision"]["lent_gpu_hours"] == 0.0 and rows["acme-vision"]["borrowed_gpu_hours"] == 2.0
    assert rows["globex-llm"]["lent_gpu_hours"] == 0.0
    assert "acme-nlp 2" in result.note
    tenant = row_map(METRICS["borrowing"].compute(q(cast, "alice", group_by="tenant")))
    assert tenant == {"acme": {"borrowed_gpu_hours": 2.0, "admitted_gpu_hours": 10.0, "borrowed_share": 20.0,
                               "lent_gpu_hours": 2.0, "lending_projects": 1}}
    # a project filter keeps the cohort whole: nlp still lent what vision borrowed
    only = row_map(METRICS["borrowing"].compute(q(cast, "alice", group_by="project", project_id=cast.nlp.pk)))
    assert only == {"acme-nlp": {"borrowed_gpu_hours": 0.0, "admitted_gpu_hours": 0.0, "borrowed_share": None,
                                 "lent_gpu_hours": 2.0, "lending_projects": 1}}
    assert "globex" not in str(row_map(METRICS["borrowing"].compute(q(cast, "alice", group_by="project"))))

"""Scheduling metrics on a constructed history with known answers (rows written directly; the follower's own
stamping is tested against the sandbox in test_admitted_at.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from insights.registry import METRICS, Query
from quotas.models import Cluster, Flavor
from tenants.access import scope_of
from workloads.models import RequestEvent, RequestState, WorkloadRequest

from ..workloads.factories import make_request

S = RequestState
T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 8, tzinfo=UTC)
M = timedelta(minutes=1)


def q(cast: Any, who: str, **kwargs: Any) -> Query:
    kwargs.setdefault("start", START)
    kwargs.setdefault("end", END)
    return Query(scope=scope_of(cast.actor(who)), **kwargs)


def row_map(result: Any) -> dict[str, dict[str, Any]]:
    return {r.group: r.values for r in result.rows}


def req(cat: Any, project: Any, user: Any, *, approved: datetime | None = T0, wait: float | None = None,
        start_after: float | None = None, state: str = S.SUCCEEDED, **values: Any) -> WorkloadRequest:
    fields: dict[str, Any] = {"approved_at": approved, "queued_at": approved + M / 2 if approved else None}
    if wait is not None:
        fields["first_admitted_at"] = fields["admitted_at"] = approved + wait * M
        if start_after is not None:
            fields["started_at"] = fields["admitted_at"] + start_after * M
    fields.update(values)
    return make_request(cat, project, user, state=state, **fields)


@pytest.fixture
def history(cast, cat) -> dict[str, WorkloadRequest]:
    r1 = req(cat, cast.vision, cast.carol, wait=2, start_after=1)
    # Preempted and requeued: its first admission after 4 minutes; its current run admitted an hour later.
    r2 = req(cat, cast.vision, cast.carol, wait=4, start_after=1)
    WorkloadRequest.objects.filter(pk=r2.pk).update(admitted_at=T0 + 60 * M, started_at=T0 + 61 * M)
    r3 = req(cat, cast.vision, cast.carol, wait=6, start_after=3)
    r4 = req(cat, cast.nlp, cast.carol, wait=15, start_after=1)
    r5 = req(cat, cast.nlp, cast.carol, state=S.CANCELLED)  # queued, never admitted
    g1 = req(cat, cast.llm, cast.frank, wait=100, start_after=2)
    req(cat, cast.vision, cast.carol, approved=T0 - timedelta(days=30), wait=1)  # approved before the period
    req(cat, cast.vision, cast.carol, approved=None, state=S.PENDING_APPROVAL)  # never approved
    return {"r1": r1, "r2": r2, "r3": r3, "r4": r4, "r5": r5, "g1": g1}


def test_queue_wait_percentiles_count_a_requeued_request_once(cast, history) -> None:
    result = METRICS["queue-wait"].compute(q(cast, "ops", group_by="project"))
    rows = row_map(result)
    vision = rows["acme-vision"]
    assert vision["admitted"] == 3  # r2 once, with its first wait (4), not its second run's (60)
    assert vision["admit_p50"] == 4.0
    assert vision["admit_p95"] == pytest.approx(5.8)
    assert vision["admit_p99"] == pytest.approx(5.96)
    # Admission → running of the current run: 1, 1 (r2's second run), 3.
    assert vision["start_p50"] == 1.0 and vision["start_p99"] == pytest.approx(2.96)
    assert rows["globex-llm"]["admit_p50"] == 100.0
    assert rows["acme-nlp"]["admitted"] == 1
    assert {p.series for p in result.points} == {"acme-vision", "acme-nlp", "globex-llm"}
    [point] = [p for p in result.points if p.series == "acme-vision"]
    assert point.at == datetime(2026, 11, 2, tzinfo=UTC) and point.value == pytest.approx(5.8)


def test_queue_wait_is_scoped_and_empty_periods_say_so(cast, history) -> None:
    alice = row_map(METRICS["queue-wait"].compute(q(cast, "alice", group_by="tenant")))
    assert list(alice) == ["acme"] and alice["acme"]["admitted"] == 4
    frank = row_map(METRICS["queue-wait"].compute(q(cast, "frank", group_by="tenant")))
    assert list(frank) == ["globex"]
    empty = METRICS["queue-wait"].compute(q(cast, "ops", start=END, end=END + timedelta(days=7)))
    assert empty.rows == [] and empty.points == [] and empty.note


def test_queue_wait_by_queue_is_project_times_cluster(cast, history) -> None:
    rows = row_map(METRICS["queue-wait"].compute(q(cast, "ops", group_by="queue")))
    assert set(rows) == {"acme-vision@lab", "acme-nlp@lab", "globex-llm@lab"}


def test_scheduling_success_against_the_target(cast, history, settings) -> None:
    rows = row_map(METRICS["scheduling-success"].compute(q(cast, "ops", group_by="tenant")))
    # acme: r1 (2), r2 (4), r3 (6) within 10 minutes; r4 (15) late; r5 never admitted.
    assert rows["acme"] == {"queued": 5, "admitted_in_time": 3, "rate": 60.0}
    assert rows["globex"] == {"queued": 1, "admitted_in_time": 0, "rate": 0.0}
    settings.INSIGHTS_ADMIT_TARGET_MINUTES = 5
    rows = row_map(METRICS["scheduling-success"].compute(q(cast, "alice", group_by="tenant")))
    assert rows == {"acme": {"queued": 5, "admitted_in_time": 2, "rate": 40.0}}
    empty = METRICS["scheduling-success"].compute(q(cast, "ops", start=END, end=END + timedelta(days=1)))
    assert empty.rows == [] and "not defined" in empty.note


def test_pending_now_counts_waiting_requests_and_the_oldest(cast, cat) -> None:
    now = timezone.now()
    make_request(cat, cast.vision, cast.carol, state=S.QUEUED, gpus=2, replicas=2, queued_at=now - 30 * M)
    make_request(cat, cast.vision, cast.carol, state=S.PREEMPTED, gpus=1, queued_at=now - 5 * M)
    make_request(cat, cast.vision, cast.carol, state=S.RUNNING, gpus=8, queued_at=now - 90 * M)
    make_request(cat, cast.llm, cast.frank, state=S.QUEUED, gpus=1, queued_at=now - 300 * M)
    rows = row_map(METRICS["pending-now"].compute(q(cast, "bob", group_by="project")))
    assert list(rows) == ["acme-vision"]
    assert rows["acme-vision"]["pending"] == 2 and rows["acme-vision"]["demand"] == 5
    assert 30 <= rows["acme-vision"]["oldest_minutes"] < 31
    assert set(row_map(METRICS["pending-now"].compute(q(cast, "ops", group_by="tenant")))) == {"acme", "globex"}


def test_preemptions_and_evictions_by_reason(cast, cat) -> None:
    a = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    b = make_request(cat, cast.llm, cast.frank, state=S.RUNNING)
    messages = [
        (a, "Preempted: Preempted to accommodate a workload (UID: 1) due to reclamation within the cohort; ..."),
        (a, "Preempted: Preempted to accommodate a workload (UID: 2) due to prioritization in the ClusterQueue; ..."),
        (a, "Volcano restarts the gang: a pod was evicted or failed."),
        (a, "Preempted: The ClusterQueue is stopped"),
        (b, "Preempted: Preempted to accommodate a workload (UID: 3) due to prioritization in the ClusterQueue"),
    ]
    for r, message in messages:
        event = RequestEvent.objects.create(request=r, from_state=S.RUNNING, to_state=S.PREEMPTED, actor_label="cluster",
                                            message=message)
        RequestEvent.objects.filter(pk=event.pk).update(at=T0)
    RequestEvent.objects.create(request=a, from_state=S.PREEMPTED, to_state=S.QUEUED, actor_label="cluster",
                                message="Requeued by the cluster.")
    rows = row_map(METRICS["preemptions"].compute(q(cast, "alice", group_by="project")))
    assert list(rows) == ["acme-vision"]
    vision = rows["acme-vision"]
    assert (vision["total"], vision["preemptions"], vision["evictions"]) == (4, 2, 2)
    assert (vision["cohort_reclaim"], vision["queue_priority"], vision["gang_restart"], vision["stopped"]) == (1, 1, 1, 1)
    assert row_map(METRICS["preemptions"].compute(q(cast, "ops", group_by="tenant")))["globex"]["queue_priority"] == 1


def test_gang_start_success_and_time_to_assemble(cast, cat) -> None:
    cluster = Cluster.objects.create(name="train-e", architecture="E")
    offline = Flavor.objects.create(cluster=cluster, name="h100-offline", kind=Flavor.Kind.WHOLE, pool_label="offline",
                                    gpu_model="h100-80gb")
    online = Flavor.objects.create(cluster=cluster, name="h100-online", kind=Flavor.Kind.WHOLE, pool_label="online")
    base = {"cluster": cluster, "template": cat.training}
    req(cat, cast.vision, cast.carol, wait=3.5, start_after=0, flavor=offline, **base)  # queued +0.5: assembled in 3
    req(cat, cast.vision, cast.carol, flavor=offline, state=S.FAILED, **base)  # never assembled
    req(cat, cast.vision, cast.carol, wait=1, start_after=0, flavor=online, **base)  # Kueue's, not a gang
    req(cat, cast.vision, cast.carol, wait=1, start_after=0, flavor=offline, template=cat.notebook,
        cluster=cluster)  # not training
    rows = row_map(METRICS["gang-start"].compute(q(cast, "ops", group_by="cluster")))
    assert rows == {"train-e": {"gangs": 2, "started": 1, "success": 50.0, "assemble_p50": 3.0, "assemble_p95": 3.0}}
    assert METRICS["gang-start"].compute(q(cast, "frank", group_by="cluster")).rows == []


def test_gangs_count_by_the_architecture_at_approval(cast, cat) -> None:
    """A cluster that ran E (Volcano gangs on the offline pool) and moved to F keeps its gangs in the history."""
    from quotas.models import ArchitectureChange

    cluster = Cluster.objects.create(name="moved-to-f", architecture="F")
    offline = Flavor.objects.create(cluster=cluster, name="h100-offline", kind=Flavor.Kind.WHOLE, pool_label="offline",
                                    gpu_model="h100-80gb")
    ArchitectureChange.objects.create(cluster=cluster, from_architecture="E", to_architecture="F", fingerprint="x",
                                      state=ArchitectureChange.State.APPLIED, finished_at=T0 + 60 * M)
    ArchitectureChange.objects.create(cluster=cluster, from_architecture="F", to_architecture="E", fingerprint="y",
                                      state=ArchitectureChange.State.FAILED, finished_at=T0 + 90 * M)  # not applied
    base = {"cluster": cluster, "template": cat.training, "flavor": offline}
    req(cat, cast.vision, cast.carol, wait=2.5, start_after=0, **base)  # under E: a gang, assembled in 2 minutes
    req(cat, cast.vision, cast.carol, approved=T0 + 120 * M, wait=1, start_after=0, **base)  # under F: Kueue's
    result = METRICS["gang-start"].compute(q(cast, "ops", group_by="cluster"))
    assert row_map(result) == {"moved-to-f": {"gangs": 1, "started": 1, "success": 100.0, "assemble_p50": 2.0,
                                              "assemble_p95": 2.0}}
    assert "no cluster runs it now" in result.note
    assert METRICS["gang-start"].compute(q(cast, "erin", group_by="cluster")).rows == []  # another tenant's gangs

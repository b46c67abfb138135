"""The request state machine: allowed and forbidden moves, what a move writes, and compare-and-set."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from tenants.models import AuditEntry
from workloads.models import RequestEvent, RequestState, WorkloadRequest
from workloads.states import ALLOWED, FINAL, can_move, move, sources_of

from .factories import make_request

S = RequestState
ALL = list(S.values)


def test_every_state_is_known_to_the_machine() -> None:
    reachable = {to for targets in ALLOWED.values() for to in targets}
    assert set(ALL) - {S.SUBMITTED} <= reachable  # everything but the start can be reached
    assert set(ALLOWED) <= set(ALL)
    # Nothing leaves a terminal state except a restart of a stopped or failed request.
    for state in FINAL:
        assert ALLOWED.get(state, set()) <= {S.APPROVED}
    # queued -> approved: a re-dispatch off a drained or unhealthy cluster (workloads/routing.py).
    assert sources_of(S.APPROVED) == sorted([S.SUBMITTED, S.PENDING_APPROVAL, S.QUEUED, S.STOPPED, S.FAILED])
    assert can_move(S.PREEMPTED, S.QUEUED) and can_move(S.RUNNING, S.PREEMPTED)
    assert not can_move(S.SUCCEEDED, S.RUNNING) and not can_move(S.REJECTED, S.APPROVED)


@pytest.mark.django_db
@pytest.mark.parametrize("source", ALL)
def test_moves_from_each_state(cast, cat, source) -> None:
    """Every (from, to) pair: allowed ones win and write, forbidden ones change nothing."""
    for target in ALL:
        if not sources_of(target):
            continue
        req = make_request(cat, cast.vision, cast.carol, state=source)
        events = RequestEvent.objects.count()
        won = move(req, to=target, actor_label="test", reason="because")
        assert won is can_move(source, target), (source, target)
        assert WorkloadRequest.objects.get(pk=req.pk).state == (target if won else source)
        assert RequestEvent.objects.count() == events + (1 if won else 0)


@pytest.mark.django_db
def test_move_writes_timeline_audit_and_timestamps(cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.PENDING_APPROVAL)
    assert move(req, to=S.APPROVED, actor_label="bob", actor=cast.actor("bob"), reason="looks fine",
                fields={"approved_by": cast.bob})
    row = WorkloadRequest.objects.get(pk=req.pk)
    assert row.approved_at is not None and row.approved_by == cast.bob and row.state_reason == "looks fine"
    event = row.events.get()
    assert (event.from_state, event.to_state, event.actor_label, event.message) == (S.PENDING_APPROVAL, S.APPROVED, "bob", "looks fine")
    entry = AuditEntry.objects.get(action="request.approved")
    assert entry.actor == cast.bob and entry.project == cast.vision and entry.before == {"state": S.PENDING_APPROVAL}

    assert move(req, to=S.QUEUED, actor_label="cluster") and WorkloadRequest.objects.get(pk=req.pk).queued_at
    assert AuditEntry.objects.get(action="request.queued").actor_label == "cluster"
    assert move(req, to=S.RUNNING, actor_label="cluster")
    assert move(req, to=S.PREEMPTED, actor_label="cluster", reason="evicted by a higher priority workload")
    assert move(req, to=S.QUEUED, actor_label="cluster")  # requeued
    assert move(req, to=S.RUNNING, actor_label="cluster")
    assert move(req, to=S.SUCCEEDED, actor_label="cluster")
    row = WorkloadRequest.objects.get(pk=req.pk)
    assert row.started_at and row.finished_at and row.pending_reason == ""
    assert [e.to_state for e in row.events.all()] == [
        S.APPROVED, S.QUEUED, S.RUNNING, S.PREEMPTED, S.QUEUED, S.RUNNING, S.SUCCEEDED,
    ]


@pytest.mark.django_db
def test_move_is_compare_and_set_against_the_database(cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.PENDING_APPROVAL)
    stale = WorkloadRequest.objects.get(pk=req.pk)
    assert move(req, to=S.CANCELLED, actor_label="carol")
    # The stale copy still says pending_approval; the database decides.
    assert move(stale, to=S.APPROVED, actor_label="bob") is False
    assert WorkloadRequest.objects.get(pk=req.pk).state == S.CANCELLED
    assert stale.state == S.PENDING_APPROVAL  # a lost move leaves the copy alone


@pytest.mark.django_db
def test_only_from_narrows_the_sources(cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.STOPPED)
    assert move(req, to=S.APPROVED, actor_label="bob", only_from=[S.PENDING_APPROVAL]) is False
    assert move(req, to=S.APPROVED, actor_label="carol", only_from=[S.STOPPED, S.FAILED]) is True
    with pytest.raises(ValueError):
        move(req, to="nonsense", actor_label="x")
    with pytest.raises(ValueError):
        move(req, to=S.SUBMITTED, actor_label="x")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "source, targets",
    [
        (S.PENDING_APPROVAL, (S.APPROVED, S.REJECTED)),  # two approvers deciding differently
        (S.QUEUED, (S.RUNNING, S.RUNNING)),  # two watchers seeing the same admission
        (S.RUNNING, (S.SUCCEEDED, S.STOPPED)),  # the job ends while the user stops it
    ],
)
def test_two_concurrent_moves_exactly_one_wins(cast, cat, source, targets) -> None:
    for _ in range(5):
        req = make_request(cat, cast.vision, cast.carol, state=source)
        barrier = threading.Barrier(2)
        results: list[tuple[str, bool]] = []

        def attempt(to: str, req=req, barrier=barrier, results=results) -> None:  # this iteration's
            try:
                fresh = WorkloadRequest.objects.get(pk=req.pk)
                barrier.wait()
                results.append((to, move(fresh, to=to, actor_label=f"worker-{to}")))
            finally:
                connection.close()

        threads = [threading.Thread(target=attempt, args=(to,)) for to in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(won for _, won in results) == [False, True], results
        winner = next(to for to, won in results if won)
        row = WorkloadRequest.objects.get(pk=req.pk)
        assert row.state == winner
        assert list(row.events.values_list("from_state", "to_state")) == [(source, winner)]

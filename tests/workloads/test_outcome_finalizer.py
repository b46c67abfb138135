"""A run's outcome never depends on the status follower seeing it in time (docs/architecture.md, "Outcomes survive
the follower"): the Jobs the portal creates carry ``gpu-portal.io/outcome``, the sandbox cluster (like a real one)
keeps a finished Job its TTL controller deletes until that finalizer is off, and the follower takes it off only after
recording the outcome and handing the objects to billing. The portal's own stop/cancel/delete paths take it off
themselves, so nothing waits forever. Materialization runs in the test; the follower is the beat task."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
from django.core.cache import cache

from billing.models import UsageInterval
from portal.labels import OUTCOME_FINALIZER
from tenants.access import Actor
from workloads import services
from workloads.manifests import REQUEST_LABEL
from workloads.materialize import request_materialize
from workloads.models import RequestState, WorkloadRequest
from workloads.status import StatusFollower, follow_lease
from workloads.tasks import request_changed_task, requests_sync_task

from .test_lifecycle import World, _world

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]
TTL = 60


@pytest.fixture
def world(fresh_sandbox, cast, settings) -> World:
    settings.WORKLOADS_JOB_TTL_SECONDS = TTL
    return _world(fresh_sandbox, cast, architecture="B")


def follow(world: World) -> None:
    """One run of the status-follow Celery task (what beat sends every 5 s)."""
    assert world.cluster.name in requests_sync_task.apply().get()


def follow_until(world: World, reqs: list[WorkloadRequest], states: set[str], *, advance: float = 0,
                 timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for req in reqs:
            req.refresh_from_db()
        if all(r.state in states for r in reqs):
            return
        assert time.monotonic() < deadline, [(r.pk, r.state, r.state_reason, r.cluster_status) for r in reqs]
        if advance:
            world.sandbox.advance(advance)
        follow(world)


def jobs(world: World, req: WorkloadRequest) -> list[dict[str, Any]]:
    return world.sandbox.store.list("batch/v1", "Job", req.project.namespace,
                                    label_selector=f"{REQUEST_LABEL}={req.pk}")["items"]


def workloads_of(world: World, req: WorkloadRequest) -> list[dict[str, Any]]:
    items = world.sandbox.store.list("kueue.x-k8s.io/v1beta2", "Workload", req.project.namespace)["items"]
    return [w for w in items if any(ref.get("name") == req.k8s_name for ref in w["metadata"].get("ownerReferences") or [])]


def condition_time(obj: dict[str, Any], kind: str) -> datetime:
    cond = next(c for c in obj["status"]["conditions"] if c["type"] == kind and c["status"] == "True")
    return datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))


@pytest.mark.parametrize("restart", ["resumes its watch", "re-lists everything"])
def test_jobs_that_finish_and_expire_while_the_follower_is_stopped_keep_outcome_and_usage(world: World, restart) -> None:
    reqs = [world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1) for _ in range(3)]
    for req in reqs:
        assert request_materialize(request_id=req.pk) == "queued"
        job = jobs(world, req)[0]
        assert job["spec"]["ttlSecondsAfterFinished"] == TTL
        assert job["metadata"]["finalizers"] == [OUTCOME_FINALIZER]
    follow_until(world, reqs, {S.RUNNING}, advance=5)
    assert all(UsageInterval.objects.filter(request=r, ended_at__isnull=True).exists() for r in reqs)

    # The follower stops (the worker with its beat died). The jobs run their simulated hour and finish, and their
    # TTL passes: the cluster deletes them, but our finalizer keeps each one (and so its Workload) until recorded.
    world.sandbox.advance(3600)
    world.sandbox.advance(TTL + 30)
    world.sandbox.advance(600)
    finished: dict[int, tuple[datetime, datetime]] = {}
    for req in reqs:
        (job,) = jobs(world, req)
        assert job["metadata"].get("deletionTimestamp"), job["metadata"]
        assert job["metadata"]["finalizers"] == [OUTCOME_FINALIZER]
        (wl,) = workloads_of(world, req)
        finished[req.pk] = (condition_time(wl, "Admitted"), condition_time(wl, "Finished"))
        req.refresh_from_db()
        assert req.state == S.RUNNING  # nobody looked yet

    # The follower starts again: from where its watches stopped, or (stopped longer than the re-list period, or
    # its saved place lost) with a full re-list.
    if restart == "re-lists everything":
        lease = follow_lease(world.cluster)
        assert lease.hold()
        try:
            StatusFollower(world.cluster, watch_seconds=1).cycle(resync=True)
        finally:
            lease.release()
    follow_until(world, reqs, {S.SUCCEEDED, S.FAILED}, timeout=30)
    for req in reqs:
        assert req.state == S.SUCCEEDED, (req.state, req.state_reason)
        intervals = list(UsageInterval.objects.filter(request=req))
        assert intervals, req.pk
        admitted, ended = finished[req.pk]
        for interval in intervals:
            assert (interval.started_at, interval.ended_at, interval.end_reason) == (admitted, ended, "finished")
    # Recorded, so let go: the TTL deletion completes (and the Workload goes with its Job).
    for _ in range(3):
        world.sandbox.advance(5)
        follow(world)
    for req in reqs:
        assert jobs(world, req) == [] and workloads_of(world, req) == []
        req.refresh_from_db()
        assert req.state == S.SUCCEEDED

    # An unchanged cluster: a full re-list writes nothing and patches nothing.
    lease = follow_lease(world.cluster)
    assert lease.hold()
    try:
        follower = StatusFollower(world.cluster, watch_seconds=1)
        follower.cycle(resync=True)
        patches = follower.kube.calls.get("patch", 0)
        stats = follower.cycle(resync=True)
    finally:
        lease.release()
    assert (stats.db_writes, stats.moves, follower.kube.calls.get("patch", 0) - patches) == (0, 0, 0)


def test_stop_cancel_and_delete_take_the_finalizer_off(world: World) -> None:
    bob = Actor(user=world.cast.bob)
    running, doomed, waiting = (world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
                                for _ in range(3))
    for req in (running, doomed):
        assert request_materialize(request_id=req.pk) == "queued"
    follow_until(world, [running, doomed], {S.RUNNING}, advance=5)
    assert request_materialize(request_id=waiting.pk) == "queued"  # handed over, never followed yet

    services.request_stop(actor=bob, request=running)
    services.request_delete(actor=bob, request=doomed)
    services.request_cancel(actor=bob, request=waiting)
    # The follower is not running: the portal's own path removes the objects, finalizer and all.
    for req, action in ((running, "stop"), (doomed, "delete"), (waiting, "cancel")):
        assert OUTCOME_FINALIZER in jobs(world, req)[0]["metadata"]["finalizers"]
        assert request_changed_task.apply(args=[req.pk, action]).get() == "deleted"
    world.sandbox.advance(5)
    for req in (running, doomed, waiting):
        assert jobs(world, req) == [] and workloads_of(world, req) == [], req.pk
    follow(world)
    for req, state in ((running, S.STOPPED), (doomed, S.STOPPED), (waiting, S.CANCELLED)):
        req.refresh_from_db()
        assert req.state == state, (req.pk, req.state, req.state_reason)


def test_a_running_job_deleted_by_hand_fails_and_is_let_go(world: World) -> None:
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    assert request_materialize(request_id=req.pk) == "queued"
    follow_until(world, [req], {S.RUNNING}, advance=5)
    world.kube().delete("batch/v1", "Job", req.k8s_name, req.project.namespace)
    assert jobs(world, req)[0]["metadata"]["deletionTimestamp"]  # held by our finalizer
    cache.clear()  # the next cycle re-lists
    follow_until(world, [req], {S.FAILED}, advance=1, timeout=30)
    assert "deleted outside the portal" in req.state_reason
    world.sandbox.advance(5)
    follow(world)
    assert jobs(world, req) == []

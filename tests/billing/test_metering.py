"""Metering against the sandbox cluster with a frozen clock (speed 0: only ``advance`` moves it).

Requests go through the services, the materializer applies them, the status follower runs one cycle at a time
(``requests_sync``, as beat would) and hands what it saw to billing through ``portal.extensions.usage_meter``.
Every instant asserted is the cluster's own (its objects' timestamps), never the portal's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.cache import cache

from billing import services
from billing.metering import meter_observe, parse_time
from billing.models import ClusterClock, UsageInterval
from tenants.access import Actor
from workloads import services as workload_services
from workloads.materialize import request_act, request_materialize
from workloads.models import RequestState, WorkloadRequest
from workloads.status import StatusFollower

from ..workloads.test_lifecycle import World, _world

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]
API = "/api/v1"


@pytest.fixture
def world(fresh_sandbox, cast) -> World:
    fresh_sandbox.clock.speed = 0  # frozen: the test moves the cluster's time
    world = _world(fresh_sandbox, cast, architecture="B")
    services.price_create(actor=cast.actor("ops"), unit="gpu", key="h100-80gb", amount=Decimal("3.60"),
                          effective_from=datetime(2020, 1, 1, tzinfo=UTC))
    return world


def run(world: World, req: WorkloadRequest, until: Any, *, advance: float, cycles: int = 60) -> WorkloadRequest:
    for _ in range(cycles):
        req.refresh_from_db()
        if until(req):
            return req
        world.sandbox.advance(advance)
        world.sync()
    raise AssertionError(f"request {req.pk} stuck in {req.state}: {req.state_reason} {req.cluster_status}")


def submit(world: World, who: str, template: str, gpus: int, **values: Any) -> WorkloadRequest:
    req = world.submit(who, template, "h100-80gb-offline", gpus=gpus, **values)
    if req.state == S.PENDING_APPROVAL:
        req = world.approve(req)
    assert request_materialize(request_id=req.pk) in ("queued", "skipped")
    return req


def workloads_of(world: World, req: WorkloadRequest) -> list[dict[str, Any]]:
    items = world.sandbox.store.list("kueue.x-k8s.io/v1beta2", "Workload", req.project.namespace)["items"]
    return [w for w in items if any(r.get("name") == req.k8s_name for r in w["metadata"].get("ownerReferences") or [])]


def condition_time(wl: dict[str, Any], ctype: str) -> datetime:
    cond = next(c for c in wl["status"]["conditions"] if c["type"] == ctype)
    return parse_time(cond["lastTransitionTime"])


def gpu_intervals(req: WorkloadRequest) -> list[UsageInterval]:
    return list(UsageInterval.objects.filter(request=req, unit="gpu").order_by("started_at"))


def test_a_run_opens_at_admission_and_closes_when_finished_in_cluster_time(world: World, api) -> None:
    # The cluster runs a day ahead of the portal: its instants, not the portal's, make the interval.
    world.sandbox.advance(86400)
    req = submit(world, "carol", "training", 2, duration_hours=1)
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    [wl] = workloads_of(world, req)
    admitted = condition_time(wl, "Admitted")
    [iv] = gpu_intervals(req)
    assert iv.started_at == admitted and iv.ended_at is None and iv.quantity == 2 and iv.key == "h100-80gb"
    assert iv.source == "workload" and iv.object_uid == wl["metadata"]["uid"]
    units = dict(UsageInterval.objects.filter(request=req).values_list("unit", "quantity"))
    assert units == {"gpu": Decimal(2), "cpu": Decimal(req.cpu), "memory": Decimal(req.memory_gib)}
    # Queue time is not billed: the interval starts after the Workload was created.
    assert admitted >= parse_time(wl["metadata"]["creationTimestamp"])
    clock = ClusterClock.objects.get(cluster=world.cluster)
    assert clock.cluster_time <= world.sandbox.clock.now() and clock.cluster_time >= admitted
    # An open interval is never negative, though the cluster's instants lie a day after the portal's now.
    assert Decimal(api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_so_far"]) >= 0

    req = run(world, req, lambda r: r.state == S.SUCCEEDED, advance=600)
    [wl] = workloads_of(world, req)
    [iv] = gpu_intervals(req)
    finished = condition_time(wl, "Finished")
    assert iv.started_at == admitted and iv.ended_at == finished and iv.end_reason == "finished"
    hours = Decimal((finished - admitted).total_seconds()) / 3600
    expected = (Decimal("3.60") * 2 * hours).quantize(Decimal("0.01"))
    assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_so_far"] == str(expected)
    assert expected > 0
    # Another tenant sees none of it.
    assert api("frank").get(f"{API}/usage/").json()["count"] == 0
    assert api("frank").get(f"{API}/usage/?request={req.pk}").json()["count"] == 0
    assert api("carol").get(f"{API}/usage/?request={req.pk}").json()["count"] == 3


def test_replaying_the_same_events_never_counts_twice(world: World) -> None:
    req = submit(world, "carol", "training", 1, duration_hours=1)
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    before = list(UsageInterval.objects.order_by("pk").values_list("pk", "run_key", "unit", "started_at", "ended_at"))
    assert len(before) == 3
    [wl] = workloads_of(world, req)
    seen = [("workload", "ADDED", wl, req.pk), ("workload", "MODIFIED", wl, req.pk), ("workload", "MODIFIED", wl, req.pk)]
    meter_observe(cluster=world.cluster, seen=seen)  # a duplicated delivery
    meter_observe(cluster=world.cluster, seen=seen)  # and a replay
    StatusFollower(world.cluster).cycle(resync=True)  # the periodic resync lists it again
    cache.clear()  # a lost cache: the follower starts over with a full list
    world.sync()
    after = list(UsageInterval.objects.order_by("pk").values_list("pk", "run_key", "unit", "started_at", "ended_at"))
    assert after == before
    # And once closed, a replay of the old "admitted" event does not reopen it.
    req = run(world, req, lambda r: r.state == S.SUCCEEDED, advance=600)
    closed = list(UsageInterval.objects.order_by("pk").values_list("pk", "ended_at"))
    assert all(end is not None for _, end in closed)
    meter_observe(cluster=world.cluster, seen=[("workload", "MODIFIED", wl, req.pk)])
    assert list(UsageInterval.objects.order_by("pk").values_list("pk", "ended_at")) == closed


def test_a_preempted_and_requeued_job_makes_two_intervals_and_its_queue_time_is_free(world: World, api) -> None:
    job = submit(world, "bob", "training", 8, duration_hours=1)
    job = run(world, job, lambda r: r.state == S.RUNNING, advance=5)
    [first_wl] = workloads_of(world, job)
    first_admitted = condition_time(first_wl, "Admitted")
    notebook = submit(world, "bob", "notebook", 1, duration_hours=2)
    job = run(world, job, lambda r: "Preempted" in " ".join(r.events.values_list("message", flat=True)), advance=2)
    notebook = run(world, notebook, lambda r: r.state == S.RUNNING, advance=5)
    [evicted_wl] = workloads_of(world, job)
    evicted_at = condition_time(evicted_wl, "Evicted")
    [iv] = gpu_intervals(job)
    assert iv.started_at == first_admitted and iv.ended_at == evicted_at and iv.end_reason == "evicted"

    workload_services.request_stop(actor=Actor(user=world.cast.bob), request=notebook)
    request_act(request_id=notebook.pk, action="stop")  # what the worker does with the stop
    job = run(world, job, lambda r: r.state == S.RUNNING, advance=5)
    job = run(world, job, lambda r: r.state == S.SUCCEEDED, advance=600)
    [wl] = workloads_of(world, job)
    first, second = gpu_intervals(job)
    assert (first.started_at, first.ended_at) == (first_admitted, evicted_at)
    assert second.started_at == condition_time(wl, "Admitted") and second.ended_at == condition_time(wl, "Finished")
    assert second.started_at > first.ended_at  # the time in the queue between them is in neither
    assert first.run_key != second.run_key and first.object_uid == second.object_uid
    billed = sum(((iv.ended_at - iv.started_at).total_seconds() for iv in (first, second)), 0.0)
    cost = (Decimal("3.60") * 8 * Decimal(billed) / 3600).quantize(Decimal("0.01"))
    assert api("bob").get(f"{API}/requests/{job.pk}/").json()["cost_so_far"] == str(cost)
    # The notebook's run closed when it was stopped (its objects deleted), at the cluster's deletion time.
    world.sync()
    [nb] = gpu_intervals(notebook)
    assert nb.ended_at is not None and nb.ended_at >= nb.started_at and nb.end_reason in ("deleted", "finished", "gone")


def test_an_object_deleted_behind_the_portals_back_closes_its_interval(world: World) -> None:
    req = submit(world, "carol", "training", 1, duration_hours=1)
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    [iv] = gpu_intervals(req)
    world.sandbox.advance(1200)
    world.sync()
    seen_before = ClusterClock.objects.get(cluster=world.cluster).cluster_time
    # Deleted while nobody watched: the follower's saved resourceVersions are lost too, so it never gets the
    # DELETED events and only the resync's list says the Workload is gone.
    ns, name = req.project.namespace, req.k8s_name
    world.sandbox.store.delete("batch/v1", "Job", name, ns)
    for wl in workloads_of(world, req):
        world.sandbox.store.delete("kueue.x-k8s.io/v1beta2", "Workload", wl["metadata"]["name"], ns)
    world.sandbox.advance(600)
    cache.clear()
    StatusFollower(world.cluster).cycle(resync=True)
    iv.refresh_from_db()
    assert iv.end_reason == "gone" and iv.started_at <= iv.ended_at <= seen_before + timedelta(seconds=1)
    assert iv.ended_at <= world.sandbox.clock.now()


def test_a_deleted_workload_closes_at_its_deletion_time(world: World) -> None:
    req = submit(world, "carol", "training", 1, duration_hours=1)
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    world.sandbox.advance(900)
    world.sync()
    deleted_at = world.sandbox.clock.now().replace(microsecond=0)
    # kubectl delete --cascade=foreground: the Job shows its deletion time, then its Workload goes.
    world.sandbox.store.delete("batch/v1", "Job", req.k8s_name, req.project.namespace, propagation_policy="Foreground")
    for _ in range(5):
        world.sync()
        [iv] = gpu_intervals(req)
        if iv.ended_at is not None:
            break
    assert iv.end_reason in ("deleted", "gone")
    assert iv.ended_at == deleted_at and iv.ended_at <= world.sandbox.clock.now()
    hours = Decimal((iv.ended_at - iv.started_at).total_seconds()) / 3600
    assert hours > Decimal("0.25")  # the 15 minutes it ran are all there


def test_a_volcano_gang_is_metered_from_its_pods(fresh_sandbox, cast, api) -> None:
    # Architecture E: distributed training on the offline pool is a Volcano Job, which Kueue does not own.
    fresh_sandbox.clock.speed = 0
    world = _world(fresh_sandbox, cast, architecture="E")
    services.price_create(actor=cast.actor("ops"), unit="gpu", key="h100-80gb", amount=Decimal("3.60"),
                          effective_from=datetime(2020, 1, 1, tzinfo=UTC))
    req = submit(world, "bob", "training", 2, duration_hours=1,
                 parameters={"command": "torchrun train.py", "distributed": True, "workers": 3})
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    pods = {p["metadata"]["uid"]: p for p in world.sandbox.store.list("v1", "Pod", req.project.namespace)["items"]
            if req.k8s_name in p["metadata"]["name"]}
    ivs = gpu_intervals(req)
    assert {iv.object_uid for iv in ivs} == set(pods) and len(ivs) == len(pods) >= 2
    for iv in ivs:
        assert iv.source == "pod" and iv.quantity == 2 and iv.ended_at is None
        assert iv.started_at == parse_time(pods[iv.object_uid]["status"]["startTime"])
    req = run(world, req, lambda r: r.state == S.SUCCEEDED, advance=600)
    world.sync()
    for iv in gpu_intervals(req):
        assert iv.ended_at is not None and iv.ended_at > iv.started_at
    assert Decimal(api("bob").get(f"{API}/requests/{req.pk}/").json()["cost_so_far"]) > 0
    assert api("frank").get(f"{API}/usage/?request={req.pk}").json()["count"] == 0


def _workload_at(wl: dict[str, Any], uid: str, version: int, admitted: datetime, finished: datetime | None,
                 *, evicted: datetime | None = None) -> dict[str, Any]:
    """A copy of a real Workload as the cluster showed it at one resourceVersion (its own uid, our instants)."""
    import copy

    obj = copy.deepcopy(wl)
    obj["metadata"] |= {"uid": uid, "name": f"ooo-{uid}", "resourceVersion": str(version)}
    obj["metadata"].pop("deletionTimestamp", None)
    obj["metadata"].pop("managedFields", None)
    iso = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")
    conds = [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": iso(admitted), "reason": "QuotaReserved"},
             {"type": "Admitted", "status": "False" if evicted else "True",
              "lastTransitionTime": iso(evicted or admitted), "reason": "Evicted" if evicted else "Admitted"}]
    if evicted:
        conds.append({"type": "Evicted", "status": "True", "lastTransitionTime": iso(evicted), "reason": "Preempted"})
    if finished is not None:
        conds.append({"type": "Finished", "status": "True", "lastTransitionTime": iso(finished), "reason": "Succeeded"})
    obj["status"] = {"conditions": conds}
    return obj


def test_out_of_order_status_events_leave_one_interval_from_admitted_to_finished(world: World) -> None:
    """Events may come late, twice or in any order (a re-list after a newer watch event, two batches crossing):
    whatever the order, each run is one interval per unit from the cluster's Admitted to its Finished instant."""
    req = submit(world, "carol", "training", 1, duration_hours=1)
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    [wl] = workloads_of(world, req)
    base = condition_time(wl, "Admitted")
    t0, t1 = base + timedelta(seconds=10), base + timedelta(seconds=130)  # within what the cluster already showed

    def observe(*events: tuple[str, dict[str, Any]]) -> None:
        meter_observe(cluster=world.cluster, seen=[("workload", etype, obj, req.pk) for etype, obj in events])

    def spans(uid: str) -> list[tuple[str, datetime, datetime | None, str]]:
        return sorted(UsageInterval.objects.filter(object_uid=uid).values_list("unit", "started_at", "ended_at", "end_reason"))

    def once(uid: str, start: datetime, end: datetime | None, reason: str = "finished") -> None:
        assert spans(uid) == [(unit, start, end, reason if end else "") for unit in ("cpu", "gpu", "memory")], uid

    # 1. Finished seen before Admitted (a later batch, then an older resourceVersion): one closed interval.
    observe(("MODIFIED", _workload_at(wl, "ooo-1", 20, t0, t1)))
    observe(("MODIFIED", _workload_at(wl, "ooo-1", 10, t0, None)))
    once("ooo-1", t0, t1)
    # 2. Both in one batch, the newer first.
    observe(("MODIFIED", _workload_at(wl, "ooo-2", 20, t0, t1)), ("MODIFIED", _workload_at(wl, "ooo-2", 10, t0, None)))
    once("ooo-2", t0, t1)
    # 3. Both in one batch in order: the run opened by the first event is closed by the second, in the same cycle.
    observe(("ADDED", _workload_at(wl, "ooo-3", 10, t0, None)), ("MODIFIED", _workload_at(wl, "ooo-3", 20, t0, t1)))
    once("ooo-3", t0, t1)
    # 4. Opened, finished, then the old "admitted" replayed and the deletion seen late: still the same interval.
    observe(("ADDED", _workload_at(wl, "ooo-4", 10, t0, None)))
    once("ooo-4", t0, None)
    observe(("MODIFIED", _workload_at(wl, "ooo-4", 20, t0, t1)))
    observe(("MODIFIED", _workload_at(wl, "ooo-4", 10, t0, None)), ("DELETED", _workload_at(wl, "ooo-4", 30, t0, t1)))
    once("ooo-4", t0, t1)
    # 5. An eviction seen before the admission it ends (in one batch): admitted..evicted, nothing left open.
    t_ev = t0 + timedelta(seconds=60)
    observe(("MODIFIED", _workload_at(wl, "ooo-5", 20, t0, None, evicted=t_ev)), ("MODIFIED", _workload_at(wl, "ooo-5", 10, t0, None)))
    once("ooo-5", t0, t_ev, "evicted")
    # A resync afterwards (the objects are not in the cluster) changes none of the closed ones.
    before = {uid: spans(uid) for uid in ("ooo-1", "ooo-2", "ooo-3", "ooo-4", "ooo-5")}
    StatusFollower(world.cluster).cycle(resync=True)
    assert {uid: spans(uid) for uid in before} == before

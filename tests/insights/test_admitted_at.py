"""``admitted_at`` / ``first_admitted_at`` as the status follower records them, against the sandbox cluster.

The follower runs one cycle at a time (``requests_sync``, as beat would); requests go through the services and the
materializer. ``admitted_at`` is the current run's admission (a preemption clears it, the next admission sets it
again); ``first_admitted_at`` is the first admission since the approval, which the queue-wait metrics read.
"""

from __future__ import annotations

from typing import Any

import pytest

from tenants.access import Actor
from workloads import services as workload_services
from workloads.materialize import request_act, request_materialize
from workloads.models import RequestState, WorkloadRequest

from ..workloads.test_lifecycle import World, _world

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]


@pytest.fixture
def world(fresh_sandbox, cast) -> World:
    fresh_sandbox.clock.speed = 0
    return _world(fresh_sandbox, cast, architecture="B")


def run(world: World, req: WorkloadRequest, until: Any, *, advance: float, cycles: int = 60) -> WorkloadRequest:
    for _ in range(cycles):
        req.refresh_from_db()
        if until(req):
            return req
        world.sandbox.advance(advance)
        world.sync()
    raise AssertionError(f"request {req.pk} stuck in {req.state}: {req.state_reason} {req.cluster_status}")


def submit(world: World, who: str, template: str, gpus: int, flavor: str = "h100-80gb-offline", **values: Any) -> WorkloadRequest:
    req = world.submit(who, template, flavor, gpus=gpus, **values)
    if req.state == S.PENDING_APPROVAL:
        req = world.approve(req)
    assert request_materialize(request_id=req.pk) in ("queued", "skipped")
    return req


def test_admission_is_stamped_once_between_approval_and_running(world: World) -> None:
    req = submit(world, "carol", "training", 1, duration_hours=1)
    assert req.admitted_at is None and req.first_admitted_at is None
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    assert req.admitted_at is not None and req.first_admitted_at == req.admitted_at
    assert req.approved_at <= req.admitted_at <= req.started_at
    stamped = req.admitted_at
    for _ in range(3):  # later cycles (and a resync) leave it alone
        world.sandbox.advance(5)
        world.sync()
    req.refresh_from_db()
    assert req.admitted_at == stamped


def test_a_preempted_and_requeued_request_keeps_its_first_admission(world: World) -> None:
    job = submit(world, "bob", "training", 8, duration_hours=1)
    job = run(world, job, lambda r: r.state == S.RUNNING, advance=5)
    first = job.first_admitted_at
    assert first is not None and job.admitted_at == first
    notebook = submit(world, "bob", "notebook", 1, duration_hours=2)
    job = run(world, job, lambda r: "Preempted" in " ".join(r.events.values_list("message", flat=True)), advance=2)
    notebook = run(world, notebook, lambda r: r.state == S.RUNNING, advance=5)
    job.refresh_from_db()
    # Waiting again: no current admission, the first one kept.
    assert job.state == S.QUEUED and job.admitted_at is None and job.first_admitted_at == first
    assert notebook.admitted_at is not None
    workload_services.request_stop(actor=Actor(user=world.cast.bob), request=notebook)
    request_act(request_id=notebook.pk, action="stop")
    job = run(world, job, lambda r: r.state == S.RUNNING, advance=5)
    assert job.admitted_at is not None and job.admitted_at > first
    assert job.first_admitted_at == first
    assert list(job.events.filter(to_state=S.PREEMPTED).values_list("to_state", flat=True)) == [S.PREEMPTED]


def test_a_volcano_gang_is_admitted_when_it_runs(fresh_sandbox, cast) -> None:
    fresh_sandbox.clock.speed = 0
    world = _world(fresh_sandbox, cast, architecture="E")
    req = submit(world, "bob", "training", 2, duration_hours=1,
                 parameters={"command": "torchrun train.py", "distributed": True, "workers": 3})
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    assert req.admitted_at is not None and req.first_admitted_at == req.admitted_at
    assert req.queued_at <= req.admitted_at <= req.started_at


def test_a_restart_clears_both(world: World) -> None:
    req = submit(world, "carol", "training", 1, duration_hours=1)
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    workload_services.request_stop(actor=Actor(user=world.cast.carol), request=req)
    req.refresh_from_db()
    assert req.state == S.STOPPED and req.first_admitted_at is not None
    req = workload_services.request_restart(actor=Actor(user=world.cast.carol), request=req)
    req.refresh_from_db()
    assert req.state == S.APPROVED and req.admitted_at is None and req.first_admitted_at is None


def test_what_counts_as_admitted() -> None:
    from workloads.status import admitted_seen

    def wl(**conds: str) -> dict[str, Any]:
        return {"workload/w": {"c": {k: [v, "", ""] for k, v in conds.items()}}}

    assert admitted_seen(wl(Admitted="True"))
    assert not admitted_seen(wl(Admitted="False"))
    assert not admitted_seen(wl(Admitted="True", Finished="True"))
    assert not admitted_seen(wl(Admitted="True", Evicted="True"))  # evicted, its pods still stopping
    assert admitted_seen(wl(Admitted="True", Evicted="False"))  # admitted again after a preemption
    assert admitted_seen({"vcjob": {"phase": "Running"}}) and not admitted_seen({"vcjob": {"phase": "Pending"}})
    assert not admitted_seen({})

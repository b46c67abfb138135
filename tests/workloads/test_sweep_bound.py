"""Recovery after a killed worker is bounded (docs/operations.md, "Recovery bounds"): an approved request whose
claim holder died (``claimed_at`` stamped, then nothing) is queued again by the sweep once the claim lapses
(``materialize.CLAIM_LEASE``), and beat sends the sweep often enough that the whole wait stays under 45 s; a claim
a live run holds is left alone. The sweep task and the materializer run for real against the sandbox cluster."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from workloads import hooks, materialize
from workloads.models import RequestState, WorkloadRequest
from workloads.tasks import request_materialize_task, requests_sweep_approved_task

from .test_lifecycle import World, _world

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]
BOUND = 45  # seconds from a worker's death to its claimed requests being queued again


def test_the_claim_lease_and_the_sweep_period_bound_the_recovery() -> None:
    sweep = django_settings.CELERY_BEAT_SCHEDULE["workloads-requests-sweep-approved"]
    assert sweep["task"] == "workloads.tasks.requests_sweep_approved_task"
    assert materialize.CLAIM_LEASE.total_seconds() + float(sweep["schedule"]) <= BOUND - 5


@pytest.fixture
def world(fresh_sandbox, cast, monkeypatch) -> World:
    # No Celery message on approval: the only way back is the sweep.
    monkeypatch.setattr(hooks, "request_approved", lambda request_id: None)
    return _world(fresh_sandbox, cast, architecture="B")


def test_an_approved_request_whose_claim_holder_died_is_picked_up_within_the_bound(world: World) -> None:
    dead, live = (world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1) for _ in range(2))
    # A worker claimed both and was killed before applying anything (its claim stays); another run holds `live` now.
    died = timezone.now() - materialize.CLAIM_LEASE - timedelta(seconds=1)
    WorkloadRequest.objects.filter(pk=dead.pk).update(claimed_at=died, approved_at=died)
    WorkloadRequest.objects.filter(pk=live.pk).update(claimed_at=timezone.now(), approved_at=died)

    started = time.monotonic()
    assert materialize.requests_sweep_approved() == [dead.pk]  # the live claim is not touched
    assert requests_sweep_approved_task.apply().get() == {"requeued": 1}  # one run queued for what was lost
    out = request_materialize_task.apply(args=[dead.pk]).get()  # that run, as the worker takes it
    assert out["queued"] == 1
    dead.refresh_from_db()
    live.refresh_from_db()
    assert dead.state == S.QUEUED and world.objects(dead) == {"batch/v1/Job": 1}
    assert live.state == S.APPROVED and world.objects(live) == {}
    assert time.monotonic() - started < BOUND

    # A claim younger than the lease is a live run's: the sweep leaves it, and picks it up once it lapses.
    assert requests_sweep_approved_task.apply().get() == {"requeued": 0}
    WorkloadRequest.objects.filter(pk=live.pk).update(claimed_at=died)
    assert materialize.requests_sweep_approved() == [live.pk]
    assert requests_sweep_approved_task.apply().get() == {"requeued": 1}

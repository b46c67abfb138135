"""The status follower is active once per cluster: a lease (``workloads.status.follow_lease``) held by another
follower keeps this one off the cluster, and when that holder dies (stops renewing) the next cycle takes over
within the lease's TTL (the sandbox cluster, the beat task and ``manage.py follow_cluster``)."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command

from portal.leases import Lease
from workloads.materialize import request_materialize
from workloads.models import RequestState
from workloads.status import follow_lease
from workloads.tasks import requests_sync_task

from .test_lifecycle import World, _world

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]


@pytest.fixture
def world(fresh_sandbox, cast) -> World:
    return _world(fresh_sandbox, cast, architecture="B")


def test_a_live_holder_keeps_other_followers_off_and_a_dead_one_is_replaced_within_the_ttl(world: World, settings) -> None:
    settings.PORTAL_FOLLOW_LEASE_SECONDS = 30
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    assert request_materialize(request_id=req.pk) == "queued"
    # The Job's pod runs in the cluster: first the cluster settles (Kueue admits, the pod is made and bound now), then
    # time passes its start delay. Advancing at once could bind the pod only after the clock moved, left Pending.
    world.sandbox.settle()
    world.sandbox.advance(30)

    # Another replica's follower holds the cluster (it dies in 2 s: its lease is not renewed after that).
    other = Lease(follow_lease(world.cluster).key.removeprefix("portal:lease:"), 2, token="other-host:4242:abcd")
    assert other.hold()
    assert "sandbox-b" not in requests_sync_task.apply().get()  # the beat task stays off the cluster
    call_command("follow_cluster", "--once", "--watch", "1")  # so does the long-running follower
    req.refresh_from_db()
    assert req.state == S.QUEUED
    assert follow_lease(world.cluster).holder() == "other-host:4242:abcd"

    died = time.monotonic()
    deadline = died + 15
    while "sandbox-b" not in requests_sync_task.apply().get():
        assert time.monotonic() < deadline, "no follower took over"
        time.sleep(0.5)
    assert time.monotonic() - died <= 2 + 5  # the TTL, plus a cycle
    req.refresh_from_db()
    assert req.state == S.RUNNING, (req.state, req.cluster_status)
    assert follow_lease(world.cluster).holder() is None  # a task's cycle hands the lease back


def test_follow_cluster_keeps_the_lease_and_hands_it_back(world: World) -> None:
    call_command("follow_cluster", "--once", "--watch", "1")
    assert follow_lease(world.cluster).holder() is None  # released on exit
    mine = follow_lease(world.cluster)
    assert mine.hold() and mine.hold()  # taken, then renewed by its holder
    assert not follow_lease(world.cluster).hold()  # anyone else waits
    mine.release()
    assert follow_lease(world.cluster).hold()

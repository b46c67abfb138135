"""``insights.measured_take`` end to end against the sandbox: requests run on the sandbox cluster with the usage
profiles of its DCGM exporter (``light`` for training, ``idle`` for notebooks, by the profile's ``usage.byKind``);
the beat task queries the sandbox's Prometheus API and writes one MeasuredSample per request and slot with the
profile's figures; a second run in the same slot writes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from insights.measured import SLOT_SECONDS, measured_take, slot_end
from insights.models import MeasuredDay, MeasuredSample
from workloads.models import RequestState

from ..workloads.test_lifecycle import World, _world
from .test_admitted_at import run, submit

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]


@pytest.fixture
def world(fresh_sandbox, cast, settings) -> World:
    fresh_sandbox.clock.speed = 0
    fresh_sandbox.dcgm.by_kind.update(training="light", notebook="idle")
    settings.PROMETHEUS_URL = f"{fresh_sandbox.http_url}/prometheus"
    return _world(fresh_sandbox, cast, architecture="B")


def test_the_beat_task_writes_the_profiles_figures(world: World) -> None:
    train = submit(world, "carol", "training", 1, duration_hours=2)
    book = submit(world, "carol", "notebook", 1, duration_hours=2)
    train = run(world, train, lambda r: r.state == S.RUNNING, advance=5)
    book = run(world, book, lambda r: r.state == S.RUNNING, advance=5)
    world.sandbox.advance(SLOT_SECONDS)  # five minutes of scrapes

    now = timezone.now()
    slot_day = slot_end(now).date()  # a day already rolled up (a replayed slot): the writer marks it dirty
    MeasuredDay.objects.create(day=slot_day, computed_at=now, idle_percent=5.0)
    first = measured_take(now)
    assert (first["requests"], first["written"]) == (2, 2)
    assert MeasuredDay.objects.get(day=slot_day).dirty
    got = {s.request_id: s for s in MeasuredSample.objects.all()}
    assert set(got) == {train.pk, book.pk}
    light, idle = got[train.pk], got[book.pk]
    # light: 30-50 % busy, SM active 10-14 %, ~9.1 GiB of the H100's memory; idle: ~0 %, 1.2 GiB
    assert 30 <= light.util_avg <= 50 and 0.10 <= light.sm_active_avg <= 0.14
    assert 8718 <= light.fb_used_max <= 9318 and light.xid == 0
    assert light.gpus == 1 and light.memory_mib == train.flavor.gpu_memory_mib and light.seconds == SLOT_SECONDS
    assert idle.util_avg <= 3 and idle.fb_used_max == 1230 and idle.xid == 0
    assert (light.tenant_id, light.project_id, light.cluster_id) == (train.tenant_id, train.project_id, world.cluster.pk)

    assert measured_take(now)["written"] == 0  # the same slot again: nothing twice
    nxt = measured_take(now + timedelta(seconds=SLOT_SECONDS))
    assert nxt["written"] == 2, nxt  # the next slot
    assert MeasuredSample.objects.count() == 4

"""Idle detection by measured GPU use (insights/idle.py) on constructed MeasuredSample histories: flagged after 30
minutes below the threshold (5 %, or the template's own), once per idle episode (one timeline entry, one notice);
not flagged while it rises; and what the project's policy lets stop: a notebook is culled only where the project culls
by measured GPU use, a training job is flagged but kept running unless the project stops idle batch jobs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from insights.idle import idle_detect
from insights.measured import device_memory_mib
from insights.models import MeasuredSample
from tenants.models import Project
from workloads.models import RequestState, ServiceTemplate, WorkloadRequest

from ..insights.test_admitted_at import run, submit
from ..workloads.factories import make_request
from ..workloads.test_lifecycle import World, _world

S = RequestState
SLOT = timedelta(minutes=5)


def history(req: Any, utils: list[float], *, now: Any) -> None:
    """One sample per 5 minutes, the last ending at ``now``: ``utils`` oldest first."""
    n = len(utils)
    MeasuredSample.objects.bulk_create([MeasuredSample(
        at=now - (n - 1 - i) * SLOT, request_id=req.pk, cluster_id=req.cluster_id, tenant_id=req.tenant_id,
        project_id=req.project_id, flavor_id=req.flavor_id, seconds=300, gpus=req.gpus,
        memory_mib=device_memory_mib(req.flavor) or 81920, util_avg=u, sm_active_avg=0.01, fb_used_max=1000.0)
        for i, u in enumerate(utils)])


def idle_events(req: Any) -> list[str]:
    return list(req.events.filter(message__startswith="Idle:").values_list("message", flat=True))


@pytest.mark.django_db
def test_flagged_after_30_minutes_below_5_percent_once_per_episode(cast, cat, as_user) -> None:
    now = timezone.now()
    idle = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    short = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    rising = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    history(idle, [2, 1, 0, 3, 4, 2], now=now)  # 6 slots: 30 minutes below 5 %
    history(short, [0, 0, 0, 0, 0], now=now)  # 25 minutes: not yet
    history(rising, [0, 0, 0, 0, 0, 40], now=now)  # rose in the last slot
    assert idle_detect(now) == {"flagged": 1, "cleared": 0, "stopped": 0}
    idle.refresh_from_db()
    assert idle.measured_idle_since == now - 6 * SLOT and idle.state == S.RUNNING
    assert idle_events(idle) == [f"Idle: its GPUs were measured below 5 % utilisation for 30 minutes (since "
                                 f"{idle.measured_idle_since:%Y-%m-%d %H:%M} UTC)."]
    assert [m.to for m in mail.outbox] == [["carol@example.com"]] and "is idle" in mail.outbox[0].subject
    assert "keeps it running" in mail.outbox[0].body  # training, and the project does not stop idle batch jobs
    for r in (short, rising):
        r.refresh_from_db()
        assert r.measured_idle_since is None and idle_events(r) == []

    # the same episode seen again: nothing more
    assert idle_detect(now + timedelta(minutes=1))["flagged"] == 0
    assert len(idle_events(idle)) == 1 and len(mail.outbox) == 1
    page = as_user("carol").get(f"/requests/{idle.pk}/").content.decode()
    assert "idle GPUs since" in page
    assert "idle GPUs since" not in as_user("carol").get(f"/requests/{rising.pk}/").content.decode()

    # it rises: the episode ends; idle for 30 minutes again: a new episode, flagged and told again
    history(idle, [55], now=now + SLOT)
    assert idle_detect(now + SLOT)["cleared"] == 1
    idle.refresh_from_db()
    assert idle.measured_idle_since is None
    later = now + 8 * SLOT
    history(idle, [1, 1, 1, 1, 1, 1], now=later)
    assert idle_detect(later)["flagged"] == 1
    assert len(idle_events(idle)) == 2 and len(mail.outbox) == 2


@pytest.mark.django_db
def test_the_templates_threshold_wins_over_the_setting(cast, cat, settings) -> None:
    now = timezone.now()
    ServiceTemplate.objects.filter(pk=cat.training.pk).update(idle_gpu_percent=20)
    req = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    history(req, [12] * 6, now=now)  # busy by the 5 % default, idle by the template's 20 %
    assert idle_detect(now)["flagged"] == 1
    assert "below 20 %" in idle_events(req)[0]
    ServiceTemplate.objects.filter(pk=cat.training.pk).update(idle_gpu_percent=None)
    settings.MEASURED_IDLE_PERCENT = 5.0
    other = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    history(other, [12] * 6, now=now)
    assert idle_detect(now)["flagged"] == 0


@pytest.fixture
def world(fresh_sandbox, cast) -> World:
    fresh_sandbox.clock.speed = 0
    return _world(fresh_sandbox, cast, architecture="B")


@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("lifecycle")
@pytest.mark.timeout(240)
def test_only_the_projects_policy_stops_idle_notebooks_and_batch_jobs(world: World) -> None:
    book = submit(world, "carol", "notebook", 1, duration_hours=4)
    train = submit(world, "carol", "training", 1, duration_hours=4)
    book = run(world, book, lambda r: r.state == S.RUNNING, advance=5)
    train = run(world, train, lambda r: r.state == S.RUNNING, advance=5)
    now = timezone.now()
    history(book, [0] * 6, now=now)
    history(train, [1] * 6, now=now)

    # no policy: both flagged, neither stopped
    assert idle_detect(now) == {"flagged": 2, "cleared": 0, "stopped": 0}
    for r in (book, train):
        r.refresh_from_db()
        assert r.state == S.RUNNING and r.measured_idle_since is not None

    # the project culls idle notebooks by measured GPU use: the notebook goes, the training job stays
    Project.objects.filter(pk=world.cast.vision.pk).update(cull_idle_notebooks_by_gpu=True)
    assert idle_detect(now)["stopped"] == 1
    book.refresh_from_db()
    train.refresh_from_db()
    assert book.state == S.STOPPED and "measured below 5 %" in book.state_reason and "idle notebooks" in book.state_reason
    assert train.state == S.RUNNING
    assert not [p for p in world.sandbox.store.list("v1", "Pod")["items"]
                if p["metadata"].get("labels", {}).get("gpuportal.dev/request") == str(book.pk)
                and not p["metadata"].get("deletionTimestamp")]

    # the project stops idle batch jobs too: now the training job is stopped
    Project.objects.filter(pk=world.cast.vision.pk).update(stop_idle_batch_jobs=True)
    assert idle_detect(now)["stopped"] == 1
    train.refresh_from_db()
    assert train.state == S.STOPPED and "idle batch jobs" in train.state_reason
    assert WorkloadRequest.objects.filter(state=S.RUNNING).count() == 0

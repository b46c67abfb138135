"""The ``measured`` rollup (insights/measured_rollup.py): on a constructed history of the last days, every measured
metric, breakdown, bucket and period gives exactly the same answer from the rollup as from the samples alone; a
sample written on a rolled-up day is read from the samples once marked and rolled up again by the refresh; a change
of the idle threshold is never answered from days rolled up under the old one; and the pages stay scoped per tenant."""

from __future__ import annotations

import io
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from insights import measured, measured_rollup
from insights.measured import MEASURED_GROUPS
from insights.models import MeasuredDay, MeasuredRollup, MeasuredSample
from insights.registry import METRICS, Query
from portal import rollups
from portal.celery import rollups_refresh
from tenants.access import scope_of
from workloads.models import RequestState

from ..workloads.factories import make_request

KEYS = ("measured-utilisation", "idle-gpu-hours", "memory-headroom")
DAYS = 6  # of history, up to now
STEP = timedelta(minutes=20)  # a sample every 20 minutes: one at every 00:00


def _today() -> datetime:
    return timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def history(cast, cat) -> dict[str, Any]:
    """Three requests of two tenants on two flavors, sampled from ``DAYS`` days ago until now, with utilisations
    around the idle threshold (5 %, 4.99 %), figures with many decimals and several devices.

    The tests compare periods counted from today's 00:00 UTC with what was rolled up of whole days before it: a test
    that began just before midnight would end on another day. Less than two minutes before midnight, it waits."""
    left = (_today() + timedelta(days=1) - timezone.now()).total_seconds()
    if left < 120:
        time.sleep(left + 1)
    reqs = [make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING, gpus=2),
            make_request(cat, cast.nlp, cast.alice, state=RequestState.RUNNING, gpus=1, flavor=cat.mig),
            make_request(cat, cast.llm, cast.frank, state=RequestState.RUNNING, gpus=3)]
    first, now = _today() - timedelta(days=DAYS), timezone.now()
    rows, i, at = [], 0, first
    while at <= now:
        for n, req in enumerate(reqs):
            i += 1
            util = (5.0, 4.99, 0.0, 100.0, 100 / 3, 37.25, 62.123456789)[(i + n) % 7]
            rows.append(MeasuredSample(
                at=at, request=req, cluster_id=req.cluster_id, tenant_id=req.tenant_id, project_id=req.project_id,
                flavor_id=req.flavor_id, seconds=300, gpus=req.gpus, memory_mib=(81559, 10240, 81559)[n],
                util_avg=util, sm_active_avg=util / 110, fb_used_max=(i * 7919 % 10000) / 3, xid=0))
        at += STEP
    MeasuredSample.objects.bulk_create(rows)
    return {"first": first, "reqs": reqs}


def _queries(cast: Any, who: str) -> list[Query]:
    today = _today()
    periods = [(today - timedelta(days=DAYS), today + timedelta(days=1)),  # whole days, as the pages ask
               (today - timedelta(days=4), today - timedelta(days=1)),  # ends at a rolled-up day's 00:00
               (today - timedelta(days=5, hours=-7, minutes=-13), today - timedelta(hours=30))]  # partial days
    scope = scope_of(cast.actor(who))
    return [Query(scope=scope, start=a, end=b, group_by=g, bucket=size) for a, b in periods
            for g in MEASURED_GROUPS for size in ("day", "week", "hour")]


def _answers(cast: Any, who: str) -> dict[tuple[Any, ...], Any]:
    return {(key, q.start, q.end, q.group_by, q.bucket): (r.rows, r.points)
            for q in _queries(cast, who) for key in KEYS for r in [METRICS[key].compute(q)]}


def _from_samples(compute: Any) -> Any:
    """``compute()`` with no day rolled up: from the samples alone (the rollup is left as it was)."""
    with transaction.atomic():
        MeasuredDay.objects.all().delete()
        out = compute()
        transaction.set_rollback(True)
    return out


def _backfill(since: datetime) -> None:
    call_command("rollups", "backfill", since=since.date().isoformat(), only=["measured"], stdout=io.StringIO())


@pytest.mark.parametrize("who", ["ops", "alice", "carol"])
def test_every_breakdown_is_the_same_from_the_rollup_as_from_the_samples(cast, history, who) -> None:
    raw = _answers(cast, who)
    _backfill(history["first"])
    assert MeasuredDay.objects.count() == DAYS and MeasuredRollup.objects.filter(at_start=True).exists()
    assert _answers(cast, who) == raw
    # the rollup is what is read: rows of rolled-up days deleted without a mark leave the daily figures as they were
    gone = _today() - timedelta(days=3)
    assert MeasuredSample.objects.filter(at__gte=gone, at__lt=gone + timedelta(days=1)).delete()[0]
    answers = _answers(cast, who)
    daily = [k for k in raw if k[4] != "hour" and k[1] <= gone < k[2] - timedelta(days=1)]
    assert daily and all(answers[k] == raw[k] for k in daily)
    hourly = [k for k in raw if k[4] == "hour" and k[1] <= gone < k[2] - timedelta(days=1) and raw[k][0]]
    assert hourly and all(answers[k] != raw[k] for k in hourly)


def test_the_figures_are_the_definition(cast, history) -> None:
    """Utilisation, idle share and headroom per tenant over whole days, from the samples by their definition."""
    _backfill(history["first"])
    start, end = _today() - timedelta(days=5), _today()
    q = Query(scope=scope_of(cast.actor("ops")), start=start, end=end, group_by="tenant", bucket="day")
    got = {name: {r.group: r.values for r in METRICS[name].compute(q).rows} for name in KEYS}
    for slug in ("acme", "globex"):
        s = [x for x in MeasuredSample.objects.filter(at__gt=start, at__lte=end, tenant__slug=slug)]
        w = [x.gpus * x.seconds for x in s]
        assert got["measured-utilisation"][slug]["measured_utilisation"] == pytest.approx(
            sum(x.util_avg * n for x, n in zip(s, w, strict=True)) / sum(w), abs=0.006)
        idle = sum(n for x, n in zip(s, w, strict=True) if x.util_avg < measured.idle_percent())
        assert got["idle-gpu-hours"][slug]["measured_idle_gpu_hours"] == pytest.approx(idle / 3600, abs=0.001)
        headroom = 100 * (1 - sum(x.fb_used_max * n for x, n in zip(s, w, strict=True))
                          / sum(x.memory_mib * n for x, n in zip(s, w, strict=True)))
        assert got["memory-headroom"][slug]["measured_memory_headroom"] == pytest.approx(headroom, abs=0.006)


def test_a_sample_on_a_rolled_up_day_is_read_once_marked_and_rolled_up_again(cast, history) -> None:
    _backfill(history["first"])
    day = (_today() - timedelta(days=2)).date()
    at = datetime(day.year, day.month, day.day, 13, 2, tzinfo=UTC)
    before = MeasuredDay.objects.get(day=day).samples
    req = history["reqs"][0]
    MeasuredSample.objects.create(at=at, request=req, cluster_id=req.cluster_id, tenant_id=req.tenant_id,
                                  project_id=req.project_id, flavor_id=req.flavor_id, seconds=300, gpus=40,
                                  memory_mib=81559, util_avg=1.0, sm_active_avg=0.0, fb_used_max=10.0)
    stale = _answers(cast, "ops")
    truth = _from_samples(lambda: _answers(cast, "ops"))
    assert stale != truth  # unmarked, the rolled-up day still answers
    assert rollups.mark("measured", at) == 2  # the day and the day after (the writers' marker)
    assert _answers(cast, "ops") == truth
    out = rollups_refresh.apply().get()["measured"]
    assert "error" not in out and out["days"] >= 2
    assert not MeasuredDay.objects.filter(dirty=True).exists()
    assert MeasuredDay.objects.get(day=day).samples == before + 1
    assert _answers(cast, "ops") == truth


def test_the_refresh_finds_samples_written_late_without_a_mark(cast, history) -> None:
    _backfill(history["first"])
    day = (_today() - timedelta(days=4)).date()
    MeasuredSample.objects.filter(at__gt=datetime(day.year, day.month, day.day, 5, tzinfo=UTC),
                                  at__lt=datetime(day.year, day.month, day.day, 6, tzinfo=UTC)).delete()
    assert measured_rollup.changed_days(_today().date()) == {day}
    measured_rollup.measured_refresh()
    assert measured_rollup.changed_days(_today().date()) == set()
    assert _answers(cast, "alice") == _from_samples(lambda: _answers(cast, "alice"))


def test_another_idle_threshold_is_not_read_from_days_rolled_up_under_the_old_one(cast, history, settings) -> None:
    _backfill(history["first"])
    settings.MEASURED_IDLE_PERCENT = 40.0
    q = Query(scope=scope_of(cast.actor("ops")), start=_today() - timedelta(days=DAYS), end=_today(),
              group_by="project")
    assert measured_rollup.plan(q.start, q.end, q.bucket, 40.0).days == []
    idle = METRICS["idle-gpu-hours"].compute(q)
    assert idle.rows == _from_samples(lambda: METRICS["idle-gpu-hours"].compute(q)).rows
    assert idle.rows[0].values["measured_idle_share"] > 40  # most slots are under 40 %
    measured_rollup.measured_refresh()
    assert set(MeasuredDay.objects.values_list("idle_percent", flat=True)) == {40.0}
    assert len(measured_rollup.plan(q.start, q.end, q.bucket, 40.0).days) == DAYS
    assert METRICS["idle-gpu-hours"].compute(q).rows == idle.rows


def test_the_plan_splits_a_period_into_day_parts_and_raw_pieces(db) -> None:
    d = [date(2026, 11, 2) + timedelta(days=i) for i in range(4)]
    for day in d:
        MeasuredDay.objects.create(day=day, computed_at=timezone.now(), idle_percent=5.0)
    midnight = [datetime(x.year, x.month, x.day, tzinfo=UTC) for x in d]
    # (Nov 2 00:00, Nov 5 00:00]: the rest of Nov 2, 3 and 4, the 00:00 of Nov 3, 4 and 5 (not Nov 2's)
    parts = measured_rollup.plan(midnight[0], midnight[3], "day", 5.0)
    assert (parts.days, parts.starts, parts.raw) == (d[:3], d[1:4], [])
    # Nov 5 not rolled up: its 00:00 from the samples
    MeasuredDay.objects.filter(day=d[3]).delete()
    parts = measured_rollup.plan(midnight[0], midnight[3], "day", 5.0)
    assert (parts.days, parts.starts) == (d[:3], d[1:3])
    assert parts.raw == [(midnight[3], True, midnight[3], True)]
    # (Nov 2 10:00, Nov 4 12:00]: Nov 3 whole and Nov 4's 00:00 from the rollup
    a, b = midnight[0] + timedelta(hours=10), midnight[2] + timedelta(hours=12)
    parts = measured_rollup.plan(a, b, "week", 5.0)
    assert (parts.days, parts.starts) == ([d[1]], [d[1], d[2]])
    assert parts.raw == [(a, False, midnight[1], False), (midnight[2], False, b, True)]
    # by hour, or a dirty day: from the samples; an empty period reads nothing
    assert measured_rollup.plan(a, b, "hour", 5.0).raw == [(a, False, b, True)]
    assert measured_rollup.plan(a, a, "day", 5.0) == ([], [], [])
    MeasuredDay.objects.filter(day=d[1]).update(dirty=True)
    assert measured_rollup.plan(a, b, "day", 5.0) == ([], [d[2]], [(a, False, midnight[2], False),
                                                                    (midnight[2], False, b, True)])


def test_the_pages_are_scoped_per_tenant_with_the_rollup(cast, history, client) -> None:
    _backfill(history["first"])
    first = history["first"].date()
    period = f"?group_by=project&start={first}&end={_today().date()}"
    client.force_login(cast.alice)
    for key in KEYS:
        page = client.get(f"/tenants/acme/metrics/{key}/{period}")
        assert page.status_code == 200
        assert {r.group for r in page.context["result"].rows} == {"acme-vision", "acme-nlp"}
        assert page.context["result"].rows == _from_samples(lambda k=key: client.get(
            f"/tenants/acme/metrics/{k}/{period}").context["result"].rows)
        assert "globex-llm" not in page.content.decode()
        assert client.get(f"/tenants/globex/metrics/{key}/{period}").status_code in (403, 404)
    client.force_login(cast.erin)
    page = client.get(f"/tenants/globex/metrics/measured-utilisation/{period}")
    assert {r.group for r in page.context["result"].rows} == {"globex-llm"}
    client.force_login(cast.ops)
    page = client.get(f"/ops/metrics/measured-utilisation/{period}")
    assert {r.group for r in page.context["result"].rows} == {"acme-vision", "acme-nlp", "globex-llm"}



def test_the_demo_seeders_samples_mark_the_days_they_fall_on(cast, cat) -> None:
    """The demo's COPY of measured samples (``seed_demo``) marks rolled-up days from its first sample on."""
    from insights.demo import _seed_measured

    today = _today()
    for i in range(1, 5):
        MeasuredDay.objects.create(day=(today - timedelta(days=i)).date(), computed_at=timezone.now(), idle_percent=5.0)
    start = today - timedelta(days=3, hours=-2)
    make_request(cat, cast.vision, cast.carol, state=RequestState.SUCCEEDED, seeded=True, started_at=start,
                 finished_at=start + timedelta(hours=2))
    assert _seed_measured(timezone.now()) == 24
    assert sorted(MeasuredDay.objects.filter(dirty=True).values_list("day", flat=True)) == [
        (today - timedelta(days=i)).date() for i in (3, 2, 1)]

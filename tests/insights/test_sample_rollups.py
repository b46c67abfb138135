"""The hourly and daily sample rollups (insights/sample_rollups.py): every sample metric gives the same rows and points
from the daily rollup, the hourly rollup and the samples, for every breakdown and bucket and for each audience; the
refresh is idempotent, picks up late samples and rebuilds the days of the hours it rebuilds; the backfill command
and the beat task."""

from __future__ import annotations

import io
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from insights import sample_rollups
from insights.samples import fill_lent
from insights.models import (PoolSample, PoolSampleDay, PoolSampleHour, QueueSample, QueueSampleDay, QueueSampleHour,
                             SampleDay, SampleHour)
from insights.registry import METRICS, Query
from insights.samples import samples_take
from portal.celery import rollups_refresh as rollups_refresh_task
from tenants.access import scope_of

SLOT = timedelta(minutes=5)
HOURS = 30
SAMPLE_METRICS = ("pending-now", "quota-fulfilment", "guarantee-violations", "borrowing", "overcommit",
                  "gpu-allocation", "idle-allocated", "mig-fragmentation")


ANCHOR: list[datetime] = []


@pytest.fixture(autouse=True)
def anchor() -> None:
    """The history's first hour, fixed for the test (so an hour turning meanwhile moves nothing)."""
    ANCHOR[:] = [sample_rollups.hour_of(timezone.now()) - timedelta(hours=HOURS)]


def first_hour() -> datetime:
    return ANCHOR[0]


def period(cast: Any, who: str, **kwargs: Any) -> Query:
    kwargs.setdefault("start", first_hour() + timedelta(minutes=17))  # a partial first hour
    kwargs.setdefault("end", timezone.now() + timedelta(hours=1))  # the current hour, open
    return Query(scope=scope_of(cast.actor(who)), **kwargs)


def computed(key: str, query: Query) -> tuple[Any, Any, str]:
    result = METRICS[key].compute(query)
    return ([(r.group, r.group_id, r.values) for r in result.rows], [(p.at, p.series, p.value) for p in result.points],
            result.note)


def crossing_run(at: datetime) -> bool:
    """acme-vision on h100 violates its guarantee from 10 minutes before an hour to 10 minutes after it."""
    boundary = first_hour() + timedelta(hours=5)
    return boundary - 2 * SLOT <= at < boundary + 2 * SLOT


@pytest.fixture
def history(cast, cat) -> None:
    build_history(cast, cat)


def build_history(cast: Any, cat: Any) -> None:
    """Samples every 5 minutes from HOURS hours ago to now, a few slots missing: acme-vision (h100 and MIG slices),
    acme-nlp (never waits: fulfilment not defined), globex-llm; pools h100 and MIG. Shares like 3/7 that floats
    cannot hold exactly, runs of violations of every length, one crossing an hour."""
    rng = random.Random(5)
    queues = [(cast.vision, cat.h100, 8), (cast.vision, cat.mig, 4), (cast.nlp, cat.h100, 2), (cast.llm, cat.h100, 7)]
    queue_rows, pool_rows = [], []
    at, now = first_hour(), timezone.now()
    while at <= now:
        for project, flavor, nominal in queues:
            quiet = first_hour() + timedelta(hours=4) <= at < first_hour() + timedelta(hours=6)
            if rng.random() < 0.04 and not (quiet and project == cast.vision):
                continue  # the sampler missed this queue's slot
            count = 0 if project == cast.nlp else rng.choice([0, 0, 1, 2])
            admitted = rng.randrange(0, nominal + 3)
            smallest = rng.choice([1, 2, 5]) if count else 0
            if project == cast.vision and flavor == cat.h100:
                if crossing_run(at):
                    count, admitted, smallest = 1, 3, 1
                elif quiet:
                    count = 0  # nothing else around the crossing run
            queue_rows.append(QueueSample(
                at=at, cluster=cat.cluster, tenant=project.tenant, project=project, flavor=flavor,
                nominal=Decimal(nominal), admitted=Decimal(admitted), borrowed=Decimal(max(0, admitted - nominal)),
                pending=Decimal(count * 2), pending_count=count, pending_smallest=Decimal(smallest)))
        for flavor, capacity in ((cat.h100, 16), (cat.mig, 7)):
            if rng.random() < 0.04:
                continue
            cap = 0 if rng.random() < 0.05 else capacity
            pending = rng.randrange(0, 5)
            pool_rows.append(PoolSample(
                at=at, cluster=cat.cluster, flavor=flavor, capacity=Decimal(cap), allocated=Decimal(rng.randrange(0, 18)),
                idle_allocated=Decimal(rng.randrange(0, 3)), pending=Decimal(pending),
                shape_mismatch=Decimal(rng.randrange(0, pending + 1)) if flavor == cat.mig else Decimal(0),
                promised=Decimal(rng.randrange(10, 23)), overcommit_percent=rng.choice([0, 25])))
        at += SLOT
    QueueSample.objects.bulk_create(queue_rows)
    PoolSample.objects.bulk_create(pool_rows)
    assert fill_lent(first_hour(), now)  # as the sampler does with each slot: acme-nlp lends what vision borrows


def every_answer(cast: Any) -> dict[tuple[str, ...], Any]:
    out = {}
    for key in SAMPLE_METRICS:
        for who in ("ops", "alice", "erin"):
            for group_by in METRICS[key].groups:
                for size in ("hour", "day", "week"):
                    out[(key, who, group_by, size)] = computed(key, period(cast, who, group_by=group_by, bucket=size))
    return out


def test_every_sample_metric_is_the_same_from_the_rollup(cast, cat, history) -> None:
    raw = every_answer(cast)
    assert sample_rollups.split(period(cast, "ops").start, period(cast, "ops").end)[0] == []
    done = sample_rollups.backfill(first_hour() - timedelta(hours=3))
    assert done["hours"] == HOURS + 3 and done["rows"] > 0
    rolled, live = sample_rollups.split(period(cast, "ops").start, period(cast, "ops").end)
    assert rolled == [(first_hour() + timedelta(hours=1), sample_rollups.hour_of(timezone.now()))]
    assert len(live) == 2  # the partial first hour and the current one
    assert every_answer(cast) == raw
    # It is the rollup that answers: the rolled hours' samples are gone and nothing changes.
    QueueSample.objects.filter(at__gte=rolled[0][0], at__lt=rolled[0][1]).delete()
    PoolSample.objects.filter(at__gte=rolled[0][0], at__lt=rolled[0][1]).delete()
    assert every_answer(cast) == raw
    # Something to compare: rows and points for everyone, defined and undefined fulfilment.
    for key in SAMPLE_METRICS:  # pending-now's table is what waits now (nothing): its chart is the history
        rows, points, _ = raw[(key, "ops", METRICS[key].groups[0], "day")]
        assert points and (rows or key == "pending-now"), key
    fulfilment = dict((g, v["fulfilment"]) for g, _, v in raw[("quota-fulfilment", "ops", "project", "hour")][0])
    assert fulfilment["acme-nlp"] is None and fulfilment["acme-vision"] is not None
    assert raw[("pending-now", "ops", "tenant", "hour")][1]


def test_a_violation_run_crossing_an_hour_counts_once_from_the_rollup(cast, cat, history) -> None:
    boundary = first_hour() + timedelta(hours=5)
    query = period(cast, "ops", group_by="queue", bucket="hour", flavor_id=cat.h100.pk, project_id=cast.vision.pk,
                   start=boundary - timedelta(hours=1), end=boundary + timedelta(hours=1))
    raw = computed("guarantee-violations", query)
    sample_rollups.backfill(first_hour())
    QueueSample.objects.filter(at__gte=boundary - timedelta(hours=1), at__lt=boundary + timedelta(hours=1)).delete()
    assert computed("guarantee-violations", query) == raw
    assert raw[0][0][2] == {"violations": 1, "violation_hours": pytest.approx(20 / 60, abs=1e-3), "longest_minutes": 20}
    assert raw[1] == [(boundary - timedelta(hours=1), raw[0][0][0], 1)]  # counted in the hour it started


def test_no_pending_work_is_not_defined_from_the_rollup(cast, cat) -> None:
    start = first_hour()
    for slot in range(24):
        QueueSample.objects.create(at=start + slot * SLOT, cluster=cat.cluster, tenant=cast.vision.tenant,
                                   project=cast.vision, flavor=cat.h100, nominal=Decimal(8), admitted=Decimal(3))
    sample_rollups.backfill(start)
    query = period(cast, "ops", start=start, end=start + timedelta(hours=2))
    assert sample_rollups.split(query.start, query.end)[1] == []
    result = METRICS["quota-fulfilment"].compute(query)
    assert [r.values["fulfilment"] for r in result.rows] == [None]
    assert result.points == [] and "not defined" in result.note


def rollup_rows() -> tuple[list[Any], ...]:
    return (sorted(QueueSampleHour.objects.values_list("hour", "project_id", "flavor_id", "samples", "slots",
                                                        "pending_count", "wanting", "given_share", "borrowed",
                                                        "admitted", "violating")),
            sorted(PoolSampleHour.objects.values_list("hour", "flavor_id", "samples", "capacity", "allocated",
                                                       "idle_allocated", "pending", "shape_mismatch", "with_capacity",
                                                       "promised_share", "overcommit_percent_max", "over")),
            sorted(SampleHour.objects.values_list("hour", "queue_samples", "pool_samples", "dirty")))


def test_refresh_is_idempotent_and_picks_up_late_samples(cast, cat, history) -> None:
    first = sample_rollups.sample_rollups_refresh()
    assert first["hours"] >= HOURS  # every closed hour of the lookback was missing
    before = rollup_rows()
    again = sample_rollups.sample_rollups_refresh()
    assert again["hours"] == 2 and rollup_rows() == before  # only the last two closed hours, the same rows
    query = period(cast, "ops", group_by="project", bucket="hour")
    # A late sample in an hour rolled up long ago: its count no longer matches, the refresh recomputes that hour.
    late = first_hour() + timedelta(hours=3)
    QueueSample.objects.filter(at=late + 7 * SLOT, project=cast.llm).delete()
    QueueSample.objects.create(at=late + 7 * SLOT, cluster=cat.cluster, tenant=cast.llm.tenant, project=cast.llm,
                               flavor=cat.h100, nominal=Decimal(7), admitted=Decimal(1), borrowed=Decimal(0),
                               pending=Decimal(4), pending_count=1, pending_smallest=Decimal(4))
    QueueSample.objects.create(at=late + 8 * SLOT, cluster=cat.cluster, tenant=cast.nlp.tenant, project=cast.nlp,
                               flavor=cat.mig, nominal=Decimal(2), admitted=Decimal(2))
    assert sample_rollups.hour_of(late) in sample_rollups.changed_hours(sample_rollups.hour_of(timezone.now()))
    result = rollups_refresh_task()["samples"]  # the one beat task refreshes every rollup
    assert result["hours"] == 3
    assert SampleHour.objects.get(hour=late).queue_samples == QueueSample.objects.filter(
        at__gte=late, at__lt=late + timedelta(hours=1)).count()
    expected = {key: computed(key, query) for key in ("quota-fulfilment", "borrowing", "pending-now")}
    SampleHour.objects.all().delete()  # everything from the samples
    assert {key: computed(key, query) for key in expected} == expected


def test_a_sample_written_into_a_rolled_hour_marks_it_dirty(cast, cat) -> None:
    hour = first_hour()
    sample_rollups.backfill(hour, hour + timedelta(hours=1))
    assert SampleHour.objects.get(hour=hour).dirty is False
    samples_take(now=hour + timedelta(minutes=7))
    assert SampleHour.objects.get(hour=hour).dirty is True
    assert sample_rollups.split(hour, hour + timedelta(hours=1))[0] == []  # read from the samples meanwhile
    sample_rollups.sample_rollups_refresh()
    marker = SampleHour.objects.get(hour=hour)
    assert marker.dirty is False and marker.queue_samples == QueueSample.objects.filter(at__gte=hour).filter(
        at__lt=hour + timedelta(hours=1)).count() > 0


def test_tenants_see_only_their_own_rows_from_the_rollup(cast, cat, history) -> None:
    sample_rollups.backfill(first_hour())
    for who, tenant, projects in (("alice", "acme", {"acme-vision", "acme-nlp"}), ("erin", "globex", {"globex-llm"})):
        for key in ("quota-fulfilment", "borrowing", "pending-now", "guarantee-violations"):
            by_tenant = METRICS[key].compute(period(cast, who, group_by="tenant", bucket="week"))
            assert {r.group for r in by_tenant.rows} <= {tenant} and {p.series for p in by_tenant.points} <= {tenant}
            by_project = METRICS[key].compute(period(cast, who, group_by="project", bucket="day"))
            assert {p.series for p in by_project.points} <= projects
        for key in ("overcommit", "gpu-allocation"):
            assert METRICS[key].compute(period(cast, who, group_by="flavor")).rows == []


def test_backfill_command(cast, cat, history) -> None:
    out = io.StringIO()
    call_command("rollups", "backfill", since=first_hour().date().isoformat(), only=["samples"], stdout=out)
    assert "samples: rolled up" in out.getvalue() and " days" in out.getvalue() and "costs" not in out.getvalue()
    assert SampleHour.objects.filter(hour__gte=first_hour()).count() == HOURS
    assert QueueSampleHour.objects.exists() and PoolSampleHour.objects.exists()
    before = rollup_rows()
    call_command("rollups", "backfill", since=first_hour().date().isoformat(), only=["samples"], stdout=out)
    assert rollup_rows() == before
    with pytest.raises(CommandError):
        call_command("rollups", "backfill", since="yesterday")


def test_split_reads_only_closed_clean_hours(db) -> None:
    hour = datetime(2026, 11, 2, 10, tzinfo=UTC)
    sample_rollups.backfill(hour, hour + timedelta(hours=3))
    sample_rollups.mark_dirty([hour + timedelta(hours=1)])
    rolled, raw = sample_rollups.split(hour + timedelta(minutes=5), hour + timedelta(hours=3, minutes=5))
    assert rolled == [(hour + timedelta(hours=2), hour + timedelta(hours=3))]
    assert raw == [(hour + timedelta(minutes=5), hour + timedelta(hours=2)),
                   (hour + timedelta(hours=3), hour + timedelta(hours=3, minutes=5))]
    assert sample_rollups.runs([1, 2, 4, 6, 7, 8], 2) == [(1, 2), (6, 3)]


# ------------------------------------------------------------------------------------------------ the daily level
DAYS_BACK = 76  # hours: at least two whole UTC days, whatever the hour now


def day_answers(cast: Any, start: datetime, end: datetime) -> dict[tuple[str, ...], Any]:
    """Every sample metric, audience and breakdown by day and by week, over ``[start, end)``."""
    out = {}
    for key in SAMPLE_METRICS:
        for who in ("ops", "alice", "erin"):
            for group_by in METRICS[key].groups:
                for size in ("day", "week"):
                    query = period(cast, who, group_by=group_by, bucket=size, start=start, end=end)
                    out[(key, who, group_by, size)] = computed(key, query)
    return out


def test_every_sample_metric_is_the_same_from_the_daily_rollup(cast, cat) -> None:
    ANCHOR[:] = [sample_rollups.hour_of(timezone.now()) - timedelta(hours=DAYS_BACK)]
    build_history(cast, cat)
    now = timezone.now()
    first_day = sample_rollups.day_of(first_hour()) + timedelta(days=1)
    periods = [(first_hour() + timedelta(minutes=17), now + timedelta(hours=1)),  # mid-day to the open hour
               (first_day + timedelta(hours=13, minutes=35), sample_rollups.day_of(now)),  # mid-day to a day's end
               (first_day, first_day + timedelta(days=1))]  # one whole day
    raw = {p: day_answers(cast, *p) for p in periods}
    done = sample_rollups.backfill(first_hour())
    assert done["days"] == SampleDay.objects.count() >= 2 and QueueSampleDay.objects.exists() and PoolSampleDay.objects.exists()
    parts = sample_rollups.plan(*periods[0], "week")
    assert parts.days and parts.days[0][0] == first_day and parts.days[-1][1] == sample_rollups.day_of(now)
    assert parts.hours and len(parts.raw) == 2  # the partial days' closed hours; the partial first and open hours
    assert sample_rollups.plan(*periods[0], "hour").days == []  # hourly charts never read a day
    assert sample_rollups.plan(*periods[2], "day") == ([(first_day, first_day + timedelta(days=1))], [], [])
    assert {p: day_answers(cast, *p) for p in periods} == raw  # daily + hourly + samples
    # The hourly level alone gives the same (no day rows to read).
    days = list(SampleDay.objects.values_list("day", flat=True))
    SampleDay.objects.all().delete()
    assert sample_rollups.plan(*periods[0], "day").days == []
    assert {p: day_answers(cast, *p) for p in periods} == raw
    # It is the daily rollup that answers: the samples and hour rows of the days whole in every period that holds
    # them are gone (their markers stay), and nothing changes.
    sample_rollups.rebuild_days(days)
    whole = sample_rollups.plan(*periods[1], "day").days
    assert whole
    for a, b in whole:
        for model, field in ((QueueSample, "at"), (PoolSample, "at"), (QueueSampleHour, "hour"), (PoolSampleHour, "hour")):
            model.objects.filter(**{f"{field}__gte": a, f"{field}__lt": b}).delete()
    assert {p: day_answers(cast, *p) for p in periods} == raw
    rows, points, _ = raw[periods[0]][("pending-now", "ops", "tenant", "day")]
    assert points
    runs = raw[periods[0]][("guarantee-violations", "ops", "project", "week")]
    assert runs[0] and runs[1]


def test_a_day_is_rebuilt_from_its_hours_when_one_is(cast, cat) -> None:
    ANCHOR[:] = [sample_rollups.hour_of(timezone.now()) - timedelta(hours=DAYS_BACK)]
    build_history(cast, cat)
    day = sample_rollups.day_of(first_hour()) + timedelta(days=1)
    query = period(cast, "ops", group_by="cluster", bucket="day", start=day, end=day + timedelta(days=1))
    sample_rollups.sample_rollups_refresh()  # the lookback: every closed hour, and so every whole day
    marker = SampleDay.objects.get(day=day)
    assert marker.queue_samples == QueueSample.objects.filter(at__gte=day, at__lt=day + timedelta(days=1)).count()
    # A dirty hour takes its day off the daily level until the refresh rebuilds both.
    sample_rollups.mark_dirty([day + timedelta(hours=9)])
    assert sample_rollups.plan(query.start, query.end, "day").days == []
    sample_rollups.sample_rollups_refresh()
    assert sample_rollups.plan(query.start, query.end, "day").days == [(day, day + timedelta(days=1))]
    # An hour that is no longer rolled up takes its day off, and removes its rows on the next rebuild.
    SampleHour.objects.filter(hour=day + timedelta(hours=3)).delete()
    assert sample_rollups.plan(query.start, query.end, "day").days == []
    sample_rollups.rebuild_days([day])
    assert not SampleDay.objects.filter(day=day).exists() and not QueueSampleDay.objects.filter(day=day).exists()
    sample_rollups.sample_rollups_refresh()  # the missing hour, and its day
    assert sample_rollups.plan(query.start, query.end, "day").days == [(day, day + timedelta(days=1))]
    # A late sample: the refresh finds its hour's count changed and rebuilds the hour and the day.
    late = day + timedelta(hours=14, minutes=35)
    QueueSample.objects.filter(at=late, project=cast.nlp, flavor=cat.mig).delete()
    sample_rollups.sample_rollups_refresh()
    QueueSample.objects.create(at=late, cluster=cat.cluster, tenant=cast.nlp.tenant, project=cast.nlp, flavor=cat.mig,
                               nominal=Decimal(2), admitted=Decimal(1), pending=Decimal(3), pending_count=3,
                               pending_smallest=Decimal(1))
    result = sample_rollups.sample_rollups_refresh()
    assert result["hours"] == 3  # the last two closed hours and the late one
    assert SampleDay.objects.get(day=day).queue_samples == QueueSample.objects.filter(
        at__gte=day, at__lt=day + timedelta(days=1)).count()
    assert sample_rollups.plan(query.start, query.end, "day").days == [(day, day + timedelta(days=1))]
    daily = {key: computed(key, query) for key in SAMPLE_METRICS}
    SampleHour.objects.all().delete()  # everything from the samples
    assert {key: computed(key, query) for key in SAMPLE_METRICS} == daily


def test_day_masks_hold_the_hours_slots(cast, cat) -> None:
    day = sample_rollups.day_of(timezone.now()) - timedelta(days=2)
    for at in (day, day + timedelta(hours=1, minutes=5), day + timedelta(hours=23, minutes=55)):
        QueueSample.objects.create(at=at, cluster=cat.cluster, tenant=cast.vision.tenant, project=cast.vision,
                                   flavor=cat.h100, nominal=Decimal(8), admitted=Decimal(3), pending=Decimal(1),
                                   pending_count=1, pending_smallest=Decimal(1))
    sample_rollups.backfill(day, day + timedelta(days=1))
    row = QueueSampleDay.objects.get(day=day)
    assert len(row.slots) == 288 and [i for i, c in enumerate(row.slots) if c == "1"] == [0, 13, 287]
    assert row.slots == row.violating and row.samples == 3 and row.pending_count == 3
    assert sample_rollups.mask_of(row.slots) == 1 | 1 << 13 | 1 << 287
    assert sample_rollups.bits_of(sample_rollups.mask_of(row.slots)) == row.slots

"""Hourly rollups of the 5-minute samples for the fairness, efficiency and pending-now metrics over long periods
(docs/insights.md, "Rollups").

``QueueSampleHour`` holds, per UTC hour, tenant, project, cluster and flavor, and ``PoolSampleHour`` per UTC hour,
cluster and flavor, the sums, counts and maxima of that hour's samples that the sample metrics are made of; a
``SampleHour`` row marks an hour complete, with the number of samples it was computed from. Every figure a metric
shows is a sum, a count or a maximum over its samples (or a ratio of two), so over whole hours it is the same from
the rollup as from the samples, with two exceptions that need more than a sum, stored as 12-bit masks of the hour's
5-minute slots:

* pending-now's chart divides by the number of distinct slots the group was sampled in: the masks of the group's
  queues are OR-ed per hour and their bits counted (``slots``);
* guarantee violations are runs of consecutive violating slots of one queue, which may cross hours: the violating
  slots (``violating``) are read back as slot numbers and the runs found in Python, from the rollup and the samples
  alike.

Ratios of decimals (a queue's given share, a pool's promised / capacity) are rounded to 12 places per sample in SQL
on both paths and summed as numerics, so the sums are exact and the averages identical.

``sample_rollups_refresh`` (beat, hourly: ``portal.rollups_refresh``, the ``samples`` rollup) recomputes the last two closed hours,
every hour marked dirty, and every closed hour of the last ``LOOKBACK_DAYS`` whose sample counts differ from what it
was rolled up from (late samples) or that was never rolled up. Each range of hours is replaced whole in one
transaction. ``manage.py rollups backfill --only samples --since DAY`` backfills.

A daily level sits on the hourly one: ``QueueSampleDay`` / ``PoolSampleDay`` hold per UTC day the same sums and
maxima, built from the day's 24 hours (never from the samples), with the masks as 288-bit strings (character ``i``
is slot ``i`` of the day; ``bit(288)`` on PostgreSQL, so ``bit_or`` and ``bit_count`` work on them, text elsewhere,
OR-ed in Python). ``SampleDay`` marks a day built, with its hours' sample counts. ``refresh_range`` rebuilds the days
of every hour it rebuilds (``rebuild_days``); a day with an hour missing or dirty gets no rows.

The metrics read (``plan``): when the chart bucket is a day or a week, the closed days wholly inside the period that
are built from 24 complete, clean hours counting what the day was built from, from the daily rollup; the other
closed, complete hours wholly inside the period from the hourly rollup; the rest (the current hour, partial first
and last hours, hours not rolled up or dirty) from the samples; and add the three up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.db.models import Aggregate, Count, DecimalField, F, FloatField, Func, IntegerField, Max, Q, QuerySet, Sum
from django.db.models.functions import Cast, Least
from django.utils import timezone

from portal.rollups import in_ranges

from . import memo
from .common import bucket
from .models import (SLOTS_PER_DAY, PoolSample, PoolSampleDay, PoolSampleHour, QueueSample, QueueSampleDay,
                     QueueSampleHour, SampleDay, SampleHour, SlotMaskField)

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
SLOTS_PER_HOUR = 12
LOOKBACK_DAYS = 31
SHARE_PLACES = 12  # ratios are rounded to this many places per sample, then summed exactly


# ------------------------------------------------------------------------------------------------ expressions
class SlotBit(Func):
    """``1 << (the 5-minute slot of the hour an instant falls in, 0..11)``: a sample's bit in an hour's mask."""

    output_field = IntegerField()
    arity = 1

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        at, params = compiler.compile(self.source_expressions[0])
        return f"(1 << (EXTRACT(MINUTE FROM {at} AT TIME ZONE 'UTC')::int / 5))", params

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        at, params = compiler.compile(self.source_expressions[0])
        return f"(1 << (CAST(strftime('%%M', {at}) AS INTEGER) / 5))", params


class BitOr(Aggregate):
    """PostgreSQL's ``bit_or`` (of integers, or of bit strings with ``output_field=SlotMaskField()``)."""

    function = "BIT_OR"
    output_field = IntegerField()


class ShareOf(Func):
    """``part / whole`` rounded to ``SHARE_PLACES`` (NULL where ``whole`` is 0): a numeric on PostgreSQL, so sums of
    it are exact; a float on SQLite (the laptop demo)."""

    output_field = DecimalField(max_digits=32, decimal_places=SHARE_PLACES)
    arity = 2

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        (part, p1), (whole, p2) = (compiler.compile(e) for e in self.source_expressions)
        return f"ROUND(({part})::numeric / NULLIF({whole}, 0), {SHARE_PLACES})", [*p1, *p2]

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        (part, p1), (whole, p2) = (compiler.compile(e) for e in self.source_expressions)
        return f"ROUND(CAST({part} AS REAL) / NULLIF({whole}, 0), {SHARE_PLACES})", [*p1, *p2]


# Queue samples: waiting for admission with a nominal quota (fulfilment counts only these), the share given of the
# nominal quota, and a guarantee violation (docs/insights.md, "Fairness").
WANTING = Q(pending_count__gt=0, nominal__gt=0)
GIVEN_SHARE = ShareOf(Least("admitted", "nominal"), "nominal")
VIOLATING = Q(pending_count__gt=0, nominal__gt=0, admitted__lt=F("nominal"),
              pending_smallest__lte=F("nominal") - F("admitted"))
# Pool samples: promised / capacity (where there is capacity), and an overcommit violation.
HAS_CAPACITY = Q(capacity__gt=0)
PROMISED_SHARE = ShareOf("promised", "capacity")
_ALLOWED = Cast("capacity", FloatField()) * (1 + Cast("overcommit_percent", FloatField()) / 100)
OVER = Q(allocated__gt=F("capacity")) | Q(promised__gt=_ALLOWED)

QUEUE_SUMS = {
    "samples": Count("pk"), "slots": Sum(SlotBit("at")), "pending_count": Sum("pending_count"),
    "wanting": Count("pk", filter=WANTING), "given_share": Sum(GIVEN_SHARE, filter=WANTING),
    "borrowed": Sum("borrowed"), "admitted": Sum("admitted"), "lent": Sum("lent"), "violating": Sum(SlotBit("at"), filter=VIOLATING),
}
POOL_SUMS = {
    "samples": Count("pk"), "capacity": Sum("capacity"), "allocated": Sum("allocated"),
    "idle_allocated": Sum("idle_allocated"), "pending": Sum("pending"), "shape_mismatch": Sum("shape_mismatch"),
    "with_capacity": Count("pk", filter=HAS_CAPACITY), "promised_share": Sum(PROMISED_SHARE, filter=HAS_CAPACITY),
    "promised_share_max": Max(PROMISED_SHARE, filter=HAS_CAPACITY), "overcommit_percent_max": Max("overcommit_percent"),
    "over": Count("pk", filter=OVER),
}
QUEUE_KEYS = ("tenant_id", "project_id", "cluster_id", "flavor_id")
POOL_KEYS = ("cluster_id", "flavor_id")


# ------------------------------------------------------------------------------------------------ hours
def hour_of(at: datetime) -> datetime:
    """The start of the UTC hour ``at`` falls in."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _ceil_hour(at: datetime) -> datetime:
    start = hour_of(at)
    return start if start == at else start + HOUR


def _hours(start: datetime, end: datetime) -> Iterable[datetime]:
    at = start
    while at < end:
        yield at
        at += HOUR


def _ranges(starts: Iterable[datetime], step: timedelta = HOUR) -> list[tuple[datetime, datetime]]:
    """Sorted hours (or days, ``step``) as ranges of consecutive ones, [first, last + step)."""
    out: list[tuple[datetime, datetime]] = []
    for at in sorted(starts):
        if out and out[-1][1] == at:
            out[-1] = (out[-1][0], at + step)
        else:
            out.append((at, at + step))
    return out


def day_of(at: datetime) -> datetime:
    """The start of the UTC day ``at`` falls in."""
    return hour_of(at).replace(hour=0)


def _ceil_day(at: datetime) -> datetime:
    start = day_of(at)
    return start if start == at else start + DAY


def mask_of(bits: str) -> int:
    """A day's mask (character ``i`` is slot ``i``) as an integer (bit ``i`` is slot ``i``)."""
    return int(bits[::-1], 2) if bits else 0


def bits_of(mask: int) -> str:
    """``mask_of`` reversed: 288 characters."""
    return format(mask, f"0{SLOTS_PER_DAY}b")[::-1]


# ------------------------------------------------------------------------------------------------ refresh
def refresh_range(start: datetime, end: datetime) -> int:
    """Replace the rollup of the hours in ``[start, end)`` (whole hours) and mark them complete, in one
    transaction. Returns the rows written."""
    start, end = hour_of(start), _ceil_hour(end)
    computed_at = timezone.now()
    with transaction.atomic():
        # Aggregates are named s_<field>: a name of a column would shadow it in the filters (F("admitted")).
        queue_rows = list(QueueSample.objects.filter(at__gte=start, at__lt=end).annotate(h=bucket("at", "hour"))
                          .order_by().values("h", *QUEUE_KEYS).annotate(**{f"s_{k}": v for k, v in QUEUE_SUMS.items()}))
        pool_rows = list(PoolSample.objects.filter(at__gte=start, at__lt=end).annotate(h=bucket("at", "hour"))
                         .order_by().values("h", *POOL_KEYS).annotate(**{f"s_{k}": v for k, v in POOL_SUMS.items()}))
        counts: dict[datetime, list[int]] = {hour: [0, 0] for hour in _hours(start, end)}
        queue_objs = []
        for r in queue_rows:
            counts[r["h"]][0] += r["s_samples"]
            queue_objs.append(QueueSampleHour(hour=r["h"], **{k: r[k] for k in QUEUE_KEYS},
                                              **{k: r[f"s_{k}"] or 0 for k in QUEUE_SUMS}))
        pool_objs = []
        for r in pool_rows:
            counts[r["h"]][1] += r["s_samples"]
            pool_objs.append(PoolSampleHour(hour=r["h"], **{k: r[k] for k in POOL_KEYS},
                                            **{k: (r[f"s_{k}"] if k == "promised_share_max" else r[f"s_{k}"] or 0)
                                               for k in POOL_SUMS}))
        QueueSampleHour.objects.filter(hour__gte=start, hour__lt=end).delete()
        PoolSampleHour.objects.filter(hour__gte=start, hour__lt=end).delete()
        SampleHour.objects.filter(hour__gte=start, hour__lt=end).delete()
        QueueSampleHour.objects.bulk_create(queue_objs, batch_size=2000)
        PoolSampleHour.objects.bulk_create(pool_objs, batch_size=2000)
        SampleHour.objects.bulk_create([SampleHour(hour=hour, computed_at=computed_at, queue_samples=q, pool_samples=p)
                                        for hour, (q, p) in counts.items()], batch_size=2000)
        rebuild_days({day_of(hour) for hour in counts})
    return len(queue_objs) + len(pool_objs)


QUEUE_DAY_SUMS = ("samples", "pending_count", "wanting", "given_share", "borrowed", "admitted", "lent")
QUEUE_DAY_MASKS = ("slots", "violating")
POOL_DAY_SUMS = ("samples", "capacity", "allocated", "idle_allocated", "pending", "shape_mismatch", "with_capacity",
                 "promised_share", "over")
POOL_DAY_MAXIMA = ("promised_share_max", "overcommit_percent_max")


def rebuild_days(days: Iterable[datetime]) -> int:
    """Replace the daily rollup of these UTC days from their hours: a day whose 24 hours are all rolled up and
    clean gets its rows (the hours' sums and maxima, their 12-bit masks laid end to end into 288 bits) and a
    ``SampleDay`` marker; any other day gets none (it is read by the hour). Returns the rows written."""
    computed_at = timezone.now()
    written = 0
    with transaction.atomic():
        for day in sorted(days):
            end = day + DAY
            QueueSampleDay.objects.filter(day=day).delete()
            PoolSampleDay.objects.filter(day=day).delete()
            SampleDay.objects.filter(day=day).delete()
            markers = list(SampleHour.objects.filter(hour__gte=day, hour__lt=end)
                           .values_list("dirty", "queue_samples", "pool_samples"))
            if len(markers) != 24 or any(dirty for dirty, _, _ in markers):
                continue
            queues: dict[tuple[Any, ...], dict[str, Any]] = {}
            for r in QueueSampleHour.objects.filter(hour__gte=day, hour__lt=end).order_by().values(
                    "hour", *QUEUE_KEYS, *QUEUE_DAY_SUMS, *QUEUE_DAY_MASKS):
                into = queues.setdefault(tuple(r[k] for k in QUEUE_KEYS), {k: 0 for k in QUEUE_DAY_SUMS + QUEUE_DAY_MASKS})
                shift = SLOTS_PER_HOUR * int((r["hour"] - day) / HOUR)
                for k in QUEUE_DAY_SUMS:
                    into[k] += r[k]
                for k in QUEUE_DAY_MASKS:
                    into[k] |= r[k] << shift
            pools: dict[tuple[Any, ...], dict[str, Any]] = {}
            for r in PoolSampleHour.objects.filter(hour__gte=day, hour__lt=end).order_by().values(
                    *POOL_KEYS, *POOL_DAY_SUMS, *POOL_DAY_MAXIMA):
                key = tuple(r[k] for k in POOL_KEYS)
                if key not in pools:
                    pools[key] = {k: r[k] for k in POOL_DAY_SUMS + POOL_DAY_MAXIMA}
                    continue
                into = pools[key]
                for k in POOL_DAY_SUMS:
                    into[k] += r[k]
                for k in POOL_DAY_MAXIMA:
                    if r[k] is not None and (into[k] is None or r[k] > into[k]):
                        into[k] = r[k]
            QueueSampleDay.objects.bulk_create(
                [QueueSampleDay(day=day, **dict(zip(QUEUE_KEYS, key, strict=True)),
                                **{k: (bits_of(v) if k in QUEUE_DAY_MASKS else v) for k, v in figures.items()})
                 for key, figures in queues.items()], batch_size=2000)
            PoolSampleDay.objects.bulk_create(
                [PoolSampleDay(day=day, **dict(zip(POOL_KEYS, key, strict=True)), **figures)
                 for key, figures in pools.items()], batch_size=2000)
            SampleDay.objects.create(day=day, computed_at=computed_at, queue_samples=sum(q for _, q, _ in markers),
                                     pool_samples=sum(p for _, _, p in markers))
            written += len(queues) + len(pools)
    return written


def mark_dirty(hours: Iterable[datetime]) -> int:
    """Have the metrics read these hours from the samples, and the next refresh recompute them."""
    return SampleHour.objects.filter(hour__in=[hour_of(h) for h in hours]).update(dirty=True)


def mark_since(since: datetime) -> int:
    """Every rolled-up hour from ``since``'s hour on is dirty (``portal.rollups.mark``)."""
    return SampleHour.objects.filter(hour__gte=hour_of(since)).update(dirty=True)


def changed_hours(closed: datetime) -> set[datetime]:
    """Closed hours of the last ``LOOKBACK_DAYS`` (before ``closed``) never rolled up, or whose samples are not as
    many as when they were: samples written late, or deleted."""
    since = closed - timedelta(days=LOOKBACK_DAYS)
    done = {h: (q, p) for h, q, p in SampleHour.objects.filter(hour__gte=since, hour__lt=closed)
            .values_list("hour", "queue_samples", "pool_samples")}
    now: dict[datetime, list[int]] = defaultdict(lambda: [0, 0])
    for i, model in enumerate((QueueSample, PoolSample)):
        for hour, n in (model.objects.filter(at__gte=since, at__lt=closed).annotate(h=bucket("at", "hour"))
                        .order_by().values("h").annotate(n=Count("pk")).values_list("h", "n")):
            now[hour][i] = n
    return {hour for hour in _hours(since, closed) if tuple(now.get(hour, (0, 0))) != done.get(hour)}


def sample_rollups_refresh(now: datetime | None = None) -> dict[str, int]:
    """Recompute the last two closed hours, dirty hours, and changed or missing hours of the lookback. Idempotent."""
    closed = hour_of(now or timezone.now())
    hours = {closed - HOUR, closed - 2 * HOUR}
    hours |= set(SampleHour.objects.filter(dirty=True, hour__lt=closed).values_list("hour", flat=True))
    hours |= changed_hours(closed)
    rows = sum(refresh_range(a, b) for a, b in _ranges(hours))
    return {"hours": len(hours), "rows": rows}


def backfill(since: date | datetime, until: date | datetime | None = None) -> dict[str, int]:
    """Roll up every closed hour from ``since`` (a UTC day or an instant) to the current hour (or ``until``, a UTC
    day or an instant, excluded), a day at a time, and every whole day among them (``days``: the days rolled up)."""
    start = datetime.combine(since, time(), tzinfo=UTC) if not isinstance(since, datetime) else hour_of(since)
    if until is not None and not isinstance(until, datetime):
        until = datetime.combine(until, time(), tzinfo=UTC)
    end = min(hour_of(until) if until else hour_of(timezone.now()), hour_of(timezone.now()))
    hours = rows = 0
    first = start
    while start < end:
        stop = min(start + timedelta(days=1), end)
        rows += refresh_range(start, stop)  # and the days of those hours, from their hours
        hours += int((stop - start) / HOUR)
        start = stop
    if connection.vendor == "postgresql":  # fresh statistics for the planner after a bulk load
        with connection.cursor() as cursor:
            for model in (QueueSampleHour, PoolSampleHour, SampleHour, QueueSampleDay, PoolSampleDay, SampleDay):
                cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
    days = SampleDay.objects.filter(day__gte=day_of(first), day__lt=end).count()
    return {"hours": hours, "days": days, "rows": rows}


# ------------------------------------------------------------------------------------------------ reading
class Plan(NamedTuple):
    """Where each part of a period is read from: whole days from the daily rollup, hours from the hourly one, the
    rest from the samples (ranges of instants, [start, end))."""

    days: list[tuple[datetime, datetime]]
    hours: list[tuple[datetime, datetime]]
    raw: list[tuple[datetime, datetime]]


def plan(start: datetime, end: datetime, size: str = "hour", now: datetime | None = None) -> Plan:
    """``[start, end)`` split into: closed UTC days wholly inside it whose daily rollup was built from the 24 hours
    that are complete and clean now, with the same sample counts (only when ``size`` is a day or coarser: a day
    lies inside one such bucket); the other complete, clean, closed hours wholly inside it; and the rest.
    Asked once per page for an overview or a report (``memo.one_page``)."""
    if now is None:
        return memo.remembered(("sample-plan", start, end, size), lambda: _plan(start, end, size, timezone.now()))
    return _plan(start, end, size, now)


def _plan(start: datetime, end: datetime, size: str, now: datetime) -> Plan:
    first, last = _ceil_hour(start), min(hour_of(end), hour_of(now))
    day_starts: list[datetime] = []
    first_day, last_day = _ceil_day(start), day_of(min(end, now))
    if size in ("day", "week") and first_day < last_day:
        built = {d: (q, p) for d, q, p in SampleDay.objects.filter(day__gte=first_day, day__lt=last_day)
                 .values_list("day", "queue_samples", "pool_samples")}
        if built:  # per day: its clean hours, and their sample counts
            for day, n, q, p in (SampleHour.objects.filter(hour__gte=first_day, hour__lt=last_day, dirty=False)
                                 .annotate(d=bucket("hour", "day")).order_by().values("d")
                                 .annotate(n=Count("pk"), q=Sum("queue_samples"), p=Sum("pool_samples"))
                                 .values_list("d", "n", "q", "p")):
                if n == 24 and built.get(day) == (q, p):
                    day_starts.append(day)
    days = _ranges(day_starts, DAY)
    hours: list[tuple[datetime, datetime]] = []
    if first < last:
        gaps, cursor = [], first  # the hours of [first, last) outside those days
        for a, b in days:
            if a > cursor:
                gaps.append((cursor, a))
            cursor = max(cursor, b)
        if cursor < last:
            gaps.append((cursor, last))
        if gaps:
            hours = _ranges(SampleHour.objects.filter(in_ranges(gaps, "hour"), dirty=False)
                            .values_list("hour", flat=True))
    raw, cursor = [], start
    for a, b in sorted(days + hours):
        if a > cursor:
            raw.append((cursor, a))
        cursor = b
    if cursor < end:
        raw.append((cursor, end))
    return Plan(days, hours, raw)


def split(start: datetime, end: datetime, now: datetime | None = None) -> tuple[list[tuple[datetime, datetime]],
                                                                             list[tuple[datetime, datetime]]]:
    """``[start, end)`` as (ranges read from the hourly rollup: complete, clean, closed hours wholly inside it;
    ranges read from the samples: the rest), without the daily level."""
    parts = plan(start, end, "hour", now)
    return parts.hours, parts.raw


Combine = dict[str, str]  # field -> "sum" | "max"


def _merge(into: dict[str, Any], row: dict[str, Any], how: Combine) -> None:
    for name, op in how.items():
        value = row.get(name)
        if value is None:
            continue
        have = into.get(name)
        if have is None:
            into[name] = value
        elif op == "max":
            into[name] = max(have, value)
        else:
            into[name] = have + value


def gather(samples: QuerySet, hours: QuerySet, days: QuerySet, parts: Plan, by: list[str], size: str,
           figures: dict[str, tuple[Any, Any, str]]) -> dict[tuple[Any, ...], dict[datetime, dict[str, Any]]]:
    """key (the ``by`` values) -> bucket start -> figures, each (aggregate over the samples, aggregate over the
    rollup rows: the hourly and daily rows have the same names, "sum" or "max"), from the samples, the hourly
    rows and the daily rows of ``parts`` added up."""
    how = {name: op for name, (_, _, op) in figures.items()}
    out: dict[tuple[Any, ...], dict[datetime, dict[str, Any]]] = defaultdict(dict)
    queries = []
    if parts.raw:
        queries.append((samples.filter(in_ranges(parts.raw, "at")), "at", {n: f[0] for n, f in figures.items()}))
    if parts.hours:
        queries.append((hours.filter(in_ranges(parts.hours, "hour")), "hour", {n: f[1] for n, f in figures.items()}))
    if parts.days:
        queries.append((days.filter(in_ranges(parts.days, "day")), "day", {n: f[1] for n, f in figures.items()}))
    for qs, field, aggs in queries:
        # Named g_<figure>: a figure named like a column would shadow it in the filters.
        for r in qs.annotate(b=bucket(field, size)).order_by().values(*by, "b").annotate(
                **{f"g_{n}": agg for n, agg in aggs.items()}):
            _merge(out[tuple(r[b] for b in by)].setdefault(r["b"], {}), {n: r[f"g_{n}"] for n in aggs}, how)
    return out


def totals(series: dict[tuple[Any, ...], dict[datetime, dict[str, Any]]], how: Combine) -> dict[tuple[Any, ...], dict[str, Any]]:
    """key -> the figures over every bucket."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, buckets in series.items():
        total: dict[str, Any] = {}
        for figures in buckets.values():
            _merge(total, figures, how)
        out[key] = total
    return out


def how_of(figures: dict[str, tuple[Any, Any, str]]) -> Combine:
    return {name: op for name, (_, _, op) in figures.items()}


def mean(total: Any, n: Any) -> Decimal | None:
    """``total / n`` (exact sums of rounded ratios, so both paths give the same), None when ``n`` is 0."""
    return None if not n else Decimal(total or 0) / Decimal(n)


_POPCOUNT = " + ".join(f"((m >> {i}) & 1)" for i in range(SLOTS_PER_HOUR))


def slots_sampled(hours: QuerySet, days: QuerySet, parts: Plan, by: list[str],
                  size: str) -> dict[tuple[Any, ...], dict[datetime, list[int]]]:
    """key -> bucket start -> [sum of pending_count, distinct slots sampled] over the rolled hours and days of
    ``parts``: per hour (or day), the slots of the group's queues OR-ed, then counted."""
    out: dict[tuple[Any, ...], dict[datetime, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    if size not in ("hour", "day", "week"):
        raise ValueError(f"unknown bucket {size!r}")
    for rows, field, ranges in ((hours, "hour", parts.hours), (days, "day", parts.days)):
        if ranges:
            _slots_sampled(out, rows.filter(in_ranges(ranges, field)).order_by(), field, by, size)
    return out


def _slots_sampled(out: dict[tuple[Any, ...], dict[datetime, list[int]]], qs: QuerySet, field: str, by: list[str],
                   size: str) -> None:
    if connection.vendor != "postgresql":
        qs = qs.annotate(b=bucket(field, size))
        masks: dict[tuple[Any, ...], int] = defaultdict(int)
        for *key, b, at, total, mask in qs.values_list(*by, "b", field, "pending_count", "slots"):
            masks[(tuple(key), b, at)] |= mask_of(mask) if field == "day" else mask
            out[tuple(key)][b][0] += total
        for (key, b, _), mask in masks.items():
            out[key][b][1] += mask.bit_count()
        return
    # Hours: 12-bit integer masks, counted bit by bit; days: bit(288) strings, counted by bit_count.
    inner = qs.values(*by, field).annotate(
        total=Sum("pending_count"), m=BitOr("slots", output_field=SlotMaskField() if field == "day" else IntegerField()))
    try:
        sql, params = inner.query.sql_with_params()
    except Exception:  # an empty scope (EmptyResultSet)
        return
    columns = ", ".join(connection.ops.quote_name(c) for c in by)
    trunc = f"DATE_TRUNC('{size}', {field} AT TIME ZONE 'UTC')"  # size: hour | day | week (registry.BUCKETS)
    count = "bit_count(m)" if field == "day" else _POPCOUNT
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns}, {trunc}, SUM(total), SUM({count}) FROM ({sql}) t "
                       f"GROUP BY {columns}, {trunc}", params)
        for *key, truncated, total, slots in cursor.fetchall():
            b = truncated if truncated.tzinfo else truncated.replace(tzinfo=UTC)  # DATE_TRUNC(... AT TIME ZONE 'UTC') is naive
            s = out[tuple(key)][b]
            s[0] += int(total or 0)
            s[1] += int(slots or 0)


def violating_slots(samples: QuerySet, hours: QuerySet, days: QuerySet, parts: Plan) -> dict[tuple[Any, ...], list[int]]:
    """(tenant, project, cluster, flavor) -> the sorted 5-minute slot numbers (seconds since the epoch // 300) in
    which the queue violated its guarantee: from the samples, the hourly masks and the daily masks of ``parts``."""
    masks: dict[tuple[Any, ...], dict[datetime, int]] = defaultdict(lambda: defaultdict(int))  # key -> start -> mask
    if parts.raw:
        for *key, hour, mask in (samples.filter(in_ranges(parts.raw, "at")).filter(VIOLATING)
                                 .annotate(h=bucket("at", "hour")).order_by().values(*QUEUE_KEYS, "h")
                                 .annotate(m=Sum(SlotBit("at"))).values_list(*QUEUE_KEYS, "h", "m")):
            masks[tuple(key)][hour] |= mask
    if parts.hours:
        for *key, hour, mask in (hours.filter(in_ranges(parts.hours, "hour"), violating__gt=0)
                                 .values_list(*QUEUE_KEYS, "hour", "violating")):
            masks[tuple(key)][hour] |= mask
    if parts.days:
        for *key, day, mask in (days.filter(in_ranges(parts.days, "day")).exclude(violating=bits_of(0))
                                .values_list(*QUEUE_KEYS, "day", "violating")):
            masks[tuple(key)][day] |= mask_of(mask)
    out = {}
    for key, by_start in masks.items():
        slots = []
        for start in sorted(by_start):
            base = int(start.timestamp()) // 300
            mask = by_start[start]
            slots.extend(base + i for i in range(mask.bit_length()) if mask >> i & 1)
        out[key] = slots
    return out


def runs(slots: list[int], at_least: int) -> list[tuple[int, int]]:
    """(first slot, length) of each run of consecutive slot numbers at least ``at_least`` long."""
    out: list[tuple[int, int]] = []
    start = previous = None
    for slot in slots:
        if previous is not None and slot == previous + 1:
            previous = slot
            continue
        if start is not None and previous - start + 1 >= at_least:
            out.append((start, previous - start + 1))
        start = previous = slot
    if start is not None and previous - start + 1 >= at_least:
        out.append((start, previous - start + 1))
    return out

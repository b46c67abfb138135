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

``sample_rollups_refresh`` (beat, hourly: ``insights.sample_rollups_refresh``) recomputes the last two closed hours,
every hour marked dirty, and every closed hour of the last ``LOOKBACK_DAYS`` whose sample counts differ from what it
was rolled up from (late samples) or that was never rolled up. Each range of hours is replaced whole in one
transaction. ``manage.py insights_sample_rollup --since DAY`` backfills.

The metrics read the closed, complete hours wholly inside the period from the rollup and the rest (the current hour,
partial first and last hours, hours not rolled up or dirty) from the samples, and add the two up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Aggregate, Count, DecimalField, F, FloatField, Func, IntegerField, Max, Q, QuerySet, Sum
from django.db.models.functions import Cast, Least
from django.utils import timezone

from .common import bucket
from .models import PoolSample, PoolSampleHour, QueueSample, QueueSampleHour, SampleHour

HOUR = timedelta(hours=1)
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
    """PostgreSQL's ``bit_or`` of integers."""

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
    "borrowed": Sum("borrowed"), "admitted": Sum("admitted"), "violating": Sum(SlotBit("at"), filter=VIOLATING),
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


def _ranges(hours: Iterable[datetime]) -> list[tuple[datetime, datetime]]:
    """Sorted hours as ranges of consecutive hours, [first, last + 1 h)."""
    out: list[tuple[datetime, datetime]] = []
    for hour in sorted(hours):
        if out and out[-1][1] == hour:
            out[-1] = (out[-1][0], hour + HOUR)
        else:
            out.append((hour, hour + HOUR))
    return out


def in_ranges(ranges: list[tuple[datetime, datetime]], field: str) -> Q:
    q = Q(pk__in=[])
    for a, b in ranges:
        q |= Q(**{f"{field}__gte": a, f"{field}__lt": b})
    return q


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
    return len(queue_objs) + len(pool_objs)


def mark_dirty(hours: Iterable[datetime]) -> int:
    """Have the metrics read these hours from the samples, and the next refresh recompute them."""
    return SampleHour.objects.filter(hour__in=[hour_of(h) for h in hours]).update(dirty=True)


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


def backfill(since: date | datetime, until: datetime | None = None) -> dict[str, int]:
    """Roll up every closed hour from ``since`` (a UTC day or an instant) to the current hour (or ``until``), a
    day at a time."""
    start = datetime.combine(since, time(), tzinfo=UTC) if not isinstance(since, datetime) else hour_of(since)
    end = min(hour_of(until) if until else hour_of(timezone.now()), hour_of(timezone.now()))
    hours = rows = 0
    while start < end:
        stop = min(start + timedelta(days=1), end)
        rows += refresh_range(start, stop)
        hours += int((stop - start) / HOUR)
        start = stop
    if connection.vendor == "postgresql":  # fresh statistics for the planner after a bulk load
        with connection.cursor() as cursor:
            for model in (QueueSampleHour, PoolSampleHour, SampleHour):
                cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
    return {"hours": hours, "rows": rows}


# ------------------------------------------------------------------------------------------------ reading
def split(start: datetime, end: datetime, now: datetime | None = None) -> tuple[list[tuple[datetime, datetime]],
                                                                             list[tuple[datetime, datetime]]]:
    """``[start, end)`` as (ranges read from the rollup: complete, clean, closed hours wholly inside it; ranges
    read from the samples: the rest)."""
    first, last = _ceil_hour(start), min(hour_of(end), hour_of(now or timezone.now()))
    rolled = []
    if first < last:
        rolled = _ranges(SampleHour.objects.filter(hour__gte=first, hour__lt=last, dirty=False)
                         .values_list("hour", flat=True))
    raw, cursor = [], start
    for a, b in rolled:
        if a > cursor:
            raw.append((cursor, a))
        cursor = b
    if cursor < end:
        raw.append((cursor, end))
    return rolled, raw


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


def gather(samples: QuerySet, hours: QuerySet, rolled: list[tuple[datetime, datetime]],
           raw: list[tuple[datetime, datetime]], by: list[str], size: str,
           figures: dict[str, tuple[Any, Any, str]]) -> dict[tuple[Any, ...], dict[datetime, dict[str, Any]]]:
    """key (the ``by`` values) -> bucket start -> figures, each (aggregate over the samples, aggregate over the
    rollup rows, "sum" or "max"), from the samples in ``raw`` and the rollup rows in ``rolled`` added up."""
    how = {name: op for name, (_, _, op) in figures.items()}
    out: dict[tuple[Any, ...], dict[datetime, dict[str, Any]]] = defaultdict(dict)
    parts = []
    if raw:
        parts.append((samples.filter(in_ranges(raw, "at")), "at", {n: f[0] for n, f in figures.items()}))
    if rolled:
        parts.append((hours.filter(in_ranges(rolled, "hour")), "hour", {n: f[1] for n, f in figures.items()}))
    for qs, field, aggs in parts:
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


def slots_sampled(hours: QuerySet, rolled: list[tuple[datetime, datetime]], by: list[str],
                  size: str) -> dict[tuple[Any, ...], dict[datetime, list[int]]]:
    """key -> bucket start -> [sum of pending_count, distinct slots sampled] over the rolled hours: per hour, the
    slots of the group's queues OR-ed, then counted."""
    out: dict[tuple[Any, ...], dict[datetime, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    if not rolled:
        return out
    if size not in ("hour", "day", "week"):
        raise ValueError(f"unknown bucket {size!r}")
    qs = hours.filter(in_ranges(rolled, "hour")).order_by()
    if connection.vendor != "postgresql":
        qs = qs.annotate(b=bucket("hour", size))
        masks: dict[tuple[Any, ...], int] = defaultdict(int)
        for *key, b, hour, total, mask in qs.values_list(*by, "b", "hour", "pending_count", "slots"):
            masks[(tuple(key), b, hour)] |= mask
            out[tuple(key)][b][0] += total
        for (key, b, _), mask in masks.items():
            out[key][b][1] += mask.bit_count()
        return out
    inner = qs.values(*by, "hour").annotate(total=Sum("pending_count"), m=BitOr("slots"))
    try:
        sql, params = inner.query.sql_with_params()
    except Exception:  # an empty scope (EmptyResultSet)
        return out
    columns = ", ".join(connection.ops.quote_name(c) for c in by)
    trunc = f"DATE_TRUNC('{size}', hour AT TIME ZONE 'UTC')"  # size: hour | day | week (registry.BUCKETS)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns}, {trunc}, SUM(total), SUM({_POPCOUNT}) FROM ({sql}) t "
                       f"GROUP BY {columns}, {trunc}", params)
        for *key, b, total, slots in cursor.fetchall():
            b = b if b.tzinfo else b.replace(tzinfo=UTC)  # DATE_TRUNC(... AT TIME ZONE 'UTC') is naive
            out[tuple(key)][b] = [int(total or 0), int(slots or 0)]
    return out


def violating_slots(samples: QuerySet, hours: QuerySet, rolled: list[tuple[datetime, datetime]],
                    raw: list[tuple[datetime, datetime]]) -> dict[tuple[Any, ...], list[int]]:
    """(tenant, project, cluster, flavor) -> the sorted 5-minute slot numbers (seconds since the epoch // 300) in
    which the queue violated its guarantee: from the samples in ``raw`` and the masks of the rolled hours."""
    masks: dict[tuple[Any, ...], dict[datetime, int]] = defaultdict(lambda: defaultdict(int))
    if raw:
        for *key, hour, mask in (samples.filter(in_ranges(raw, "at")).filter(VIOLATING)
                                 .annotate(h=bucket("at", "hour")).order_by().values(*QUEUE_KEYS, "h")
                                 .annotate(m=Sum(SlotBit("at"))).values_list(*QUEUE_KEYS, "h", "m")):
            masks[tuple(key)][hour] |= mask
    if rolled:
        for *key, hour, mask in (hours.filter(in_ranges(rolled, "hour"), violating__gt=0)
                                 .values_list(*QUEUE_KEYS, "hour", "violating")):
            masks[tuple(key)][hour] |= mask
    out = {}
    for key, by_hour in masks.items():
        slots = []
        for hour in sorted(by_hour):
            base = int(hour.timestamp()) // 300
            mask = by_hour[hour]
            slots.extend(base + i for i in range(SLOTS_PER_HOUR) if mask >> i & 1)
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

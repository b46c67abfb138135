"""The ``measured`` rollup: the measured samples summed per UTC day for the three measured metrics over long periods
(docs/measured-use.md, "Rollup"; registered in the one seam, ``portal/rollups.py``).

``MeasuredRollup`` holds, per UTC day, tenant, project, cluster and flavor, the sums the metrics are made of: the
samples, allocated device-seconds, utilisation x device-seconds, idle device-seconds (below the idle threshold the
day was rolled up under), peak memory x device-seconds and device memory x device-seconds. Every figure the three
metrics show is a ratio of two such sums, so over whole days it is the same from the rollup as from the samples.
To make "the same" exact, not merely close, both paths sum the same numeric expressions (:func:`figures`): a
sample's utilisation and peak memory are rounded to ``PLACES`` places (far below what DCGM measures) and summed as
numerics, so the sums do not depend on the order of the additions, and Python adds the parts as ``Decimal``.

A sample's ``at`` is the end of its 5-minute slot: a period ``(start, end]`` counts the sample taken at its end,
not the one at its start, while a chart bucket holds ``[day, day + 1)``. So a day is rolled up in two parts: the
samples taken at 00:00 exactly (``at_start``) and the rest of the day; a period uses each part that lies wholly
inside it (``plan``), and reads the rest from the samples.

``MeasuredDay`` marks a day complete, with the idle threshold (``MEASURED_IDLE_PERCENT``) and the number of samples
it was computed from. A day is read from the samples while it is missing, ``dirty`` (a writer of samples of that
day or earlier marked it: ``mark_since``), today, or rolled up under another threshold.

``measured_refresh`` (beat, hourly: ``portal.rollups_refresh``, the ``measured`` rollup) recomputes yesterday and the day
before, dirty days, days rolled up under another threshold, and days of the last ``LOOKBACK_DAYS`` whose samples
are not as many as when they were rolled up (written late without a mark, or deleted). Each day is replaced whole
in one transaction. ``manage.py rollups backfill --only measured --since DAY`` backfills.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import localcontext
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import (BigIntegerField, BooleanField, Count, DateField, DecimalField, ExpressionWrapper, F,
                              Func, Q, QuerySet, Sum)
from django.db.models.functions import Cast, Trunc, TruncDate
from django.utils import timezone

from portal.rollups import day_bounds, in_spans

from .common import bucket
from .models import MeasuredDay, MeasuredRollup, MeasuredSample

PLACES = 6  # a sample's utilisation (%) and peak memory (MiB) are summed rounded to this many places
LOOKBACK_DAYS = 31
KEYS = ("tenant_id", "project_id", "cluster_id", "flavor_id")
SUMS = ("samples", "alloc", "util", "idle", "mem_used", "mem_total")
EXACT = DecimalField(max_digits=30, decimal_places=PLACES)
BIG = BigIntegerField()
WHOLE = ("samples", "alloc", "idle", "mem_total")  # integers: a day's or a week's sum of one group fits a bigint


def idle_percent() -> float:
    """The idle threshold in % of GPU utilisation (``MEASURED_IDLE_PERCENT``, default 5)."""
    return float(getattr(settings, "MEASURED_IDLE_PERCENT", 5.0))


def idle_threshold() -> float:
    return idle_percent()


# ------------------------------------------------------------------------------------------------ expressions
class Rounded(Func):
    """``expr`` as a numeric rounded to ``PLACES`` places (a float on SQLite, the laptop demo)."""

    output_field = EXACT
    arity = 1

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"ROUND(({sql})::numeric, {PLACES})", params

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"ROUND({sql}, {PLACES})", params


def figures(threshold: float) -> dict[str, Any]:
    """The sums over samples (the raw path and the rollup's refresh alike), named as the rollup's columns."""
    weight = Cast("gpus", BIG) * F("seconds")
    return {
        "samples": Count("pk"),
        "alloc": Cast(Sum(weight), BIG),
        "util": Sum(Rounded("util_avg") * weight, output_field=EXACT),
        "idle": Cast(Sum(weight, filter=Q(util_avg__lt=threshold)), BIG),
        "mem_used": Sum(Rounded("fb_used_max") * weight, output_field=EXACT),
        "mem_total": Cast(Sum(Cast("memory_mib", BIG) * weight), BIG),
    }


def rollup_figures() -> dict[str, Any]:
    """The same sums over rollup rows (integers handed back as integers, not numerics: cheaper to read)."""
    return {name: Cast(Sum(name), BIG) if name in WHOLE else Sum(name) for name in SUMS}


# ------------------------------------------------------------------------------------------------ refresh
def refresh_day(day: date, threshold: float | None = None) -> int:
    """Replace ``day``'s rollup rows from its samples and mark it complete. Returns the rows."""
    threshold = idle_threshold() if threshold is None else threshold
    start, end = day_bounds(day)
    with transaction.atomic():
        groups = list(MeasuredSample.objects.filter(at__gte=start, at__lt=end)
                      .annotate(at_start=ExpressionWrapper(Q(at=start), output_field=BooleanField()))
                      .order_by().values(*KEYS, "at_start").annotate(**figures(threshold)))
        MeasuredRollup.objects.filter(day=day).delete()
        MeasuredRollup.objects.bulk_create(
            [MeasuredRollup(day=day, **{k: g[k] for k in (*KEYS, "at_start")},
                            **{k: g[k] or 0 for k in SUMS}) for g in groups], batch_size=2000)
        MeasuredDay.objects.update_or_create(day=day, defaults={
            "computed_at": timezone.now(), "idle_percent": threshold, "dirty": False,
            "samples": sum(g["samples"] for g in groups)})
    return len(groups)


def mark_dirty(days: list[date]) -> int:
    """Have the metrics read these days from the samples, and the next refresh recompute them."""
    return MeasuredDay.objects.filter(day__in=days).update(dirty=True)


def mark_since(since: datetime) -> int:
    """Every rolled-up day from ``since``'s UTC day on is dirty (``portal.rollups.mark``; what a writer of samples
    calls with the earliest sample it wrote)."""
    return MeasuredDay.objects.filter(day__gte=since.astimezone(UTC).date()).update(dirty=True)


def changed_days(today: date) -> set[date]:
    """Days of the last ``LOOKBACK_DAYS`` before ``today`` never rolled up, or whose samples are not as many as when
    they were: written late without a mark, or deleted."""
    since = today - timedelta(days=LOOKBACK_DAYS)
    done = dict(MeasuredDay.objects.filter(day__gte=since, day__lt=today).values_list("day", "samples"))
    start, end = day_bounds(since)[0], day_bounds(today)[0]
    now = dict(MeasuredSample.objects.filter(at__gte=start, at__lt=end).annotate(d=TruncDate("at", tzinfo=UTC))
               .order_by().values("d").annotate(n=Count("pk")).values_list("d", "n"))
    return {d for d in set(done) | set(now) if now.get(d, 0) != done.get(d)}


def measured_refresh(now: datetime | None = None) -> dict[str, int]:
    """Recompute yesterday, the day before, dirty days, days under another threshold and changed days of the
    lookback. Idempotent."""
    today = (now or timezone.now()).astimezone(UTC).date()
    threshold = idle_threshold()
    days = {today - timedelta(days=1), today - timedelta(days=2)}
    days |= set(MeasuredDay.objects.filter(Q(dirty=True) | ~Q(idle_percent=threshold))
                .filter(day__lt=today).values_list("day", flat=True))
    days |= changed_days(today)
    rows = sum(refresh_day(day, threshold) for day in sorted(days))
    return {"days": len(days), "rows": rows}


def backfill(since: date, until: date | None = None) -> dict[str, int]:
    """Roll up every closed day from ``since`` to yesterday (or ``until``, excluded)."""
    today = timezone.now().astimezone(UTC).date()
    until = min(until or today, today)
    threshold = idle_threshold()
    day, days, rows = since, 0, 0
    while day < until:
        rows += refresh_day(day, threshold)
        days += 1
        day += timedelta(days=1)
    if connection.vendor == "postgresql":  # fresh statistics for the planner after a bulk load
        with connection.cursor() as cursor:
            for model in (MeasuredRollup, MeasuredDay):
                cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
    return {"days": days, "rows": rows}


# ------------------------------------------------------------------------------------------------ reading
class Plan(NamedTuple):
    """Where each part of a period ``(start, end]`` is read from: the rest-of-day parts of ``days`` and the 00:00
    parts of ``starts`` from the rollup, and the ``raw`` pieces from the samples, each ``(a, a included, b, b
    included)``."""

    days: list[date]
    starts: list[date]
    raw: list[tuple[datetime, bool, datetime, bool]]


def rolled_days(first: date, last: date, threshold: float, now: datetime) -> list[date]:
    """The complete, clean days from ``first`` to ``last`` (both included) before today, rolled up under
    ``threshold``."""
    today = now.astimezone(UTC).date()
    return sorted(MeasuredDay.objects.filter(day__gte=first, day__lte=min(last, today - timedelta(days=1)),
                                             dirty=False, idle_percent=threshold).values_list("day", flat=True))


def plan(start: datetime, end: datetime, size: str, threshold: float, now: datetime | None = None) -> Plan:
    """``(start, end]`` split into the rolled-up parts of days that lie wholly inside it and the raw rest. Only for
    a chart by day or week (a day lies inside one such bucket); by hour everything is raw."""
    if end <= start:
        return Plan([], [], [])
    if size not in ("day", "week"):
        return Plan([], [], [(start, False, end, True)])
    rolled = rolled_days(start.astimezone(UTC).date(), end.astimezone(UTC).date(), threshold, now or timezone.now())
    days, starts, cells = [], [], []
    for day in rolled:
        a, b = day_bounds(day)
        if start < a <= end:  # the samples at 00:00
            starts.append(day)
            cells.append((a, False, a))
        if start <= a and b <= end:  # the samples after 00:00, up to and without the next day's
            days.append(day)
            cells.append((a, True, b))
    raw, cursor, cursor_in = [], start, False  # the period starts after ``start``
    for a, after_a, b in cells:  # cells in time order: a 00:00 part is the instant a, a rest part is (a, b)
        piece = (cursor, cursor_in, a, after_a)  # up to a, with a itself when the cell starts after it
        if piece[0] < piece[2] or (piece[0] == piece[2] and piece[1] and piece[3]):
            raw.append(piece)
        cursor, cursor_in = (b, True) if after_a else (a, False)
    if cursor < end or (cursor == end and cursor_in):
        raw.append((cursor, cursor_in, end, True))
    return Plan(days, starts, raw)


def in_pieces(pieces: list[tuple[datetime, bool, datetime, bool]]) -> Q:
    """Samples whose ``at`` lies in one of the pieces (no sample for none)."""
    q = Q(pk__in=[])
    for a, a_in, b, b_in in pieces:
        if a == b:
            q |= Q(at=a)
        else:
            q |= Q(**{"at__gte" if a_in else "at__gt": a, "at__lte" if b_in else "at__lt": b})
    return q


def sums(samples: QuerySet, rollup: QuerySet, parts: Plan, by: list[str], size: str, threshold: float
         ) -> dict[tuple[Any, ...], dict[datetime, list[Any]]]:
    """key (the ``by`` values) -> chart bucket start -> the sums (in ``SUMS`` order; exact: integers and decimals),
    from the samples of ``parts.raw`` and the rollup rows of ``parts`` added up. ``samples`` and ``rollup`` come
    scoped and filtered."""
    out: dict[tuple[Any, ...], dict[datetime, list[Any]]] = defaultdict(dict)
    columns = [f"g_{n}" for n in SUMS]  # named g_<sum>: a sum named like a column would shadow it
    queries = []
    if parts.raw:
        queries.append(samples.filter(in_pieces(parts.raw)).order_by().annotate(_b=bucket("at", size))
                       .values(*by, "_b").annotate(**{f"g_{n}": agg for n, agg in figures(threshold).items()})
                       .values_list(*by, "_b", *columns))
    rolled = Q(pk__in=[])
    if parts.days:
        rolled |= Q(in_spans(parts.days), at_start=False)
    if parts.starts:
        rolled |= Q(in_spans(parts.starts), at_start=True)
    if parts.days or parts.starts:
        queries.append(rollup.filter(rolled).order_by().annotate(_b=Trunc("day", size, output_field=DateField()))
                       .values(*by, "_b").annotate(**{f"g_{n}": agg for n, agg in rollup_figures().items()})
                       .values_list(*by, "_b", *columns))
    n = len(by)
    with localcontext() as ctx:
        ctx.prec = 60  # sums of up to 30 digits: exact whatever the order
        for qs in queries:
            for row in qs:
                b = row[n]
                if not isinstance(b, datetime):
                    b = datetime(b.year, b.month, b.day, tzinfo=UTC)
                values = [v or 0 for v in row[n + 1:]]  # None: no sample under the threshold
                buckets = out[row[:n]]
                have = buckets.get(b)
                if have is None:
                    buckets[b] = values
                else:  # a bucket partly rolled up, partly from the samples
                    for i, v in enumerate(values):
                        have[i] += v
    return out

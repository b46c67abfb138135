"""Daily rollups of requests for the scheduling metrics over long periods (docs/insights.md, "Rollups").

``RequestRollup`` holds, per UTC day of approval, tenant, cluster and flavor: how many requests reached the queue,
how many were first admitted within the target, and histograms of the approval → first admission and admission →
running waits in fixed logarithmic buckets. ``RollupDay`` marks a day as complete.

``rollups_refresh`` (beat, hourly: ``portal.rollups_refresh``, the ``requests`` rollup) recomputes yesterday and the day before, every day
marked dirty, and every day of the last ``LOOKBACK_DAYS`` whose requests changed after it was rolled up. Each day
is replaced whole in one transaction, so running it twice gives the same rows. ``manage.py rollups backfill --only requests --since
DAY`` backfills.

The metrics read closed, complete days from the rollup and the rest of the period (today, the period's partial
edges, days not rolled up) live from the requests, so counts equal the direct computation exactly. Percentiles come
from the merged histogram: ``histogram_percentile`` places each rank inside its bucket, so a figure is off by less
than one bucket (``BUCKET_RATIO`` − 1, 19%) of the true value, plus up to a second for waits under a second.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, CharField, Count, Max, Q, Value, When
from django.db.models.functions import Coalesce, Greatest, TruncDate
from django.utils import timezone

from portal.rollups import day_bounds, day_spans
from workloads.models import RequestEvent, RequestState, WorkloadRequest

from . import memo
from .models import PreemptionRollup, RequestRollup, RequestRollupWeek, RollupDay, RollupWeek

STEPS_PER_DOUBLING = 4  # bucket i >= 1 covers [2^((i-1)/4), 2^(i/4)) seconds; bucket 0 is [0, 1 s)
BUCKET_RATIO = 2 ** (1 / STEPS_PER_DOUBLING)
MAX_BUCKET = STEPS_PER_DOUBLING * 24  # 2^24 s, about 194 days: longer waits count in the last bucket
LOOKBACK_DAYS = 31


def admit_target_minutes() -> int:
    """``INSIGHTS_ADMIT_TARGET_MINUTES`` (default 10): admitted in time = first admitted within this of approval."""
    return int(getattr(settings, "INSIGHTS_ADMIT_TARGET_MINUTES", 10))


# ------------------------------------------------------------------------------------------------ histogram
def bucket_index(seconds: float) -> int:
    if seconds < 1:
        return 0
    return min(MAX_BUCKET, int(math.floor(math.log2(seconds) * STEPS_PER_DOUBLING)) + 1)


def bucket_bounds(index: int) -> tuple[float, float]:
    if index == 0:
        return 0.0, 1.0
    return 2 ** ((index - 1) / STEPS_PER_DOUBLING), 2 ** (index / STEPS_PER_DOUBLING)


def add_into(total: dict[int, int], hist: dict[Any, int]) -> None:
    for index, count in hist.items():
        total[int(index)] += count


def cumulative(hist: dict[Any, int]) -> list[tuple[int, int, int]]:
    """A histogram as sorted ``(index, count, count before it)`` rows, the shape the database's merge returns."""
    out, before = [], 0
    for index, count in sorted((int(i), c) for i, c in hist.items() if c):
        out.append((index, count, before))
        before += count
    return out


def _value_at(rows: list[tuple[int, int, int]], rank: float) -> float:
    """The estimated value of the ``rank``-th smallest (0-based) of a histogram (``cumulative`` rows; only the
    rows around the rank are needed): the rank's place among its bucket's counts, geometrically inside the bucket
    (linearly in bucket 0)."""
    for index, count, before in rows:
        if before <= rank < before + count:
            low, high = bucket_bounds(index)
            share = (rank - before + 0.5) / count
            return low + (high - low) * share if index == 0 else low * (high / low) ** share
    return bucket_bounds(rows[-1][0])[1]


def percentile_of_rows(rows: list[tuple[int, int, int]], n: int, fraction: float) -> float | None:
    """``percentile_cont`` estimated from ``n`` values in histogram buckets: the two closest ranks, interpolated
    linearly. ``rows`` (``cumulative``) may hold only the buckets around those ranks (``rank_rows_sql``)."""
    if not n:
        return None
    position = (n - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    lv = _value_at(rows, low)
    return lv if low == high else lv + (_value_at(rows, high) - lv) * (position - low)


def histogram_percentile(hist: dict[Any, int], fraction: float) -> float | None:
    """``percentile_cont`` estimated from a histogram (index -> count)."""
    rows = cumulative(hist)
    return percentile_of_rows(rows, sum(c for _, c, _ in rows), fraction)


# ------------------------------------------------------------------------------------------------ one request
def request_figures(approved: datetime, queued: datetime | None, first: datetime | None, admitted: datetime | None,
                    started: datetime | None, target: timedelta) -> tuple[bool, bool, float | None, float | None]:
    """(reached the queue, admitted in time, approval → first admission seconds, admission → running seconds), by
    the rules of ``scheduling.queue_wait`` and ``scheduling_success``."""
    reached = queued is not None or first is not None
    in_time = reached and first is not None and first <= approved + target
    wait = (first - approved).total_seconds() if first is not None and first >= approved else None
    start = (started - admitted).total_seconds() if admitted and started and started >= admitted else None
    return reached, in_time, wait, start


FIGURE_COLUMNS = ("approved_at", "queued_at", "first", "admitted_at", "started_at")


def with_first(qs: Any) -> Any:
    return qs.annotate(first=Coalesce("first_admitted_at", "admitted_at"))


# ------------------------------------------------------------------------------------------------ preemptions
# The eviction's reason, from the timeline message the status follower wrote ("Preempted: <Kueue's message>",
# "Volcano restarts the gang: ..."). Preemptions: another workload took the capacity; evictions: anything else.
REASONS = (
    ("cohort_reclaim", "Preemption: reclaimed within the cohort", "reclamation within the cohort"),
    ("queue_priority", "Preemption: priority in the ClusterQueue", "prioritization in the ClusterQueue"),
    ("cohort_priority", "Preemption: priority or fair sharing in the cohort", "in the cohort"),
    ("preempted_other", "Preemption: other", "Preempted to accommodate"),
    ("gang_restart", "Eviction: Volcano restarted the gang", "Volcano restarts the gang"),
    ("pods_ready", "Eviction: pods not ready in time", "PodsReady"),
    ("stopped", "Eviction: queue stopped or workload deactivated", "stopped"),
)
PREEMPTIONS = ("cohort_reclaim", "queue_priority", "cohort_priority", "preempted_other")


def preemption_events(start: datetime, end: datetime) -> Any:
    """Timeline entries of ``[start, end)`` where a request lost its admission."""
    return RequestEvent.objects.filter(to_state=RequestState.PREEMPTED, at__gte=start, at__lt=end)


def reason_of() -> Case:
    """The reason of a preemption entry (``REASONS``), from its message."""
    return Case(*[When(message__icontains=needle, then=Value(key)) for key, _, needle in REASONS]
                + [When(message__icontains="deactivated", then=Value("stopped"))],
                default=Value("other"), output_field=CharField())


# ------------------------------------------------------------------------------------------------ refresh
def week_of(day: date) -> date:
    """The Monday of ``day``'s ISO week."""
    return day - timedelta(days=day.weekday())


def row_p95(admit_hist: dict[Any, int]) -> float | None:
    """What a rollup row keeps as ``admit_p95``: its own histogram's P95, read for a chart point of that row alone."""
    return histogram_percentile(admit_hist, 0.95) if admit_hist else None


def refresh_day(day: date, *, target_minutes: int | None = None, weeks: bool = True) -> int:
    """Replace ``day``'s rollup rows (requests approved that UTC day) and mark it complete; then rebuild its week
    (``refresh_week``) unless ``weeks`` is false (the backfill builds each week once). Returns the rows."""
    minutes = admit_target_minutes() if target_minutes is None else target_minutes
    target = timedelta(minutes=minutes)
    start, end = day_bounds(day)
    computed_at = timezone.now()
    groups: dict[tuple[int, int, int], dict[str, Any]] = {}
    rows = with_first(WorkloadRequest.objects.filter(approved_at__gte=start, approved_at__lt=end)).values_list(
        "tenant_id", "cluster_id", "flavor_id", *FIGURE_COLUMNS)
    for tenant_id, cluster_id, flavor_id, *stamps in rows.iterator(chunk_size=5000):
        reached, in_time, wait, run = request_figures(*stamps, target)
        g = groups.setdefault((tenant_id, cluster_id, flavor_id), {
            "reached": 0, "in_time": 0, "admitted": 0, "started": 0,
            "admit_hist": defaultdict(int), "start_hist": defaultdict(int)})
        g["reached"] += reached
        g["in_time"] += in_time
        if wait is not None:
            g["admitted"] += 1
            g["admit_hist"][str(bucket_index(wait))] += 1
        if run is not None:
            g["started"] += 1
            g["start_hist"][str(bucket_index(run))] += 1
    objs = [RequestRollup(day=day, tenant_id=t, cluster_id=c, flavor_id=f, admit_p95=row_p95(g["admit_hist"]),
                          **{k: dict(v) if k.endswith("hist") else v for k, v in g.items()})
            for (t, c, f), g in groups.items()]
    preempted = [PreemptionRollup(day=day, tenant_id=r["request__tenant_id"], cluster_id=r["request__cluster_id"],
                                  flavor_id=r["request__flavor_id"], reason=r["reason"], count=r["n"])
                 for r in preemptions_by_reason(start, end)]
    with transaction.atomic():
        RequestRollup.objects.filter(day=day).delete()
        RequestRollup.objects.bulk_create(objs, batch_size=1000)
        PreemptionRollup.objects.filter(day=day).delete()
        PreemptionRollup.objects.bulk_create(preempted, batch_size=1000)
        RollupDay.objects.update_or_create(day=day, defaults={
            "computed_at": computed_at, "admit_target_minutes": minutes, "dirty": False})
        if weeks:
            refresh_week(week_of(day))
    return len(objs)


def refresh_week(week: date) -> int:
    """Rebuild the week of Monday ``week`` from its day rows: summed per tenant, cluster and flavor, and marked
    complete (``RollupWeek``) when its seven days are complete, clean and under one admission target; otherwise
    its week rows are removed. Returns the rows."""
    days = [week + timedelta(days=i) for i in range(7)]
    with transaction.atomic():
        RequestRollupWeek.objects.filter(week=week).delete()
        RollupWeek.objects.filter(week=week).delete()
        marks = list(RollupDay.objects.filter(day__in=days).values_list("dirty", "admit_target_minutes"))
        if len(marks) < 7 or any(dirty for dirty, _ in marks) or len({m for _, m in marks}) != 1:
            return 0
        groups: dict[tuple[int, int, int], dict[str, Any]] = {}
        for t, c, f, *counts, admit_hist, start_hist in RequestRollup.objects.filter(
                day__gte=days[0], day__lte=days[-1]).values_list(
                "tenant_id", "cluster_id", "flavor_id", "reached", "in_time", "admitted", "started", "admit_hist",
                "start_hist"):
            g = groups.setdefault((t, c, f), {"reached": 0, "in_time": 0, "admitted": 0, "started": 0,
                                              "admit_hist": defaultdict(int), "start_hist": defaultdict(int)})
            for name, value in zip(("reached", "in_time", "admitted", "started"), counts, strict=True):
                g[name] += value
            add_into(g["admit_hist"], admit_hist)
            add_into(g["start_hist"], start_hist)
        objs = [RequestRollupWeek(week=week, tenant_id=t, cluster_id=c, flavor_id=f, admit_p95=row_p95(g["admit_hist"]),
                                  **{k: {str(i): n for i, n in sorted(v.items())} if k.endswith("hist") else v
                                     for k, v in g.items()})
                for (t, c, f), g in groups.items()]
        RequestRollupWeek.objects.bulk_create(objs, batch_size=1000)
        RollupWeek.objects.create(week=week, computed_at=timezone.now(), admit_target_minutes=marks[0][1])
    return len(objs)


def missing_weeks() -> list[date]:
    """Weeks whose seven days are complete and clean under one target but that have no ``RollupWeek`` (rolled
    up before the week level existed, or left by an interrupted refresh)."""
    days: dict[date, set[int]] = defaultdict(set)
    counted: dict[date, int] = defaultdict(int)
    for day, minutes in RollupDay.objects.filter(dirty=False).values_list("day", "admit_target_minutes"):
        counted[week_of(day)] += 1
        days[week_of(day)].add(minutes)
    have = set(RollupWeek.objects.values_list("week", flat=True))
    return sorted(w for w, n in counted.items() if n == 7 and len(days[w]) == 1 and w not in have)


def preemptions_by_reason(start: datetime, end: datetime) -> Any:
    """The timeline entries to ``preempted`` of ``[start, end)`` counted per tenant, cluster, flavor and reason."""
    return (preemption_events(start, end).annotate(reason=reason_of()).order_by()
            .values("request__tenant_id", "request__cluster_id", "request__flavor_id", "reason").annotate(n=Count("pk")))


def mark_dirty(days: list[date]) -> int:
    """Have the next refresh recompute these days (and the metrics read them live until then; their weeks are
    rebuilt with them)."""
    RollupWeek.objects.filter(week__in={week_of(d) for d in days}).delete()
    return RollupDay.objects.filter(day__in=days).update(dirty=True)


def mark_since(since: datetime) -> int:
    """Every rolled-up day from ``since``'s UTC day on is dirty (``portal.rollups.mark``)."""
    day = since.astimezone(UTC).date()
    return mark_dirty(list(RollupDay.objects.filter(day__gte=day).values_list("day", flat=True)))


def changed_days(today: date) -> set[date]:
    """Days of the last ``LOOKBACK_DAYS`` whose requests changed after the day was rolled up: a later admission,
    start or any write after the day's ``computed_at`` (the follower's stamps do not always touch ``updated_at``)."""
    since = datetime.combine(today - timedelta(days=LOOKBACK_DAYS), time(), tzinfo=UTC)
    done = dict(RollupDay.objects.filter(day__gte=since.date()).values_list("day", "computed_at"))
    if not done:
        return set()
    latest = Greatest(*[Coalesce(name, "approved_at") for name in
                        ("updated_at", "queued_at", "first_admitted_at", "admitted_at", "started_at")])
    out = set()
    for r in (WorkloadRequest.objects.filter(approved_at__gte=since).annotate(d=TruncDate("approved_at", tzinfo=UTC))
              .order_by().values("d").annotate(last=Max(latest))):
        computed = done.get(r["d"])
        if computed is not None and r["last"] is not None and r["last"] >= computed:
            out.add(r["d"])
    return out


def rollups_refresh(now: datetime | None = None) -> dict[str, int]:
    """Recompute yesterday, the day before, dirty days, days whose requests changed, and days rolled up under
    another admission target. Idempotent."""
    today = (now or timezone.now()).astimezone(UTC).date()
    days = {today - timedelta(days=1), today - timedelta(days=2)}
    days |= set(RollupDay.objects.filter(Q(dirty=True) | ~Q(admit_target_minutes=admit_target_minutes()))
                .filter(day__lt=today).values_list("day", flat=True))
    days |= {d for d in changed_days(today) if d < today}
    rows = sum(refresh_day(day) for day in sorted(days))
    weeks = missing_weeks()
    for week in weeks:
        refresh_week(week)
    return {"days": len(days), "rows": rows, "weeks": len(weeks)}


def backfill(since: date, until: date | None = None) -> dict[str, int]:
    """Roll up every closed day from ``since`` to yesterday (or ``until``, excluded), then rebuild their weeks."""
    today = timezone.now().astimezone(UTC).date()
    until = min(until or today, today)
    day, days, rows, weeks = since, 0, 0, set()
    while day < until:
        rows += refresh_day(day, weeks=False)
        weeks.add(week_of(day))
        days += 1
        day += timedelta(days=1)
    week_rows = sum(refresh_week(week) for week in sorted(weeks))
    return {"days": days, "rows": rows, "weeks": len(weeks), "week_rows": week_rows}


# ------------------------------------------------------------------------------------------------ reading
def rolled_days(start: datetime, end: datetime, *, target_minutes: int, now: datetime | None = None) -> list[date]:
    """The complete, clean days lying wholly inside ``[start, end)`` and before today, rolled up under the
    current admission target (asked once per page for an overview or a report: ``memo.one_page``)."""
    if now is None:
        return list(memo.remembered(("rolled-days", start, end, target_minutes),
                                    lambda: _rolled_days(start, end, target_minutes, timezone.now())))
    return _rolled_days(start, end, target_minutes, now)


def _rolled_days(start: datetime, end: datetime, target_minutes: int, now: datetime) -> list[date]:
    today = now.astimezone(UTC).date()
    first = start.astimezone(UTC)
    first_day = first.date() if first == datetime.combine(first.date(), time(), tzinfo=UTC) else first.date() + timedelta(days=1)
    last = end.astimezone(UTC)
    last_day = min(last.date(), today)  # days before this one end by ``end``
    if first_day >= last_day:
        return []
    return sorted(RollupDay.objects.filter(day__gte=first_day, day__lt=last_day, dirty=False,
                                           admit_target_minutes=target_minutes).values_list("day", flat=True))


def whole_weeks(days: list[date], *, target_minutes: int) -> list[date]:
    """The weeks (Mondays) whose seven days are all in ``days`` (rolled up, clean) and whose week rows were built
    under ``target_minutes``: read from ``RequestRollupWeek`` instead of their seven days."""
    have = set(days)
    full = {week_of(d) for d in days if all(week_of(d) + timedelta(days=i) in have for i in range(7))}
    if not full:
        return []
    return sorted(RollupWeek.objects.filter(week__in=full, admit_target_minutes=target_minutes)
                  .values_list("week", flat=True))


# ------------------------------------------------------------------------------------------------ merging in SQL
# The rolled-up days of a period are merged by the database: counts summed per breakdown key and chart bucket, the
# JSON histograms expanded (PostgreSQL ``jsonb_each_text``, SQLite ``json_each``) and summed per key (and bucket) and
# histogram bucket. For the chart's percentile per key and bucket, a window over the merged histogram keeps only
# the histogram buckets around the two ranks ``percentile_cont`` interpolates between, so Python reads a few rows
# per point instead of every histogram bucket of every point.

def _vendor() -> str:
    return connection.vendor


def _bucket_sql(size: str) -> str:
    """The chart bucket of a rollup row's ``day`` (a date: the day itself, or the Monday of its week)."""
    if size == "day":
        return "r.day"
    if _vendor() == "postgresql":
        return "(r.day - (EXTRACT(ISODOW FROM r.day)::integer - 1))"
    return "date(r.day, '-' || ((CAST(strftime('%%w', r.day) AS INTEGER) + 6) %% 7) || ' days')"


def _each(source: str, alias: str, column: str) -> str:
    """``FROM`` items: the rows ``source`` (named ``alias``) and their histogram ``column``'s entries ``h``."""
    if _vendor() == "postgresql":
        return f"{source} CROSS JOIN LATERAL jsonb_each_text({alias}.{column}) h"
    return f"{source}, json_each({alias}.{column}) h"


ROW_COLUMNS = "tenant_id, cluster_id, flavor_id, reached, in_time, admitted, started, admit_hist, start_hist, admit_p95"


def _rows_sql(days: list[date], weeks: list[date], filters: dict[str, int]) -> tuple[str, list[Any]]:
    """``FROM`` item ``r``: the rollup rows of the rolled-up ``days``, the ``weeks`` among them as one week row
    per group (its ``day`` the Monday), with the ``filters``."""
    in_weeks = set(weeks)
    spans = day_spans([d for d in days if week_of(d) not in in_weeks])
    where = " OR ".join("day BETWEEN %s AND %s" for _ in spans) or "1 = 0"
    params: list[Any] = [_param(d) for span in spans for d in span]
    extra, extra_params = "", []
    for column, value in sorted(filters.items()):
        extra += f" AND {column} = %s"
        extra_params.append(value)
    sql = f"SELECT day, {ROW_COLUMNS} FROM {RequestRollup._meta.db_table} WHERE ({where}){extra}"
    params += extra_params
    if weeks:
        sql += (f" UNION ALL SELECT week, {ROW_COLUMNS} FROM {RequestRollupWeek._meta.db_table} "
                f"WHERE week IN ({', '.join('%s' for _ in weeks)}){extra}")
        params += [_param(w) for w in weeks] + extra_params
    return f"({sql}) r", params


def _param(day: date) -> Any:
    return day if _vendor() == "postgresql" else day.isoformat()


def _as_date(value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value)[:10])


def merged_counts(key: str, days: list[date], size: str, filters: dict[str, int], weeks: list[date] = ()
                  ) -> dict[tuple[Any, date], list[int]]:
    """(key, chart bucket) -> [reached, in_time, admitted, started] summed over the rolled-up ``days`` (the
    ``weeks`` among them read from the week rows). Queue wait and the success rate of one page share it
    (``memo.one_page``); the result is only read."""
    source, params = _rows_sql(days, list(weeks), filters)
    sql = (f"SELECT r.{key}, {_bucket_sql(size)} AS b, SUM(r.reached), SUM(r.in_time), SUM(r.admitted), "
           f"SUM(r.started) FROM {source} GROUP BY 1, 2")

    def read() -> dict[tuple[Any, date], list[int]]:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return {(k, _as_date(b)): [int(v) for v in rest] for k, b, *rest in cursor.fetchall()}

    return memo.remembered(("merged-counts", sql, repr(params)), read)


def merged_histogram(column: str, key: str, days: list[date], filters: dict[str, int], weeks: list[date] = ()
                     ) -> dict[Any, dict[int, int]]:
    """key -> the histogram ``column`` summed over the rolled-up ``days`` (index -> count)."""
    source, params = _rows_sql(days, list(weeks), filters)
    sql = (f"SELECT r.{key}, CAST(h.key AS INTEGER), SUM(CAST(h.value AS INTEGER)) FROM {_each(source, 'r', column)} "
           "GROUP BY 1, 2")
    out: dict[Any, dict[int, int]] = defaultdict(dict)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for k, index, count in cursor.fetchall():
            out[k][int(index)] = int(count)
    return out


def merged_rank_rows(column: str, key: str, days: list[date], size: str, filters: dict[str, int], percent: int,
                     whole: set[date], weeks: list[date] = ()
                     ) -> tuple[dict[Any, dict[int, int]], dict[tuple[Any, date], tuple[int, list[tuple[int, int, int]]]],
                                dict[tuple[Any, date], float]]:
    """The histogram ``column`` summed over the rolled-up ``days`` (the ``weeks`` among them from the week rows),
    in one statement: key -> its whole histogram (as ``merged_histogram``); (key, chart bucket) -> its stored
    P95 (``admit_p95``) where the point is one rollup row (``percent`` 95, ``column`` ``admit_hist``, not in
    ``whole``); and for the other points (key, chart bucket) -> (values, ``cumulative`` rows) of the sum per key
    and bucket, with only the rows around the ranks the ``percent``-th percentile interpolates between (one rank
    either side, so the float arithmetic of ``percentile_of_rows`` always finds its rows), or every row for the
    buckets in ``whole`` (those the live part adds to)."""
    source, params = _rows_sql(days, list(weeks), filters)
    keep = ", ".join("%s" for _ in whole)
    kept = [_param(d) for d in sorted(whole)]
    stored = percent == 95 and column == "admit_hist"
    alone = ("s.rows_ = 1 AND s.p95 IS NOT NULL" + (f" AND s.b NOT IN ({keep})" if whole else "")) if stored else "1 = 0"
    sql = (f"WITH s AS (SELECT r.{key} AS k, {_bucket_sql(size)} AS b, r.{column} AS hist, r.admit_p95 AS p95, "
           f"COUNT(*) OVER (PARTITION BY r.{key}, {_bucket_sql(size)}) AS rows_ FROM {source}), "
           f"e AS (SELECT s.k, s.b, CAST(h.key AS INTEGER) AS i, CAST(h.value AS INTEGER) AS c, "
           f"CASE WHEN {alone} THEN 1 ELSE 0 END AS alone FROM {_each('s', 's', 'hist')}), "
           "m AS (SELECT k, b, i, SUM(c) AS c FROM e WHERE alone = 0 GROUP BY 1, 2, 3), "
           "w AS (SELECT k, b, i, c, CAST(SUM(c) OVER (PARTITION BY k, b ORDER BY i) AS BIGINT) - c AS before_, "
           "CAST(SUM(c) OVER (PARTITION BY k, b) AS BIGINT) AS n FROM m) "
           f"SELECT k, b, i, c, before_, n, CAST(NULL AS DOUBLE PRECISION) FROM w WHERE (before_ <= ((n - 1) * {int(percent)} + 99) / 100 + 1 "
           f"AND before_ + c > ((n - 1) * {int(percent)}) / 100 - 1)"
           + (f" OR b IN ({keep})" if whole else "")
           + " UNION ALL SELECT k, NULL, i, SUM(c), 0, 0, NULL FROM e GROUP BY k, i"
           + f" UNION ALL SELECT s.k, s.b, NULL, NULL, NULL, NULL, s.p95 FROM s WHERE {alone}")
    alone_params = kept if stored else []
    totals: dict[Any, dict[int, int]] = defaultdict(dict)
    ranks: dict[tuple[Any, date], tuple[int, list[tuple[int, int, int]]]] = {}
    p95s: dict[tuple[Any, date], float] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        if _vendor() == "postgresql":  # the merged histograms (keys x buckets x histogram buckets) sort in memory
            cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute(sql, [*params, *alone_params, *kept, *alone_params])
        for k, b, index, count, before, n, p95 in cursor.fetchall():
            if b is None:
                totals[k][int(index)] = int(count)
            elif index is None:
                p95s[(k, _as_date(b))] = float(p95)
            else:
                ranks.setdefault((k, _as_date(b)), (int(n), []))[1].append((int(index), int(count), int(before)))
    for _, rows in ranks.values():
        rows.sort()
    return totals, ranks, p95s

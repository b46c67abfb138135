"""Scheduling metrics: queue waits, the scheduling success rate, what is pending now, preemptions and evictions,
and Volcano gang starts (docs/insights.md, "Scheduling").

A request's queue wait runs from its approval to its first admission (``first_admitted_at``, falling back to
``admitted_at`` for rows that have only that, e.g. demo history): a preempted and requeued request is one row, so it
counts once, with its first wait.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.db.models import Case, CharField, Count, F, Min, Q, Sum, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from quotas import architectures
from quotas.manifests import volcano_owned
from quotas.models import Flavor
from workloads.models import RequestEvent, RequestState, WorkloadRequest

from . import rollups, sample_rollups
from .common import (PATHS, bucket, bucket_of, group_fields, is_ops, make_points, make_rows, minutes, narrow,
                     percentiles, ratio)
from .models import QueueSample, QueueSampleDay, QueueSampleHour, RequestRollup
from .rollups import admit_target_minutes
from .samples import WAITING
from .registry import Metric, Query, Result, register

S = RequestState
FIRST_ADMISSION = Coalesce("first_admitted_at", "admitted_at")
QUANTILES = (0.5, 0.95, 0.99)


def _approved_in(query: Query) -> Any:
    """Requests approved in the period (their latest approval: a restart is a new one), in scope."""
    qs = WorkloadRequest.objects.filter(approved_at__gte=query.start, approved_at__lt=query.end)
    return narrow(qs, query)


# ------------------------------------------------------------------------------------------------ queue wait
ROLLUP_NOTE = ("Percentiles over whole past days are estimated from the daily wait histograms (within one bucket, "
               "19%, of the exact figure).")


def _rollup_days(query: Query) -> list[Any]:
    """The rolled-up days this query may read (docs/insights.md, "Rollups"): ops (the rollup has no project), a
    breakdown by tenant, cluster or flavor without a project filter, daily or weekly buckets. Empty: compute live."""
    if not (is_ops(query) and query.group_by in ("tenant", "cluster", "flavor") and query.project_id is None
            and query.bucket in ("day", "week")):
        return []
    return rollups.rolled_days(query.start, query.end, target_minutes=admit_target_minutes())


def _rolled_up(query: Query, days: list[Any]) -> tuple[dict[Any, dict[str, Any]], dict[Any, dict[Any, dict[str, Any]]]]:
    """key -> totals and key -> bucket start -> totals (``reached``, ``in_time``, ``admitted``, ``started``,
    ``admit_hist``, ``start_hist``): the rolled-up days from the rollup, the rest of the period live."""
    field = PATHS[query.group_by]

    def blank() -> dict[str, Any]:
        return {"reached": 0, "in_time": 0, "admitted": 0, "started": 0,
                "admit_hist": defaultdict(int), "start_hist": defaultdict(int)}

    totals: dict[Any, dict[str, Any]] = defaultdict(blank)
    series: dict[Any, dict[Any, dict[str, Any]]] = defaultdict(lambda: defaultdict(blank))
    stored = RequestRollup.objects.filter(day__in=days)
    for name in ("cluster", "flavor", "tenant"):
        if getattr(query, f"{name}_id") is not None:
            stored = stored.filter(**{f"{name}_id": getattr(query, f"{name}_id")})
    for key, day, reached, in_time, admitted, started, admit_hist, start_hist in stored.values_list(
            field, "day", "reached", "in_time", "admitted", "started", "admit_hist", "start_hist").iterator(chunk_size=5000):
        at = bucket_of(datetime.combine(day, time(), tzinfo=UTC), query.bucket)
        for t in (totals[(key,)], series[(key,)][at]):
            t["reached"] += reached
            t["in_time"] += in_time
            t["admitted"] += admitted
            t["started"] += started
            rollups.add_into(t["admit_hist"], admit_hist)
            rollups.add_into(t["start_hist"], start_hist)
    target = timedelta(minutes=admit_target_minutes())
    live = [row for a, b in rollups.live_ranges(query.start, query.end, days)  # one range each: the index serves it
            for row in rollups.with_first(narrow(WorkloadRequest.objects.filter(approved_at__gte=a, approved_at__lt=b),
                                                 query)).values_list(field, *rollups.FIGURE_COLUMNS)]
    for key, *stamps in live:
        reached, in_time, wait, run = rollups.request_figures(*stamps, target)
        for t in (totals[(key,)], series[(key,)][bucket_of(stamps[0], query.bucket)]):
            t["reached"] += reached
            t["in_time"] += in_time
            if wait is not None:
                t["admitted"] += 1
                t["admit_hist"][rollups.bucket_index(wait)] += 1
            if run is not None:
                t["started"] += 1
                t["start_hist"][rollups.bucket_index(run)] += 1
    return totals, series


def _queue_wait_rolled(query: Query, days: list[Any]) -> tuple[dict[Any, dict[str, Any]], dict[Any, dict[Any, Any]]]:
    totals, series = _rolled_up(query, days)
    values = {}
    for key, t in totals.items():
        if not (t["admitted"] or t["started"]):
            continue
        values[key] = {"admitted": t["admitted"],
                       **{f"admit_p{q}": minutes(rollups.histogram_percentile(t["admit_hist"], q / 100))
                          for q in (50, 95, 99)},
                       **{f"start_p{q}": minutes(rollups.histogram_percentile(t["start_hist"], q / 100))
                          for q in (50, 95, 99)}}
    points: dict[Any, dict[Any, Any]] = defaultdict(dict)
    for key, buckets in series.items():
        for at, t in buckets.items():
            if t["admitted"]:
                points[key][at] = minutes(rollups.histogram_percentile(t["admit_hist"], 0.95))
    return values, points


def queue_wait(query: Query, *, in_python: bool | None = None) -> Result:
    from .common import Seconds

    by = group_fields(query.group_by)
    days = _rollup_days(query)
    if days:
        values, points = _queue_wait_rolled(query, days)
        return _queue_wait_result(query, values, points, ROLLUP_NOTE)
    base = _approved_in(query).annotate(first=FIRST_ADMISSION)
    waited = base.filter(first__isnull=False, first__gte=F("approved_at"))
    wait = Seconds("first", "approved_at")
    admit = percentiles(waited, wait, by, QUANTILES, in_python=in_python)
    started = base.filter(admitted_at__isnull=False, started_at__isnull=False, started_at__gte=F("admitted_at"))
    start = percentiles(started, Seconds("started_at", "admitted_at"), by, QUANTILES, in_python=in_python)
    values: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key in set(admit) | set(start):
        a, s = admit.get(key) or {}, start.get(key) or {}
        values[key] = {"admitted": a.get("n", 0),
                       **{f"admit_p{q}": minutes(a.get(f"p{q}")) for q in (50, 95, 99)},
                       **{f"start_p{q}": minutes(s.get(f"p{q}")) for q in (50, 95, 99)}}
    series = percentiles(waited.annotate(b=bucket("approved_at", query.bucket)), wait, [*by, "b"], (0.95,),
                         in_python=in_python)
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(dict)
    for (*key, at), v in series.items():
        points[tuple(key)][at] = minutes(v["p95"])
    return _queue_wait_result(query, values, points, "")


def _queue_wait_result(query: Query, values: dict[Any, dict[str, Any]], points: dict[Any, dict[Any, Any]],
                       note: str) -> Result:
    columns = {"admitted": ("Requests admitted", "requests")}
    for q in (50, 95, 99):
        columns[f"admit_p{q}"] = (f"Approval → admission P{q}", "minutes")
    for q in (50, 95, 99):
        columns[f"start_p{q}"] = (f"Admission → running P{q}", "minutes")
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="admit_p95", columns=columns,
                  note=(note if values else "No request approved in the period was admitted."))


# ------------------------------------------------------------------------------------------------ success rate
def scheduling_success(query: Query) -> Result:
    by = group_fields(query.group_by)
    days = _rollup_days(query)
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(dict)
    if days:  # whole past days from the rollup, the rest live: the same counts
        totals, series = _rolled_up(query, days)
        values = {key: {"queued": t["reached"], "admitted_in_time": t["in_time"], "rate": ratio(t["in_time"], t["reached"])}
                  for key, t in totals.items() if t["reached"]}
        for key, buckets in series.items():
            for at, t in buckets.items():
                if t["reached"]:
                    points[key][at] = ratio(t["in_time"], t["reached"])
    else:
        target = timedelta(minutes=admit_target_minutes())
        reached = _approved_in(query).annotate(first=FIRST_ADMISSION).filter(Q(queued_at__isnull=False) | Q(first__isnull=False))
        in_time = Q(first__isnull=False, first__lte=F("approved_at") + target)
        agg = {"total": Count("pk"), "ok": Count("pk", filter=in_time)}
        values = {tuple(r[b] for b in by): {"queued": r["total"], "admitted_in_time": r["ok"], "rate": ratio(r["ok"], r["total"])}
                  for r in reached.order_by().values(*by).annotate(**agg)}
        for r in reached.annotate(b=bucket("approved_at", query.bucket)).order_by().values(*by, "b").annotate(**agg):
            points[tuple(r[b] for b in by)][r["b"]] = ratio(r["ok"], r["total"])
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points), chart_value="rate",
                  columns={"queued": ("Approved and queued", "requests"),
                           "admitted_in_time": (f"Admitted within {admit_target_minutes()} min", "requests"),
                           "rate": ("Success rate", "%")},
                  note="" if values else "No request approved in the period reached the queue: the rate is not defined.")


# ------------------------------------------------------------------------------------------------ pending now
def pending_now(query: Query) -> Result:
    """The table is now (requests waiting for admission); the chart is the sampled history of the period."""
    by = group_fields(query.group_by)
    now = timezone.now()
    waiting = narrow(WorkloadRequest.objects.filter(WAITING), query)
    values = {}
    for r in waiting.order_by().values(*by).annotate(n=Count("pk"), demand=Sum(F("gpus") * F("replicas")),
                                                      oldest=Min(Coalesce("queued_at", "approved_at"))):
        oldest = r["oldest"]
        values[tuple(r[b] for b in by)] = {
            "pending": r["n"], "demand": r["demand"] or 0,
            "oldest_minutes": minutes((now - oldest).total_seconds()) if oldest else None}
    # The chart: closed rolled-up days (daily and weekly charts) and hours from the sample rollups (slots OR-ed per
    # day or hour), the rest from the samples; per bucket, the sum of pending_count over the distinct slots sampled.
    parts = sample_rollups.plan(query.start, query.end, query.bucket)
    sums = sample_rollups.slots_sampled(narrow(QueueSampleHour.objects.all(), query),
                                        narrow(QueueSampleDay.objects.all(), query), parts, by, query.bucket)
    if raw := parts.raw:
        samples = narrow(QueueSample.objects.filter(at__gte=query.start, at__lt=query.end), query)
        for r in (samples.filter(sample_rollups.in_ranges(raw, "at")).annotate(b=bucket("at", query.bucket)).order_by()
                  .values(*by, "b").annotate(total=Sum("pending_count"), slots=Count("at", distinct=True))):
            s = sums[tuple(r[b] for b in by)][r["b"]]
            s[0] += r["total"] or 0
            s[1] += r["slots"]
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(dict)
    for key, buckets in sums.items():
        for at, (total, slots) in buckets.items():
            points[key][at] = round(total / slots, 2) if slots else None
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="pending",
                  columns={"pending": ("Waiting now", "requests"), "demand": ("Demand waiting", "GPUs"),
                           "oldest_minutes": ("Oldest waiting for", "minutes")},
                  note="The table is now; the chart is the average number waiting per 5-minute sample.")


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


def preemptions(query: Query) -> Result:
    paths = {name: f"request__{path}" for name, path in PATHS.items()}
    by = group_fields(query.group_by, paths)
    events = narrow(RequestEvent.objects.filter(to_state=S.PREEMPTED, at__gte=query.start, at__lt=query.end), query,
                    paths, project="request__project")
    reason = Case(*[When(message__icontains=needle, then=Value(key)) for key, _, needle in REASONS]
                  + [When(message__icontains="deactivated", then=Value("stopped"))],
                  default=Value("other"), output_field=CharField())
    values: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in events.annotate(reason=reason).order_by().values(*by, "reason").annotate(n=Count("pk")):
        key = tuple(r[b] for b in by)
        row = values.setdefault(key, {"total": 0, "preemptions": 0, "evictions": 0,
                                      **{k: 0 for k, _, _ in REASONS}, "other": 0})
        row[r["reason"]] += r["n"]
        row["total"] += r["n"]
        row["preemptions" if r["reason"] in PREEMPTIONS else "evictions"] += r["n"]
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(dict)
    for r in events.annotate(b=bucket("at", query.bucket)).order_by().values(*by, "b").annotate(n=Count("pk")):
        points[tuple(r[b] for b in by)][r["b"]] = r["n"]
    columns = {"total": ("Preemptions and evictions", "count"), "preemptions": ("Preemptions", "count"),
               "evictions": ("Evictions", "count"), **{k: (title, "count") for k, title, _ in REASONS},
               "other": ("Eviction: other", "count")}
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="total", columns=columns)


# ------------------------------------------------------------------------------------------------ gangs
def volcano_flavor_ids() -> list[int]:
    """Flavors whose capacity Volcano hands out (architecture E's offline whole GPUs): training there is a gang."""
    volcano = [a for a in architectures.choices() if architectures.get(a[0]).volcano_pool]
    letters = [letter for letter, _ in volcano]
    return [f.pk for f in Flavor.objects.filter(cluster__architecture__in=letters).select_related("cluster")
            if volcano_owned(f.cluster, f)]


def gang_start(query: Query, *, in_python: bool | None = None) -> Result:
    from .common import Seconds

    by = group_fields(query.group_by)
    gangs = _approved_in(query).filter(template__kind="training", flavor_id__in=volcano_flavor_ids(),
                                       queued_at__isnull=False)
    agg = {"total": Count("pk"), "ok": Count("pk", filter=Q(started_at__isnull=False))}
    counts = {tuple(r[b] for b in by): r for r in gangs.order_by().values(*by).annotate(**agg)}
    assembled = gangs.filter(admitted_at__isnull=False, admitted_at__gte=F("queued_at"))
    times = percentiles(assembled, Seconds("admitted_at", "queued_at"), by, (0.5, 0.95), in_python=in_python)
    values = {key: {"gangs": r["total"], "started": r["ok"], "success": ratio(r["ok"], r["total"]),
                    "assemble_p50": minutes((times.get(key) or {}).get("p50")),
                    "assemble_p95": minutes((times.get(key) or {}).get("p95"))} for key, r in counts.items()}
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(dict)
    for r in gangs.annotate(b=bucket("approved_at", query.bucket)).order_by().values(*by, "b").annotate(**agg):
        points[tuple(r[b] for b in by)][r["b"]] = ratio(r["ok"], r["total"])
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="success",
                  columns={"gangs": ("Gangs queued", "jobs"), "started": ("Reached running", "jobs"),
                           "success": ("Gang start success", "%"), "assemble_p50": ("Time to assemble P50", "minutes"),
                           "assemble_p95": ("Time to assemble P95", "minutes")},
                  note="" if values else "No Volcano gang (training under architecture E) was approved in the period." + ("" if volcano_flavor_ids() else " No cluster runs architecture E now, so there are no gangs to measure."))


register(Metric("queue-wait", "scheduling", "Queue wait",
                "Minutes from approval to first admission, and from admission to running (P50/P95/P99), of requests "
                "approved in the period; a preempted and requeued request counts once.", queue_wait))
register(Metric("scheduling-success", "scheduling", "Scheduling success rate",
                "Share of requests approved in the period and queued that were admitted within "
                "INSIGHTS_ADMIT_TARGET_MINUTES (default 10) of their approval.", scheduling_success))
register(Metric("pending-now", "scheduling", "Pending now",
                "Requests waiting for admission now, their GPUs and how long the oldest has waited; the chart is the "
                "average waiting per sample.", pending_now))
register(Metric("preemptions", "scheduling", "Preemptions and evictions",
                "Times a running or admitted request lost its admission in the period, by reason.", preemptions))
register(Metric("gang-start", "scheduling", "Gang start",
                "Volcano training gangs (architecture E) approved in the period: share that reached running, and "
                "minutes from queued to the whole gang scheduled (P50/P95).", gang_start))

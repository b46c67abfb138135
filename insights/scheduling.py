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

from django.db.models import Count, DateField, F, Min, Q, Sum
from django.db.models.functions import Coalesce, Trunc
from django.utils import timezone

from portal import rollups as period
from quotas import architectures
from quotas.manifests import volcano_owned
from quotas.models import Flavor
from workloads import kinds
from workloads.models import RequestState, WorkloadRequest

from . import rollups, sample_rollups
from .common import (PATHS, bucket, bucket_of, group_fields, is_ops, make_points, make_rows, minutes, narrow,
                     percentiles, ratio)
from .models import PreemptionRollup, QueueSample, QueueSampleDay, QueueSampleHour, RequestRollup
from .rollups import PREEMPTIONS, REASONS, admit_target_minutes, preemption_events, reason_of
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


def _rolled_up(query: Query, days: list[Any], *, histograms: bool = True, in_python: bool = False
               ) -> tuple[dict[Any, dict[str, Any]], dict[Any, dict[Any, dict[str, Any]]]]:
    """key -> totals and key -> bucket start -> totals (``reached``, ``in_time``, ``admitted``, ``started``, and
    with ``histograms`` ``admit_hist`` and ``start_hist``; a bucket's ``admit_rank`` instead of its ``admit_hist``
    where the database kept only the rows around P95, or ``admit_p95`` where the bucket is one rollup row and the
    database gave that row's stored P95): the rolled-up days from the rollup (whole weeks from the week rows when
    the chart is weekly), merged by the database
    (``rollups.merged_*``; ``in_python``: every row read and merged here, the reference the tests compare with),
    the rest of the period live."""
    field = PATHS[query.group_by]

    def blank() -> dict[str, Any]:
        return {"reached": 0, "in_time": 0, "admitted": 0, "started": 0,
                "admit_hist": defaultdict(int), "start_hist": defaultdict(int)}

    totals: dict[Any, dict[str, Any]] = defaultdict(blank)
    series: dict[Any, dict[Any, dict[str, Any]]] = defaultdict(lambda: defaultdict(blank))
    target = timedelta(minutes=admit_target_minutes())
    ranges = period.live_ranges(query.start, query.end, days)

    def live_requests(a: datetime, b: datetime) -> Any:  # one range each: the index serves it
        return rollups.with_first(narrow(WorkloadRequest.objects.filter(approved_at__gte=a, approved_at__lt=b), query))

    if not (histograms or in_python):  # counts only: the live part counted by the database too
        for a, b in ranges:
            for r in (live_requests(a, b).annotate(at=bucket("approved_at", query.bucket)).order_by()
                      .values(field, "at").annotate(reached=Count("pk", filter=Q(queued_at__isnull=False)
                                                                  | Q(first__isnull=False)),
                                                    in_time=Count("pk", filter=Q(first__isnull=False,
                                                                                 first__lte=F("approved_at") + target)))):
                for t in (totals[(r[field],)], series[(r[field],)][r["at"]]):
                    t["reached"] += r["reached"]
                    t["in_time"] += r["in_time"]
    live = [] if not (histograms or in_python) else [
        row for a, b in ranges for row in live_requests(a, b).order_by().values_list(field, *rollups.FIGURE_COLUMNS)]
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
    filters = {f"{name}_id": getattr(query, f"{name}_id") for name in ("cluster", "flavor", "tenant")
               if getattr(query, f"{name}_id") is not None}
    if in_python:
        stored = RequestRollup.objects.filter(day__in=days, **filters)
        for key, day, reached, in_time, admitted, started, admit_hist, start_hist in stored.values_list(
                field, "day", "reached", "in_time", "admitted", "started", "admit_hist", "start_hist"
        ).iterator(chunk_size=5000):
            at = bucket_of(datetime.combine(day, time(), tzinfo=UTC), query.bucket)
            for t in (totals[(key,)], series[(key,)][at]):
                t["reached"] += reached
                t["in_time"] += in_time
                t["admitted"] += admitted
                t["started"] += started
                rollups.add_into(t["admit_hist"], admit_hist)
                rollups.add_into(t["start_hist"], start_hist)
        return totals, series

    def at_of(day: Any) -> datetime:
        return datetime.combine(day, time(), tzinfo=UTC)

    live_buckets = {at.date() for buckets in series.values() for at in buckets}
    weeks = (rollups.whole_weeks(days, target_minutes=admit_target_minutes()) if query.bucket == "week" else [])
    for (key, day), counts in rollups.merged_counts(field, days, query.bucket, filters, weeks).items():
        for t in (totals[(key,)], series[(key,)][at_of(day)]):
            for name, value in zip(("reached", "in_time", "admitted", "started"), counts, strict=True):
                t[name] += value
    if histograms:
        for key, hist in rollups.merged_histogram("start_hist", field, days, filters, weeks).items():
            rollups.add_into(totals[(key,)]["start_hist"], hist)
        whole, ranks, p95s = rollups.merged_rank_rows("admit_hist", field, days, query.bucket, filters, 95,
                                                      live_buckets, weeks)
        for key, hist in whole.items():
            rollups.add_into(totals[(key,)]["admit_hist"], hist)
        for (key, day), (n, rows) in ranks.items():
            t = series[(key,)][at_of(day)]
            if day in live_buckets:  # every row: the live requests add to this histogram
                rollups.add_into(t["admit_hist"], {index: count for index, count, _ in rows})
            else:
                t["admit_rank"] = (n, rows)
        for (key, day), p95 in p95s.items():  # a point of one rollup row: its stored P95
            series[(key,)][at_of(day)]["admit_p95"] = p95
    return totals, series


def _queue_wait_rolled(query: Query, days: list[Any], *, in_python: bool = False
                       ) -> tuple[dict[Any, dict[str, Any]], dict[Any, dict[Any, Any]]]:
    totals, series = _rolled_up(query, days, in_python=in_python)
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
                rank = t.get("admit_rank")
                p95 = (t["admit_p95"] if "admit_p95" in t else rollups.percentile_of_rows(rank[1], rank[0], 0.95)
                       if rank else rollups.histogram_percentile(t["admit_hist"], 0.95))
                points[key][at] = minutes(p95)
    return values, points


def queue_wait(query: Query, *, in_python: bool | None = None) -> Result:
    from .common import Seconds

    by = group_fields(query.group_by)
    days = _rollup_days(query)
    if days:
        values, points = _queue_wait_rolled(query, days, in_python=bool(in_python))
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
def scheduling_success(query: Query, *, in_python: bool = False) -> Result:
    by = group_fields(query.group_by)
    days = _rollup_days(query)
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(dict)
    if days:  # whole past days from the rollup, the rest live: the same counts
        totals, series = _rolled_up(query, days, histograms=False, in_python=in_python)
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
        for r in (samples.filter(period.in_ranges(raw, "at")).annotate(b=bucket("at", query.bucket)).order_by()
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
                  note="The table is now; the chart is the average number waiting per 5-minute sample.",
                  empty_is_zero=True)


# ------------------------------------------------------------------------------------------------ preemptions
def preemptions(query: Query) -> Result:
    """Counted per key, reason and chart bucket in one statement. Whole past days rolled up (as for queue waits:
    ops, by tenant, cluster or flavor, daily or weekly) come from ``PreemptionRollup``, the rest from the timeline."""
    paths = {name: f"request__{path}" for name, path in PATHS.items()}
    by = group_fields(query.group_by, paths)
    days = _rollup_days(query)
    events = narrow(preemption_events(query.start, query.end), query, paths, project="request__project")
    if days:
        events = events.filter(period.in_ranges(period.live_ranges(query.start, query.end, days), "at"))
    counted = [(tuple(r[b] for b in by), r["reason"], r["b"], r["n"])
               for r in events.annotate(reason=reason_of(), b=bucket("at", query.bucket)).order_by()
               .values(*by, "reason", "b").annotate(n=Count("pk"))]
    if days:
        field = PATHS[query.group_by]
        stored = PreemptionRollup.objects.filter(period.in_spans(days), **{
            f"{name}_id": getattr(query, f"{name}_id") for name in ("cluster", "flavor", "tenant")
            if getattr(query, f"{name}_id") is not None})
        counted += [((r[field],), r["reason"], datetime.combine(r["b"], time(), tzinfo=UTC), r["n"])
                    for r in stored.annotate(b=Trunc("day", query.bucket, output_field=DateField())).order_by()
                    .values(field, "reason", "b").annotate(n=Sum("count"))]
    values: dict[tuple[Any, ...], dict[str, Any]] = {}
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(dict)
    for key, reason, at, n in counted:
        row = values.setdefault(key, {"total": 0, "preemptions": 0, "evictions": 0,
                                      **{k: 0 for k, _, _ in REASONS}, "other": 0})
        row[reason] += n
        row["total"] += n
        row["preemptions" if reason in PREEMPTIONS else "evictions"] += n
        points[key][at] = points[key].get(at, 0) + n
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
    gangs = _approved_in(query).filter(template__kind__in=kinds.where(gang=True), flavor_id__in=volcano_flavor_ids(),
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


def volcano_periods() -> list[tuple[int, datetime | None, datetime | None]]:
    """(flavor, from, to) while Volcano owned the flavor's capacity: the clusters' architecture over time, from
    their applied architecture changes (before the first: its ``from_architecture``; after the last: the cluster's
    architecture now). None: open ended. A cluster that ran E and moved to F keeps its gangs in the history."""
    from types import SimpleNamespace

    from quotas.models import ArchitectureChange

    changes: dict[int, list[ArchitectureChange]] = defaultdict(list)
    for change in (ArchitectureChange.objects.filter(state=ArchitectureChange.State.APPLIED, finished_at__isnull=False)
                   .order_by("finished_at", "id")):
        changes[change.cluster_id].append(change)
    out: list[tuple[int, datetime | None, datetime | None]] = []
    for flavor in Flavor.objects.filter(kind=Flavor.Kind.WHOLE).select_related("cluster"):
        history = changes.get(flavor.cluster_id, [])
        spans: list[tuple[str, datetime | None, datetime | None]] = []
        begin: datetime | None = None
        for change in history:
            spans.append((change.from_architecture, begin, change.finished_at))
            begin = change.finished_at
        spans.append((flavor.cluster.architecture, begin, None))
        for letter, a, b in spans:
            if volcano_owned(SimpleNamespace(architecture=letter), flavor):
                out.append((flavor.pk, a, b))
    return out


def gang_start_over_time(query: Query, *, in_python: bool | None = None) -> Result:
    """``gang_start`` over the architecture each request was approved under (``volcano_periods``): training on a
    flavor while Volcano owned it was a gang, even if the cluster runs another architecture now."""
    from .common import Seconds

    periods = volcano_periods()
    if not periods:
        return gang_start(query, in_python=in_python)  # nothing was ever Volcano's: the same empty answer and note
    when = Q()
    for flavor_id, a, b in periods:
        span = Q(flavor_id=flavor_id)
        if a is not None:
            span &= Q(approved_at__gte=a)
        if b is not None:
            span &= Q(approved_at__lt=b)
        when |= span
    by = group_fields(query.group_by)
    gangs = _approved_in(query).filter(when, template__kind__in=kinds.where(gang=True), queued_at__isnull=False)
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
    now_e = bool(volcano_flavor_ids())
    note = "" if values else ("No Volcano gang (training under architecture E) was approved in the period."
                              + ("" if now_e else " No cluster runs architecture E now."))
    if values and not now_e:
        note = "Gangs from when a cluster ran architecture E (no cluster runs it now)."
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="success",
                  columns={"gangs": ("Gangs queued", "jobs"), "started": ("Reached running", "jobs"),
                           "success": ("Gang start success", "%"), "assemble_p50": ("Time to assemble P50", "minutes"),
                           "assemble_p95": ("Time to assemble P95", "minutes")}, note=note)


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
                "minutes from queued to the whole gang scheduled (P50/P95).", gang_start_over_time))

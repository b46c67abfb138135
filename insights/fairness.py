"""Fairness metrics from the queue and pool samples: quota fulfilment, guarantee violations, borrowing and
overcommit (docs/insights.md, "Fairness").

Every sample stands for its 5-minute slot (``SAMPLE_HOURS``): sums over samples are time-weighted, and a slot
without a sample (the sampler was down) counts as no data, never as zero or full. Closed hours that are rolled up
are read from the hourly rollup, closed days (for daily and weekly charts) from the daily one
(``insights/sample_rollups.py``), the rest of the period from the samples: the same answers.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count, Max, Sum

from . import sample_rollups
from .common import (OPS_ONLY_NOTE, SAMPLE_HOURS, SAMPLE_SECONDS, bucket_of, group_fields, hours, is_ops, make_points,
                     make_rows, narrow, ratio)
from .models import PoolSample, PoolSampleDay, PoolSampleHour, QueueSample, QueueSampleDay, QueueSampleHour
from .sample_rollups import GIVEN_SHARE, HAS_CAPACITY, OVER, PROMISED_SHARE, WANTING
from .registry import Metric, Query, Result, register

POOL_PATHS = {"cluster": "cluster_id", "flavor": "flavor_id"}
# A guarantee violation lasts at least this many consecutive samples (10 minutes): a single sample may catch a
# request in the seconds between its arrival and its admission.
VIOLATION_MIN_SAMPLES = 2


def _samples(query: Query) -> Any:
    return narrow(QueueSample.objects.filter(at__gte=query.start, at__lt=query.end), query)


def _queue_hours(query: Query) -> Any:
    return narrow(QueueSampleHour.objects.all(), query)


def _queue_days(query: Query) -> Any:
    return narrow(QueueSampleDay.objects.all(), query)


def _pool_samples(query: Query) -> Any:
    return narrow(PoolSample.objects.filter(at__gte=query.start, at__lt=query.end), query, POOL_PATHS)


def _pool_hours(query: Query) -> Any:
    return narrow(PoolSampleHour.objects.all(), query, POOL_PATHS)


def _pool_days(query: Query) -> Any:
    return narrow(PoolSampleDay.objects.all(), query, POOL_PATHS)


# ------------------------------------------------------------------------------------------------ fulfilment
FULFILMENT = {"n": (Count("pk"), Sum("samples"), "sum"), "wanting": (Count("pk", filter=WANTING), Sum("wanting"), "sum"),
              "share": (Sum(GIVEN_SHARE, filter=WANTING), Sum("given_share"), "sum")}


def _percent(share: Any, n: Any) -> float | None:
    avg = sample_rollups.mean(share, n)
    return None if avg is None else round(float(avg) * 100, 2)


def quota_fulfilment(query: Query) -> Result:
    by = group_fields(query.group_by)
    parts = sample_rollups.plan(query.start, query.end, query.bucket)
    series = sample_rollups.gather(_samples(query), _queue_hours(query), _queue_days(query), parts, by, query.bucket, FULFILMENT)
    values = {}
    for key, r in sample_rollups.totals(series, sample_rollups.how_of(FULFILMENT)).items():
        values[key] = {
            "fulfilment": _percent(r.get("share"), r.get("wanting")),
            "wanting_hours": hours((r.get("wanting") or 0) * SAMPLE_HOURS),
            "sampled_hours": hours((r.get("n") or 0) * SAMPLE_HOURS)}
    points = {key: {at: _percent(r.get("share"), r.get("wanting")) for at, r in buckets.items() if r.get("wanting")}
              for key, buckets in series.items()}
    points = {key: p for key, p in points.items() if p}
    defined = any(v["fulfilment"] is not None for v in values.values())
    note = "" if defined else ("No pending work in the period (or no nominal quota): fulfilment is not defined, "
                               "which is not 100%.")
    if defined and any(v["fulfilment"] is None for v in values.values()):
        note = "Empty cells: no pending work there in the period, so fulfilment is not defined (not 100%)."
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="fulfilment",
                  columns={"fulfilment": ("Quota fulfilment while waiting", "%"),
                           "wanting_hours": ("Time with pending work", "hours"),
                           "sampled_hours": ("Time sampled", "hours")}, note=note)


# ------------------------------------------------------------------------------------------------ violations
def violation_runs(query: Query) -> list[tuple[int, int, int, int, datetime, int]]:
    """Runs of consecutive violating samples of one queue (project, flavor), at least ``VIOLATION_MIN_SAMPLES``
    long: (tenant, project, cluster, flavor, start, samples), sorted. The violating 5-minute slots come from the
    samples and, for rolled-up hours, from the rollup's masks (a run may cross hours and both)."""
    parts = sample_rollups.plan(query.start, query.end, query.bucket)
    out = []
    for key, slots in sorted(sample_rollups.violating_slots(_samples(query), _queue_hours(query), _queue_days(query), parts).items()):
        for first, n in sample_rollups.runs(slots, VIOLATION_MIN_SAMPLES):
            out.append((*key, datetime.fromtimestamp(first * SAMPLE_SECONDS, tz=UTC), n))
    return out


def guarantee_violations(query: Query) -> Result:
    index = {"tenant": 0, "project": 1, "cluster": 2, "flavor": 3}
    values: dict[tuple[Any, ...], dict[str, Any]] = {}
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(lambda: defaultdict(int))
    for run in violation_runs(query):
        key = (run[1], run[2]) if query.group_by == "queue" else (run[index[query.group_by]],)
        minutes_long = run[5] * SAMPLE_SECONDS // 60
        row = values.setdefault(key, {"violations": 0, "violation_hours": 0.0, "longest_minutes": 0})
        row["violations"] += 1
        row["violation_hours"] = round(row["violation_hours"] + minutes_long / 60, 3)
        row["longest_minutes"] = max(row["longest_minutes"], minutes_long)
        points[key][bucket_of(run[4], query.bucket)] += 1
    return Result(rows=make_rows(query.group_by, values),
                  points=make_points(query.group_by, {k: dict(v) for k, v in points.items()}),
                  chart_value="violations",
                  columns={"violations": ("Guarantee violations", "count"),
                           "violation_hours": ("Time in violation", "hours"),
                           "longest_minutes": ("Longest", "minutes")},
                  note=("A violation: at least two consecutive samples where work waited, the queue was given less "
                        "than its nominal quota, and the smallest waiting request fit in the unused part."))


# ------------------------------------------------------------------------------------------------ borrowing
BORROWING = {"borrowed": (Sum("borrowed"), Sum("borrowed"), "sum"), "admitted": (Sum("admitted"), Sum("admitted"), "sum")}


def borrowing(query: Query) -> Result:
    by = group_fields(query.group_by)
    parts = sample_rollups.plan(query.start, query.end, query.bucket)
    series = sample_rollups.gather(_samples(query), _queue_hours(query), _queue_days(query), parts, by, query.bucket, BORROWING)
    values = {}
    for key, r in sample_rollups.totals(series, sample_rollups.how_of(BORROWING)).items():
        values[key] = {
            "borrowed_gpu_hours": hours((r.get("borrowed") or 0) * SAMPLE_HOURS),
            "admitted_gpu_hours": hours((r.get("admitted") or 0) * SAMPLE_HOURS),
            "borrowed_share": ratio(r.get("borrowed"), r.get("admitted"))}
    points = {key: {at: hours((r.get("borrowed") or 0) * SAMPLE_HOURS) for at, r in buckets.items()}
              for key, buckets in series.items()}
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="borrowed_gpu_hours",
                  columns={"borrowed_gpu_hours": ("Borrowed", "GPU-hours"), "admitted_gpu_hours": ("Admitted", "GPU-hours"),
                           "borrowed_share": ("Borrowed share", "%")},
                  note=("A project borrows only from its own tenant's cohort (one Kueue Cohort per tenant): grouped by "
                        "tenant, each row is a cohort. GPU-hours count the flavor's units (slices, vGPUs)."))


# ------------------------------------------------------------------------------------------------ who lent
# Each sample carries what its queue lent to the cohort at that moment (``QueueSample.lent``, computed per slot by
# ``samples.fill_lent``: the cohort's borrowed units split over its queues in proportion to their unused nominal
# quota). Lending limits are not sampled: the split assumes every queue lends all of its unused quota.


LENT = {"lent": (Sum("lent"), Sum("lent"), "sum")}


def lent_by(query: Query) -> dict[tuple[Any, ...], dict[str, float | int]]:
    """key of ``query.group_by`` -> {"lent": units x samples, "lenders": projects that lent}, from the samples and
    the hourly and daily rollups like every sample metric (a lent share is never negative, so a project lent in
    the period exactly when its sum is positive)."""
    by = group_fields(query.group_by)
    parts = sample_rollups.plan(query.start, query.end, query.bucket)
    per_project = by if "project_id" in by else [*by, "project_id"]
    series = sample_rollups.gather(_samples(query), _queue_hours(query), _queue_days(query), parts, per_project,
                                   query.bucket, LENT)
    out: dict[tuple[Any, ...], dict[str, float | int]] = {}
    for key, total in sample_rollups.totals(series, sample_rollups.how_of(LENT)).items():
        lent = Decimal(total.get("lent") or 0)
        group = out.setdefault(key[:len(by)], {"lent": 0.0, "lenders": 0})
        group["lent"] += float(lent)
        group["lenders"] += 1 if lent > 0 else 0
    return out


def borrowing_from_whom(query: Query) -> Result:
    """``borrowing`` with who lent: each group's GPU-hours lent to its cohort and how many of its projects lent.
    Grouped by project, the lenders are the rows with lent GPU-hours; the note names the biggest."""
    result = borrowing(query)
    lent = lent_by(query)
    by_key = {}
    for row in result.rows:
        key = tuple(int(p) for p in str(row.group_id).split(":")) if query.group_by == "queue" else (row.group_id,)
        by_key[key] = row
    for key, figures in lent.items():
        row = by_key.get(key)
        if row is None:  # lent without borrowing or admitting in the group: still a row
            continue
        row.values["lent_gpu_hours"] = hours(Decimal(str(figures["lent"])) * SAMPLE_HOURS)
        row.values["lending_projects"] = figures["lenders"]
    for row in result.rows:
        row.values.setdefault("lent_gpu_hours", 0.0)
        row.values.setdefault("lending_projects", 0)
    result.columns = {**result.columns, "lent_gpu_hours": ("Lent to the cohort", "GPU-hours"),
                      "lending_projects": ("Projects that lent", "projects")}
    lenders = sorted(((r.values["lent_gpu_hours"], r.group) for r in result.rows if r.values["lent_gpu_hours"]),
                     reverse=True)
    if lenders and query.group_by in ("project", "queue"):
        named = ", ".join(f"{group} {value:g}" for value, group in lenders[:5])
        result.note += f" Lent to the cohort (GPU-hours): {named}."
    return result


# ------------------------------------------------------------------------------------------------ overcommit
OVERCOMMIT = {"with_capacity": (Count("pk", filter=HAS_CAPACITY), Sum("with_capacity"), "sum"),
              "share": (Sum(PROMISED_SHARE, filter=HAS_CAPACITY), Sum("promised_share"), "sum"),
              "peak": (Max(PROMISED_SHARE, filter=HAS_CAPACITY), Max("promised_share_max"), "max"),
              "pct": (Max("overcommit_percent"), Max("overcommit_percent_max"), "max"),
              "bad": (Count("pk", filter=OVER), Sum("over"), "sum")}


def _three(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def overcommit(query: Query) -> Result:
    columns = {"ratio_avg": ("Promised / capacity (average)", "x"), "ratio_max": ("Promised / capacity (peak)", "x"),
               "allowed": ("Allowed by the overcommit setting", "x"), "violations": ("Samples in violation", "count"),
               "violation_hours": ("Time in violation", "hours")}
    if not is_ops(query):
        return Result(columns=columns, chart_value="ratio_avg", note=OPS_ONLY_NOTE)
    by = group_fields(query.group_by, POOL_PATHS)
    parts = sample_rollups.plan(query.start, query.end, query.bucket)
    series = sample_rollups.gather(_pool_samples(query), _pool_hours(query), _pool_days(query), parts, by, query.bucket, OVERCOMMIT)
    values = {}
    for key, r in sample_rollups.totals(series, sample_rollups.how_of(OVERCOMMIT)).items():
        bad = r.get("bad") or 0
        values[key] = {
            "ratio_avg": _three(sample_rollups.mean(r.get("share"), r.get("with_capacity"))),
            "ratio_max": _three(r.get("peak")),
            "allowed": round(1 + (r.get("pct") or 0) / 100, 3), "violations": bad,
            "violation_hours": hours(bad * SAMPLE_HOURS)}
    points = {key: {at: _three(sample_rollups.mean(r.get("share"), r.get("with_capacity")))
                    for at, r in buckets.items() if r.get("with_capacity")} for key, buckets in series.items()}
    points = {key: p for key, p in points.items() if p}
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="ratio_avg", columns=columns,
                  note=("Promised: the sum of the projects' nominal quotas of the flavor. A violation: admitted work "
                        "above capacity, or promises above capacity x (1 + overcommit %)."))


POOL_GROUPS = ("cluster", "flavor")

register(Metric("quota-fulfilment", "fairness", "Quota fulfilment",
                "While a queue had pending work: what it was given of what it was promised, min(admitted, nominal) / "
                "nominal, averaged over the 5-minute samples; not defined without pending work.", quota_fulfilment))
register(Metric("guarantee-violations", "fairness", "Guarantee violations",
                "Runs of 2+ consecutive samples where a queue had waiting work that fit in its unused nominal quota "
                "and was given less than nominal: how many, and for how long.", guarantee_violations))
register(Metric("borrowing", "fairness", "Borrowing",
                "GPU-hours admitted beyond nominal quota, borrowed from the tenant's cohort, and who lent them: each "
                "queue's share of its cohort's unused nominal quota while others borrowed.", borrowing_from_whom))
register(Metric("overcommit", "fairness", "Overcommit",
                "Sum of nominal quotas / capacity per flavor against the cluster's overcommit setting, and samples "
                "where admitted work exceeded capacity or promises exceeded the setting.", overcommit,
                groups=POOL_GROUPS, ops_only=True))

"""Reclaim latency (docs/insights.md, "Reclaim latency"): when a lender's workload needs quota it lent to its
cohort, how long until it gets it back.

Kueue reclaims by evicting borrowers, naming the lender only by its Workload's UID in the eviction message
("Preempted to accommodate a workload (UID: ...) due to reclamation within the cohort"). The status follower keeps
each request's Workload UID and writes a ``workloads.Reclaim`` row per such eviction, linked to the lender's request
and its run: when that run started waiting (``lender_queued_at``) and when it was admitted. One lender run may
evict several borrowers; it is one reclaim, timed to the last of them.

Reclaims are rare (a handful per lender run), so the lender runs are grouped in SQL (one row each) and the
percentiles are taken over those in Python.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Count, Max, Min

from workloads.models import Reclaim

from .common import PATHS, bucket_of, group_fields, make_points, make_rows, minutes, narrow, percentile_of
from .registry import Metric, Query, Result, register

LENDER_PATHS = {name: f"lender__{path}" for name, path in PATHS.items()}
COLUMNS = {
    "reclaims": ("Reclaims (lender runs)", "count"),
    "evictions": ("Borrowers evicted", "count"),
    "reclaim_p50": ("Waiting → borrowers evicted P50", "minutes"),
    "reclaim_p95": ("Waiting → borrowers evicted P95", "minutes"),
    "admit_p50": ("Waiting → lender admitted P50", "minutes"),
    "admit_p95": ("Waiting → lender admitted P95", "minutes"),
    "not_admitted": ("Lender not admitted (yet)", "count"),
}


def lender_runs(query: Query) -> list[dict[str, Any]]:
    """One dict per lender run that started waiting in the period and reclaimed quota: its group key values, when
    it started waiting, its last borrower eviction, its admission (or None) and how many borrowers it evicted.
    Scoped by the lender's project (a cohort is one tenant, so its borrowers are the same tenant's)."""
    rows = Reclaim.objects.filter(lender__isnull=False, lender_queued_at__gte=query.start,
                                  lender_queued_at__lt=query.end)
    rows = narrow(rows, query, LENDER_PATHS, project="lender__project")
    by = group_fields(query.group_by, LENDER_PATHS)
    return list(rows.order_by().values("lender_id", "lender_queued_at", *by).annotate(
        evictions=Count("pk"), reclaimed=Max("evicted_at"), first=Min("evicted_at"), admitted=Max("lender_admitted_at")))


def _seconds(end: Any, start: Any) -> float | None:
    if end is None or start is None or end < start:
        return None
    return (end - start).total_seconds()


def reclaim_latency(query: Query) -> Result:
    by = group_fields(query.group_by, LENDER_PATHS)
    runs = lender_runs(query)
    grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    series: dict[tuple[Any, ...], dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        key = tuple(run[b] for b in by)
        grouped[key].append(run)
        waited = _seconds(run["admitted"], run["lender_queued_at"])
        if waited is not None:
            series[key][bucket_of(run["lender_queued_at"], query.bucket)].append(waited)
    values = {}
    for key, group in grouped.items():
        to_reclaim = sorted(s for r in group if (s := _seconds(r["reclaimed"], r["lender_queued_at"])) is not None)
        to_admit = sorted(s for r in group if (s := _seconds(r["admitted"], r["lender_queued_at"])) is not None)
        values[key] = {"reclaims": len(group), "evictions": sum(r["evictions"] for r in group),
                       "reclaim_p50": minutes(percentile_of(to_reclaim, 0.5)),
                       "reclaim_p95": minutes(percentile_of(to_reclaim, 0.95)),
                       "admit_p50": minutes(percentile_of(to_admit, 0.5)),
                       "admit_p95": minutes(percentile_of(to_admit, 0.95)),
                       "not_admitted": sum(1 for r in group if r["admitted"] is None)}
    points = {key: {at: minutes(percentile_of(sorted(v), 0.95)) for at, v in buckets.items()}
              for key, buckets in series.items()}
    note = ("From when the lender's run started waiting (queued) to the eviction of the last borrower Kueue "
            "preempted for it, and to the lender's admission; grouped by the lender.")
    if not values:
        note = "No lender reclaimed quota lent to its cohort in the period (no eviction \"due to reclamation within the cohort\")."
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="admit_p95", columns=COLUMNS, note=note)


register(Metric("reclaim-latency", "fairness", "Reclaim latency",
                "When a lender needs quota it lent to its cohort: minutes from its run starting to wait to Kueue "
                "evicting the borrowers (the reclaim) and to its admission, P50/P95 over lender runs.",
                reclaim_latency))

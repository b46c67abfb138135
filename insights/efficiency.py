"""Efficiency metrics from the pool samples: GPU allocation, idle allocated GPUs and MIG fragmentation
(docs/insights.md, "Efficiency"). Pools hold every tenant's work, so these are platform ops' (``ops_only``).

A flavor is one GPU offering of one node pool (a GPU model, a sharing mode, a pool label), so "by flavor" is by pool.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

from django.db.models import Sum

from quotas.models import Flavor

from . import sample_rollups
from .common import OPS_ONLY_NOTE, SAMPLE_HOURS, group_fields, hours, is_ops, make_points, make_rows, narrow, ratio
from .models import PoolSample, PoolSampleDay, PoolSampleHour
from .registry import Metric, Query, Result, register
from .samples import profile_gpu_share

POOL_PATHS = {"cluster": "cluster_id", "flavor": "flavor_id"}
POOL_GROUPS = ("cluster", "flavor")


def _pools(query: Query) -> Any:
    return narrow(PoolSample.objects.filter(at__gte=query.start, at__lt=query.end), query, POOL_PATHS)


def _pool_hours(query: Query) -> Any:
    return narrow(PoolSampleHour.objects.all(), query, POOL_PATHS)


def _sums(query: Query, *fields: str, extra_by: tuple[str, ...] = (), mig: bool = False
          ) -> tuple[dict[tuple[Any, ...], dict[str, Any]], dict[tuple[Any, ...], dict[Any, dict[str, Any]]]]:
    """Per group, and per group and bucket: the sums of ``fields`` over the pool samples (closed rolled-up days
    from the daily rollup when the bucket is a day or a week, closed rolled-up hours from the hourly one, the rest
    from the samples; the same sums)."""
    by = group_fields(query.group_by, POOL_PATHS)
    by += [f for f in extra_by if f not in by]
    figures = {f: (Sum(f), Sum(f), "sum") for f in fields}
    samples, rollup = _pools(query), _pool_hours(query)
    daily = narrow(PoolSampleDay.objects.all(), query, POOL_PATHS)
    if mig:
        samples, rollup = samples.filter(flavor__kind=Flavor.Kind.MIG), rollup.filter(flavor__kind=Flavor.Kind.MIG)
        daily = daily.filter(flavor__kind=Flavor.Kind.MIG)
    parts = sample_rollups.plan(query.start, query.end, query.bucket)
    series = sample_rollups.gather(samples, rollup, daily, parts, by, query.bucket, figures)
    return sample_rollups.totals(series, sample_rollups.how_of(figures)), series


def gpu_allocation(query: Query) -> Result:
    columns = {"allocation": ("Allocation", "%"), "allocated_gpu_hours": ("Allocated", "GPU-hours"),
               "capacity_gpu_hours": ("Capacity", "GPU-hours")}
    if not is_ops(query):
        return Result(columns=columns, chart_value="allocation", note=OPS_ONLY_NOTE)
    totals, series = _sums(query, "allocated", "capacity")
    values = {key: {"allocation": ratio(r["allocated"], r["capacity"]),
                    "allocated_gpu_hours": hours((r["allocated"] or 0) * SAMPLE_HOURS),
                    "capacity_gpu_hours": hours((r["capacity"] or 0) * SAMPLE_HOURS)} for key, r in totals.items()}
    points = {key: {at: ratio(r["allocated"], r["capacity"]) for at, r in s.items()} for key, s in series.items()}
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="allocation", columns=columns,
                  note="Admitted GPU-hours / capacity GPU-hours, from the 5-minute pool samples (in the flavor's unit).")


def idle_allocated(query: Query) -> Result:
    columns = {"idle_gpu_hours": ("Allocated but idle", "GPU-hours"), "idle_share": ("Share of allocated", "%"),
               "allocated_gpu_hours": ("Allocated", "GPU-hours")}
    if not is_ops(query):
        return Result(columns=columns, chart_value="idle_gpu_hours", note=OPS_ONLY_NOTE)
    totals, series = _sums(query, "idle_allocated", "allocated")
    values = {key: {"idle_gpu_hours": hours((r["idle_allocated"] or 0) * SAMPLE_HOURS),
                    "idle_share": ratio(r["idle_allocated"], r["allocated"]),
                    "allocated_gpu_hours": hours((r["allocated"] or 0) * SAMPLE_HOURS)} for key, r in totals.items()}
    points = {key: {at: hours((r["idle_allocated"] or 0) * SAMPLE_HOURS) for at, r in s.items()}
              for key, s in series.items()}
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="idle_gpu_hours", columns=columns,
                  note=("Idle: running notebooks past their template's idle timeout. Inference has no traffic signal "
                        "yet and counts as busy."))


def mig_fragmentation(query: Query) -> Result:
    columns = {"mismatch_share": ("Pending demand blocked by slice shape", "%"),
               "mismatch_slice_hours": ("Blocked", "slice-hours"), "mismatch_gpu_hours": ("Blocked", "GPU-hours"),
               "pending_slice_hours": ("Pending", "slice-hours")}
    if not is_ops(query):
        return Result(columns=columns, chart_value="mismatch_share", note=OPS_ONLY_NOTE)
    by = group_fields(query.group_by, POOL_PATHS)
    # Summed per flavor; a flavor's slices become GPU-hours by its profile's compute share.
    per_flavor, series = _sums(query, "shape_mismatch", "pending", extra_by=("flavor_id",), mig=True)
    profiles = dict(Flavor.objects.filter(pk__in={key[-1] for key in per_flavor}).values_list("pk", "mig_profile"))
    width = len(by)
    values: dict[tuple[Any, ...], dict[str, Any]] = {}
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(dict)
    for key, r in per_flavor.items():
        row = values.setdefault(key[:width], {"mismatch": Decimal(0), "pending": Decimal(0), "gpu": Decimal(0)})
        row["mismatch"] += r.get("shape_mismatch") or 0
        row["pending"] += r.get("pending") or 0
        row["gpu"] += (r.get("shape_mismatch") or 0) * profile_gpu_share(profiles.get(key[-1], ""))
    sums: dict[tuple[Any, ...], dict[Any, list[Decimal]]] = defaultdict(lambda: defaultdict(lambda: [Decimal(0), Decimal(0)]))
    for key, buckets in series.items():
        for at, r in buckets.items():
            s = sums[key[:width]][at]
            s[0] += r.get("shape_mismatch") or 0
            s[1] += r.get("pending") or 0
    for key, buckets in sums.items():
        for at, (mismatch, pending) in buckets.items():
            points[key][at] = ratio(mismatch, pending)
    rows = {key: {"mismatch_share": ratio(v["mismatch"], v["pending"]),
                  "mismatch_slice_hours": hours(v["mismatch"] * SAMPLE_HOURS),
                  "mismatch_gpu_hours": hours(v["gpu"] * SAMPLE_HOURS),
                  "pending_slice_hours": hours(v["pending"] * SAMPLE_HOURS)} for key, v in values.items()}
    return Result(rows=make_rows(query.group_by, rows), points=make_points(query.group_by, points),
                  chart_value="mismatch_share", columns=columns,
                  note=("Blocked by shape: waiting MIG slices no free slice of their profile could take although the "
                        "pool's free slice memory would have held them. Not defined without pending MIG demand."))


register(Metric("gpu-allocation", "efficiency", "GPU allocation",
                "Admitted GPU-hours / capacity GPU-hours per flavor (pool) and cluster, from the pool samples.",
                gpu_allocation, groups=POOL_GROUPS, ops_only=True))
register(Metric("idle-allocated", "efficiency", "Idle allocated GPUs",
                "GPU-hours allocated to notebooks idle past their timeout (inference: no traffic signal, counted busy).",
                idle_allocated, groups=POOL_GROUPS, ops_only=True))
register(Metric("mig-fragmentation", "efficiency", "MIG fragmentation",
                "Share of pending MIG-slice demand (and its GPU-hours) that no free slice of its profile could take "
                "although the pool's free slice memory would have been enough.", mig_fragmentation,
                groups=POOL_GROUPS, ops_only=True))

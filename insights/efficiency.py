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

from .common import OPS_ONLY_NOTE, SAMPLE_HOURS, bucket, group_fields, hours, is_ops, make_points, make_rows, narrow, ratio
from .models import PoolSample
from .registry import Metric, Query, Result, register
from .samples import profile_gpu_share

POOL_PATHS = {"cluster": "cluster_id", "flavor": "flavor_id"}
POOL_GROUPS = ("cluster", "flavor")


def _pools(query: Query) -> Any:
    return narrow(PoolSample.objects.filter(at__gte=query.start, at__lt=query.end), query, POOL_PATHS)


def _sums(query: Query, *fields: str) -> tuple[dict[tuple[Any, ...], dict[str, Any]], dict[tuple[Any, ...], dict[Any, dict[str, Any]]]]:
    """Per group, and per group and bucket: the sums of ``fields`` over the pool samples."""
    by = group_fields(query.group_by, POOL_PATHS)
    samples = _pools(query)
    agg = {f: Sum(f) for f in fields}
    totals = {tuple(r[b] for b in by): r for r in samples.order_by().values(*by).annotate(**agg)}
    series: dict[tuple[Any, ...], dict[Any, dict[str, Any]]] = defaultdict(dict)
    for r in samples.annotate(b=bucket("at", query.bucket)).order_by().values(*by, "b").annotate(**agg):
        series[tuple(r[b] for b in by)][r["b"]] = r
    return totals, series


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
    samples = _pools(query).filter(flavor__kind=Flavor.Kind.MIG)
    # Summed per flavor in the database; a flavor's slices become GPU-hours by its profile's compute share.
    per_flavor = samples.order_by().values(*by, "flavor_id", "flavor__mig_profile").annotate(
        mismatch=Sum("shape_mismatch"), pending=Sum("pending"))
    values: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in per_flavor:
        key = tuple(r[b] for b in by)
        row = values.setdefault(key, {"mismatch": Decimal(0), "pending": Decimal(0), "gpu": Decimal(0)})
        row["mismatch"] += r["mismatch"] or 0
        row["pending"] += r["pending"] or 0
        row["gpu"] += (r["mismatch"] or 0) * profile_gpu_share(r["flavor__mig_profile"])
    rows = {key: {"mismatch_share": ratio(v["mismatch"], v["pending"]),
                  "mismatch_slice_hours": hours(v["mismatch"] * SAMPLE_HOURS),
                  "mismatch_gpu_hours": hours(v["gpu"] * SAMPLE_HOURS),
                  "pending_slice_hours": hours(v["pending"] * SAMPLE_HOURS)} for key, v in values.items()}
    points: dict[tuple[Any, ...], dict[Any, Any]] = defaultdict(dict)
    for r in (samples.annotate(b=bucket("at", query.bucket)).order_by().values(*by, "b")
              .annotate(mismatch=Sum("shape_mismatch"), pending=Sum("pending"))):
        points[tuple(r[b] for b in by)][r["b"]] = ratio(r["mismatch"], r["pending"])
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

"""Cost metrics: spend by tenant / project / flavor next to the GPU-hours used, and the cost of a GPU-hour actually
used (docs/insights.md, "Cost"). Both come from billing's metered usage and its one summing pass
(``billing.costs.cost_and_usage``: PostgreSQL sums in SQL, SQLite in Python), so they match the cost views.

GPU-hours used are GPU-equivalents: whole GPUs count 1, a MIG slice its profile's compute share (``3g.40gb``: 3/7),
HAMi compute its cores percent / 100. Charts are daily at the finest (an ``hour`` bucket is drawn per day).
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

from billing import costs, selectors
from billing.models import UsageInterval
from quotas.models import Flavor

from .common import bucket_of, make_points, make_rows, narrow, ratio
from .registry import Metric, Query, Result, register
from .samples import profile_gpu_share

PATHS = {"cluster": "cluster_id", "flavor": "request__flavor_id", "tenant": "tenant_id", "project": "project_id"}
# The billing groups each breakdown is summed by (cluster and queue are derived from the flavor's cluster).
BILLING_BY = {"tenant": ("tenant",), "project": ("project",), "flavor": ("flavor",), "cluster": ("flavor",),
              "queue": ("project", "flavor")}


def gpu_equivalent(unit: str, key: str) -> Decimal:
    if unit == "gpu":
        return Decimal(1)
    if unit == "mig":
        return profile_gpu_share(key)
    if unit == "hami_cores":
        return Decimal("0.01")
    return Decimal(0)


def _summed(query: Query) -> tuple[dict[tuple[Any, ...], dict[Any, dict[str, Decimal]]], list[str]]:
    """group key -> day -> {"cost", "gpu_hours"} over the period, in scope."""
    intervals = narrow(UsageInterval.objects.all(), query, PATHS)
    by = BILLING_BY[query.group_by]
    cost_rows, usage_rows = costs.cost_and_usage(intervals, since=query.start, until=query.end, by=(*by, "day"))
    cluster_of: dict[int, int] = {}
    if query.group_by in ("cluster", "queue"):
        ids = {r["flavor"] for r in [*cost_rows, *usage_rows]}
        cluster_of = dict(Flavor.objects.filter(pk__in=ids).values_list("pk", "cluster_id"))

    def key_of(r: dict[str, Any]) -> tuple[Any, ...]:
        if query.group_by == "cluster":
            return (cluster_of.get(r["flavor"]),)
        if query.group_by == "queue":
            return (r["project"], cluster_of.get(r["flavor"]))
        return (r[by[0]],)

    out: dict[tuple[Any, ...], dict[Any, dict[str, Decimal]]] = defaultdict(
        lambda: defaultdict(lambda: {"cost": Decimal(0), "gpu_hours": Decimal(0)}))
    for r in cost_rows:
        out[key_of(r)][r["day"]]["cost"] += r["cost"]
    for r in usage_rows:
        out[key_of(r)][r["day"]]["gpu_hours"] += r["hours"] * gpu_equivalent(r["unit"], r["key"])
    return out, list(by)


def _by_bucket(days: dict[Any, dict[str, Decimal]], size: str) -> dict[Any, dict[str, Decimal]]:
    out: dict[Any, dict[str, Decimal]] = defaultdict(lambda: {"cost": Decimal(0), "gpu_hours": Decimal(0)})
    for day, v in days.items():
        at = bucket_of(day, "week" if size == "week" else "day")
        out[at]["cost"] += v["cost"]
        out[at]["gpu_hours"] += v["gpu_hours"]
    return out


def _money(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.01"))


def spend(query: Query) -> Result:
    summed, _ = _summed(query)
    total = sum((v["cost"] for days in summed.values() for v in days.values()), Decimal(0))
    values = {}
    points: dict[tuple[Any, ...], dict[Any, Any]] = {}
    for key, days in summed.items():
        cost = sum((v["cost"] for v in days.values()), Decimal(0))
        used = sum((v["gpu_hours"] for v in days.values()), Decimal(0))
        values[key] = {"cost": _money(cost), "gpu_hours": round(float(used), 3), "share": ratio(cost, total)}
        points[key] = {at: _money(v["cost"]) for at, v in _by_bucket(days, query.bucket).items()}
    currency = selectors.currency()
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="cost",
                  columns={"cost": ("Spend", currency), "gpu_hours": ("GPU-hours used", "GPU-hours"),
                           "share": ("Share of spend", "%")},
                  note="" if values else "No metered usage in the period.")


def cost_per_gpu_hour(query: Query) -> Result:
    summed, _ = _summed(query)
    values = {}
    points: dict[tuple[Any, ...], dict[Any, Any]] = {}

    def per(cost: Decimal, used: Decimal) -> Decimal | None:
        return None if not used else _money(cost / used)

    for key, days in summed.items():
        cost = sum((v["cost"] for v in days.values()), Decimal(0))
        used = sum((v["gpu_hours"] for v in days.values()), Decimal(0))
        values[key] = {"per_gpu_hour": per(cost, used), "cost": _money(cost), "gpu_hours": round(float(used), 3)}
        points[key] = {at: per(v["cost"], v["gpu_hours"]) for at, v in _by_bucket(days, query.bucket).items()}
    currency = selectors.currency()
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="per_gpu_hour",
                  columns={"per_gpu_hour": ("Cost per GPU-hour used", currency), "cost": ("Spend", currency),
                           "gpu_hours": ("GPU-hours used", "GPU-hours")},
                  note="Not defined where no GPU-hour was used (CPU-only spend).")


register(Metric("spend", "cost", "Spend",
                "What metered usage cost in the period (billing's prices and discounts), next to the GPU-hours used.",
                spend))
register(Metric("cost-per-gpu-hour", "cost", "Cost per GPU-hour",
                "Spend / GPU-hours actually used (admitted runs as metered; a MIG slice counts its share of a GPU).",
                cost_per_gpu_hour))

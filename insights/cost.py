"""Cost metrics: spend by tenant / project / flavor next to the GPU-hours used, and the cost of a GPU-hour actually
used (docs/insights.md, "Cost"). Both come from billing's metered usage and its one summing pass
(``billing.costs.cost_and_usage``: PostgreSQL sums in SQL, SQLite in Python), so they match the cost views.

GPU-hours used are GPU-equivalents: whole GPUs count 1, a MIG slice its profile's compute share (``3g.40gb``: 3/7),
HAMi compute its cores percent / 100. Charts are daily at the finest (an ``hour`` bucket is drawn per day).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, time
from decimal import Decimal
from typing import Any

from django.db.models import DateField, Sum
from django.db.models.functions import Trunc

from billing import costs, selectors
from billing import rollup as cost_rollup
from billing.models import CostRollup, UsageInterval
from billing.pricing import HOUR
from portal import rollups as period
from quotas.models import Flavor

from . import memo
from .common import bucket_of, make_points, make_rows, narrow, ratio
from .registry import Metric, Query, Result, register
from .samples import profile_gpu_share

PATHS = {"cluster": "cluster_id", "flavor": "request__flavor_id", "tenant": "tenant_id", "project": "project_id"}
ROLLUP_PATHS = {"cluster": "cluster_id", "flavor": "flavor_id", "tenant": "tenant_id", "project": "project_id"}
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


def _summed(query: Query, *, rollup: bool = True) -> dict[tuple[Any, ...], dict[datetime, dict[str, Decimal]]]:
    """group key -> chart bucket (day, or week for ``week``) -> {"cost", "gpu_hours"} over the period, in scope.

    Whole closed days that billing's cost rollup holds (``billing.rollup``) are summed from it in the database;
    the rest of the period (today, partial first and last days, days not rolled up) is computed live by billing's
    summing pass. ``rollup=False``: everything live (the direct computation the rollup must equal). Spend and cost
    per GPU-hour of one overview or report share it (``memo.one_page``); the result is only read."""
    key = ("cost-summed", rollup, id(query.scope), *(getattr(query, f) for f in (
        "start", "end", "group_by", "bucket", "cluster_id", "flavor_id", "tenant_id", "project_id")))
    return memo.remembered(key, lambda: (query.scope, _summed_now(query, rollup=rollup)))[1]


def _summed_now(query: Query, *, rollup: bool) -> dict[tuple[Any, ...], dict[datetime, dict[str, Decimal]]]:
    size = "week" if query.bucket == "week" else "day"
    by = BILLING_BY[query.group_by]
    days = cost_rollup.rolled_days(query.start, query.end) if rollup else []
    intervals = narrow(UsageInterval.objects.all(), query, PATHS)
    out: dict[tuple[Any, ...], dict[datetime, dict[str, Decimal]]] = defaultdict(
        lambda: defaultdict(lambda: {"cost": Decimal(0), "gpu_hours": Decimal(0)}))
    cost_rows: list[dict[str, Any]] = []
    usage_rows: list[dict[str, Any]] = []
    for since, until in period.live_ranges(query.start, query.end, days):
        c, u = costs.cost_and_usage(intervals, since=since, until=until, by=(*by, "day"))
        cost_rows += c
        usage_rows += u
    rolled: list[tuple[Any, ...]] = []
    if days:
        rolled = list(narrow(CostRollup.objects.filter(cost_rollup.in_days(days)), query, ROLLUP_PATHS)
                      .annotate(at=Trunc("day", size, output_field=DateField())).order_by()
                      .values_list(*by, "at", "unit", "key").annotate(cost=Sum("cost"), seconds=Sum("unit_seconds")))
    cluster_of: dict[int, int] = {}
    if query.group_by in ("cluster", "queue"):
        ids = {r["flavor"] for r in [*cost_rows, *usage_rows]} | {row[by.index("flavor")] for row in rolled}
        cluster_of = dict(Flavor.objects.filter(pk__in=ids).values_list("pk", "cluster_id"))

    def key_of(r: dict[str, Any]) -> tuple[Any, ...]:
        if query.group_by == "cluster":
            return (cluster_of.get(r["flavor"]),)
        if query.group_by == "queue":
            return (r["project"], cluster_of.get(r["flavor"]))
        return (r[by[0]],)

    for r in cost_rows:
        out[key_of(r)][bucket_of(r["day"], size)]["cost"] += r["cost"]
    for r in usage_rows:
        out[key_of(r)][bucket_of(r["day"], size)]["gpu_hours"] += r["hours"] * gpu_equivalent(r["unit"], r["key"])
    # The rolled-up days, already per bucket (tens of thousands of rows over a year: one pass, no dicts per row).
    starts: dict[Any, datetime] = {}
    shares: dict[tuple[str, str], Decimal] = {}
    width = len(by)
    for row in rolled:
        at, unit, unit_key, cost, seconds = row[width:]
        when = starts.get(at)
        if when is None:
            when = starts[at] = datetime.combine(at, time(), tzinfo=UTC)
        share = shares.get((unit, unit_key))
        if share is None:
            share = shares[(unit, unit_key)] = gpu_equivalent(unit, unit_key)
        group = row[:1] if query.group_by in ("tenant", "project", "flavor") else key_of(dict(zip(by, row[:width], strict=True)))
        cell = out[group][when]
        cell["cost"] += cost
        cell["gpu_hours"] += seconds / HOUR * share
    return out


def _money(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.01"))


def spend(query: Query, *, rollup: bool = True) -> Result:
    summed = _summed(query, rollup=rollup)
    total = sum((v["cost"] for days in summed.values() for v in days.values()), Decimal(0))
    values = {}
    points: dict[tuple[Any, ...], dict[Any, Any]] = {}
    for key, days in summed.items():
        cost = sum((v["cost"] for v in days.values()), Decimal(0))
        used = sum((v["gpu_hours"] for v in days.values()), Decimal(0))
        values[key] = {"cost": _money(cost), "gpu_hours": round(float(used), 3), "share": ratio(cost, total)}
        points[key] = {at: _money(v["cost"]) for at, v in days.items()}
    currency = selectors.currency()
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="cost",
                  columns={"cost": ("Spend", currency), "gpu_hours": ("GPU-hours used", "GPU-hours"),
                           "share": ("Share of spend", "%")},
                  note="" if values else "No metered usage in the period.")


def cost_per_gpu_hour(query: Query, *, rollup: bool = True) -> Result:
    summed = _summed(query, rollup=rollup)
    values = {}
    points: dict[tuple[Any, ...], dict[Any, Any]] = {}

    def per(cost: Decimal, used: Decimal) -> Decimal | None:
        return None if not used else _money(cost / used)

    for key, days in summed.items():
        cost = sum((v["cost"] for v in days.values()), Decimal(0))
        used = sum((v["gpu_hours"] for v in days.values()), Decimal(0))
        values[key] = {"per_gpu_hour": per(cost, used), "cost": _money(cost), "gpu_hours": round(float(used), 3)}
        points[key] = {at: per(v["cost"], v["gpu_hours"]) for at, v in days.items()}
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

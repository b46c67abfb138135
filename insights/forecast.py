"""Capacity forecast: each pool's demand trend against its capacity, and when it runs short at that trend
(docs/insights.md, "Capacity forecast").

**Daily figures** over the last ``INSIGHTS_FORECAST_WEEKS`` weeks (default 8) of whole UTC days before the period's
end (today excluded: it is not over), per pool (a flavor: one GPU offering of one node pool) or per cluster (its
pools added up):

* capacity, allocated and waiting: the day's mean over the 5-minute pool samples (``PoolSample``: ready, present
  capacity; units held by admitted work; units waiting for admission), read through the sample rollups
  (``sample_rollups.gather``, the same sums as the samples); queued GPU-hours: the waiting units times 5 minutes;
* promised: the projects' nominal quotas. The rollups keep the promised / capacity share per sample, so the day's
  mean is read back as (mean share) x (mean capacity of the samples with capacity): exact while capacity is
  steady within the day, an approximation on a day it changed;
* measured: mean busy GPUs (DCGM utilisation x allocated devices, ``MeasuredSample``), from the pool's first
  measured day in the window on (a day without a sample after that counts 0: nothing ran).

**Demand** is allocated + waiting: what the pool was asked to hold. Each series gets an ordinary least-squares line
(x: days since the window's first day, y: the day's figure); its value at the window's end is "now" and its slope
the growth. The pool **runs short** where the demand line reaches today's capacity: ``(capacity - a) / b`` days,
when the slope ``b`` is positive (0: already short); the same for the promised and the measured lines.

Tenant admins (and ops filtering on a tenant or a project, or breaking down by project) see shares instead of the
pools: the queues' nominal quota is the capacity, admitted + waiting the demand (``QueueSample``), so "runs short" is
the day that demand outgrows its guarantee and relies on borrowing; per flavor, or per project (a tenant's pages
default to it).

Limits (said on the page too): a straight line, so no seasonality or step changes (a new project, a planned
purchase); waiting demand may be counted again by a resubmission; the units are the flavor's (GPUs, MIG slices or
vGPUs); fewer than ``MIN_DAYS`` days of figures give no trend, and a date beyond ``HORIZON_DAYS`` is not given.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, FloatField, Sum
from django.utils import timezone

from quotas.models import Flavor

from . import sample_rollups
from .common import SAMPLE_HOURS, bucket, is_ops, labels, narrow
from .models import MeasuredSample, PoolSample, PoolSampleDay, PoolSampleHour, QueueSample
from .registry import Metric, Point, Query, Result, Row, register
from .sample_rollups import HAS_CAPACITY, PROMISED_SHARE

POOL_PATHS = {"cluster": "cluster_id", "flavor": "flavor_id"}
GROUPS = ("flavor", "cluster", "project")  # the pools first: what ops look at
DAY = timedelta(days=1)
MIN_DAYS = 14  # fewer daily figures than two weeks: no trend
HORIZON_DAYS = 730  # a crossing further out than two years is not given
CHART_AHEAD_DAYS = 28  # the chart draws the trend this far past the window (or to the crossing, if sooner)
METHOD = ("Method: per day, the mean of the 5-minute samples; demand = allocated + waiting. A least-squares straight "
          "line through the last {weeks} weeks of daily figures (today excluded); \"runs short\" is where the demand "
          "line reaches today's capacity. Limits: a straight line (no seasonality, no step changes such as a new "
          "project or a purchase); units are the flavor's (GPUs, MIG slices, vGPUs); at least {min_days} days of "
          "figures are needed; dates more than {horizon} days out are not given.")


def forecast_weeks() -> int:
    """``INSIGHTS_FORECAST_WEEKS`` (default 8): how many weeks of daily figures the trend is fitted to."""
    return max(int(getattr(settings, "INSIGHTS_FORECAST_WEEKS", 8)), 1)


# ------------------------------------------------------------------------------------------------ the trend
@dataclass(frozen=True)
class Trend:
    """``y = intercept + slope * x`` (x in days since the window's first day), fitted to ``n`` daily figures."""

    slope: float
    intercept: float
    n: int

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit(points: list[tuple[float, float]]) -> Trend | None:
    """The ordinary least-squares line through ``points`` (x, y); None for fewer than ``MIN_DAYS`` of them."""
    n = len(points)
    if n < MIN_DAYS:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if not sxx:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return Trend(slope=slope, intercept=my - slope * mx, n=n)


def days_until(trend: Trend | None, level: float | None, today: float) -> float | None:
    """Days from ``today`` (x) until ``trend`` reaches ``level``: 0 when it is there already, None when it does not
    rise, there is no level, or it is more than ``HORIZON_DAYS`` away."""
    if trend is None or level is None:
        return None
    if trend.at(today) >= level:
        return 0.0
    if trend.slope <= 0:
        return None
    # To a hundredth of a day: the figures are kept to thousandths, so the crossing is not finer than that.
    days = round((level - trend.intercept) / trend.slope - today, 2)
    return days if days <= HORIZON_DAYS else None


# ------------------------------------------------------------------------------------------------ daily figures
Daily = dict[Any, dict[datetime, dict[str, float]]]  # flavor id -> day -> figures


def window(query: Query, now: datetime | None = None) -> tuple[datetime, datetime]:
    """[first day, end): the last ``forecast_weeks()`` whole UTC days before the period's end, today excluded."""
    today = (now or timezone.now()).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    end = min(query.end.astimezone(UTC), today)
    end = end.replace(hour=0, minute=0, second=0, microsecond=0)
    return end - timedelta(weeks=forecast_weeks()), end


def _f(value: Any) -> float:
    return float(value or 0)


def _pool_days(query: Query, start: datetime, end: datetime) -> Daily:
    """Per flavor and day: mean capacity, allocated, waiting and promised units, and queued unit-hours."""
    figures = {
        "n": (Count("pk"), Sum("samples"), "sum"),
        "capacity": (Sum("capacity"), Sum("capacity"), "sum"),
        "allocated": (Sum("allocated"), Sum("allocated"), "sum"),
        "pending": (Sum("pending"), Sum("pending"), "sum"),
        "with_capacity": (Count("pk", filter=HAS_CAPACITY), Sum("with_capacity"), "sum"),
        "promised_share": (Sum(PROMISED_SHARE, filter=HAS_CAPACITY), Sum("promised_share"), "sum"),
    }
    samples = narrow(PoolSample.objects.filter(at__gte=start, at__lt=end), query, POOL_PATHS)
    hours = narrow(PoolSampleHour.objects.all(), query, POOL_PATHS)
    days = narrow(PoolSampleDay.objects.all(), query, POOL_PATHS)
    parts = sample_rollups.plan(start, end, "day")
    series = sample_rollups.gather(samples, hours, days, parts, ["flavor_id"], "day", figures)
    out: Daily = defaultdict(dict)
    for (flavor_id,), buckets in series.items():
        for at, r in buckets.items():
            n, with_capacity = _f(r.get("n")), _f(r.get("with_capacity"))
            if not n:
                continue
            promised = (_f(r.get("promised_share")) / with_capacity) * (_f(r.get("capacity")) / with_capacity) \
                if with_capacity else None
            out[flavor_id][at] = {"capacity": _f(r.get("capacity")) / n, "allocated": _f(r.get("allocated")) / n,
                                  "pending": _f(r.get("pending")) / n, "promised": promised,
                                  "queued_hours": _f(r.get("pending")) * float(SAMPLE_HOURS)}
    return out


def _share_days(query: Query, start: datetime, end: datetime, field: str = "flavor_id") -> Daily:
    """A tenant's (or a project's) share per flavor (or ``field``) and day, from its queue samples: nominal quota as
    capacity."""
    qs = narrow(QueueSample.objects.filter(at__gte=start, at__lt=end), query)
    out: Daily = defaultdict(dict)
    for r in (qs.annotate(b=bucket("at", "day")).order_by().values(field, "b")
              .annotate(slots=Count("at", distinct=True), s_nominal=Sum("nominal"), s_admitted=Sum("admitted"),
                        s_pending=Sum("pending"))):
        slots = r["slots"]
        if not slots:
            continue
        nominal = _f(r["s_nominal"]) / slots
        out[r[field]][r["b"]] = {"capacity": nominal, "promised": nominal,
                                       "allocated": _f(r["s_admitted"]) / slots, "pending": _f(r["s_pending"]) / slots,
                                       "queued_hours": _f(r["s_pending"]) * float(SAMPLE_HOURS)}
    return out


def _measured_days(query: Query, start: datetime, end: datetime, field: str = "flavor_id") -> Daily:
    """Per flavor (or ``field``) and day: mean busy devices measured (DCGM utilisation x allocated devices, over the
    day)."""
    qs = narrow(MeasuredSample.objects.filter(at__gt=start, at__lte=end), query)
    busy = Sum(F("util_avg") * F("gpus") * F("seconds"), output_field=FloatField())
    out: Daily = defaultdict(dict)
    for r in qs.annotate(b=bucket("at", "day")).order_by().values(field, "b").annotate(busy=busy):
        if r["b"] < end:
            out[r[field]][r["b"]] = {"measured": _f(r["busy"]) / 100 / 86400}
    return out


def _grouped(daily: Daily, group_of: dict[Any, Any]) -> Daily:
    """Flavors' daily figures added up per group (a figure missing on a flavor's day adds nothing)."""
    out: Daily = defaultdict(lambda: defaultdict(dict))
    for flavor_id, days in daily.items():
        key = group_of.get(flavor_id)
        if key is None:
            continue
        for at, figures in days.items():
            into = out[key][at]
            for name, value in figures.items():
                if value is None:
                    into.setdefault(name, None)
                else:
                    into[name] = (into.get(name) or 0.0) + value
    return out


# ------------------------------------------------------------------------------------------------ the metric
def _x(at: datetime, start: datetime) -> float:
    return (at - start) / DAY


def _r(value: float | None, places: int = 2) -> float | None:
    return None if value is None else round(value, places)


def _date(start: datetime, today: float, days: float | None) -> date | None:
    return None if days is None else (start + timedelta(days=today + days)).date()


def capacity_forecast(query: Query, *, now: datetime | None = None) -> Result:
    by = query.group_by if query.group_by in GROUPS else "flavor"
    share = not is_ops(query) or query.tenant_id is not None or query.project_id is not None or by == "project"
    columns = {
        "capacity": ("Your nominal quota" if share else "Capacity", "GPUs"),
        **({} if share else {"promised": ("Promised (nominal quotas)", "GPUs")}),
        "allocated": ("Allocated (last day)", "GPUs"),
        "queued_gpu_hours": ("Queued, last 7 days", "GPU-hours"),
        "measured": ("Measured use (last day)", "GPUs"),
        "demand_now": ("Demand now (trend)", "GPUs"),
        "growth_per_week": ("Demand growth", "GPUs/week"),
        "days_to_short": ("Demand outgrows the quota in" if share else "Runs short in", "days"),
        **({} if share else {"promised_days": ("Promised passes capacity in", "days")}),
        "measured_days": ("Measured use reaches it in" if share else "Measured use reaches capacity in", "days"),
    }
    start, end = window(query, now)
    weeks = forecast_weeks()
    method = METHOD.format(weeks=weeks, min_days=MIN_DAYS, horizon=HORIZON_DAYS)
    if share:
        method = ("Your share: your queues' nominal quota stands for the capacity, their admitted + waiting units for "
                  "the demand. ") + method
    field = "project_id" if by == "project" else "flavor_id"
    daily = _share_days(query, start, end, field) if share else _pool_days(query, start, end)
    measured = _measured_days(query, start, end, field)
    ids = set(daily) | set(measured)  # flavors, or projects
    if by == "cluster":
        group_of = {pk: (cluster,) for pk, cluster in Flavor.objects.filter(pk__in=ids).values_list("pk", "cluster_id")}
    else:
        group_of = {pk: (pk,) for pk in ids}
    groups, busy = _grouped(daily, group_of), _grouped(measured, group_of)
    today = _x(end, start)
    named = labels(by, set(groups) | set(busy))
    rows: list[Row] = []
    points: list[Point] = []
    shorts: list[str] = []
    for key in sorted(set(groups) | set(busy), key=lambda k: named[k][0]):
        label, group_id = named[key]
        days = sorted(groups.get(key, {}).items())
        demand = [(_x(at, start), f["allocated"] + f["pending"]) for at, f in days]
        trend = fit(demand)
        capacity = days[-1][1]["capacity"] if days else None
        promised_points = [(_x(at, start), f["promised"]) for at, f in days if f.get("promised") is not None]
        measured_days = sorted(busy.get(key, {}).items())
        measured_points: list[tuple[float, float]] = []
        if measured_days:  # from its first measured day on; a day without a sample after that: nothing ran
            seen = {at: f["measured"] for at, f in measured_days}
            at = measured_days[0][0]
            while at < end:
                measured_points.append((_x(at, start), seen.get(at, 0.0)))
                at += DAY
        short = days_until(trend, capacity, today)
        values = {
            "capacity": _r(capacity),
            **({} if share else {"promised": _r(promised_points[-1][1]) if promised_points else None}),
            "allocated": _r(days[-1][1]["allocated"]) if days else None,
            "queued_gpu_hours": round(sum(f["queued_hours"] for at, f in days if at >= end - timedelta(days=7)), 3),
            "measured": _r(measured_points[-1][1]) if measured_points else None,
            "demand_now": _r(trend.at(today)) if trend else None,
            "growth_per_week": _r(trend.slope * 7) if trend else None,
            "days_to_short": _r(short, 1),
            **({} if share else {"promised_days": _r(days_until(fit(promised_points), capacity, today), 1)}),
            "measured_days": _r(days_until(fit(measured_points), capacity, today), 1),
        }
        rows.append(Row(group=label, group_id=group_id, values=values))
        if short is not None:
            when = _date(start, today, short)
            shorts.append(f"{label} already" if short == 0 else f"{label} on {when.isoformat()}")
        # The chart: the daily demand, its line carried past today, and the capacity.
        for at, f in days:
            points.append(Point(at=at, series=label, value=_r(f["allocated"] + f["pending"])))
            points.append(Point(at=at, series=f"{label} capacity", value=_r(f["capacity"])))
        if trend is not None:
            ahead = min(short if short else CHART_AHEAD_DAYS, CHART_AHEAD_DAYS * 4)
            x = 0.0
            while x <= today + ahead:
                points.append(Point(at=start + timedelta(days=x), series=f"{label} trend", value=_r(trend.at(x))))
                x += 1
    points.sort(key=lambda p: (p.at, p.series))
    verdict = ("Runs short at the current trend: " + "; ".join(shorts) + ". ") if shorts else (
        "No pool runs short at the current trend. " if rows else "No samples in the window. ")
    window_text = f"Window: {start.date().isoformat()} to {(end - DAY).date().isoformat()} (UTC). "
    return Result(rows=rows, points=points, chart_value="demand_now", columns=columns,
                  note=verdict + window_text + method)


register(Metric("capacity-forecast", "capacity", "Capacity forecast",
                "Per pool: demand (allocated + waiting units per day), promised quota and measured use against "
                "capacity, each with its least-squares linear trend over the last INSIGHTS_FORECAST_WEEKS (default "
                "8) weeks, and the days until the demand trend reaches capacity. Tenant admins: their share against "
                "their nominal quota.", capacity_forecast, groups=GROUPS))

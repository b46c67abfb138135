"""Usage cost summed in the database: the cost views, the costs API and budget spend (docs/billing.md,
"Budgets and cost views").

One SQL statement per question. The window is cut into segments at every instant a price or a discount changes
(and at day boundaries, UTC, for a per-day series); each interval is joined only with the segments it spans (found
by binary search over the sorted segment starts, ``width_bucket``, rather than compared with every segment: a year
per day is 365 segments); PostgreSQL sums quantity × seconds of overlap per segment and
group (tenant, unit, key and the grouping asked for); Python then prices the few resulting rows. Open intervals
accrue up to their cluster's "now" (``selectors.cluster_now``, computed in SQL from ``ClusterClock``), exactly
as ``selectors.intervals_cost`` does one interval at a time, so both agree. The window and the days are the
portal's: each run is placed on the portal's clock (``portal_span``: where the cluster says, unless the cluster
runs ahead of the portal) and its cluster seconds spread over that span, so the amounts are the cluster's.

**SQLite (the laptop demo) sums in Python, PostgreSQL in SQL.** The statement is PostgreSQL's (arrays, ``GREATEST``,
``EXTRACT``); on any other database ``_sum_python`` reads the scoped intervals (only the columns needed) and makes
the same sums, clipping each interval to the segments it overlaps. Only the summing differs: the segments and the
pricing (``_priced``) are shared, and tests/billing/test_portable_sums.py runs both on the same PostgreSQL data and
requires identical figures.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from workloads.models import WorkloadRequest

from . import pricing, selectors
from .models import ClusterClock, Discount, UsageInterval

GROUPS = {  # name -> SQL expression over the "iv" rows
    "tenant": "iv.tenant_id",
    "project": "iv.project_id",
    "flavor": "iv.flavor_id",
    "user": "iv.user_id",
    "unit": "iv.unit",
    "key": "iv.key",
    "cluster": "iv.cluster_id",
    "day": "seg.day",
}


def month_start(now: datetime | None = None) -> datetime:
    now = (now or timezone.now()).astimezone(UTC)
    return datetime(now.year, now.month, 1, tzinfo=UTC)


def month_bounds(now: datetime | None = None) -> tuple[datetime, datetime]:
    start = month_start(now)
    return start, selectors.month_end(start.date())


def _segments(since: datetime, until: datetime, *, daily: bool) -> list[tuple[datetime, datetime, datetime]]:
    cuts = {since, until}
    for rates in selectors.price_rates().values():
        cuts.update(r.effective_from for r in rates if since < r.effective_from < until)
    cuts.update(Discount.objects.filter(effective_from__gt=since, effective_from__lt=until)
                .values_list("effective_from", flat=True))
    if daily:
        day = datetime(since.year, since.month, since.day, tzinfo=UTC) + timedelta(days=1)
        while day < until:
            cuts.add(day)
            day += timedelta(days=1)
    edges = sorted(cuts)
    out = []
    for a, b in zip(edges, edges[1:], strict=False):
        day = datetime(a.year, a.month, a.day, tzinfo=UTC)
        out.append((a, b, day))
    return out


GROUP_COLUMNS = {  # name -> the interval's value (``_sum_python``), as GROUPS in SQL
    "tenant": "tenant_id",
    "project": "project_id",
    "flavor": "request__flavor_id",
    "user": "request__requested_by_id",
    "unit": "unit",
    "key": "key",
    "cluster": "cluster_id",
}

# One sum: (segment start, tenant id, unit, key, *the ``by`` group values, quantity × seconds) per segment and group.
Sum = tuple[Any, ...]


def cost_rows(intervals: QuerySet[UsageInterval], *, since: datetime, until: datetime, by: tuple[str, ...] = (),
              now: datetime | None = None, in_python: bool | None = None) -> list[dict[str, Any]]:
    """The exact cost of ``intervals`` (any scoped queryset) within ``[since, until)``, one row per value of the
    ``by`` groups (``GROUPS``): ``{group: value, ..., "cost": Decimal}``. Unpriced usage costs nothing.

    ``in_python``: sum in Python (``_sum_python``) rather than SQL (``_sum_sql``); by default SQL on PostgreSQL and
    Python elsewhere (SQLite, the laptop demo). Both give the same sums."""
    if not selectors.price_rates():
        return []
    now = now or timezone.now()
    segments = _segments(since, until, daily="day" in by)
    if not segments:
        return []
    if in_python is None:
        in_python = connection.vendor != "postgresql"
    summed = (_sum_python if in_python else _sum_sql)(intervals, segments, by=by, since=since, until=until, now=now)
    return _priced(summed, by)


def _sum_sql(intervals: QuerySet[UsageInterval], segments: list[tuple[datetime, datetime, datetime]], *,
             by: tuple[str, ...], since: datetime, until: datetime, now: datetime) -> list[Sum]:
    """The sums in one PostgreSQL statement (the production path)."""
    try:
        scope_sql, scope_params = intervals.order_by().values("id").query.sql_with_params()
    except EmptyResultSet:  # a scope that can hold nothing (``none()``)
        return []
    groups = [GROUPS[name] for name in by]
    select = "".join(f", {g} AS g{i}" for i, g in enumerate(groups))
    group = "".join(f", {g}" for g in groups)
    # ``cu``: the cluster's span (started_at, end_at); ``pv``: the same run on the portal's clock (``portal_span``),
    # over which its cluster seconds are spread (``dur`` / ``span``: 1 unless the cluster ran ahead of the portal).
    sql = f"""
        WITH seg AS (SELECT s, e, day, i FROM unnest(%s::timestamptz[], %s::timestamptz[], %s::timestamptz[])
                     WITH ORDINALITY AS t(s, e, day, i)),
        cu AS (
            SELECT u.tenant_id, u.project_id, u.cluster_id, u.unit, u.key, u.quantity, u.started_at, u.created_at,
                   r.flavor_id, r.requested_by_id AS user_id,
                   COALESCE(u.ended_at, GREATEST(u.started_at, c.cluster_time + GREATEST(%s - c.seen_at, interval '0')),
                            u.started_at) AS end_at
            FROM {UsageInterval._meta.db_table} u
            JOIN {WorkloadRequest._meta.db_table} r ON r.id = u.request_id
            LEFT JOIN {ClusterClock._meta.db_table} c ON c.cluster_id = u.cluster_id
            WHERE u.id IN ({scope_sql}) AND LEAST(u.started_at, u.created_at) < %s
              AND (u.ended_at IS NULL OR u.ended_at > %s)
        ),
        pe AS (
            SELECT cu.*, LEAST(cu.started_at, cu.created_at) AS p0,
                   CASE WHEN cu.started_at > cu.created_at
                        THEN GREATEST(LEAST(cu.end_at - (cu.started_at - cu.created_at), %s::timestamptz), cu.created_at)
                        ELSE cu.end_at END AS p1
            FROM cu
        ),
        pv AS (
            SELECT pe.tenant_id, pe.project_id, pe.cluster_id, pe.unit, pe.key, pe.quantity, pe.flavor_id, pe.user_id,
                   CASE WHEN pe.p1 <= pe.p0 AND pe.end_at > pe.started_at THEN pe.p1 - interval '1 second'
                        ELSE pe.p0 END AS started_at,
                   pe.p1 AS end_at, EXTRACT(EPOCH FROM (pe.end_at - pe.started_at)) AS dur
            FROM pe
        ),
        iv AS (SELECT pv.*, EXTRACT(EPOCH FROM (pv.end_at - pv.started_at)) AS span FROM pv)
        SELECT seg.s, iv.tenant_id, iv.unit, iv.key{select},
               SUM(CASE WHEN iv.dur = iv.span
                        THEN iv.quantity * EXTRACT(EPOCH FROM (LEAST(iv.end_at, seg.e) - GREATEST(iv.started_at, seg.s)))
                        ELSE iv.quantity * EXTRACT(EPOCH FROM (LEAST(iv.end_at, seg.e) - GREATEST(iv.started_at, seg.s)))
                             * iv.dur / iv.span END)
        FROM iv
        CROSS JOIN LATERAL generate_series(GREATEST(width_bucket(iv.started_at, %s::timestamptz[]), 1),
                                           width_bucket(iv.end_at, %s::timestamptz[])) AS k(i)
        JOIN seg ON seg.i = k.i AND iv.started_at < seg.e AND iv.end_at > seg.s
        GROUP BY seg.s, iv.tenant_id, iv.unit, iv.key{group}
    """
    starts = [s[0] for s in segments]
    params = [starts, [s[1] for s in segments], [s[2] for s in segments], now,
              *scope_params, until, since, now, starts, starts]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _sum_python(intervals: QuerySet[UsageInterval], segments: list[tuple[datetime, datetime, datetime]], *,
                by: tuple[str, ...], since: datetime, until: datetime, now: datetime) -> list[Sum]:
    """The same sums as ``_sum_sql``, computed in Python from the scoped intervals (SQLite: the laptop demo).

    The intervals touching the window are read (only the columns needed), an open one ends at its cluster's now
    (``COALESCE(ended_at, GREATEST(started_at, cluster_time + GREATEST(now - seen_at, 0)))``, the start without a
    clock), and each is clipped to the segments it overlaps."""
    clocks = selectors.cluster_nows(now=now)
    starts = [s for s, _, _ in segments]
    columns = [GROUP_COLUMNS[name] for name in by if name != "day"]
    rows = (UsageInterval.objects.filter(pk__in=intervals.order_by().values("id"))
            .filter(Q(started_at__lt=until) | Q(created_at__lt=until))
            .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since))
            .values_list("tenant_id", "unit", "key", "quantity", "started_at", "ended_at", "cluster_id", "created_at",
                         *columns))
    sums: dict[Sum, Decimal] = defaultdict(Decimal)
    for tenant_id, unit, key, quantity, c_start, ended_at, cluster_id, created_at, *values in rows.iterator(chunk_size=5000):
        c_end = ended_at
        if c_end is None:
            clock = clocks.get(cluster_id)
            c_end = c_start if clock is None else max(c_start, clock)
        started_at, end = portal_span(c_start, c_end, created_at, now=now)
        if not started_at < until:
            continue
        dur, span = pricing.seconds(c_end - c_start), pricing.seconds(end - started_at)
        grouped = iter(values)
        picked = [None if name == "day" else next(grouped) for name in by]
        for s, e, day in segments[max(bisect_right(starts, started_at) - 1, 0):]:
            if s >= end:
                break
            if not (started_at < e and end > s):
                continue
            key_row = (s, tenant_id, unit, key, *(day if name == "day" else v for name, v in zip(by, picked, strict=True)))
            part = quantity * pricing.seconds(min(end, e) - max(started_at, s))
            sums[key_row] += part if dur == span else part * dur / span
    return [(*k, v) for k, v in sums.items()]


def portal_span(started_at: datetime, ended_at: datetime, recorded_at: datetime, *,
                now: datetime) -> tuple[datetime, datetime]:
    """Where a run lies on the portal's clock (days and months are the portal's; docs/billing.md, "Clocks"), given its
    cluster span and the portal time its interval was recorded (``created_at``). ``_sum_sql`` computes the same.

    A cluster at or behind the portal's clock (a real one; a follower that recorded the start late): the cluster's
    span as it is. A cluster ahead of it (the sandbox at 60x, a clock set forward): the run starts when the portal
    recorded it and ends that much earlier, but never after the portal's ``now``; its cluster seconds, which are
    what is billed, are spread evenly over that span. So no cost is dated after today, and the total is unchanged."""
    if started_at <= recorded_at:
        return started_at, ended_at
    start, end = recorded_at, max(min(ended_at - (started_at - recorded_at), now), recorded_at)
    if end <= start and ended_at > started_at:  # recorded this instant: give it a second to be spread over
        start = end - timedelta(seconds=1)
    return start, end


def _priced(summed: list[Sum], by: tuple[str, ...]) -> list[dict[str, Any]]:
    """Price the sums (the same for both paths): the price and discount in force at each segment's start. In a fixed
    order, so that both paths add the same Decimals in the same order."""
    prices = selectors.price_rates()
    discounts: dict[Any, Any] = {}  # tenant -> its discount rates, read once (each read checks the cache's version)
    totals: dict[tuple[Any, ...], Decimal] = defaultdict(Decimal)
    for s, tenant_id, unit, key, *rest in sorted(summed, key=lambda row: [(v is None, v) for v in row[:-1]]):
        *values, unit_seconds = rest
        price = pricing.rate_at(prices.get((unit, key), []), s)
        if price is None or not unit_seconds:
            continue
        if tenant_id not in discounts:
            discounts[tenant_id] = selectors.discount_rates(tenant_id)
        off = pricing.rate_at(discounts[tenant_id], s) or Decimal(0)
        cost = pricing.hourly(unit, price) * Decimal(unit_seconds) / pricing.HOUR * (Decimal(100) - off) / Decimal(100)
        totals[tuple(values)] += cost
    return [dict(zip(by, key, strict=True)) | {"cost": cost} for key, cost in totals.items()]


def cost_and_usage(intervals: QuerySet[UsageInterval], *, since: datetime, until: datetime, by: tuple[str, ...] = (),
                   now: datetime | None = None, in_python: bool | None = None
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``cost_rows`` and the usage it is computed from, from one summing pass: (cost rows as ``cost_rows``, usage
    rows ``{group: value, ..., "unit": unit, "key": key, "hours": Decimal}``: quantity-hours per unit and key within
    the window, priced or not). insights' cost per GPU-hour reads both (docs/insights.md)."""
    now = now or timezone.now()
    segments = _segments(since, until, daily="day" in by)
    if not segments:
        return [], []
    if in_python is None:
        in_python = connection.vendor != "postgresql"
    summed = (_sum_python if in_python else _sum_sql)(intervals, segments, by=by, since=since, until=until, now=now)
    usage: dict[tuple[Any, ...], Decimal] = defaultdict(Decimal)
    for _, _, unit, key, *rest in summed:
        *values, unit_seconds = rest
        usage[(unit, key, *values)] += Decimal(unit_seconds or 0)
    used = [dict(zip(by, values, strict=True)) | {"unit": unit, "key": key, "hours": seconds / pricing.HOUR}
            for (unit, key, *values), seconds in usage.items()]
    return (_priced(summed, by) if selectors.price_rates() else []), used


def cost_total(intervals: QuerySet[UsageInterval], *, since: datetime, until: datetime,
               now: datetime | None = None) -> Decimal:
    return sum((r["cost"] for r in cost_rows(intervals, since=since, until=until, now=now)), Decimal(0))


def forecast(spent: Decimal, *, since: datetime, until: datetime, now: datetime) -> Decimal:
    """Month-end spend if the burn so far goes on: linear over the elapsed part of the month
    (``spent / elapsed × month length``). At the very start of a month (under an hour elapsed) it is the spend."""
    elapsed = (min(now, until) - since).total_seconds()
    if elapsed < 3600:
        return spent
    return spent * Decimal((until - since).total_seconds()) / Decimal(elapsed)


def labelled(rows: list[dict[str, Any]], group: str) -> list[tuple[str, Decimal]]:
    """``cost_rows(..., by=(group,))`` as (label, cost): slugs, flavor names, usernames, units or days (ISO);
    days in time order, everything else most expensive first."""
    from django.contrib.auth import get_user_model

    from quotas.models import Flavor
    from tenants.models import Project, Tenant

    ids = [r[group] for r in rows]
    names: dict[Any, str]
    if group == "tenant":
        names = dict(Tenant.objects.filter(pk__in=ids).values_list("pk", "slug"))
    elif group == "project":
        names = dict(Project.objects.filter(pk__in=ids).values_list("pk", "slug"))
    elif group == "flavor":
        names = dict(Flavor.objects.filter(pk__in=ids).values_list("pk", "name"))
    elif group == "user":
        names = dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
    elif group == "day":
        names = {i: i.date().isoformat() for i in ids}
    else:
        names = {i: str(i) for i in ids}
    out = [(names.get(r[group], str(r[group])), r["cost"]) for r in rows]
    if group == "day":
        return sorted(out)
    return sorted(out, key=lambda pair: (-pair[1], pair[0]))

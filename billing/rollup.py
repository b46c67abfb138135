"""The daily cost rollup: priced usage per closed UTC day (docs/billing.md, "Cost rollup").

``CostRollup`` holds, per UTC day, tenant, project, cluster, flavor, requesting user, unit and key, what that day's
usage cost (``cost``: the prices and discounts in force, exact, not rounded) and its quantity x seconds
(``unit_seconds``). The rows are made by billing's own summing pass (``costs._sum_sql``, or ``_sum_python`` off
PostgreSQL) with the day cut at every price or discount change, and priced by the same ``costs._priced``, so a
day's rows add up to what the direct computation gives for that day.

``CostRollupDay`` marks a day complete (``dirty`` false). Whatever changes a day's figures marks it dirty and bumps
its ``version`` in the same transaction as the change:

* the meter, for usage opened or closed (``mark_changed`` from the earliest instant the cycle's writes affect: a
  new interval's start, a closed one's end; an interval counts up to its end, so earlier days are unchanged);
* price and discount writes (``billing.services``), from the earliest ``effective_from`` they touch.

A refresh reads a day's version before it sums and marks the day clean only if the version is unchanged when it
writes (a conditional ``UPDATE`` that waits for a concurrent marker's row lock), so a change racing the refresh
leaves the day dirty and the next refresh recomputes it. Each day is replaced whole in one transaction.

**Closed days only.** A day is rolled up once it is over (before today, UTC) and no running interval can still add to
it: every open interval has been seen running past the day's end on its cluster's observed clock
(``ClusterClock.cluster_time``, which only moves forward), so the live computation counts it to the day's end too.
A day that fails this stays dirty and is read live until a later refresh can roll it up.

``refresh`` (beat, hourly: ``portal.rollups_refresh``, the ``costs`` rollup) rolls up yesterday, the day before, every dirty day and
every day of the last ``LOOKBACK_DAYS`` not rolled up yet; ``backfill`` (``manage.py rollups backfill --since``)
every closed day from a date on. Readers take the clean days wholly inside their period from the rollup and
compute the rest (today, the period's partial edges, days not rolled up) live.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Min, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from portal.rollups import day_bounds

from . import costs
from .models import ClusterClock, CostRollup, CostRollupDay, UsageInterval

LOOKBACK_DAYS = 31
CHUNK_DAYS = 31  # days summed in one statement
BY = ("tenant", "project", "cluster", "flavor", "user", "unit", "key", "day")


def today(now: datetime | None = None) -> date:
    return (now or timezone.now()).astimezone(UTC).date()


# ------------------------------------------------------------------------------------------------ marking
def mark_changed(since: datetime | date | None) -> int:
    """Figures from ``since`` on changed: every rolled-up day from its UTC day on is dirty (and read live) until
    the next refresh recomputes it. Call it in the transaction of the change."""
    if since is None:
        return 0
    day = since.astimezone(UTC).date() if isinstance(since, datetime) else since
    return CostRollupDay.objects.filter(day__gte=day).update(dirty=True, version=F("version") + 1)


# ------------------------------------------------------------------------------------------------ refresh
def horizon() -> datetime | None:
    """The instant up to which every open interval's accrual is final (its cluster was seen past it; without a
    clock, its start: it has accrued nothing); None when nothing is open."""
    clock = ClusterClock.objects.filter(cluster_id=OuterRef("cluster_id")).values("cluster_time")[:1]
    found = (UsageInterval.objects.filter(ended_at__isnull=True)
             .aggregate(h=Min(Greatest("started_at", Coalesce(Subquery(clock), "started_at")))))
    return found["h"]


def _chunks(days: list[date], size: int = CHUNK_DAYS) -> list[list[date]]:
    """Runs of consecutive days, at most ``size`` each."""
    out: list[list[date]] = []
    for day in sorted(days):
        if out and day == out[-1][-1] + timedelta(days=1) and len(out[-1]) < size:
            out[-1].append(day)
        else:
            out.append([day])
    return out


def refresh_days(days: list[date] | set[date], *, now: datetime | None = None) -> dict[str, int]:
    """Roll up ``days`` (closed ones only; the others are skipped and stay dirty). Returns days and rows written."""
    now = now or timezone.now()
    limit = datetime.combine(today(now), time(), tzinfo=UTC)
    open_until = horizon()
    if open_until is not None:
        limit = min(limit, open_until)
    wanted = sorted({d for d in days if day_bounds(d)[1] <= limit})
    if not wanted:
        return {"days": 0, "rows": 0}
    CostRollupDay.objects.bulk_create([CostRollupDay(day=d) for d in wanted], ignore_conflicts=True)
    written = rows = 0
    for chunk in _chunks(wanted):
        versions = dict(CostRollupDay.objects.filter(day__in=chunk).values_list("day", "version"))
        since, until = day_bounds(chunk[0])[0], day_bounds(chunk[-1])[1]
        segments = costs._segments(since, until, daily=True)
        summer = costs._sum_python if connection.vendor != "postgresql" else costs._sum_sql
        summed = summer(UsageInterval.objects.all(), segments, by=BY, since=since, until=until, now=now)
        seconds: dict[tuple[Any, ...], Decimal] = defaultdict(Decimal)
        for _, _, _, _, *values, unit_seconds in summed:
            seconds[tuple(values)] += Decimal(unit_seconds or 0)
        cost = {tuple(r[name] for name in BY): r["cost"] for r in costs._priced(summed, BY)}
        by_day: dict[date, list[CostRollup]] = defaultdict(list)
        for key, secs in seconds.items():
            tenant, project, cluster, flavor, user, unit, unit_key, day = key
            day = day.astimezone(UTC).date()
            by_day[day].append(CostRollup(day=day, tenant_id=tenant, project_id=project, cluster_id=cluster,
                                          flavor_id=flavor, user_id=user, unit=unit, key=unit_key,
                                          cost=cost.get(key, Decimal(0)), unit_seconds=secs))
        for day in chunk:
            objs = by_day.get(day, [])
            with transaction.atomic():
                CostRollup.objects.filter(day=day).delete()
                CostRollup.objects.bulk_create(objs, batch_size=2000)
                done = CostRollupDay.objects.filter(day=day, version=versions.get(day, 0)).update(
                    dirty=False, computed_at=now, rows=len(objs))
            written += 1
            rows += len(objs) if done else 0
    return {"days": written, "rows": rows}


def refresh(now: datetime | None = None) -> dict[str, int]:
    """Yesterday, the day before, every dirty day and every day of the last ``LOOKBACK_DAYS`` not rolled up yet
    (closed days only). Idempotent: a second run writes the same rows."""
    now = now or timezone.now()
    first = today(now)
    days = {first - timedelta(days=1), first - timedelta(days=2)}
    days |= set(CostRollupDay.objects.filter(dirty=True, day__lt=first).values_list("day", flat=True))
    known = set(CostRollupDay.objects.filter(day__gte=first - timedelta(days=LOOKBACK_DAYS)).values_list("day", flat=True))
    days |= {first - timedelta(days=n) for n in range(1, LOOKBACK_DAYS + 1)} - known
    return refresh_days(days, now=now)


def backfill(since: date, until: date | None = None, *, now: datetime | None = None) -> dict[str, int]:
    """Roll up every closed day from ``since`` to yesterday (or ``until``, excluded)."""
    last = min(until or today(now), today(now))
    days = [since + timedelta(days=n) for n in range(max((last - since).days, 0))]
    return refresh_days(days, now=now)


# ------------------------------------------------------------------------------------------------ reading
def rolled_days(start: datetime, end: datetime, *, now: datetime | None = None) -> list[date]:
    """The clean rolled-up days lying wholly inside ``[start, end)`` and before today."""
    first = start.astimezone(UTC)
    first_day = first.date() if first == day_bounds(first.date())[0] else first.date() + timedelta(days=1)
    last_day = min(end.astimezone(UTC).date(), today(now))  # days before this one end by ``end``
    if first_day >= last_day:
        return []
    return sorted(CostRollupDay.objects.filter(day__gte=first_day, day__lt=last_day, dirty=False)
                  .values_list("day", flat=True))


def in_days(days: list[date]) -> Q:
    """Rollup rows of ``days`` (as ranges of consecutive days)."""
    q = Q(pk__in=[])
    for run in _chunks(days, size=len(days)):
        q |= Q(day__gte=run[0], day__lte=run[-1])
    return q

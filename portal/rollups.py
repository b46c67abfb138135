"""The one rollup seam: every precomputed summary the metrics and cost pages read instead of raw rows.

Four rollups exist, each owned by the app whose rows it sums and registered from its ``AppConfig.ready``:

========== ============================ ========================================== ==================
name       owner                        what one row sums                          grain (dirty flag)
========== ============================ ========================================== ==================
costs      ``billing/rollup.py``        priced usage per day, tenant, project ...  UTC day
requests   ``insights/rollups.py``      queue waits and admissions per day/week    UTC day (+ weeks)
samples    ``insights/sample_rollups``  queue and pool samples per hour and day    hour (+ days)
measured   ``insights/measured_rollup`` measured GPU use per day, tenant, project  UTC day
========== ============================ ========================================== ==================

They share one contract, so a maintainer learns it once:

- **Marking.** Whatever changes figures already rolled up calls ``mark(name, since)`` (or the owner's own marker)
  in the transaction of the change; every period from ``since`` on is dirty and read live until refreshed.
- **Refreshing.** One beat task, ``portal.rollups_refresh`` (hourly), runs every rollup's ``refresh``: recent
  closed periods, dirty ones, and those of the lookback not rolled up yet. Each refresh is idempotent (a period is
  replaced whole in one transaction) and one rollup's failure is logged and reported without stopping the others.
- **Backfilling.** One command, ``manage.py rollups backfill --since YYYY-MM-DD [--only NAME]``, rolls up every
  closed period from a day on (``manage.py rollups refresh`` runs what the beat task runs).
- **Reading.** A reader takes the clean periods wholly inside its range from the rollup and computes the rest from
  the raw rows: ``live_ranges`` is that rest; ``in_ranges``/``in_spans`` filter by it.

The period helpers below are the ones every rollup uses; the registry is listed in docs/extending.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as day_start
from typing import Any

from django.db.models import Q

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rollup:
    """One registered rollup. ``refresh(now)`` and ``backfill(since, until)`` answer counts for the log and the
    command (``{"days": 3, "rows": 120}``); ``mark(since)`` marks every period from ``since`` on dirty."""

    name: str
    owner: str
    grain: str
    refresh: Callable[[datetime | None], dict[str, int]]
    backfill: Callable[[date, date | None], dict[str, int]]
    mark: Callable[[datetime], int]


_REGISTRY: dict[str, Rollup] = {}


def register(rollup: Rollup) -> Rollup:
    """Register ``rollup`` (from its owner's ``AppConfig.ready``); registering the same name again replaces it."""
    _REGISTRY[rollup.name] = rollup
    return rollup


def registered() -> list[Rollup]:
    """Every rollup, in registration order (the apps' order: billing before insights)."""
    return list(_REGISTRY.values())


def named(names: list[str] | None) -> list[Rollup]:
    """The rollups called ``names`` (all of them for None or empty); ValueError naming the unknown ones."""
    if not names:
        return registered()
    unknown = sorted(set(names) - set(_REGISTRY))
    if unknown:
        raise ValueError(f"no rollup called {', '.join(unknown)}: choose from {', '.join(_REGISTRY)}")
    return [_REGISTRY[n] for n in names]


def mark(name: str, since: datetime) -> int:
    """Mark rollup ``name`` dirty from ``since`` on (in the transaction of the change)."""
    return _REGISTRY[name].mark(since)


def refresh_all(now: datetime | None = None, *, only: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Refresh every rollup (or ``only`` those): ``{name: counts, ...}`` with ``seconds`` added, or
    ``{"error": ...}`` for one that failed (logged; the others still run)."""
    out: dict[str, dict[str, Any]] = {}
    for rollup in named(only):
        started = time.monotonic()
        try:
            out[rollup.name] = {**rollup.refresh(now), "seconds": round(time.monotonic() - started, 3)}
        except Exception as exc:  # one rollup's failure must not stop the others; it stays dirty for the next run
            logger.exception("rollup %s: refresh failed", rollup.name)
            out[rollup.name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def backfill_all(since: date, until: date | None = None, *, only: list[str] | None = None,
                 progress: Callable[[Rollup, dict[str, int], float], None] | None = None) -> dict[str, dict[str, int]]:
    """Roll up every closed period from ``since`` (to ``until``, excluded) in every rollup (or ``only`` those);
    ``progress(rollup, counts, seconds)`` is told as each one finishes. Errors propagate (an operator runs it)."""
    out: dict[str, dict[str, int]] = {}
    for rollup in named(only):
        started = time.monotonic()
        out[rollup.name] = rollup.backfill(since, until)
        if progress:
            progress(rollup, out[rollup.name], time.monotonic() - started)
    return out


# ------------------------------------------------------------------------------------------------ periods
def day_bounds(day: date) -> tuple[datetime, datetime]:
    """The UTC day ``day`` as ``[start, end)``."""
    start = datetime.combine(day, day_start(), tzinfo=UTC)
    return start, start + timedelta(days=1)


def live_ranges(start: datetime, end: datetime, days: list[date]) -> list[tuple[datetime, datetime]]:
    """``[start, end)`` less the rolled-up ``days`` (sorted): the parts a reader computes from the raw rows."""
    out, cursor = [], start
    for day in days:
        a, b = day_bounds(day)
        if a > cursor:
            out.append((cursor, a))
        cursor = max(cursor, b)
    if cursor < end:
        out.append((cursor, end))
    return out


def in_ranges(ranges: list[tuple[datetime, datetime]], field: str) -> Q:
    """Rows whose ``field`` lies in one of the ``[a, b)`` ranges (no row for no range)."""
    q = Q(pk__in=[])
    for a, b in ranges:
        q |= Q(**{f"{field}__gte": a, f"{field}__lt": b})
    return q


def day_spans(days: list[date]) -> list[tuple[date, date]]:
    """Sorted days as runs of consecutive days: ``(first, last)``, both included."""
    spans: list[tuple[date, date]] = []
    for day in sorted(days):
        if spans and spans[-1][1] + timedelta(days=1) == day:
            spans[-1] = (spans[-1][0], day)
        else:
            spans.append((day, day))
    return spans


def in_spans(days: list[date], field: str = "day") -> Q:
    """Rollup rows of the ``days``, as runs of consecutive days (``day_spans``)."""
    q = Q(pk__in=[])
    for first, last in day_spans(days):
        q |= Q(**{f"{field}__gte": first, f"{field}__lte": last})
    return q

"""The metrics registry: every acceptance metric is a ``Metric`` with a one-line definition and a ``compute``.

Surfaces (the pages, the API, reports, the digest) only ever go through ``METRICS`` / ``metric()``; the metric
families (``scheduling.py``, ``fairness.py``, ``efficiency.py``, ``cost.py``) register themselves in
``apps.ready()``. A compute function reads only what the ``Query`` lets it see (``query.scope`` is the
actor's ``tenants.access.ActorScope``) and is computed by aggregation in the database.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tenants.access import ActorScope

# What a metric can be broken down by, and the time buckets of its chart.
GROUPS = ("cluster", "flavor", "tenant", "project", "queue")
BUCKETS = ("hour", "day", "week")


@dataclass(frozen=True)
class Query:
    """What is asked: a period [start, end), a breakdown, a time bucket and optional filters (ids)."""

    scope: ActorScope  # of who asks
    start: datetime
    end: datetime
    group_by: str = "tenant"
    bucket: str = "day"
    cluster_id: int | None = None
    flavor_id: int | None = None
    tenant_id: int | None = None
    project_id: int | None = None


@dataclass
class Row:
    """One row of a metric's table: a group (its label and id) and named values (None = not defined)."""

    group: str
    group_id: int | str | None
    values: dict[str, Decimal | float | int | None]


@dataclass
class Point:
    """One point of a metric's chart: a bucket's start, a series (the group's label) and a value."""

    at: datetime
    series: str
    value: Decimal | float | int | None


@dataclass
class Result:
    rows: list[Row] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    # The column of ``Row.values`` the chart draws, and every column's title and unit.
    chart_value: str = ""
    columns: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (title, unit)
    note: str = ""  # e.g. "no pending work in the period: fulfilment is not defined"
    # No row means zero, not "not defined" (what waits now: nothing waits), so the headline says 0.
    empty_is_zero: bool = False


@dataclass(frozen=True)
class Metric:
    key: str  # URL-safe: queue-wait, scheduling-success, quota-fulfilment, ...
    family: str  # scheduling | fairness | efficiency | cost | measured | capacity
    title: str
    definition: str  # one line, shown on the page and in the API
    compute: Callable[[Query], Result]
    groups: tuple[str, ...] = GROUPS  # the breakdowns it supports
    # Cluster-wide figures (pools: every tenant's work): computed for platform ops only; others get an empty Result
    # with a note. Surfaces may leave such a metric out of a non-ops page.
    ops_only: bool = False


METRICS: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    METRICS[metric.key] = metric
    return metric


def metric(key: str) -> Metric:
    return METRICS[key]

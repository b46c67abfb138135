"""What every metric family shares: scoping and filtering a queryset by the ``Query``, the breakdown's columns and
labels, time buckets, seconds between two instants, and percentiles in the database (docs/insights.md).

Percentiles: PostgreSQL computes ``percentile_cont`` in SQL; SQLite (the laptop demo) has no ordered-set aggregates,
so ``percentiles`` reads the grouped values (one column) and interpolates the same way in Python.
tests/insights/test_portable.py runs both paths on the same PostgreSQL data and requires equal answers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import Aggregate, DateTimeField, Expression, FloatField, Func, QuerySet
from django.db.models.functions import Trunc

from quotas.models import Cluster, Flavor
from tenants.models import Project, Tenant

from . import memo
from .registry import Point, Query, Row

SAMPLE_HOURS = Decimal(5) / Decimal(60)  # one sample stands for its 5-minute slot
SAMPLE_SECONDS = 300

# Where each breakdown / filter lives on the usual rows (requests, queue samples).
PATHS = {"cluster": "cluster_id", "flavor": "flavor_id", "tenant": "tenant_id", "project": "project_id"}
OPS_ONLY_NOTE = "Cluster-wide figures (every tenant's work): platform ops only."


class PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(f) WITHIN GROUP (ORDER BY expr)``: the continuous percentile."""

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=repr(float(fraction)), **extra)


class Seconds(Func):
    """``end - start`` in seconds (a float), on PostgreSQL and SQLite."""

    output_field = FloatField()
    arity = 2

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        end, start = (compiler.compile(e) for e in self.source_expressions)
        return f"(EXTRACT(EPOCH FROM ({end[0]} - {start[0]})))::double precision", [*end[1], *start[1]]

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        end, start = (compiler.compile(e) for e in self.source_expressions)
        return f"((julianday({end[0]}) - julianday({start[0]})) * 86400.0)", [*end[1], *start[1]]


class SlotIndex(Func):
    """The 5-minute slot number of an instant (seconds since the epoch // 300), for runs of consecutive samples."""

    output_field = FloatField()
    arity = 1

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        at, params = compiler.compile(self.source_expressions[0])
        return f"FLOOR(EXTRACT(EPOCH FROM {at}) / {SAMPLE_SECONDS})::bigint", params

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        at, params = compiler.compile(self.source_expressions[0])
        return f"(CAST(strftime('%%s', {at}) AS INTEGER) / {SAMPLE_SECONDS})", params


def is_ops(query: Query) -> bool:
    return bool(getattr(query.scope, "everything", False))


def narrow(qs: QuerySet, query: Query, paths: dict[str, str] | None = None, *, project: str = "project") -> QuerySet:
    """``qs`` limited to what ``query.scope`` may see (its visible projects, at the ``project`` foreign key) and to
    the query's filters (ids, at ``paths``; a filter the rows have no column for is left out)."""
    paths = PATHS if paths is None else paths
    if not is_ops(query):
        qs = qs.filter(query.scope.in_projects(project))
    for name in ("cluster", "flavor", "tenant", "project"):
        value = getattr(query, f"{name}_id")
        if value is not None and name in paths:
            qs = qs.filter(**{paths[name]: value})
    return qs


def group_fields(group_by: str, paths: dict[str, str] | None = None) -> list[str]:
    """The columns a breakdown groups by (``queue`` is the project's ClusterQueue: project x cluster)."""
    paths = PATHS if paths is None else paths
    if group_by == "queue":
        return [paths["project"], paths["cluster"]]
    return [paths[group_by]]


def bucket(field: str, size: str) -> Trunc:
    """The start of the hour / day / week (Monday, UTC) ``field`` falls in."""
    return Trunc(field, size, output_field=DateTimeField(), tzinfo=UTC)


def bucket_of(at: datetime, size: str) -> datetime:
    """``bucket`` in Python (for rows the database hands back whole, e.g. runs of samples)."""
    at = at.astimezone(UTC)
    start = at.replace(minute=0, second=0, microsecond=0)
    if size in ("day", "week"):
        start = start.replace(hour=0)
    if size == "week":
        start -= timedelta(days=start.weekday())
    return start


def labels(group_by: str, keys: Iterable[tuple[Any, ...]]) -> dict[tuple[Any, ...], tuple[str, int | str | None]]:
    """key -> (label, group id) for a breakdown's keys (slugs, names; ``queue``: ``project@cluster``)."""
    keys = list(set(keys))
    out: dict[tuple[Any, ...], tuple[str, int | str | None]] = {}
    if group_by == "queue":
        projects = dict(Project.objects.filter(pk__in={k[0] for k in keys}).values_list("pk", "slug"))
        clusters = dict(Cluster.objects.filter(pk__in={k[1] for k in keys}).values_list("pk", "name"))
        for p, c in keys:
            out[(p, c)] = (f"{projects.get(p, p)}@{clusters.get(c, c)}", f"{p}:{c}")
        return out
    model, column = {"cluster": (Cluster, "name"), "flavor": (Flavor, "name"), "tenant": (Tenant, "slug"),
                     "project": (Project, "slug")}[group_by]

    def fetch(pks: set[Any]) -> dict[Any, Any]:
        found = dict(model.objects.filter(pk__in=pks).values_list("pk", column))
        if group_by == "flavor":  # flavor names repeat across clusters
            clusters = dict(Flavor.objects.filter(pk__in=pks).values_list("pk", "cluster__name"))
            found = {pk: f"{name}@{clusters.get(pk)}" for pk, name in found.items()}
        return found

    names = memo.names(model, column, {k[0] for k in keys}, fetch)  # once per page for an overview or a report
    for key in keys:
        out[key] = (str(names.get(key[0], key[0])), key[0])
    return out


def make_rows(group_by: str, values: dict[tuple[Any, ...], dict[str, Any]]) -> list[Row]:
    """Rows in label order from key -> values."""
    named = labels(group_by, values)
    rows = [Row(group=named[key][0], group_id=named[key][1], values=v) for key, v in values.items()]
    return sorted(rows, key=lambda r: r.group)


def make_points(group_by: str, values: dict[tuple[Any, ...], dict[datetime, Any]]) -> list[Point]:
    """Points in time order from key -> {bucket start: value}."""
    named = labels(group_by, values)
    points = [Point(at=at, series=named[key][0], value=value)
              for key, series in values.items() for at, value in series.items()]
    return sorted(points, key=lambda p: (p.at, p.series))


def percentile_of(sorted_values: Sequence[float], fraction: float) -> float | None:
    """``percentile_cont`` of already sorted values: linear interpolation between the closest ranks."""
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    if low == high:
        return float(sorted_values[low])
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low))


def percentiles(qs: QuerySet, value: Expression, by: Sequence[str], fractions: Sequence[float], *,
                in_python: bool | None = None) -> dict[tuple[Any, ...], dict[str, Any]]:
    """key (the ``by`` values) -> {"n": count, "p50": ..., "p95": ...} of ``value`` over ``qs``'s rows.

    PostgreSQL: one grouped ``percentile_cont`` query. Elsewhere (or ``in_python=True``): the values are read
    ordered by group and value (one column each) and interpolated as ``percentile_cont`` does."""
    from django.db.models import Count

    if in_python is None:
        in_python = connection.vendor != "postgresql"
    names = {f: f"p{round(f * 100)}" for f in fractions}
    qs = qs.order_by().annotate(_v=value)
    if not in_python:
        aggregates = {name: PercentileCont("_v", f) for f, name in names.items()}
        rows = qs.values(*by).annotate(n=Count("pk"), **aggregates)
        return {tuple(r[b] for b in by): {"n": r["n"], **{name: r[name] for name in names.values()}} for r in rows}
    grouped: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for *key, v in qs.values_list(*by, "_v").order_by(*by, "_v").iterator(chunk_size=10000):
        grouped[tuple(key)].append(float(v))
    return {key: {"n": len(vals), **{name: percentile_of(vals, f) for f, name in names.items()}}
            for key, vals in grouped.items()}


def minutes(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 60, 2)


def ratio(part: Any, whole: Any, *, percent: bool = True) -> float | None:
    """``part / whole`` (x100 for a percentage); None when ``whole`` is 0 or missing: not defined, never 0 or 100."""
    if part is None or not whole:
        return None
    value = float(part) / float(whole)
    return round(value * 100, 2) if percent else round(value, 4)


def hours(value: Any) -> float:
    return round(float(value or 0), 3)

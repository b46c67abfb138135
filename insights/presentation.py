"""Pure functions from a metric's ``Result`` to what the surfaces show: the table's columns and cells, the headline
figure, the Chart.js spec ``static/js/charts.js`` draws, and the JSON-ready rows of the API. No queries."""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from typing import Any

from .registry import Metric, Result

# Distinct hues; every chart's numbers are also in a table, so colour is never the only cue.
COLOURS = ["#1f6feb", "#d97706", "#059669", "#9333ea", "#dc2626", "#0891b2", "#65a30d", "#db2777"]
SMALL_SERIES = 4  # the overview's small charts draw at most this many series
MAX_SERIES = len(COLOURS)
NOT_DEFINED = "—"


def columns_of(result: Result) -> list[tuple[str, str, str]]:
    """(key, title, unit) of each value column: the result's own, then any a row has that it did not name."""
    cols = [(key, title, unit) for key, (title, unit) in result.columns.items()]
    named = {c[0] for c in cols}
    for row in result.rows:
        for key in row.values:
            if key not in named:
                named.add(key)
                cols.append((key, key.replace("_", " ").capitalize(), ""))
    return cols


def number(value: Any) -> float | int | None:
    """A value as a JSON number (``None``: not defined)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return float(value)


def cell(value: Any) -> str:
    """A value as the table and the CSV show it: whole numbers as they are, others to 2 decimals (3 below 1)."""
    if value is None:
        return NOT_DEFINED
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    d = Decimal(str(value))
    if d == d.to_integral_value() and abs(d) >= 1:
        return str(d.quantize(Decimal(1)))
    return str(d.quantize(Decimal("0.01") if abs(d) >= 1 else Decimal("0.001")))


def unit_of(result: Result, column: str | None = None) -> str:
    column = column or result.chart_value
    return result.columns.get(column, ("", ""))[1] if column else ""


def figure(value: Decimal) -> str:
    """A headline number, readable at a glance: thousands separated, and fewer decimals the larger it is
    (1,485 · 326 · 71.8 · 3.91 · 0.525); the table keeps the exact cell."""
    size = abs(value)
    if size >= 100 or value == value.to_integral_value():
        return f"{value:,.0f}"
    return f"{value:,.1f}" if size >= 10 else cell(value)


# A headline's unit after the figure 1 ("1 request"); "count" goes without saying.
SINGULAR = {"requests": "request", "jobs": "job", "GPUs": "GPU", "minutes": "minute", "hours": "hour"}


def _with_unit(text: str, unit: str, value: Decimal) -> str:
    if not unit or unit == "count":
        return text
    return f"{text} {SINGULAR.get(unit, unit) if value == 1 else unit}"


PERCENTILE = re.compile(r"\bP\d{2}\b")


def headline(result: Result) -> str:
    """One figure for the overview and the digest, from the chart's column: the value when there is one row,
    the lowest and highest otherwise ("12 – 40"), ``—`` when nothing is defined (0 where no row means none:
    ``Result.empty_is_zero``). A percentile says which, with its column's title ("Approval → admission P95: ...")."""
    column = result.chart_value or (columns_of(result)[0][0] if columns_of(result) else "")
    values = [r.values.get(column) for r in result.rows]
    defined = sorted(Decimal(str(v)) for v in values if v is not None)
    unit = unit_of(result, column)
    if not defined and result.empty_is_zero and not result.rows:
        defined = [Decimal(0)]
    if not defined:
        return NOT_DEFINED
    title = result.columns.get(column, ("", ""))[0]
    label = f"{title}: " if PERCENTILE.search(title) else ""
    if len(defined) == 1 or defined[0] == defined[-1]:
        return label + _with_unit(figure(defined[0]), unit, defined[0])
    low, high = defined[0], defined[-1]
    return f"{label}{_with_unit(f'{figure(low)} – {figure(high)}', unit, high)} across {len(defined)} groups"


def _label(at: datetime, bucket: str) -> str:
    return at.strftime("%Y-%m-%d %H:00") if bucket == "hour" else at.date().isoformat()


def chart_spec(metric: Metric, result: Result, *, bucket: str, small: bool = False) -> dict[str, Any] | None:
    """A line chart over time (one series per group) for ``static/js/charts.js``; ``None`` without points."""
    if not result.points:
        return None
    times = sorted({p.at for p in result.points})
    series: dict[str, dict[datetime, Any]] = {}
    for p in result.points:
        series.setdefault(p.series, {})[p.at] = p.value
    limit = SMALL_SERIES if small else MAX_SERIES
    names = list(series)[:limit]
    notes = [] if len(series) <= limit else [f"{len(series) - limit} more series in the table"] * len(times)
    return {
        "type": "line", "title": metric.title, "labels": [_label(t, bucket) for t in times], "stacked": False,
        "notes": notes, "unit": unit_of(result),
        "datasets": [{"label": name, "data": [number(series[name].get(t)) for t in times],
                      "color": COLOURS[i % len(COLOURS)]} for i, name in enumerate(names)],
    }


def table(result: Result) -> tuple[list[tuple[str, str, str]], list[dict[str, Any]]]:
    """(columns, rows) with each row's cells formatted, in the columns' order."""
    cols = columns_of(result)
    rows = [{"group": r.group, "group_id": r.group_id, "cells": [cell(r.values.get(c[0])) for c in cols]}
            for r in result.rows]
    return cols, rows

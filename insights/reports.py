"""The per-period report: every metric's table for one period, as sections (the printable page) and as CSV
(one section per metric). Built from the same ``Result`` the pages show (docs/insights.md)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import presentation
from .registry import Metric, Query, Result


@dataclass
class Section:
    metric: Metric
    query: Query
    result: Result
    columns: list[tuple[str, str, str]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    headline: str = ""


def sections_of(metrics: list[Metric], query_of: Callable[[Metric], Query]) -> list[Section]:
    """Compute each metric for its query (``query_of(metric)``: the breakdown it supports)."""
    out = []
    for metric in metrics:
        query = query_of(metric)
        result = metric.compute(query)
        columns, rows = presentation.table(result)
        out.append(Section(metric=metric, query=query, result=result, columns=columns, rows=rows,
                           headline=presentation.headline(result)))
    return out


def _text(value: Any) -> str:
    """A label as a spreadsheet reads it: one that starts like a formula is quoted, so it stays text."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _utc(at: datetime) -> str:
    return at.astimezone(UTC).isoformat()


def csv_of(sections: list[Section], *, start: datetime, end: datetime, seeded: bool = False) -> str:
    """One section per metric: its key, title, definition, period and note, then its table (group, columns),
    then an empty line. Values as the pages show them; ``—`` is "not defined"."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["report", "metrics", _utc(start), _utc(end)])
    if seeded:
        writer.writerow(["note", "includes seeded demo history"])
    writer.writerow([])
    for s in sections:
        writer.writerow(["metric", s.metric.key])
        writer.writerow(["title", _text(s.metric.title)])
        writer.writerow(["definition", _text(s.metric.definition)])
        writer.writerow(["group_by", s.query.group_by])
        if s.result.note:
            writer.writerow(["note", _text(s.result.note)])
        writer.writerow([s.query.group_by, *[f"{title} ({unit})" if unit else title for _k, title, unit in s.columns]])
        for row in s.rows:
            writer.writerow([_text(row["group"]), *row["cells"]])
        writer.writerow([])
    return out.getvalue()

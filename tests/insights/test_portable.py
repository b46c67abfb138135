"""Percentiles: PostgreSQL's ``percentile_cont`` in SQL and the Python interpolation SQLite uses give the same answers
on the same PostgreSQL data (the SQLite run of the other tests checks the rest of the SQLite path)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from insights import scheduling
from insights.common import percentile_of
from insights.registry import Query
from tenants.access import scope_of
from workloads.models import RequestState

from ..workloads.factories import make_request

pytestmark = pytest.mark.postgresql
T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def test_percentile_cont_in_sql_equals_python(cast, cat) -> None:
    rng = random.Random(7)
    for i in range(60):
        project = (cast.vision, cast.nlp, cast.llm)[i % 3]
        approved = T0 + timedelta(hours=rng.randrange(0, 100))
        admitted = approved + timedelta(seconds=rng.randrange(1, 7200))
        make_request(cat, project, cast.carol, state=RequestState.SUCCEEDED, approved_at=approved,
                     queued_at=approved, admitted_at=admitted, first_admitted_at=admitted,
                     started_at=admitted + timedelta(seconds=rng.randrange(0, 600)))
    for group_by in ("project", "tenant", "queue", "flavor", "cluster"):
        for bucket in ("hour", "day", "week"):
            query = Query(scope=scope_of(cast.actor("ops")), start=T0 - timedelta(days=1), end=T0 + timedelta(days=7),
                          group_by=group_by, bucket=bucket)
            sql, py = scheduling.queue_wait(query, in_python=False), scheduling.queue_wait(query, in_python=True)
            assert [(r.group, r.values) for r in sql.rows] == [(r.group, r.values) for r in py.rows]
            assert [(p.at, p.series, p.value) for p in sql.points] == [(p.at, p.series, p.value) for p in py.points]
    assert sql.rows and sql.points


def test_percentile_of_interpolates_like_percentile_cont() -> None:
    assert percentile_of([], 0.5) is None
    assert percentile_of([3.0], 0.99) == 3.0
    assert percentile_of([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile_of([2.0, 4.0, 6.0], 0.95) == pytest.approx(5.8)

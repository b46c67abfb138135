"""Fairness and efficiency metrics on constructed samples with known answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from insights.models import PoolSample, QueueSample
from insights.registry import METRICS, Query
from quotas.models import Flavor
from tenants.access import scope_of

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 8, tzinfo=UTC)
SLOT = timedelta(minutes=5)


def q(cast: Any, who: str, **kwargs: Any) -> Query:
    kwargs.setdefault("start", START)
    kwargs.setdefault("end", END)
    return Query(scope=scope_of(cast.actor(who)), **kwargs)


def row_map(result: Any) -> dict[str, dict[str, Any]]:
    return {r.group: r.values for r in result.rows}


def qs(cat: Any, project: Any, slot: int, *, nominal: int = 8, admitted: int = 0, pending: int = 0, smallest: int = 0,
       borrowed: int = 0, flavor: Flavor | None = None) -> QueueSample:
    return QueueSample.objects.create(
        at=T0 + slot * SLOT, cluster=cat.cluster, tenant=project.tenant, project=project, flavor=flavor or cat.h100,
        nominal=Decimal(nominal), admitted=Decimal(admitted), borrowed=Decimal(borrowed), pending=Decimal(pending),
        pending_count=1 if pending else 0, pending_smallest=Decimal(smallest))


def test_fulfilment_while_waiting_and_not_defined_without_pending_work(cast, cat) -> None:
    qs(cat, cast.vision, 0, admitted=4, pending=2, smallest=2)  # given 4 of 8 while waiting: 0.5
    qs(cat, cast.vision, 1, admitted=10, pending=2, smallest=2, borrowed=2)  # given min(10, 8) of 8: 1.0
    qs(cat, cast.vision, 2, admitted=0)  # nothing waits: not counted
    qs(cat, cast.nlp, 0, nominal=2, admitted=0)  # never waited: not defined, not 100%
    qs(cat, cast.llm, 0, nominal=0, admitted=0, pending=1, smallest=1)  # no promise: not defined
    rows = row_map(METRICS["quota-fulfilment"].compute(q(cast, "ops", group_by="project")))
    assert rows["acme-vision"]["fulfilment"] == 75.0
    assert rows["acme-nlp"]["fulfilment"] is None and rows["globex-llm"]["fulfilment"] is None
    assert rows["acme-vision"]["wanting_hours"] == pytest.approx(10 / 60, abs=1e-3)
    tenants = METRICS["quota-fulfilment"].compute(q(cast, "alice", group_by="tenant"))
    assert row_map(tenants) == {"acme": {"fulfilment": 75.0, "wanting_hours": pytest.approx(10 / 60, abs=1e-3),
                                         "sampled_hours": 0.333}}
    assert [p.value for p in tenants.points] == [75.0]


def test_no_pending_work_means_fulfilment_is_not_defined(cast, cat) -> None:
    for slot in range(3):
        qs(cat, cast.vision, slot, admitted=3)
    result = METRICS["quota-fulfilment"].compute(q(cast, "ops", group_by="tenant"))
    assert row_map(result)["acme"]["fulfilment"] is None
    assert "not defined" in result.note and result.points == []
    empty = METRICS["quota-fulfilment"].compute(q(cast, "ops", start=END, end=END + timedelta(days=1)))
    assert empty.rows == [] and "not defined" in empty.note


def test_guarantee_violations_are_runs_of_two_or_more_samples(cast, cat) -> None:
    for slot in (0, 1, 2):  # 15 minutes below nominal with a 2-GPU request that would fit in the unused 4
        qs(cat, cast.vision, slot, admitted=4, pending=2, smallest=2)
    qs(cat, cast.vision, 3, admitted=8, pending=2, smallest=2)  # given all it was promised
    qs(cat, cast.vision, 4, admitted=4, pending=2, smallest=2)  # one sample alone: not a violation
    qs(cat, cast.vision, 5, admitted=4, pending=6, smallest=6)  # the waiting request needs more than the unused 4
    qs(cat, cast.vision, 6, admitted=4, pending=6, smallest=6)
    for slot in (0, 1):
        qs(cat, cast.llm, slot, nominal=4, admitted=0, pending=1, smallest=1)
    rows = row_map(METRICS["guarantee-violations"].compute(q(cast, "ops", group_by="project")))
    assert rows["acme-vision"] == {"violations": 1, "violation_hours": 0.25, "longest_minutes": 15}
    assert rows["globex-llm"] == {"violations": 1, "violation_hours": pytest.approx(10 / 60, abs=1e-3),
                                  "longest_minutes": 10}
    alice = METRICS["guarantee-violations"].compute(q(cast, "alice", group_by="tenant"))
    assert list(row_map(alice)) == ["acme"]
    assert [(p.at, p.value) for p in alice.points] == [(datetime(2026, 11, 2, tzinfo=UTC), 1)]


def test_borrowing_in_gpu_hours(cast, cat) -> None:
    for slot in range(12):  # an hour borrowing 2
        qs(cat, cast.vision, slot, admitted=10, borrowed=2)
    qs(cat, cast.llm, 0, nominal=4, admitted=4)
    rows = row_map(METRICS["borrowing"].compute(q(cast, "erin", group_by="tenant")))
    assert rows == {"globex": {"borrowed_gpu_hours": 0.0, "admitted_gpu_hours": 0.333, "borrowed_share": 0.0,
                               "lent_gpu_hours": 0.0, "lending_projects": 0}}
    rows = row_map(METRICS["borrowing"].compute(q(cast, "alice", group_by="project")))
    assert rows["acme-vision"] == {"borrowed_gpu_hours": 2.0, "admitted_gpu_hours": 10.0, "borrowed_share": 20.0,
                                   "lent_gpu_hours": 0.0, "lending_projects": 0}


def ps(cat: Any, slot: int, *, flavor: Flavor | None = None, **values: Any) -> PoolSample:
    return PoolSample.objects.create(at=T0 + slot * SLOT, cluster=cat.cluster, flavor=flavor or cat.h100,
                                     **{k: Decimal(v) if k != "overcommit_percent" else v for k, v in values.items()})


def test_overcommit_against_the_setting_and_only_for_ops(cast, cat) -> None:
    ps(cat, 0, capacity=8, allocated=4, promised=12, overcommit_percent=25)  # 1.5 > 1.25: a violation
    ps(cat, 1, capacity=8, allocated=9, promised=8, overcommit_percent=25)  # admitted above capacity
    ps(cat, 2, capacity=8, allocated=8, promised=10, overcommit_percent=25)  # 1.25: allowed
    rows = row_map(METRICS["overcommit"].compute(q(cast, "ops", group_by="flavor")))
    assert rows == {"h100@lab": {"ratio_avg": 1.25, "ratio_max": 1.5, "allowed": 1.25, "violations": 2,
                                 "violation_hours": pytest.approx(10 / 60, abs=1e-3)}}
    for who in ("alice", "frank"):
        result = METRICS["overcommit"].compute(q(cast, who, group_by="flavor"))
        assert result.rows == [] and result.points == [] and "ops" in result.note


def test_allocation_idle_and_mig_fragmentation(cast, cat) -> None:
    ps(cat, 0, capacity=8, allocated=4, idle_allocated=2)
    ps(cat, 1, capacity=8, allocated=8)
    ps(cat, 0, flavor=cat.mig, capacity=7, allocated=6, pending=4, shape_mismatch=3)
    ps(cat, 1, flavor=cat.mig, capacity=7, allocated=7, pending=0)
    alloc = row_map(METRICS["gpu-allocation"].compute(q(cast, "ops", group_by="flavor")))
    assert alloc["h100@lab"] == {"allocation": 75.0, "allocated_gpu_hours": 1.0, "capacity_gpu_hours": 1.333}
    idle = row_map(METRICS["idle-allocated"].compute(q(cast, "ops", group_by="flavor")))
    assert idle["h100@lab"]["idle_gpu_hours"] == pytest.approx(2 / 12, abs=1e-3)
    assert idle["h100@lab"]["idle_share"] == pytest.approx(16.67)
    mig = row_map(METRICS["mig-fragmentation"].compute(q(cast, "ops", group_by="cluster")))
    assert mig == {"lab": {"mismatch_share": 75.0, "mismatch_slice_hours": 0.25,
                           "mismatch_gpu_hours": pytest.approx(0.25 / 7, abs=1e-3), "pending_slice_hours": 0.333}}
    for key in ("gpu-allocation", "idle-allocated", "mig-fragmentation"):
        assert METRICS[key].compute(q(cast, "alice", group_by="flavor")).rows == []

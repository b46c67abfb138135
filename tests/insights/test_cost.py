"""Cost metrics: spend and cost per GPU-hour from metered usage, scoped, next to the GPU-hours used."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from billing import services
from billing.models import UsageInterval
from insights.registry import METRICS, Query
from tenants.access import scope_of
from workloads.models import RequestState

from ..workloads.factories import make_request

START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 8, tzinfo=UTC)
T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def q(cast: Any, who: str, **kwargs: Any) -> Query:
    return Query(scope=scope_of(cast.actor(who)), start=kwargs.pop("start", START), end=kwargs.pop("end", END), **kwargs)


def interval(req: Any, hours: float, quantity: int, *, unit: str = "gpu", key: str = "h100-80gb",
             start: datetime = T0) -> None:
    UsageInterval.objects.create(request=req, tenant=req.tenant, project=req.project, cluster=req.cluster,
                                 run_key=f"{req.pk}-{unit}-{start.isoformat()}", source="workload", object_uid="u",
                                 object_name=req.k8s_name, unit=unit, key=key, quantity=Decimal(quantity),
                                 started_at=start, ended_at=start + timedelta(hours=hours))


def test_spend_and_cost_per_gpu_hour(cast, cat) -> None:
    services.price_create(actor=cast.actor("ops"), unit="gpu", key="h100-80gb", amount=Decimal("3.60"),
                          effective_from=datetime(2020, 1, 1, tzinfo=UTC))
    services.price_create(actor=cast.actor("ops"), unit="cpu", amount=Decimal("0.05"),
                          effective_from=datetime(2020, 1, 1, tzinfo=UTC))
    a = make_request(cat, cast.vision, cast.carol, state=RequestState.SUCCEEDED)
    b = make_request(cat, cast.llm, cast.frank, state=RequestState.SUCCEEDED)
    interval(a, 2, 2)  # 4 GPU-hours: 14.40
    interval(a, 2, 4, unit="cpu", key="")  # 8 core-hours: 0.40
    interval(b, 1, 1, start=T0 + timedelta(days=1))  # 3.60
    interval(b, 1, 1, start=END + timedelta(hours=1))  # after the period
    spend = {r.group: r.values for r in METRICS["spend"].compute(q(cast, "ops", group_by="tenant")).rows}
    assert spend["acme"] == {"cost": Decimal("14.80"), "gpu_hours": 4.0, "share": 80.43}
    assert spend["globex"]["cost"] == Decimal("3.60")
    per = METRICS["cost-per-gpu-hour"].compute(q(cast, "alice", group_by="project"))
    assert [(r.group, r.values["per_gpu_hour"]) for r in per.rows] == [("acme-vision", Decimal("3.70"))]
    assert [(p.at, p.value) for p in per.points] == [(datetime(2026, 11, 2, tzinfo=UTC), Decimal("3.70"))]
    frank = METRICS["spend"].compute(q(cast, "frank", group_by="queue"))
    assert [(r.group, r.values["cost"]) for r in frank.rows] == [("globex-llm@lab", Decimal("3.60"))]
    weekly = METRICS["spend"].compute(q(cast, "ops", group_by="cluster", bucket="week"))
    assert [(p.at, p.value) for p in weekly.points] == [(datetime(2026, 11, 2, tzinfo=UTC), Decimal("18.40"))]  # a Monday
    assert METRICS["spend"].compute(q(cast, "ops", start=END + timedelta(days=7), end=END + timedelta(days=8))).rows == []

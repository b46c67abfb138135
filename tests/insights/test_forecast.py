"""The capacity forecast on constructed histories with known answers: a pool whose demand grows 2 GPUs a week
against 40 runs short on a known day, from the samples and from their rollups alike; measured use and promised
quota get their own lines; a tenant admin sees only their own share against their nominal quota; the pages show the
method."""

from __future__ import annotations

from datetime import UTC, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from insights import forecast, sample_rollups
from insights.models import MeasuredSample, PoolSample, QueueSample
from insights.registry import METRICS, Query
from tenants.access import scope_of
from workloads.models import RequestState

from ..workloads.factories import make_request

pytestmark = pytest.mark.django_db
TODAY = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
START = TODAY - timedelta(weeks=8)  # the window: the 56 whole days before today
D = Decimal("0.001")


def q(cast: Any, who: str, **kwargs: Any) -> Query:
    kwargs.setdefault("start", TODAY - timedelta(days=7))
    kwargs.setdefault("end", TODAY + timedelta(days=1))
    return Query(scope=scope_of(cast.actor(who)), **kwargs)


def rows(result: Any) -> dict[str, dict[str, Any]]:
    return {r.group: r.values for r in result.rows}


def pool_history(cat: Any, *, days: int = 56) -> None:
    """h100@lab: capacity 40, promised 30; allocated 16 + 2/7 per day and 4 waiting (demand 20 + 2 GPUs a week),
    two samples a day with the same figures."""
    objs = []
    for i in range(days):
        allocated = (Decimal(16) + Decimal(2) * i / 7).quantize(D)
        for hour in (3, 15):
            objs.append(PoolSample(at=START + timedelta(days=i, hours=hour), cluster=cat.cluster, flavor=cat.h100,
                                   capacity=Decimal(40), allocated=allocated, pending=Decimal(4),
                                   promised=Decimal(30)))
    PoolSample.objects.bulk_create(objs)


def test_the_fit_and_the_crossing_on_known_lines() -> None:
    line = [(float(x), 20 + 2 / 7 * x) for x in range(56)]
    trend = forecast.fit(line)
    assert trend.slope * 7 == pytest.approx(2.0) and trend.intercept == pytest.approx(20.0)
    assert forecast.days_until(trend, 40, 56) == 14.0  # 20 + 2/7 x = 40 at x = 70
    assert forecast.days_until(trend, 30, 56) == 0.0  # already above
    flat = forecast.fit([(float(x), 10.0) for x in range(56)])
    assert flat.slope == 0 and forecast.days_until(flat, 40, 56) is None  # never
    assert forecast.fit(line[:13]) is None  # under two weeks of figures: no trend
    slow = forecast.fit([(float(x), 0.001 * x) for x in range(56)])
    assert forecast.days_until(slow, 40, 56) is None  # beyond the two-year horizon


def test_a_pool_growing_two_gpus_a_week_runs_short_on_a_known_day(cast, cat) -> None:
    pool_history(cat)
    result = METRICS["capacity-forecast"].compute(q(cast, "ops", group_by="flavor"))
    row = rows(result)["h100@lab"]
    assert row["capacity"] == 40 and row["promised"] == 30
    assert row["growth_per_week"] == pytest.approx(2.0, abs=0.01)
    assert row["demand_now"] == pytest.approx(36.0, abs=0.01)  # 20 + 2/7 x 56
    assert row["days_to_short"] == 14.0
    assert row["promised_days"] is None  # promised is flat at 30, under 40
    assert row["measured"] is None and row["measured_days"] is None  # nothing measured
    assert row["queued_gpu_hours"] == pytest.approx(4 * 24 * 7 * 2 * 5 / 60 / 24, abs=0.01)  # 2 samples a day
    short_on = (START + timedelta(days=70)).date().isoformat()
    assert f"h100@lab on {short_on}" in result.note
    assert "least-squares" in result.note and "Limits:" in result.note
    series = {p.series for p in result.points}
    assert series == {"h100@lab", "h100@lab capacity", "h100@lab trend"}
    last_trend = max(p.at for p in result.points if p.series == "h100@lab trend")
    assert last_trend == START + timedelta(days=70)  # the line is drawn to the day it runs short

    by_cluster = rows(METRICS["capacity-forecast"].compute(q(cast, "ops", group_by="cluster")))
    assert by_cluster["lab"]["days_to_short"] == 14.0

    # The same answer once the hours and days are rolled up (the promised figure is read back from the shares).
    sample_rollups.backfill(START.date(), TODAY.date())
    assert sample_rollups.plan(START, TODAY, "day").days  # read from the daily rollup now
    assert rows(METRICS["capacity-forecast"].compute(q(cast, "ops", group_by="flavor")))["h100@lab"] == row


def test_too_short_a_history_gives_no_trend_and_a_falling_one_no_date(cast, cat) -> None:
    pool_history(cat, days=10)
    row = rows(METRICS["capacity-forecast"].compute(q(cast, "ops")))["h100@lab"]
    assert row["capacity"] == 40 and row["days_to_short"] is None and row["growth_per_week"] is None
    PoolSample.objects.all().delete()
    PoolSample.objects.bulk_create([PoolSample(at=START + timedelta(days=i, hours=1), cluster=cat.cluster,
                                               flavor=cat.h100, capacity=Decimal(40), allocated=Decimal(30 - i * 0.25))
                                    for i in range(56)])
    result = METRICS["capacity-forecast"].compute(q(cast, "ops"))
    assert rows(result)["h100@lab"]["days_to_short"] is None and rows(result)["h100@lab"]["growth_per_week"] < 0
    assert "No pool runs short" in result.note


def test_measured_use_gets_its_own_line(cast, cat) -> None:
    pool_history(cat)
    req = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING)
    # From day 14 on: 40 devices a whole day at (10 + 2/7 x) / 40 busy: 10 + 2 GPUs a week, reaching 40 at x = 105.
    MeasuredSample.objects.bulk_create([
        MeasuredSample(at=START + timedelta(days=i, hours=12), request=req, cluster=cat.cluster, tenant=cast.acme,
                       project=cast.vision, flavor=cat.h100, seconds=86400, gpus=40, memory_mib=81920,
                       util_avg=(10 + 2 / 7 * i) / 40 * 100, sm_active_avg=0.5, fb_used_max=1000)
        for i in range(14, 56)])
    row = rows(METRICS["capacity-forecast"].compute(q(cast, "ops")))["h100@lab"]
    assert row["measured"] == pytest.approx(10 + 2 / 7 * 55, abs=0.01)
    assert row["measured_days"] == 49.0  # 105 - 56


def test_a_tenant_admin_sees_only_their_share_against_their_nominal_quota(cast, cat, as_user) -> None:
    pool_history(cat)
    objs = []
    for i in range(56):
        at = START + timedelta(days=i, hours=6)
        # acme-vision: nominal 8, admitted 2 + i/14 and 1 waiting: 3 + 0.5 a week, reaching 8 at x = 70.
        objs.append(QueueSample(at=at, cluster=cat.cluster, tenant=cast.acme, project=cast.vision, flavor=cat.h100,
                                nominal=Decimal(8), admitted=(Decimal(2) + Decimal(i) / 14).quantize(D),
                                pending=Decimal(1)))
        # globex-llm waits for far more: none of it is acme's.
        objs.append(QueueSample(at=at, cluster=cat.cluster, tenant=cast.globex, project=cast.llm, flavor=cat.h100,
                                nominal=Decimal(4), admitted=Decimal(4), pending=Decimal(30)))
    QueueSample.objects.bulk_create(objs)
    result = METRICS["capacity-forecast"].compute(q(cast, "alice", group_by="flavor"))
    row = rows(result)["h100@lab"]
    assert row["capacity"] == 8 and "promised" not in row and "promised_days" not in row
    assert row["growth_per_week"] == pytest.approx(0.5, abs=0.01)
    assert row["days_to_short"] == 14.0
    assert row["queued_gpu_hours"] == pytest.approx(7 * 5 / 60, abs=0.001)  # 1 waiting, one sample a day
    assert result.columns["capacity"][0] == "Your nominal quota" and "Your share" in result.note
    # Ops filtering on the tenant see the same share; unfiltered, the pool.
    assert rows(METRICS["capacity-forecast"].compute(q(cast, "ops", tenant_id=cast.acme.pk)))["h100@lab"] == row
    assert rows(METRICS["capacity-forecast"].compute(q(cast, "ops")))["h100@lab"]["capacity"] == 40

    # By project: each project's own demand against its own nominal quota; a tenant admin sees only theirs.
    projects = rows(METRICS["capacity-forecast"].compute(q(cast, "ops", group_by="project")))
    assert projects["acme-vision"]["days_to_short"] == 14.0 and projects["globex-llm"]["days_to_short"] == 0.0
    assert set(rows(METRICS["capacity-forecast"].compute(q(cast, "alice", group_by="project")))) == {"acme-vision"}

    page = as_user("alice").get("/tenants/acme/metrics/capacity-forecast/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Your nominal quota" in text and "least-squares" in text and "Runs short" in text
    ops_page = as_user("ops").get("/ops/metrics/capacity-forecast/")
    assert ops_page.status_code == 200 and "Promised passes capacity in" in ops_page.content.decode()
    assert as_user("frank").get("/tenants/acme/metrics/capacity-forecast/").status_code == 404

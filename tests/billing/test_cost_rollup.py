"""The daily cost rollup (billing/rollup.py): insights' spend and cost per GPU-hour read from it equal the direct
computation to the cent, by tenant, project, flavor, cluster and queue, daily and weekly, on a history with
intervals across midnight, a price change and a discount mid-period, a running interval, MIG and HAMi units; the
refresh is idempotent; new usage (through the meter), price and discount changes are picked up; closed days only;
the backfill command and the beat task; a tenant admin still sees only their tenant."""

from __future__ import annotations

import io
import random
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from billing import rollup, services
from billing.metering import meter_observe
from billing.models import ClusterClock, CostRollup, CostRollupDay, UsageInterval
from portal.celery import rollups_refresh as rollups_refresh_task
from insights import cost
from insights.registry import METRICS, Query
from quotas.models import Flavor
from tenants.access import scope_of
from workloads.models import RequestState

from ..workloads.factories import make_cluster, make_request

DAYS = 9


def since() -> Any:
    """Backfill from here: the refresh's whole look-back, so a refresh afterwards has only its two days to redo."""
    return today_start().date() - timedelta(days=rollup.LOOKBACK_DAYS)
KEYS = ("spend", "cost-per-gpu-hour")
DIRECT = {"spend": cost.spend, "cost-per-gpu-hour": cost.cost_per_gpu_hour}


def today_start() -> datetime:
    return datetime.combine(timezone.now().astimezone(UTC).date(), time(), tzinfo=UTC)


def q(cast: Any, who: str, **kwargs: Any) -> Query:
    kwargs.setdefault("start", today_start() - timedelta(days=DAYS, hours=-7, minutes=-13))  # a partial first day
    kwargs.setdefault("end", timezone.now() + timedelta(hours=1))
    return Query(scope=scope_of(cast.actor(who)), **kwargs)


def answers(query: Query, *, rolled: bool = True) -> dict[str, Any]:
    out = {}
    for key in KEYS:
        result = METRICS[key].compute(query) if rolled else DIRECT[key](query, rollup=False)
        out[key] = ({r.group: r.values for r in result.rows}, [(p.at, p.series, p.value) for p in result.points])
    return out


def add(req: Any, start: datetime, hours: float | None, *, unit: str = "gpu", key: str = "h100-80gb",
        quantity: str = "1") -> UsageInterval:
    return UsageInterval.objects.create(
        request=req, tenant=req.tenant, project=req.project, cluster=req.cluster, run_key=f"run-{start.isoformat()}",
        source="workload", object_uid=f"u{req.pk}", object_name=req.k8s_name, unit=unit, key=key,
        quantity=Decimal(quantity), started_at=start, ended_at=None if hours is None else start + timedelta(hours=hours))


@pytest.fixture
def history(cast, cat) -> dict[str, Any]:
    """Two clusters (lab: H100 and MIG slices; edge: HAMi vGPUs), three projects in two tenants, ~150 intervals over
    the last DAYS days and today (many across midnight), one still running; a GPU price change and a discount for
    globex in the middle of the period; CPU usage beside the GPUs."""
    ops = cast.actor("ops")
    edge = make_cluster("edge")
    hami = Flavor.objects.create(cluster=edge, name="l40s-hami", display_name="L40S vGPU", kind=Flavor.Kind.HAMI,
                                 gpu_model="l40s", hami_memory_mib=12288, hami_cores_percent=50, order=30)
    old = datetime(2020, 1, 1, tzinfo=UTC)
    for unit, key, amount in (("gpu", "h100-80gb", "2.40"), ("mig", "1g.10gb", "0.37"), ("hami_memory", "", "0.013"),
                              ("hami_cores", "", "0.93"), ("cpu", "", "0.05")):
        services.price_create(actor=ops, unit=unit, key=key, amount=Decimal(amount), effective_from=old)
    change = today_start() - timedelta(days=4, hours=-9, minutes=-41, seconds=-7)
    services.price_create(actor=ops, unit="gpu", key="h100-80gb", amount=Decimal("3.17"), effective_from=change)
    services.discount_create(actor=ops, tenant=cast.globex, percent=Decimal("12.3"),
                             effective_from=today_start() - timedelta(days=6, hours=-15, minutes=-3))
    rng = random.Random(7)
    now = timezone.now()
    shapes = [(cat.h100, cat.cluster, [("gpu", "h100-80gb", "2")]), (cat.mig, cat.cluster, [("mig", "1g.10gb", "3")]),
              (hami, edge, [("hami_memory", "", "24"), ("hami_cores", "", "1")])]
    for i in range(150):
        project, user = ((cast.vision, cast.carol), (cast.nlp, cast.carol), (cast.llm, cast.frank))[i % 3]
        flavor, cluster, units = shapes[i % len(shapes)]
        req = make_request(cat, project, user, state=RequestState.SUCCEEDED, flavor=flavor, cluster=cluster)
        start = now - timedelta(seconds=rng.randrange(int((DAYS + 1.5) * 86400)))
        hours = rng.choice([rng.uniform(0.01, 2), rng.uniform(2, 30), rng.uniform(20, 60)])
        hours = min(hours, (now - start).total_seconds() / 3600 - 0.01)
        for unit, key, quantity in [*units, ("cpu", "", "4")]:
            add(req, start, max(hours, 0), unit=unit, key=key, quantity=quantity)
    running = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING)
    add(running, today_start() - timedelta(days=3, hours=5), None, quantity="4")  # open: accrues to the cluster's now
    # Seen "in the future": the clusters' now stays at their observed time, so answers computed a moment apart agree.
    ClusterClock.objects.create(cluster=cat.cluster, cluster_time=now - timedelta(minutes=3), seen_at=now + timedelta(days=1))
    ClusterClock.objects.create(cluster=edge, cluster_time=now - timedelta(minutes=1), seen_at=now + timedelta(days=1))
    return {"edge": edge, "hami": hami, "running": running}


@pytest.mark.parametrize("group_by", ["tenant", "project", "flavor", "cluster", "queue"])
@pytest.mark.parametrize("bucket", ["day", "week"])
def test_rollup_answers_equal_the_direct_computation(cast, history, group_by, bucket) -> None:
    query = q(cast, "ops", group_by=group_by, bucket=bucket)
    direct = answers(query, rolled=False)
    assert answers(query) == direct  # nothing rolled up yet: all live
    done = rollup.backfill(since())
    assert done["days"] == rollup.LOOKBACK_DAYS and CostRollup.objects.exists()
    assert answers(query) == direct
    spend = direct["spend"][0]
    assert len(spend) > 1 and all(v["cost"] > 0 for v in spend.values())
    # The whole days really come from the rollup: change its rows and the answer moves.
    CostRollup.objects.filter(day=today_start().date() - timedelta(days=2)).update(cost=Decimal(0))
    assert answers(query) != direct


def test_exact_to_the_cent_whole_days_and_partial_edges(cast, history) -> None:
    rollup.backfill(since())
    for start, end in [(today_start() - timedelta(days=DAYS), today_start()),  # whole days only
                       (today_start() - timedelta(days=3, hours=2), today_start() - timedelta(days=1, hours=-5)),
                       (today_start() + timedelta(minutes=5), timezone.now())]:  # today only: live
        for group_by in ("tenant", "flavor"):
            query = q(cast, "ops", start=start, end=end, group_by=group_by)
            assert answers(query) == answers(query, rolled=False)


def test_tenant_admin_sees_only_their_tenant(cast, history) -> None:
    rollup.backfill(since())
    for who, allowed in (("alice", {"acme-vision", "acme-nlp"}), ("erin", {"globex-llm"})):
        query = q(cast, who, group_by="project")
        got = answers(query)
        assert got == answers(query, rolled=False)
        assert set(got["spend"][0]) == allowed
        assert {series for _, series, _ in got["spend"][1]} <= allowed
    ops = answers(q(cast, "ops", group_by="project"))["spend"][0]
    alice = answers(q(cast, "alice", group_by="project"))["spend"][0]
    assert {k: v["cost"] for k, v in alice.items()} == {k: v["cost"] for k, v in ops.items() if k.startswith("acme")}


def test_refresh_is_idempotent(cast, history) -> None:
    first = rollup.backfill(since())

    def snapshot() -> list[tuple[Any, ...]]:
        return sorted(CostRollup.objects.values_list("day", "tenant_id", "project_id", "cluster_id", "flavor_id",
                                                     "user_id", "unit", "key", "cost", "unit_seconds"))

    rows = snapshot()
    assert len(rows) == first["rows"] and rows
    assert rollup.backfill(since()) == first
    assert rollup.refresh()["days"] == 2  # yesterday and the day before
    assert rollups_refresh_task.apply().get()["costs"]["days"] == 2  # the beat task (every rollup), the same
    assert snapshot() == rows
    assert not CostRollupDay.objects.filter(dirty=True).exists()
    assert not CostRollupDay.objects.filter(day__gte=today_start().date()).exists()  # today is never rolled up
    assert "portal.rollups_refresh" in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}


def test_price_and_discount_changes_are_picked_up(cast, history) -> None:
    rollup.backfill(since())
    query = q(cast, "ops", group_by="tenant", bucket="week")
    before = answers(query)
    ops = cast.actor("ops")
    services.price_create(actor=ops, unit="mig", key="1g.10gb", amount=Decimal("0.55"),
                          effective_from=today_start() - timedelta(days=5, hours=-3))
    services.discount_create(actor=ops, tenant=cast.acme, percent=Decimal("7"),
                             effective_from=today_start() - timedelta(days=2, hours=-11))
    dirty = set(CostRollupDay.objects.filter(dirty=True).values_list("day", flat=True))
    assert dirty == {today_start().date() - timedelta(days=n) for n in range(1, 6)}
    after = answers(query)
    assert after != before and after == answers(query, rolled=False)  # dirty days are read live meanwhile
    assert rollup.refresh()["days"] == 5
    assert not CostRollupDay.objects.filter(dirty=True).exists()
    assert answers(query) == after
    discount = cast.acme.discounts.get()
    services.discount_delete(actor=ops, discount=discount)
    assert CostRollupDay.objects.filter(dirty=True).count() == 2
    without = answers(query)
    assert without != after and without == answers(query, rolled=False)
    rollup.refresh()
    assert answers(query) == without


def workload(uid: str, admitted: datetime, finished: datetime | None) -> dict[str, Any]:
    conditions = [{"type": "Admitted", "status": "True", "lastTransitionTime": admitted.strftime("%Y-%m-%dT%H:%M:%SZ")}]
    if finished is not None:
        conditions.append({"type": "Finished", "status": "True",
                           "lastTransitionTime": finished.strftime("%Y-%m-%dT%H:%M:%SZ")})
    return {"metadata": {"uid": uid, "name": f"wl-{uid}"}, "spec": {"podSets": [{"count": 1}]},
            "status": {"conditions": conditions}}


def test_new_and_closed_usage_from_the_meter_is_picked_up(cast, cat, history) -> None:
    rollup.backfill(since())
    query = q(cast, "ops", group_by="project")
    before = answers(query)
    # A run first seen finished, days ago (a late batch): its days are recomputed.
    late = make_request(cat, cast.nlp, cast.carol, state=RequestState.SUCCEEDED, gpus=2)
    admitted = today_start() - timedelta(days=4, hours=3)
    stats = meter_observe(cluster=cat.cluster, seen=[("workload", "MODIFIED", workload("late", admitted,
                                                      admitted + timedelta(hours=30)), late.pk)])
    assert stats.opened
    assert set(CostRollupDay.objects.filter(dirty=True).values_list("day", flat=True)) == {
        today_start().date() - timedelta(days=n) for n in range(1, 6)}
    middle = answers(query)
    assert middle != before and middle == answers(query, rolled=False)
    rollup.refresh()
    assert answers(query) == middle and not CostRollupDay.objects.filter(dirty=True).exists()
    # A running interval, counted to each closed day's end, closes two days ago: those days change.
    running = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING, gpus=1)
    started = today_start() - timedelta(days=6)
    meter_observe(cluster=cat.cluster, seen=[("workload", "MODIFIED", workload("run", started, None), running.pk)])
    rollup.refresh()
    rolled_open = answers(query)
    assert rolled_open == answers(query, rolled=False)
    meter_observe(cluster=cat.cluster, seen=[("workload", "MODIFIED",
                                              workload("run", started, today_start() - timedelta(days=2, hours=4)),
                                              running.pk)])
    assert CostRollupDay.objects.filter(dirty=True).count() == 3  # the day it ended and the two after it
    closed = answers(query)
    assert closed != rolled_open and closed == answers(query, rolled=False)
    rollup.refresh()
    assert answers(query) == closed


def test_days_a_running_interval_can_still_change_are_read_live(cast, cat, history) -> None:
    """An open interval on a cluster whose clock has not passed a day's end (here: no clock seen since three days
    ago) may still add to that day: such days are not rolled up, and the answers stay equal."""
    ClusterClock.objects.filter(cluster=history["edge"]).update(cluster_time=today_start() - timedelta(days=3, hours=2))
    req = make_request(cat, cast.llm, cast.frank, state=RequestState.RUNNING, flavor=history["hami"],
                       cluster=history["edge"])
    add(req, today_start() - timedelta(days=5), None, unit="hami_cores", key="", quantity="2")
    rollup.backfill(since())
    rolled = set(CostRollupDay.objects.filter(dirty=False).values_list("day", flat=True))
    assert max(rolled) == today_start().date() - timedelta(days=5)  # the last day wholly before the clock
    query = q(cast, "ops", group_by="cluster", bucket="day")
    assert answers(query) == answers(query, rolled=False)
    ClusterClock.objects.filter(cluster=history["edge"]).update(cluster_time=timezone.now() - timedelta(minutes=1))
    rollup.refresh()
    assert CostRollupDay.objects.filter(dirty=False).count() == rollup.LOOKBACK_DAYS
    assert answers(query) == answers(query, rolled=False)


def test_backfill_command(cast, history) -> None:
    since = (today_start() - timedelta(days=DAYS)).date()
    out = io.StringIO()
    call_command("rollups", "backfill", since=since.isoformat(), only=["costs"], stdout=out)
    assert f"costs: rolled up {DAYS} days" in out.getvalue()
    assert CostRollupDay.objects.filter(dirty=False).count() == DAYS
    call_command("rollups", "backfill", since=since.isoformat(), only=["costs"], stdout=out)  # again: the same rows
    assert CostRollupDay.objects.filter(dirty=False).count() == DAYS
    with pytest.raises(CommandError):
        call_command("rollups", "backfill", since="last week")

"""The two ways of summing usage agree: PostgreSQL sums in SQL (``costs._sum_sql``, ``statements._rate_sql``), any
other database (SQLite, the laptop demo) in Python (``costs._sum_python``, ``statements._rate_python``). Here both
run on the same PostgreSQL data, and every figure must be identical: an open interval (a cluster with a clock and
one without), a price change and a discount mid-month, a month end, fractions of a second and of a unit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing import costs, selectors, services, statements
from billing.models import ClusterClock, UsageInterval

from ..workloads.factories import make_cluster, make_request

pytestmark = pytest.mark.django_db
JAN = datetime(2026, 1, 1, tzinfo=UTC)
FEB = datetime(2026, 2, 1, tzinfo=UTC)
CHANGE = datetime(2026, 1, 15, 12, tzinfo=UTC)
NOW = datetime(2026, 1, 20, 6, 30, tzinfo=UTC)  # the portal's now for every figure here

_runs = iter(range(1, 10**6))


def _interval(req, unit: str, quantity: str, start: datetime, end: datetime | None, key: str = "", cluster=None) -> None:
    UsageInterval.objects.create(
        request=req, tenant=req.tenant, project=req.project, cluster=cluster or req.cluster, run_key=f"wl/p/{next(_runs)}",
        source="workload", object_uid=f"uid-{req.pk}", object_name="job-x", unit=unit, key=key, quantity=Decimal(quantity),
        started_at=start, ended_at=end)


@pytest.fixture
def usage(cast, cat) -> None:
    ops = cast.actor("ops")
    for unit, key, amount, at in [("gpu", "h100-80gb", "2.00", JAN), ("gpu", "h100-80gb", "3.10", CHANGE),
                                  ("mig", "1g.10gb", "0.37", JAN), ("cpu", "", "0.07", JAN),
                                  ("storage", "", "0.11", JAN), ("memory", "", "0.013", CHANGE)]:
        services.price_create(actor=ops, unit=unit, key=key, amount=Decimal(amount), effective_from=at)
    services.discount_create(actor=ops, tenant=cast.acme, percent=Decimal("12.5"), effective_from=CHANGE + timedelta(hours=7))
    services.discount_create(actor=ops, tenant=cast.globex, percent=Decimal(30), effective_from=JAN + timedelta(days=3))
    vision = make_request(cat, cast.vision, cast.carol, state="running", gpus=2)
    nlp = make_request(cat, cast.nlp, cast.alice, state="succeeded", gpus=1, flavor=cat.mig)
    llm = make_request(cat, cast.llm, cast.frank, state="running", gpus=1)
    odd = datetime(2026, 1, 15, 9, 13, 7, 123457, tzinfo=UTC)
    _interval(vision, "gpu", "2", CHANGE - timedelta(hours=5), CHANGE + timedelta(hours=30, microseconds=999), key="h100-80gb")
    _interval(vision, "cpu", "4.5", odd, odd + timedelta(days=2, seconds=17, microseconds=3))
    _interval(vision, "memory", "16", odd, None)  # open: accrues to the cluster's now
    _interval(vision, "storage", "20", datetime(2025, 12, 30, tzinfo=UTC), datetime(2026, 2, 2, tzinfo=UTC))
    _interval(vision, "cpu", "1", NOW + timedelta(hours=1), None)  # open, after the cluster's now: nothing yet
    _interval(nlp, "mig", "3", datetime(2026, 1, 31, 22, tzinfo=UTC), datetime(2026, 2, 1, 3, tzinfo=UTC), key="1g.10gb")
    _interval(nlp, "cpu", "0.25", JAN + timedelta(days=1, microseconds=1), JAN + timedelta(days=9, hours=3))
    _interval(nlp, "gpu", "1", JAN + timedelta(days=2), JAN + timedelta(days=2, hours=4), key="unpriced")
    _interval(llm, "gpu", "1", datetime(2026, 1, 2, 23, tzinfo=UTC), None, key="h100-80gb")
    _interval(llm, "cpu", "8", datetime(2026, 1, 18, tzinfo=UTC), None, cluster=make_cluster("dark"))  # no clock: 0
    # The cluster runs 40 minutes behind the portal, last seen 10 minutes ago.
    ClusterClock.objects.create(cluster=cat.cluster, cluster_time=NOW - timedelta(minutes=50), seen_at=NOW - timedelta(minutes=10))


def _both(intervals, **kwargs) -> tuple[list, list]:
    key = lambda row: [(v is None, v) for k, v in sorted(row.items()) if k != "cost"]
    in_sql = sorted(costs.cost_rows(intervals, now=NOW, in_python=False, **kwargs), key=key)
    in_python = sorted(costs.cost_rows(intervals, now=NOW, in_python=True, **kwargs), key=key)
    return in_sql, in_python


@pytest.mark.postgresql
@pytest.mark.parametrize("by", [(), ("day",), ("project", "unit"), ("tenant",), ("flavor",), ("user",), ("day", "flavor")])
def test_cost_rows_in_python_equal_those_in_sql(usage, cast, by) -> None:
    everything = UsageInterval.objects.all()
    for since, until in [(JAN, FEB), (CHANGE - timedelta(hours=1, microseconds=7), NOW),
                         (datetime(2025, 12, 30, tzinfo=UTC), datetime(2026, 1, 4, 5, tzinfo=UTC)), (datetime(2026, 1, 31, 23, tzinfo=UTC), NOW + timedelta(days=30))]:
        in_sql, in_python = _both(everything, since=since, until=until, by=by)
        assert in_sql and in_python == in_sql, (since, until)
    # Scoped querysets, as the views and the budgets pass them, and one that can hold nothing.
    for scope in [UsageInterval.objects.filter(tenant=cast.acme), UsageInterval.objects.filter(project=cast.nlp).order_by("-id"),
                  UsageInterval.objects.none()]:
        in_sql, in_python = _both(scope, since=JAN, until=FEB, by=by)
        assert in_python == in_sql


@pytest.mark.postgresql
def test_the_sums_themselves_are_identical(usage, cast) -> None:
    segments = costs._segments(JAN, FEB, daily=True)
    for by in [(), ("day", "project", "unit")]:
        args = (UsageInterval.objects.all(), segments)
        in_sql = costs._sum_sql(*args, by=by, since=JAN, until=FEB, now=NOW)
        in_python = costs._sum_python(*args, by=by, since=JAN, until=FEB, now=NOW)
        assert sorted(map(tuple, in_sql)) == sorted(in_python) and len(in_python) > 10


@pytest.mark.postgresql
def test_rate_month_in_python_equals_the_sql(usage, cast) -> None:
    for month in [JAN.date(), FEB.date(), datetime(2025, 12, 1).date()]:
        for tenants in [None, [cast.acme.pk], [cast.globex.pk, cast.acme.pk], []]:
            in_sql = statements.rate_month(month, tenant_ids=tenants, now=NOW + timedelta(days=20), in_python=False)
            in_python = statements.rate_month(month, tenant_ids=tenants, now=NOW + timedelta(days=20), in_python=True)
            assert in_python == in_sql, (month, tenants)
    lines = statements.rate_month(JAN.date(), now=NOW, in_python=True)
    # The price change and both discount changes each split a line; the unpriced key makes none.
    gpu = [(r.unit_price, r.discount_percent, r.period_start) for r in lines[cast.acme.pk] if r.unit == "gpu"]
    assert gpu == [(Decimal("2.00"), 0, JAN), (Decimal("3.10"), 0, CHANGE), (Decimal("3.10"), Decimal("12.5"), CHANGE + timedelta(hours=7))]
    assert statements.rate_month(JAN.date(), now=NOW, in_python=False) == lines


def test_the_default_path_prices_as_cost_so_far(usage, cast) -> None:
    """Whatever the database (this one runs on SQLite too): the month's cost equals the sum of each interval's
    cost so far (``selectors.intervals_cost``, one interval at a time), to the last digit that matters."""
    intervals = list(UsageInterval.objects.all())
    expected = selectors.intervals_cost(intervals, now=NOW)
    total = costs.cost_total(UsageInterval.objects.all(), since=datetime(2025, 12, 1, tzinfo=UTC), until=datetime(2026, 3, 1, tzinfo=UTC), now=NOW)
    assert abs(total - expected) < Decimal("1e-18") and total > 100
    rated = statements.rate_month(JAN.date(), now=NOW)
    assert rated[cast.acme.pk] and rated[cast.globex.pk]

"""A cluster whose clock runs ahead of the portal's (the sandbox at 60x; issue 27): what it ran is billed by its
own timestamps, but costs are dated and grouped by the portal's days, so no day after today carries a cost, and
the month's spend (and so the budget's forecast) counts only what the portal has seen by now."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import budgets, costs, services
from billing.models import Budget, ClusterClock, UsageInterval

from ..workloads.factories import make_request

pytestmark = pytest.mark.django_db
API = "/api/v1"
JAN = datetime(2026, 1, 1, tzinfo=UTC)


def _run(req, cat, *, cluster_start: datetime, cluster_end: datetime | None, recorded: datetime, cores: str = "1"):
    """A usage interval as the meter writes it: cluster times, and the portal time it was recorded at."""
    iv = UsageInterval.objects.create(
        request=req, tenant=req.tenant, project=req.project, cluster=cat.cluster, run_key=f"wl/{cluster_start.isoformat()}",
        source="workload", object_uid=f"uid-{req.pk}", object_name="job-x", unit="cpu", quantity=Decimal(cores),
        started_at=cluster_start, ended_at=cluster_end)
    UsageInterval.objects.filter(pk=iv.pk).update(created_at=recorded)
    return iv


def test_no_day_after_today_carries_a_cost_and_the_total_is_the_clusters(as_user, api, cast, cat) -> None:
    services.price_create(actor=cast.actor("ops"), unit="cpu", key="", amount=Decimal("1.00"), effective_from=JAN)
    req = make_request(cat, cast.vision, cast.carol, state="running")
    now = timezone.now()
    today = now.astimezone(UTC).date()
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    recorded = max(now - timedelta(minutes=1), midnight)
    # The cluster is three days ahead: it ran 30 of its hours (2 cores) that the portal saw in the last minute.
    start = now + timedelta(days=3)
    _run(req, cat, cluster_start=start, cluster_end=start + timedelta(hours=30), recorded=recorded, cores="2")
    ClusterClock.objects.create(cluster=cat.cluster, cluster_time=now + timedelta(days=5), seen_at=now)
    page = as_user("carol").get(f"/costs/projects/{cast.vision.slug}/").content.decode()
    section = page.split('id="cost-day"', 1)[1].split("</section>", 1)[0]
    days = re.findall(r"<tr><td>(\d{4}-\d{2}-\d{2})</td>", section)
    assert days and all(day <= today.isoformat() for day in days), days
    assert '<strong id="total">60.00 EUR</strong>' in page  # 2 cores x 30 h of cluster time, billed in full
    rows = api("carol").get(f"{API}/costs/?group_by=day").json()["rows"]
    assert rows and all(row["key"] <= today.isoformat() for row in rows), rows


def test_the_forecast_counts_what_the_portal_has_seen(cast, cat) -> None:
    services.price_create(actor=cast.actor("ops"), unit="cpu", key="", amount=Decimal("1.00"), effective_from=JAN)
    req = make_request(cat, cast.vision, cast.carol, state="running")
    now = datetime(2026, 2, 2, 12, tzinfo=UTC)  # 1.5 days into February (28 days)
    # Seen on 31 January, when the cluster (36 h ahead) said 2 February: January's, 6 h.
    _run(req, cat, cluster_start=datetime(2026, 2, 2, tzinfo=UTC), cluster_end=datetime(2026, 2, 2, 6, tzinfo=UTC),
         recorded=datetime(2026, 1, 31, 12, tzinfo=UTC))
    # A run on a clock in step with the portal's: 1 February, 6 h.
    _run(req, cat, cluster_start=datetime(2026, 2, 1, 6, tzinfo=UTC), cluster_end=datetime(2026, 2, 1, 12, tzinfo=UTC),
         recorded=datetime(2026, 2, 1, 6, tzinfo=UTC))
    # Running, seen an hour ago when the cluster (33 h ahead) said 3 February 20:00; the cluster now says 4 February:
    # 4 h of cluster time so far, all of it today's on the portal's clock.
    _run(req, cat, cluster_start=datetime(2026, 2, 3, 20, tzinfo=UTC), cluster_end=None,
         recorded=datetime(2026, 2, 2, 11, tzinfo=UTC))
    ClusterClock.objects.create(cluster=cat.cluster, cluster_time=datetime(2026, 2, 4, tzinfo=UTC), seen_at=now)

    rows = costs.cost_rows(UsageInterval.objects.all(), since=JAN, until=datetime(2026, 3, 1, tzinfo=UTC), by=("day",),
                           now=now)
    assert dict(costs.labelled(rows, "day")) == {"2026-01-31": Decimal(6), "2026-02-01": Decimal(6),
                                                 "2026-02-02": Decimal(4)}
    # Summed in Python (the laptop's SQLite path) the same.
    in_python = costs.cost_rows(UsageInterval.objects.all(), since=JAN, until=datetime(2026, 3, 1, tzinfo=UTC),
                                by=("day",), now=now, in_python=True)
    assert dict(costs.labelled(in_python, "day")) == dict(costs.labelled(rows, "day"))

    budget = Budget.objects.create(tenant=cast.acme, project=cast.vision, amount=Decimal("500.00"))
    status = budgets.status_of(budget, now=now)
    assert status.spent == Decimal(10)  # February's: 6 + 4
    assert status.forecast == Decimal(10) * 28 / Decimal("1.5")  # 186.67, not the 16 a day of cluster time

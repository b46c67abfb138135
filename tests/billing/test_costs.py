"""What things cost: a price change mid-month splits an interval at that instant, a tenant's discount comes off,
open intervals accrue up to the cluster's now, and the estimate prices a request (or a half-filled form)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import selectors, services
from billing.models import ClusterClock, UsageInterval

from ..workloads.factories import make_request

pytestmark = pytest.mark.django_db
API = "/api/v1"
JAN = datetime(2026, 1, 1, tzinfo=UTC)


def _price(cast, unit: str, amount: str, at: datetime, key: str = "") -> None:
    services.price_create(actor=cast.actor("ops"), unit=unit, key=key, amount=Decimal(amount), effective_from=at)


def _interval(req, cat, unit: str, quantity: str, start: datetime, end: datetime | None, key: str = "") -> UsageInterval:
    return UsageInterval.objects.create(
        request=req, tenant=req.tenant, project=req.project, cluster=cat.cluster, run_key=f"wl/uid-{req.pk}/{start.isoformat()}",
        source="workload", object_uid=f"uid-{req.pk}", object_name="job-x", unit=unit, key=key, quantity=Decimal(quantity),
        started_at=start, ended_at=end)


def test_a_price_change_mid_month_splits_the_interval_at_that_instant(api, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state="succeeded", gpus=2)
    _price(cast, "gpu", "2.00", JAN, key="h100-80gb")
    change = datetime(2026, 1, 15, 12, tzinfo=UTC)
    _price(cast, "gpu", "3.00", change, key="h100-80gb")
    # 2 GPUs from 10:00 to 15:00 on the day of the change: 2 h at 2.00, 3 h at 3.00.
    _interval(req, cat, "gpu", "2", change - timedelta(hours=2), change + timedelta(hours=3), key="h100-80gb")
    assert selectors.request_cost_so_far(req) == Decimal("2") * 2 * 2 + Decimal("3") * 2 * 3
    assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_so_far"] == "26.00"
    # A discount from the same instant applies to the second part only.
    services.discount_create(actor=cast.actor("ops"), tenant=cast.acme, percent=Decimal(50), effective_from=change)
    assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_so_far"] == "17.00"  # 8 + 18/2
    page = api("carol").get(f"/requests/{req.pk}/").content.decode()
    assert '<dd id="cost-so-far">17.00 EUR</dd>' in page
    # The other tenant sees neither the request nor its cost.
    assert api("frank").get(f"{API}/requests/{req.pk}/").status_code == 404
    assert api("frank").get(f"/requests/{req.pk}/").status_code == 404


def test_money_is_rounded_once_at_the_line(api, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state="succeeded")
    _price(cast, "cpu", "0.0040", JAN)
    # Three intervals of 0.001 each: rounding each would say 0.00; the sum rounds to 0.01 once.
    for i in range(3):
        start = datetime(2026, 1, 2, i, tzinfo=UTC)
        UsageInterval.objects.create(request=req, tenant=req.tenant, project=req.project, cluster=cat.cluster,
                                     run_key=f"r{i}", source="workload", object_uid="u", object_name="w", unit="cpu",
                                     quantity=Decimal("0.25"), started_at=start, ended_at=start + timedelta(hours=1))
    assert selectors.request_cost_so_far(req) == Decimal("0.0030")
    assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_so_far"] == "0.00"


def test_an_open_interval_accrues_up_to_the_clusters_now_never_below_zero(api, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state="running")
    _price(cast, "cpu", "1.00", JAN)
    # The cluster runs a day ahead of the portal: its instants are later than the portal's now.
    ahead = timezone.now() + timedelta(days=1)
    _interval(req, cat, "cpu", "4", ahead - timedelta(hours=2), None)
    # Before the follower has seen the cluster there is no "now" for it: nothing accrued, nothing negative.
    assert selectors.request_cost_so_far(req) == Decimal(0)
    ClusterClock.objects.create(cluster=cat.cluster, cluster_time=ahead, seen_at=timezone.now())
    so_far = selectors.request_cost_so_far(req)
    assert Decimal(8) <= so_far < Decimal("8.01")  # 4 cores x 2 h of cluster time (+ the seconds since it was seen)
    assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_so_far"] == "8.00"


def test_the_estimate_prices_the_request_and_the_form(api, as_user, cast, cat) -> None:
    _price(cast, "gpu", "2.00", JAN, key="h100-80gb")
    _price(cast, "mig", "0.50", JAN, key="1g.10gb")
    _price(cast, "cpu", "0.05", JAN)
    _price(cast, "memory", "0.01", JAN)
    _price(cast, "storage", "7.30", JAN)  # per GiB-month: 0.01 per GiB-hour
    # A price that takes effect later is not today's.
    _price(cast, "gpu", "99", timezone.now() + timedelta(days=3), key="h100-80gb")
    req = make_request(cat, cast.vision, cast.carol, gpus=4, duration_hours=3, cpu=Decimal(8), memory_gib=64)
    # (4 x 2.00 + 8 x 0.05 + 64 x 0.01) x 3 h
    assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_estimate"] == "27.12"
    sliced = make_request(cat, cast.vision, cast.carol, flavor=cat.mig, gpus=2, replicas=3, duration_hours=2, cpu=Decimal(1),
                          memory_gib=10)
    # 3 replicas x (2 x 0.50 + 1 x 0.05 + 10 x 0.01) x 2 h
    assert api("carol").get(f"{API}/requests/{sliced.pk}/").json()["cost_estimate"] == "6.90"
    notebook = make_request(cat, cast.vision, cast.carol, template=cat.notebook, gpus=1, duration_hours=10, cpu=Decimal(4),
                            memory_gib=32, parameters={"home_size_gib": 50})
    # (2.00 + 0.20 + 0.32 + 50 GiB x 0.01) x 10 h
    assert api("carol").get(f"{API}/requests/{notebook.pk}/").json()["cost_estimate"] == "30.20"
    services.discount_create(actor=cast.actor("ops"), tenant=cast.acme, percent=Decimal(10), effective_from=JAN)
    assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_estimate"] == "24.41"  # 27.12 less 10 %
    # The form's estimate: the training template's defaults (1 GPU, 4 CPUs, 32 GiB, 8 h) in the first flavor offered.
    form = as_user("carol").get("/requests/new/?template=training&project=acme-vision").content.decode()
    assert "Billing not configured" not in form
    assert "EUR</strong>" in form

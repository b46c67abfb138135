"""The project cost page in the browser: Chart.js (served locally) draws the cost per day from the page's data,
and the same numbers are in the table under it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from billing import costs, services
from billing.models import UsageInterval
from tests.workloads.factories import make_catalogue, make_request

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_cost_page_draws_its_chart(signed_in, cast) -> None:
    cat = make_catalogue(cast)
    services.price_create(actor=cast.actor("ops"), unit="gpu", key="h100-80gb", amount=Decimal(60),
                          effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    req = make_request(cat, cast.vision, cast.carol, state="succeeded")
    end = timezone.now() - timedelta(minutes=1)
    start = max(end - timedelta(minutes=30), costs.month_start())
    UsageInterval.objects.create(request=req, tenant=req.tenant, project=req.project, cluster=cat.cluster, run_key="wl/x",
                                 source="workload", object_uid="x", object_name="w", unit="gpu", key="h100-80gb",
                                 quantity=Decimal(1), started_at=start, ended_at=end)
    page = signed_in("carol")
    page.goto(f"/costs/projects/{cast.vision.slug}/")
    expect(page.locator("#cost-day-chart-canvas")).to_have_attribute("data-rendered", "true")
    chart = page.evaluate("""() => {
        const c = Chart.getChart(document.getElementById('cost-day-chart-canvas'));
        return {labels: c.data.labels, data: c.data.datasets[0].data, label: c.data.datasets[0].label};
    }""")
    spent = float(Decimal((end - start).total_seconds() / 60).quantize(Decimal("0.01")))
    assert chart["label"] == "Cost (EUR)" and abs(sum(chart["data"]) - spent) < 0.011
    assert chart["labels"][-1] == end.date().isoformat()
    expect(page.locator("#cost-day table")).to_contain_text(end.date().isoformat())

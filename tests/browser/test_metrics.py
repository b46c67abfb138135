"""A metric page in the browser: Chart.js (served locally, no inline script) draws the metric over time from the
page's data, and the same numbers are in the table under it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.insights import surfaces

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
demo_metric = surfaces.demo_metric  # the fixture: a metric with a known answer, registered for the test


def test_a_metric_page_draws_its_chart_and_table(signed_in, cast, demo_metric) -> None:
    page = signed_in("ops")
    page.goto(f"/ops/metrics/{surfaces.KEY}/?preset=7")
    expect(page.locator("#metric-chart-canvas")).to_have_attribute("data-rendered", "true")
    chart = page.evaluate("""() => {
        const c = Chart.getChart(document.getElementById('metric-chart-canvas'));
        return {type: c.config.type, series: c.data.datasets.map(d => d.label), data: c.data.datasets.map(d => d.data)};
    }""")
    assert chart == {"type": "line", "series": ["acme", "globex"], "data": [[2], [1]]}
    expect(page.locator("#metric-table table")).to_contain_text("acme")
    expect(page.locator("#metric-table table")).to_contain_text("globex")
    page.goto("/ops/metrics/")  # the overview's small chart is drawn too
    expect(page.locator(f"#chart-{surfaces.KEY}-canvas")).to_have_attribute("data-rendered", "true")
    page.get_by_role("link", name=demo_metric.title).click()
    expect(page.locator("h1").last).to_have_text(demo_metric.title)


def test_a_tenant_admin_opens_their_metrics_from_the_tenant_page(signed_in, cast, demo_metric) -> None:
    page = signed_in("alice")
    page.goto("/tenants/acme/")
    page.get_by_role("navigation", name="Tenant sections").get_by_role("link", name="Metrics").click()
    page.get_by_role("link", name=demo_metric.title).click()
    expect(page.locator("#metric-chart-canvas")).to_have_attribute("data-rendered", "true")
    expect(page.locator("#metric-table table")).to_contain_text("acme-vision")
    expect(page.locator("#metric-table")).not_to_contain_text("globex")

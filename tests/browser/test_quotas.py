"""Capacity and quotas in the browser: a quota request made and approved end to end, the ops
capacity chart drawn from the page's data, and a quota refusal with its numbers."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.pages import stay

from quotas import services
from quotas.models import Quota, QuotaRequest
from tests.quotas.factories import GPU, make_fleet


pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def split(cast):
    """acme 8 of the 16 H100s (vision 4 of them), globex 12: 20 promised of 16, with 50% overcommit allowed."""
    fleet = make_fleet(overcommit_percent=50)
    ops = cast.actor("ops")
    services.quota_set(actor=ops, tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=8)
    services.quota_set(actor=ops, tenant=cast.globex, flavor=fleet.h100, resource=GPU, nominal=12)
    services.quota_set(actor=ops, project=cast.vision, flavor=fleet.h100, resource=GPU, nominal=4)
    Quota.objects.filter(project=cast.vision, flavor=fleet.h100).update(used=3)
    return fleet


def test_quota_request_is_made_approved_and_seen(signed_in, split) -> None:
    carol = signed_in("carol")
    carol.goto("/projects/acme-vision/")
    carol.get_by_role("region", name="Quota").get_by_role("link", name="Details and requests →").click()
    usage = carol.get_by_role("region", name="Quota and use")
    expect(usage.locator("tr", has_text="h100-80gb").locator(".quota-nominal")).to_have_text("4")

    ask = carol.get_by_role("region", name="Ask for more quota")
    ask.get_by_label("Flavor and resource").select_option(label="h100-80gb — nvidia.com/gpu")
    ask.get_by_label("How much more").fill("2")
    ask.get_by_label("Reason").fill("Paper deadline next week.")
    ask.get_by_role("button", name="Send request").click()
    expect(carol.get_by_role("status").first).to_contain_text("sent: +2 nvidia.com/gpu (h100-80gb)")
    request = QuotaRequest.objects.get()
    expect(carol.get_by_role("region", name="Quota requests")).to_contain_text("Pending")

    # bob, the project admin, finds it in his inbox with its context and approves it with a comment.
    bob = signed_in("bob")
    bob.get_by_role("navigation", name="Main").get_by_role("link", name="Quota requests").click()
    inbox = bob.get_by_role("list", name="Waiting for you")
    card = inbox.get_by_role("listitem").filter(has_text=f"#{request.pk}")
    expect(card).to_contain_text("Paper deadline next week.")
    expect(card).to_contain_text("4 promised, 3 in use")
    stay(bob)
    card.get_by_label(f"Comment on #{request.pk}").fill("Go ahead; release them after the deadline.")
    card.get_by_role("button", name=f"Approve #{request.pk}").click()
    expect(card).to_contain_text("Approved by bob")
    expect(card.get_by_role("status")).to_contain_text("has 2 more × nvidia.com/gpu of h100-80gb")
    expect(card.get_by_role("button")).to_have_count(0)
    assert bob.evaluate("window.__stayed") is True  # decided in place (htmx), no reload

    # carol sees the new nominal quota and the decision.
    carol.reload()
    expect(usage.locator("tr", has_text="h100-80gb").locator(".quota-nominal")).to_have_text("6")
    requests = carol.get_by_role("region", name="Quota requests")
    expect(requests).to_contain_text("Approved")
    expect(requests).to_contain_text("Go ahead; release them after the deadline.")
    assert Quota.objects.get(project__slug="acme-vision", flavor=split.h100).nominal == 6


def test_capacity_chart_draws_the_numbers_with_overcommit_in_red(signed_in, split) -> None:
    page = signed_in("ops")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Capacity").click()
    canvas = page.locator("#flavor-chart-canvas")
    expect(canvas).to_have_attribute("data-rendered", "true")
    box = canvas.bounding_box()
    assert box is not None and box["width"] > 200 and box["height"] > 100
    chart = page.evaluate("""() => {
        const c = Chart.getChart(document.getElementById('flavor-chart-canvas'));
        return {labels: c.data.labels, sets: c.data.datasets.map(d => [d.label, d.data, d.backgroundColor])};
    }""")
    assert chart["labels"][0] == "h100-80gb (gpu)"
    sets = {label: (data[0], colour) for label, data, colour in chart["sets"]}
    assert sets["Capacity"][0] == 16 and sets["Promised to tenants"][0] == 16 and sets["In use"][0] == 3
    assert sets["Promised over capacity (overcommit)"] == (4, "#b42318")  # the danger red
    alert = page.locator("#overcommit")
    expect(alert).to_contain_text("4 over (25.0%)")
    assert alert.evaluate("el => getComputedStyle(el.querySelector('.over')).color") == "rgb(180, 35, 24)"
    expect(page.locator("#pool-chart-canvas")).to_have_attribute("data-rendered", "true")
    expect(page.get_by_role("region", name="Nodes").locator("tr", has_text="gpu-h100-2")).to_contain_text("NotReady")


def test_capacity_page_fits_a_phone(signed_in, split) -> None:
    page = signed_in("ops", width=390, height=800)
    page.goto("/ops/capacity/")
    expect(page.locator("#flavor-chart-canvas")).to_have_attribute("data-rendered", "true")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


def test_quota_split_refusal_says_by_how_much(signed_in, split) -> None:
    alice = signed_in("alice")
    alice.goto("/tenants/acme/")
    alice.get_by_role("navigation", name="Tenant sections").get_by_role("link", name="Quotas").click()
    expect(alice.locator("#split-chart-canvas")).to_have_attribute("data-rendered", "true")
    alice.get_by_role("link", name=re.compile(r"^Edit Vision h100-80gb")).click()
    form = alice.get_by_role("region", name="Set a project's quota")
    expect(form.get_by_label("Nominal quota")).to_have_value("4")
    form.get_by_label("Nominal quota").fill("12")
    form.get_by_role("button", name="Save project quota").click()
    expect(alice.get_by_role("alert")).to_contain_text("but the tenant has 8 (4 over)")
    assert Quota.objects.get(project__slug="acme-vision", flavor=split.h100).nominal == 4

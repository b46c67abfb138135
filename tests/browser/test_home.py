"""Home, navigation and the small-screen layout."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_home_lists_my_projects_and_navigates(signed_in) -> None:
    page = signed_in("alice")
    cards = page.get_by_role("list", name="Projects").get_by_role("listitem")
    expect(cards).to_have_count(2)
    expect(cards.filter(has_text="NLP")).to_contain_text("Tenant admin")
    assert page.evaluate("typeof htmx") == "object"  # our own copy of htmx loaded

    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Ops")).to_have_count(0)
    nav.get_by_role("link", name="Tenants you admin").click()
    page.get_by_role("link", name="Acme Research").click()
    expect(page.get_by_role("heading", name=re.compile("Acme Research"))).to_be_visible()

    page.get_by_role("link", name="Vision").click()
    expect(page.get_by_role("heading", name=re.compile("Vision"))).to_be_visible()
    expect(page.get_by_role("region", name="Members")).to_contain_text("carol")


def test_filter_projects_on_home(signed_in) -> None:
    page = signed_in("alice")
    page.get_by_label("Name or slug contains").fill("nlp")
    page.get_by_role("button", name="Filter").click()
    cards = page.get_by_role("list", name="Projects").get_by_role("listitem")
    expect(cards).to_have_count(1)
    expect(cards.first).to_contain_text("NLP")
    page.get_by_role("link", name="Clear").click()
    expect(cards).to_have_count(2)


def test_ops_sees_ops_pages(signed_in) -> None:
    page = signed_in("ops")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Ops").click()
    expect(page.get_by_role("heading", name="Platform ops")).to_be_visible()
    expect(page.get_by_role("region", name="Tenants")).to_contain_text("Globex AI")
    page.get_by_role("link", name="Audit log").click()
    expect(page.get_by_role("region", name="Audit log")).to_contain_text("membership.create")


@pytest.mark.parametrize("path", ["/", "/projects/acme-vision/", "/tenants/acme/members/", "/tenants/acme/audit/"])
def test_pages_fit_a_phone(signed_in, path) -> None:
    page = signed_in("alice", width=375, height=740)
    page.goto(path)
    # Nothing pushes the page sideways; wide tables scroll inside their own box.
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    expect(page.get_by_role("link", name="GPU Portal")).to_be_visible()

"""The layout on a phone (390 x 844) and on a laptop (1366 wide): the menu folds behind a toggle on narrow
screens, list tables become one card per row, nothing pushes the page sideways, and at 1366 px the full
menu (ops see the most links) stays on one line."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.workloads.factories import make_catalogue, make_request

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def cat(cast):
    return make_catalogue(cast)


def _no_sideways_scroll(page) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def _menu_is_folded(page) -> None:
    menu = page.locator("#mainnav")
    expect(menu).to_be_hidden()
    toggle = page.get_by_role("checkbox", name="Menu")
    expect(toggle).not_to_be_checked()
    # The folded top bar is one row: brand, toggle, avatar.
    assert page.evaluate("document.querySelector('.topbar').getBoundingClientRect().height") < 70


def test_phone_request_list_shows_cards_and_a_folded_menu(signed_in, cast, cat) -> None:
    for i in range(3):
        make_request(cat, cast.vision, cast.carol, name=f"resnet-on-a-phone-{i}")
    page = signed_in("carol", **PHONE)
    page.goto("/requests/")
    _menu_is_folded(page)
    _no_sideways_scroll(page)

    rows = page.locator("table.requests tbody tr")
    expect(rows).to_have_count(3)
    first = rows.first
    # One card per row: the row and its cells are blocks as wide as the card, the header row is out of sight.
    assert first.evaluate("tr => getComputedStyle(tr).display") == "block"
    assert page.locator("table.requests thead").evaluate("h => h.getBoundingClientRect().height") <= 1
    cell = first.locator("td[data-label='Project']")
    assert cell.evaluate("td => getComputedStyle(td, '::before').content") == '"Project"'
    box = first.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    name_cell = first.locator("td[data-label='Name']").bounding_box()
    state_cell = first.locator("td[data-label='State']").bounding_box()
    assert name_cell and state_cell and state_cell["y"] > name_cell["y"]  # stacked, not side by side

    # The toggle opens the menu; its links work.
    page.locator("label[for=nav-toggle]").click()
    nav = page.get_by_role("navigation", name="Main")
    expect(nav).to_be_visible()
    _no_sideways_scroll(page)
    nav.get_by_role("link", name="New request", exact=True).click()
    expect(page.get_by_role("heading", name="New request")).to_be_visible()
    _menu_is_folded(page)  # folded again on the next page


def test_phone_request_page_fits(signed_in, cast, cat) -> None:
    long_command = "python train.py --config=" + "x" * 160
    req = make_request(cat, cast.vision, cast.carol, name="a-rather-long-request-name-on-a-phone",
                       parameters={"command": long_command})
    page = signed_in("carol", **PHONE)
    page.goto(f"/requests/{req.pk}/")
    expect(page.get_by_role("heading", name=req.name)).to_be_visible()
    _menu_is_folded(page)
    _no_sideways_scroll(page)
    page.keyboard.press("Tab")  # the skip link, then the brand, then the toggle: reachable from the keyboard
    page.get_by_role("checkbox", name="Menu").focus()
    page.keyboard.press("Space")
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    _no_sideways_scroll(page)


@pytest.mark.parametrize("path", ["/ops/tenants/", "/ops/projects/", "/ops/users/", "/ops/audit/", "/tenants/"])
def test_phone_ops_lists_are_cards(signed_in, cast, path) -> None:
    page = signed_in("ops", **PHONE)
    page.goto(path)
    _no_sideways_scroll(page)
    row = page.locator("table.stack tbody tr").first
    assert row.evaluate("tr => getComputedStyle(tr).display") == "block"
    for cell in row.locator("td").all():
        if cell.evaluate("td => td.classList.contains('cell-actions')"):
            continue
        assert cell.get_attribute("data-label"), f"{path}: a cell without a data-label"


def test_laptop_top_menu_is_one_line(signed_in, cast, cat) -> None:
    page = signed_in("ops", width=1366, height=768)  # ops see every link there is
    page.goto("/requests/")
    nav = page.get_by_role("navigation", name="Main")
    links = nav.get_by_role("link")
    assert links.count() >= 10
    tops = {round(link.bounding_box()["y"]) for link in links.all()}
    assert len(tops) == 1, f"the menu wraps: links at heights {sorted(tops)}"
    expect(page.locator("label[for=nav-toggle]")).to_be_hidden()
    assert page.evaluate("document.querySelector('.topbar').getBoundingClientRect().height") < 70
    assert page.evaluate("document.documentElement.scrollWidth") <= 1366


# Every ops page with a tab bar: the ops tabs (ops/_tabs.html) and the capacity tabs (quotas/_ops_tabs.html, which
# also hold MIG changes and the architecture review).
OPS_TAB_PAGES = ["/ops/tenants/", "/ops/metrics/", "/ops/identity/", "/ops/audit/", "/ops/costs/", "/ops/capacity/",
                 "/ops/mig-changes/", "/ops/architecture-review/"]


@pytest.mark.parametrize("width", [1280, 1366])
def test_laptop_ops_tabs_are_one_line_with_nothing_hidden(signed_in, cast, cat, width) -> None:
    page = signed_in("ops", width=width, height=800)
    for path in OPS_TAB_PAGES:
        page.goto(path)
        tabs = page.locator("nav.tabs").first
        links = tabs.get_by_role("link").all()
        assert len(links) >= 5, path
        tops = {round(link.bounding_box()["y"]) for link in links}
        assert len(tops) == 1, f"{path}: the tabs wrap, at heights {sorted(tops)}"
        # The bar scrolls sideways when it overflows: at laptop widths no tab may be out of sight.
        assert tabs.evaluate("nav => nav.scrollWidth <= nav.clientWidth"), f"{path}: tabs hidden to the right"
        assert page.evaluate("document.documentElement.scrollWidth") <= width, path
        expect(tabs.locator("[aria-current=page]")).to_have_count(1)


def test_phone_ops_tab_pages_do_not_push_the_page_sideways(signed_in, cast, cat) -> None:
    page = signed_in("ops", **PHONE)
    for path in OPS_TAB_PAGES:
        page.goto(path)
        _menu_is_folded(page)
        _no_sideways_scroll(page)

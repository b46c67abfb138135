"""Ops and approvers on a phone (390 x 844): a metric table wider than the screen scrolls inside its box (the page does
not move sideways), the filters of /requests/ and /approvals/ fold behind a "Filters" toggle so the list is on the
first screen (open while a filter is on), and an approver sees what waits for them on the folded menu's toggle."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from insights.registry import METRICS, Metric, Point, Query, Result, Row, register
from tests.workloads.factories import make_catalogue, make_request

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
WIDE = "test-wide"


def _wide(query: Query) -> Result:
    columns = {f"c{i}": (f"A rather long column title number {i}", "minutes") for i in range(8)}
    rows = [Row(group=f"tenant-with-a-long-name-{g}", group_id=g, values={k: 12345.678 for k in columns}) for g in range(3)]
    return Result(rows=rows, points=[Point(at=query.start, series=r.group, value=1) for r in rows],
                  chart_value="c0", columns=columns)


@pytest.fixture
def wide_metric():
    metric = register(Metric(key=WIDE, family="scheduling", title="A wide metric (test)",
                             definition="Eight columns, wider than a phone.", compute=_wide, groups=("tenant",)))
    yield metric
    METRICS.pop(WIDE, None)


def _no_sideways_scroll(page) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_a_wide_metric_table_scrolls_inside_its_box(signed_in, cast, wide_metric) -> None:
    page = signed_in("ops", **PHONE)
    for path in (f"/ops/metrics/{WIDE}/", "/ops/metrics/report/"):
        page.goto(path)
        table = page.locator("table", has_text="A rather long column title number 7").first
        expect(table).to_be_visible()
        _no_sideways_scroll(page)
        box = table.locator("xpath=..")  # its scrolling box
        assert box.evaluate("b => getComputedStyle(b).overflowX") == "auto", path
        assert box.evaluate("b => b.scrollWidth > b.clientWidth"), path  # it scrolls there, not the page


@pytest.mark.parametrize("who,path", [("carol", "/requests/"), ("bob", "/approvals/")])
def test_list_filters_fold_on_a_phone(signed_in, cast, who, path) -> None:
    cat = make_catalogue(cast)
    for i in range(2):
        make_request(cat, cast.vision, cast.carol, name=f"waiting-{i}")
    page = signed_in(who, **PHONE)
    page.goto(path)
    filters = page.get_by_role("search")
    expect(filters).to_be_hidden()
    toggle = page.get_by_text("Filters", exact=True)
    expect(toggle).to_be_visible()
    first = page.get_by_text("waiting-0").first
    expect(first).to_be_visible()
    assert first.bounding_box()["y"] < PHONE["height"]  # the list starts on the first screen
    _no_sideways_scroll(page)
    toggle.click()
    expect(filters).to_be_visible()
    page.goto(path + ("&" if "?" in path else "?") + "project=acme-vision")  # a filter on: they show open
    expect(page.get_by_role("search")).to_be_visible()
    expect(page.get_by_text("Filters (on)", exact=True)).to_be_visible()
    page.set_viewport_size({"width": 1366, "height": 768})  # on a laptop: no toggle, always shown
    page.goto(path)
    expect(page.get_by_role("search")).to_be_visible()
    expect(page.get_by_text("Filters", exact=True)).to_be_hidden()


def test_an_approvers_count_is_on_the_folded_menus_toggle(signed_in, cast) -> None:
    cat = make_catalogue(cast)
    for i in range(3):
        make_request(cat, cast.vision, cast.carol, name=f"to-decide-{i}")
    page = signed_in("bob", **PHONE)
    page.goto("/requests/")
    expect(page.locator("#mainnav")).to_be_hidden()  # the menu is folded, its badges with it...
    badge = page.locator("label[for=nav-toggle] .nav-badge")
    expect(badge).to_be_visible()  # ...but the toggle says how many wait
    expect(badge).to_have_text("3")
    _no_sideways_scroll(page)
    carol = signed_in("carol", **PHONE)  # a member decides nothing: no count
    carol.goto("/requests/")
    expect(carol.locator("label[for=nav-toggle] .nav-badge")).to_have_count(0)

"""Notebooks and logs in a real browser, against a real sandbox cluster and a real Celery worker.

A researcher opens her running notebook from the request page (through the portal's proxy to the sandbox's
stand-in notebook page), stops it and finds it says so; someone of another tenant finds nothing. The logs page
follows a running job without a reload, offers the whole log as a download, and shows cluster times in the
reader's time zone, labelled as cluster time.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.pages import stay

from tests.workloads.test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures
from workloads.models import RequestState

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"),
              pytest.mark.timeout(300)]
S = RequestState


@pytest.fixture
def world(fresh_sandbox, cast, worker) -> World:  # noqa: F811 - the fixture named like the imported helper
    return _world(fresh_sandbox, cast, architecture="B")


def _sign_in(page, who: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(who)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/")


def test_researcher_opens_her_notebook_then_stops_it(world: World, signed_in, password) -> None:
    req = world.submit("carol", "notebook", "h100-80gb-offline", gpus=1, duration_hours=4)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)

    page = signed_in("carol")
    page.goto(f"/requests/{req.pk}/")
    link = page.get_by_role("link", name="Open the notebook")
    expect(link).to_have_attribute("href", f"/notebooks/{req.pk}/lab")  # no token in the URL
    with page.context.expect_page() as opened:
        link.click()
    notebook = opened.value
    notebook.wait_for_load_state()
    expect(notebook.get_by_role("heading", name=f"Notebook of req-{req.pk}")).to_be_visible()
    assert notebook.url.endswith(f"/notebooks/{req.pk}/lab") and "token" not in notebook.url
    # The stand-in's echo kernel answers a same-origin form post through the proxy.
    notebook.get_by_label("Code for the echo kernel").fill("print('hi')")
    notebook.get_by_role("button", name="Run").click()
    expect(notebook.locator("body")).to_contain_text(re.compile(r'"kernel": ?"echo"'))
    req.refresh_from_db()
    assert req.last_active_at is not None

    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Stop").click()
    expect(page.locator(".notebook-stopped")).to_contain_text("The notebook is stopped.")
    expect(page.get_by_role("link", name="Open the notebook")).to_have_count(0)
    notebook.goto(f"/notebooks/{req.pk}/lab")
    expect(notebook.get_by_role("heading", name="This notebook is stopped")).to_be_visible()
    expect(notebook.get_by_role("status").last).to_contain_text("restart it from the request page")

    outsider = signed_in("frank")
    response = outsider.goto(f"/notebooks/{req.pk}/lab")
    assert response is not None and response.status == 404


def test_logs_page_follows_downloads_and_shows_cluster_time_in_the_readers_zone(
        world: World, browser, live_server, password) -> None:
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)
    world.sandbox.advance(35)

    context = browser.new_context(base_url=live_server.url, timezone_id="Asia/Tokyo", locale="en-US")
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        _sign_in(page, "carol", password)
        page.goto(f"/requests/{req.pk}/logs/")
        lines = page.locator(".log-line")
        expect(lines.first).to_be_visible()
        before = lines.count()
        expect(page.locator("#log-follow")).to_contain_text("Following")
        expect(page.locator("#request-logs")).to_contain_text("cluster time")

        # Times: labelled with their clock, shown in the reader's zone (Tokyo here) by the local formatter.
        first_time = page.locator(".log-line time").first
        expect(first_time).to_have_attribute("data-clock", "cluster")
        expect(first_time).to_have_attribute("data-local", "Asia/Tokyo")
        expect(first_time).to_have_attribute("title", re.compile(r"^cluster time, shown in Asia/Tokyo"))
        expect(first_time).to_contain_text("GMT+9")

        # Follow: the cluster writes more lines; they appear without a reload.
        stay(page)
        world.sandbox.advance(65)
        expect(page.locator(".log-line", has_text="step 300")).to_have_count(1, timeout=15_000)
        assert lines.count() > before
        assert page.evaluate("window.__stayed") is True
        expect(page.locator(".log-line time").last).to_have_attribute("data-local", "Asia/Tokyo")

        # Download: a plain-text attachment with every line.
        with page.expect_download() as download_info:
            page.get_by_role("link", name="Download full log").first.click()
        download = download_info.value
        assert re.fullmatch(rf"req-{req.pk}-.+\.log", download.suggested_filename)
        text = download.path().read_text(encoding="utf-8")
        assert "step 300" in text and len(text.splitlines()) >= lines.count()

        # The request page's timeline is portal time, labelled so.
        page.goto(f"/requests/{req.pk}/")
        expect(page.get_by_role("heading", name="Timeline (portal time)")).to_be_visible()
        expect(page.locator(".timeline time").first).to_have_attribute("data-clock", "portal")
        expect(page.locator(".timeline time").first).to_contain_text("GMT+9")
    finally:
        context.close()

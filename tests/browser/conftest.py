"""Browser tests: Playwright (sync API) driving Debian's Chromium against pytest-django's live server.

The live server runs in a thread of this process. Playwright's sync API keeps an event loop running
in the main thread, which makes Django refuse ORM calls there (fixtures, assertions) unless told
that this is safe, as it is here: nothing else runs on that loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Refusals that are the policy doing its job: Redoc's bundle always loads its "API docs by Redocly"
# logo from Redocly's CDN; nothing is fetched from elsewhere, and Redoc hides the missing image.
EXPECTED_CSP_REFUSALS = ["https://cdn.redoc.ly/redoc/logo-mini.svg"]


def _csp_refusal(text: str) -> bool:
    return "Content Security Policy" in text and not any(url in text for url in EXPECTED_CSP_REFUSALS)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's Chromium (apt-get install chromium). "
            "They fail rather than skip, so a missing browser is never mistaken for a pass.",
            pytrace=False,
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def new_page(browser, live_server) -> Iterator[Callable[..., object]]:
    """``new_page()`` opens a page in a fresh browser context (its own cookies) on the live server."""
    contexts = []
    violations: list[str] = []

    def make(width: int = 1280, height: int = 900) -> object:
        context = browser.new_context(base_url=live_server.url, viewport={"width": width, "height": height})
        context.set_default_timeout(10_000)
        contexts.append(context)
        page = context.new_page()
        # Every browser test also checks the Content-Security-Policy: Chromium logs each refusal.
        page.on("console", lambda msg: violations.append(f"{page.url}: {msg.text}") if _csp_refusal(msg.text) else None)
        return page

    yield make
    for context in contexts:
        context.close()
    assert violations == [], "Content-Security-Policy violations:\n" + "\n".join(violations)


@pytest.fixture
def signed_in(new_page, cast, password) -> Callable[..., object]:
    """``signed_in("alice")`` is a page where alice has signed in through the login form."""

    def make(who: str, **size: int) -> object:
        page = new_page(**size)
        page.goto("/accounts/login/")
        page.get_by_label("Username").fill(who)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/")
        return page

    return make

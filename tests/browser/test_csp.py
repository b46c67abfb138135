"""The Content-Security-Policy holds on the main pages, the admin and the API docs: every page is
opened in Chromium and any refusal it logs fails the test (``new_page`` in conftest.py checks)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.quotas.factories import GPU, make_fleet
from tests.workloads.factories import make_catalogue

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PAGES = [
    "/", "/projects/acme-vision/", "/tenants/", "/tenants/acme/", "/tenants/acme/members/", "/tenants/acme/audit/",
    "/tenants/acme/quotas/", "/projects/acme-vision/quota/", "/quota-requests/", "/requests/", "/requests/new/",
    "/approvals/", "/ops/", "/ops/capacity/", "/ops/flavors/", "/ops/requests/", "/ops/templates/", "/ops/images/",
    "/accounts/password/",
]


@pytest.fixture
def world(cast):
    from quotas import services

    fleet = make_fleet(overcommit_percent=50)
    services.quota_set(actor=cast.actor("ops"), tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=8)
    return make_catalogue(cast)


def test_main_pages_keep_the_policy(signed_in, world) -> None:
    page = signed_in("ops")
    for path in PAGES:
        response = page.goto(path)
        assert response.status == 200, path
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "object-src 'none'" in policy
        page.wait_for_load_state("networkidle")
    # The capacity chart is drawn (Chart.js from our own static files, under the policy).
    page.goto("/ops/capacity/")
    expect(page.locator("canvas").first).to_be_visible()


def test_login_and_admin_keep_the_policy(new_page, cast, password) -> None:
    page = new_page()
    page.goto("/admin/login/")
    page.get_by_label("Username").fill("ops")
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Site administration")).to_be_visible()
    for path in ["/admin/tenants/tenant/", "/admin/tenants/auditentry/", "/admin/auth/user/1/change/"]:
        page.goto(path)
        page.wait_for_load_state("networkidle")


def test_api_docs_render_under_the_policy(signed_in, cast) -> None:
    page = signed_in("alice")
    page.goto("/api/docs/")
    # The schema (18,000 lines of YAML) takes a while: 10-35 s on a slow 2-core machine under the suite's load.
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("GPU Portal API", timeout=90_000)
    page.wait_for_load_state("networkidle")
    page.goto("/api/redoc/")
    expect(page.get_by_role("heading", name="GPU Portal API").first).to_be_visible(timeout=90_000)
    page.wait_for_load_state("networkidle")


def test_the_browsable_api_keeps_the_policy(signed_in, world, cast) -> None:
    """REST framework's browsable API (its HTML pages of the API) under the same policy: its inline styles are classes
    of the portal's stylesheet (templates/rest_framework/), so the buttons still sit where REST framework puts them."""
    from tests.workloads.factories import make_request

    made = make_request(world, cast.vision, cast.carol)
    page = signed_in("ops")
    for path in ["/api/v1/", "/api/v1/requests/", "/api/v1/approvals/", f"/api/v1/requests/{made.pk}/",
                 "/api/v1/projects/?search=acme"]:
        response = page.goto(path)
        assert response.status == 200, path
        assert "unsafe-inline" not in response.headers["content-security-policy"]
        page.wait_for_load_state("networkidle")
    page.goto("/api/v1/approvals/")
    filters = page.get_by_role("button", name="Filters")
    assert filters.evaluate("e => getComputedStyle(e).float") == "right"
    assert page.locator(".dropdown.drf-aside").evaluate("e => getComputedStyle(e).marginRight") == "10px"
    filters.click()
    expect(page.locator("#filtersModal input[name=search], #filtersModal select").first).to_be_visible()

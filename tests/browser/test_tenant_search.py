"""The ops request list's tenant filter in a real browser: typing asks the tenant search (htmx) and the field
suggests the matching tenants; the chosen tenant's slug filters the list. HTTP-level checks (scope, limit, the
filter without JavaScript) are in tests/tenants/test_tenant_search.py."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tenants.models import Tenant
from tests.workloads.factories import make_catalogue, make_request
from workloads.models import RequestState

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
S = RequestState


def test_ops_types_a_tenant_and_picks_it_from_the_suggestions(signed_in, cast) -> None:
    Tenant.objects.bulk_create([Tenant(name=f"Bulk tenant {i:03d}", slug=f"bulk-{i:03d}") for i in range(30)])
    cat = make_catalogue(cast)
    make_request(cat, cast.vision, cast.carol, state=S.RUNNING, name="acme-one")
    make_request(cat, cast.llm, cast.frank, state=S.FAILED, name="globex-one")
    page = signed_in("ops")
    page.goto("/ops/requests/")
    field = page.get_by_label("Tenant", exact=True)
    suggestions = page.locator("#tenant-options option")
    expect(suggestions).to_have_count(0)

    with page.expect_response(lambda r: "/search/tenants/" in r.url and "tenant=glob" in r.url):
        field.press_sequentially("glob", delay=30)
    expect(suggestions).to_have_count(1)
    expect(suggestions.first).to_have_attribute("value", "globex")
    expect(suggestions.first).to_have_text("Globex AI")

    with page.expect_response(lambda r: "/search/tenants/" in r.url and "tenant=bulk" in r.url):
        field.fill("bulk")
    expect(suggestions).to_have_count(20)  # a few to pick from, never every tenant

    field.fill("globex")  # what picking the suggestion puts in the field
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/ops/requests/?*tenant=globex*")
    rows = page.get_by_role("region", name="Requests")
    expect(rows.get_by_role("link", name="globex-one")).to_be_visible()
    expect(rows.get_by_role("link", name="acme-one")).to_have_count(0)

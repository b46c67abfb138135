"""Tenant filters on pages that list every tenant's rows (ops requests, capacity, quota requests): a text field
with suggestions from ``GET /search/tenants/`` as one types, never a drop-down of every tenant.

HTTP in; status and body out. The browser half (suggestions appear as one types, picking one filters) is in
tests/browser/test_tenant_search.py; the capacity page and its tenant quota form in tests/quotas/test_views.py.
"""

from __future__ import annotations

import re

import pytest

from tenants.models import Tenant
from tests.workloads.factories import make_catalogue, make_request
from workloads.models import RequestState

pytestmark = pytest.mark.django_db
S = RequestState


def options(response) -> list[tuple[str, str]]:
    assert response.status_code == 200
    return re.findall(r'<option value="([^"]*)">([^<]*)</option>', response.content.decode())


@pytest.fixture
def many_tenants(cast) -> None:
    Tenant.objects.bulk_create([Tenant(name=f"Bulk tenant {i:03d}", slug=f"bulk-{i:03d}") for i in range(60)])


def test_search_answers_matching_tenants_by_slug_or_name_at_most_twenty(as_user, cast, many_tenants) -> None:
    ops = as_user("ops")
    assert options(ops.get("/search/tenants/", {"q": "glob"})) == [("globex", "Globex AI")]
    assert options(ops.get("/search/tenants/", {"q": "ACME RES"})) == [("acme", "Acme Research")]
    found = options(ops.get("/search/tenants/", {"q": "bulk"}))
    assert len(found) == 20 and found[0] == ("bulk-000", "Bulk tenant 000")
    # htmx sends the field's own name and value: the same answer.
    assert options(ops.get("/search/tenants/", {"tenant": "glob"})) == [("globex", "Globex AI")]
    assert len(options(ops.get("/search/tenants/"))) == 20  # nothing typed yet: the first twenty by name


def test_search_is_scoped_to_the_tenants_one_sees(as_user, client, cast, many_tenants) -> None:
    assert options(as_user("carol").get("/search/tenants/", {"q": "glob"})) == []
    assert options(as_user("carol").get("/search/tenants/", {"q": "a"})) == [("acme", "Acme Research")]
    assert options(as_user("frank").get("/search/tenants/")) == [("globex", "Globex AI")]
    assert options(as_user("nobody").get("/search/tenants/")) == []
    client.logout()
    assert client.get("/search/tenants/").status_code == 302  # sign in first


def test_ops_requests_filter_by_a_typed_tenant_without_listing_every_tenant(as_user, cast, many_tenants) -> None:
    cat = make_catalogue(cast)
    make_request(cat, cast.vision, cast.carol, state=S.RUNNING, name="acme-one")
    make_request(cat, cast.llm, cast.frank, state=S.FAILED, name="globex-one")
    ops = as_user("ops")
    body = ops.get("/ops/requests/").content.decode()
    assert '<select name="tenant"' not in body and "Bulk tenant" not in body  # no option per tenant
    field = re.search(r'<input type="text" name="tenant"[^>]*>', body).group(0)
    assert 'list="tenant-options"' in field and 'hx-get="/search/tenants/"' in field
    assert '<datalist id="tenant-options"></datalist>' in body
    for typed in ("globex", "Globex AI", "globex ai", " globex "):  # the slug, or the name in any case
        body = ops.get("/ops/requests/", {"tenant": typed}).content.decode()
        assert "globex-one" in body and "acme-one" not in body, typed
    body = ops.get("/ops/requests/", {"tenant": "glob"}).content.decode()
    assert "globex-one" not in body and "acme-one" not in body and "No request matches these filters." in body

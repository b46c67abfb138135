"""The API lists' filter backend (``portal.inputs.FilterBackend``): django-filter's, not run when no query parameter
asks for more than a page. Through the HTTP API: the same rows and order with and without it, its 400s and its
filtering when asked, and no FilterSet built for a plain page."""

from __future__ import annotations

import django_filters
import pytest

from quotas import services
from quotas.models import QuotaRequest

from .factories import GPU

pytestmark = [pytest.mark.django_db]

API = "/api/v1"


@pytest.fixture
def built(monkeypatch) -> list[str]:
    """The FilterSets django-filter builds, by class name (django-filter's constructor, wrapped to count)."""
    names: list[str] = []
    original = django_filters.FilterSet.__init__

    def counting(self, *args, **kwargs):
        names.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(django_filters.FilterSet, "__init__", counting)
    return names


def _ask(cast, fleet, who: str, amount: int) -> QuotaRequest:
    return services.quota_request_create(actor=cast.actor(who), project=cast.vision, flavor=fleet.h100, resource=GPU,
                                         amount=amount, reason="More runs.")


def _ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


def test_a_plain_page_builds_no_filterset_and_lists_what_the_filters_would(api, cast, fleet, built) -> None:
    mine = [_ask(cast, fleet, "carol", n) for n in (1, 2, 3)]
    client = api("bob")
    plain = _ids(client.get(f"{API}/quota-requests/"))
    assert built == []
    assert sorted(plain) == sorted(r.pk for r in mine)
    # The same rows in the same order (the model's ordering) when a parameter runs the FilterSet without narrowing.
    assert _ids(client.get(f"{API}/quota-requests/?tenant=")) == plain
    assert built == ["QuotaRequestFilter"]
    # Paging parameters alone build none either.
    assert _ids(client.get(f"{API}/quota-requests/?page=1&page_size=2")) == plain[:2]
    assert _ids(client.get(f"{API}/approvals/?page_size=5&format=json")) == []
    assert built == ["QuotaRequestFilter"]


def test_asked_filters_still_filter_and_refuse_bad_values(api, cast, fleet) -> None:
    first = _ask(cast, fleet, "carol", 1)
    second = _ask(cast, fleet, "carol", 2)
    services.quota_request_reject(actor=cast.actor("alice"), request=second, comment="Not now.")
    client = api("bob")
    assert _ids(client.get(f"{API}/quota-requests/?status=pending")) == [first.pk]
    assert _ids(client.get(f"{API}/quota-requests/?status=rejected&page_size=10")) == [second.pk]
    bad = client.get(f"{API}/quota-requests/?status=bogus")
    assert bad.status_code == 400
    assert "status" in bad.json()["fields"]
    bad = client.get(f"{API}/requests/?state=nope&cursor=")
    assert bad.status_code == 400
    # An order asked for is honoured (OrderingFilter), the FilterSet skipped or not.
    assert _ids(client.get(f"{API}/quota-requests/?ordering=amount")) == [first.pk, second.pk]
    assert _ids(client.get(f"{API}/quota-requests/?ordering=-amount")) == [second.pk, first.pk]


def test_another_tenants_rows_stay_out_without_the_filterset(api, cast, fleet, built) -> None:
    _ask(cast, fleet, "carol", 1)
    assert _ids(api("erin").get(f"{API}/quota-requests/")) == []
    assert _ids(api("erin").get(f"{API}/approvals/")) == []
    assert built == []

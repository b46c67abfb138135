"""The project quota page's request form offers the enforced flavors from the process's copy
(``quotas.selectors.ENFORCED_FLAVORS``): no query for them once read, and a flavor changed through the API is seen by
the next page view.

Committed transactions, as in production: inside a transaction nothing is kept (the table is read)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

pytestmark = [pytest.mark.django_db(transaction=True)]

PAGE = "/projects/acme-vision/quota/"


def _offered(response) -> set[str]:
    return {label for key, label in response.context["form"].fields["target"].choices if key}


def test_the_request_form_reads_no_flavors_once_kept(as_user, split) -> None:
    client = as_user("carol")
    first = client.get(PAGE)
    assert first.status_code == 200
    assert any(split.h100.name in label for label in _offered(first)), _offered(first)
    with CaptureQueriesContext(connection) as ctx:
        again = client.get(PAGE)
    assert again.status_code == 200 and _offered(again) == _offered(first)
    flavor_reads = [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().startswith('SELECT') and
                    'FROM "quotas_flavor"' in q["sql"]]
    assert flavor_reads == [], "\n".join(s[:300] for s in flavor_reads)


def test_a_flavor_deactivated_through_the_api_is_no_longer_offered(as_user, api, split) -> None:
    assert any(split.h100.name in label for label in _offered(as_user("carol").get(PAGE)))
    changed = api("ops").patch(f"/api/v1/flavors/{split.h100.pk}/", {"active": False}, format="json")
    assert changed.status_code == 200, changed.content
    assert not any(split.h100.name in label for label in _offered(as_user("carol").get(PAGE)))
    back = api("ops").patch(f"/api/v1/flavors/{split.h100.pk}/", {"active": True}, format="json")
    assert back.status_code == 200, back.content
    assert any(split.h100.name in label for label in _offered(as_user("carol").get(PAGE)))

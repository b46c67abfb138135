"""``Pager(most=…)`` counts at most that many rows past the page's start (one ``COUNT(*)`` of a LIMITed subquery, the
same cost at any size): more than that reads "N+", with no last page; fewer, the exact count as before. The request
list (``/requests/``) pages this way."""

from __future__ import annotations

from django.db import connection
from django.template import engines
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from portal.ui import Pager
from tests.workloads.factories import make_catalogue, make_request
from workloads.models import WorkloadRequest

PAGINATION = engines["django"].from_string('{% include "includes/pagination.html" %}')


def _pager(query: str, most: int) -> tuple[Pager, str, list[str]]:
    rows = WorkloadRequest.objects.order_by("-created_at", "-id")
    with CaptureQueriesContext(connection) as queries:
        pager = Pager(RequestFactory().get(f"/requests/{query}"), rows, per_page=2, most=most)
        text = " ".join(PAGINATION.render({"pager": pager}).split())
    return pager, text, [q["sql"] for q in queries.captured_queries]


def test_the_count_stops_at_its_bound(cast) -> None:
    cat = make_catalogue(cast)
    made = [make_request(cat, cast.vision, cast.carol) for _ in range(12)]

    pager, text, sql = _pager("?state=x", 5)
    assert pager.capped and len(pager) == 2 and [r.pk for r in pager] == [r.pk for r in made[::-1][:2]]
    assert "1–2 of 5+" in text and "Page 1 of 3+" in text and "Next" in text and "Last" not in text
    assert pager.next_url == "?state=x&page=2" and pager.last_url is None
    assert len(sql) == 2 and "LIMIT 6" in sql[1] and "COUNT(*)" in sql[1]

    pager, text, _ = _pager("?page=4", 5)  # counted from the page's start: 6 + 5
    assert pager.capped and "7–8 of 11+" in text and "Page 4 of" in text and "‹ Previous" in text and "« First" in text

    pager, text, _ = _pager("?page=5", 5)  # 8 + 5 is more than there are: the exact count, the last page known
    assert not pager.capped and "9–10 of 12" in text and "Page 5 of 6" in text and pager.last_url is None

    pager, text, _ = _pager("", 20)
    assert not pager.capped and "1–2 of 12" in text and "Page 1 of 6" in text and pager.last_url == "?page=6"

    pager, text, _ = _pager("?page=99", 5)  # past the end: the last page, as without a bound
    assert pager.page.number == 6 and "11–12 of 12" in text


def test_the_request_list_counts_exactly_below_the_bound(as_user, cast) -> None:
    cat = make_catalogue(cast)
    for _ in range(3):
        make_request(cat, cast.vision, cast.carol)
    body = " ".join(as_user("carol").get("/requests/").content.decode().split())
    assert "1–3 of 3" in body

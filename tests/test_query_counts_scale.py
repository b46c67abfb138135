"""Query counts do not grow with the data: every page and API list of ``tests/bench/speedworld.ENDPOINTS``
answers with as many queries over 200 rows as over 10 (a pager's one ``COUNT(*)`` aside: a list that still fits
one page at 10 rows needs none, ``portal.ui.page_of``), and the pages of ``CEILING_PAGES`` with at most
``CEILING`` queries at either size.

One world is seeded (the demo, then ``seed_rows``: N requests, half of them in acme-vision, N extra projects
in other tenants and N in acme, N members, tokens, quota requests and nodes), every endpoint is counted at
N=10, the world grows to N=200 and every endpoint is counted again (``CaptureQueriesContext``, after a warm-up
call). The data lives in one transaction, rolled back at the end. ``tests/bench/speed.py`` measures the same
endpoints' time.
"""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

from tests.bench.speedworld import ENDPOINTS, count_queries, make_clients, seed_base, seed_rows

# django_db: pytest-django makes the test database only for marked tests; the data itself lives in `counts`.
pytestmark = [pytest.mark.django_db, pytest.mark.xdist_group("query-counts")]

SIZES = (10, 200)
MEASURED = [(name, who, path) for name, kind, who, path in ENDPOINTS if kind != "floor"]
# Pages whose count grows with the data today (strict: the test says so once one is fixed).
GROWS: dict[str, str] = {}
# The pages people open most: each makes at most CEILING queries, whatever the page size or the rows behind it.
CEILING = 10
CEILING_PAGES = [
    "page request list", "page request list (projects)", "page request list (small project)", "page project detail",
    "page ops requests", "page capacity", "page tenant quotas", "page project quota", "page quota requests",
    "page approvals inbox",
]
# Over the ceiling today, and why (strict: the test says so once one is under it). None: the page frame costs a
# page at most three queries (the session, unless the cache holds it; the user with their ops membership; the
# approvals count for approvers and ops), the navigation's other questions are answered from the scope.
OVER_CEILING: dict[str, str] = {}


def pager_counts(sql: list[str]) -> int:
    """The pagers' counts: ``COUNT(*)``, or one bounded by a LIMITed subquery (``portal.ui.BoundedPaginator``)."""
    return sum(1 for s in sql if s.startswith(('SELECT COUNT(*) AS "__count"', "SELECT COUNT(*) FROM (SELECT")))


@pytest.fixture(scope="module")
def counts(django_db_setup, django_db_blocker, tmp_path_factory) -> dict[str, list[tuple[int, list[str]]]]:
    """endpoint name -> [(queries, their SQL) at each of SIZES]."""
    kubeconfig = tmp_path_factory.mktemp("no-cluster") / "kubeconfig"  # never written: no cluster
    cache = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "query-counts"}}
    result: dict[str, list[tuple[int, list[str]]]] = {name: [] for name, _, _ in MEASURED}
    with django_db_blocker.unblock(), override_settings(KUBECONFIG=str(kubeconfig), CACHES=cache,
                                                       PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]), transaction.atomic():
        world = seed_base()
        clients = make_clients(world)
        grown = 0
        for size in SIZES:
            more = size - grown
            seed_rows(world, requests=more, projects=more, acme_projects=more, members=more, tokens=more,
                      quota_requests=more, nodes=more, hot=0.5)
            grown = size
            for name, who, path in MEASURED:
                sql = count_queries(clients[who], world.path(path))
                result[name].append((len(sql), sql))
        transaction.set_rollback(True)
    return result


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=GROWS[name])) if name in GROWS else name
    for name, _, _ in MEASURED
])
def test_query_count_does_not_grow_with_rows(counts, name: str) -> None:
    (small, small_sql), (large, sql) = counts[name]
    # A pager counts only a full page: one COUNT(*) per list may appear between 10 and 200 rows, never more.
    assert large - pager_counts(sql) <= small - pager_counts(small_sql) and pager_counts(sql) <= 3, (
        f"{name}: {small} queries with {SIZES[0]} rows, {large} with {SIZES[1]}:\n" + "\n".join(s[:200] for s in sql)
    )


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=OVER_CEILING[name])) if name in OVER_CEILING
    else name
    for name in CEILING_PAGES
])
def test_page_makes_at_most_ten_queries(counts, name: str) -> None:
    for size, (n, sql) in zip(SIZES, counts[name], strict=True):
        assert n <= CEILING, f"{name}: {n} queries with {size} rows:\n" + "\n".join(s[:200] for s in sql)

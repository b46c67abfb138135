"""Query counts do not grow with the data: every page and API list of ``tests/bench/speedworld.ENDPOINTS``
answers with as many queries over 200 rows as over 10.

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


@pytest.fixture(scope="module")
def counts(django_db_setup, django_db_blocker, tmp_path_factory) -> dict[str, list[tuple[int, list[str]]]]:
    """endpoint name -> [(queries, their SQL) at each of SIZES]."""
    kubeconfig = tmp_path_factory.mktemp("no-cluster") / "kubeconfig"  # never written: no cluster
    cache = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "query-counts"}}
    result: dict[str, list[tuple[int, list[str]]]] = {name: [] for name, _, _ in MEASURED}
    with django_db_blocker.unblock(), override_settings(KUBECONFIG=str(kubeconfig), CACHES=cache,
                                                       PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        with transaction.atomic():
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
    (small, _), (large, sql) = counts[name]
    assert large <= small, (
        f"{name}: {small} queries with {SIZES[0]} rows, {large} with {SIZES[1]}:\n" + "\n".join(s[:200] for s in sql)
    )

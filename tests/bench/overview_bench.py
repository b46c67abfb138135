"""How fast the two metrics overviews answer on the demo (a script, not a test).

    python tests/bench/overview_bench.py [--db URL] [--repeat 10] [--rollups] [--keep]

1. Makes a fresh, throwaway database (``--db`` or ``DATABASE_URL``: PostgreSQL ``<name>`` becomes
   ``overview_bench_<pid>``; without either, an SQLite file under var/bench/, as a plain ``make run``),
   migrates it and runs ``manage.py seed_demo`` (no cluster: the demo's three weeks of history, as ``make run``).
   ``--rollups``: then refreshes the request, sample and cost rollups as the beat tasks would.
2. Gets ``/ops/metrics/`` as ops and ``/tenants/acme/metrics/`` as alice with Django's test client, once to warm
   up, then ``--repeat`` times each: prints p50 / p95 / max in ms and the queries of one call (``--compare``: also
   with the metrics' shared reads off, as before they were shared, interleaved), then each metric's ``compute``
   time on the overview's query (the costliest first).

The database is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--db", default=os.environ.get("DATABASE_URL", ""), help="PostgreSQL server URL (default DATABASE_URL)")
parser.add_argument("--repeat", type=int, default=10, help="timed calls per page (default 10)")
parser.add_argument("--rollups", action="store_true", help="refresh the rollups before timing")
parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
parser.add_argument("--sql", action="store_true", help="print the SQL of one call of each page")
parser.add_argument("--compare", action="store_true", help="also time each page with the shared reads off "
                    "(insights.memo.one_page a no-op: every metric reads for itself, as before they were shared), "
                    "interleaved with the normal calls")
ARGS = parser.parse_args()
VAR = REPO / "var" / "bench"
VAR.mkdir(parents=True, exist_ok=True)
if not ARGS.db:  # SQLite, as a plain ``make run``
    ARGS.db = f"sqlite:///{VAR / f'overview-{os.getpid()}.sqlite3'}"
os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
os.environ["PORTAL_VAR_DIR"] = str(VAR)
os.environ.setdefault("DEBUG", "0")  # DEBUG=1: as under make run
os.environ["PORTAL_KUBECONFIG"] = str(VAR / "no-cluster.kubeconfig")  # nothing talks to a cluster
os.environ["DATABASE_URL"] = ARGS.db
os.environ.setdefault("PORTAL_RUNTIME_DB_ROLE", "")
if not (os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL")):
    os.environ["CELERY_BROKER_URL"] = f"portal+sqlite:///{VAR / f'overview-{os.getpid()}-broker.sqlite3'}"

import django  # only now: the settings read the environment above

django.setup()

from django.core.management import call_command
from django.core.signals import request_started
from django.db import connection, reset_queries
from django.test import Client
from django.test.utils import CaptureQueriesContext, setup_test_environment


def _ms(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
    return f"p50 {statistics.median(values):7.1f} ms  p95 {p95:7.1f} ms  max {values[-1]:7.1f} ms"


def main() -> int:
    setup_test_environment()
    request_started.disconnect(reset_queries)  # keep each call's queries for the count
    db = connection.settings_dict
    test_name = f"overview_bench_{os.getpid()}"
    db.setdefault("TEST", {})["NAME"] = str(VAR / f"{test_name}.sqlite3") if "sqlite" in db["ENGINE"] else test_name
    started = time.monotonic()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    print(f"database {db['NAME']} (migrated in {time.monotonic() - started:.1f} s)")
    try:
        started = time.monotonic()
        call_command("seed_demo", stdout=io.StringIO())
        print(f"seeded the demo in {time.monotonic() - started:.1f} s")
        if ARGS.rollups:
            from billing import rollup as cost_rollup
            from insights import rollups, sample_rollups

            rollups.rollups_refresh()
            sample_rollups.sample_rollups_refresh()
            cost_rollup.refresh()
            print("refreshed the rollups")
        from django.contrib.auth import get_user_model

        users = {u.username: u for u in get_user_model().objects.filter(username__in=["ops", "alice"])}
        pages = [("ops", "/ops/metrics/"), ("alice", "/tenants/acme/metrics/")]
        print(f"\n{'page':<28} {'queries':>7}  latency over {ARGS.repeat} calls")
        import contextlib

        from insights import memo

        shared = memo.one_page
        modes = [("", shared)] + ([(" (not shared)", contextlib.nullcontext)] if ARGS.compare else [])
        for username, path in pages:
            client = Client()
            client.force_login(users[username])
            assert client.get(path).status_code == 200, path
            counts, times = {}, {label: [] for label, _ in modes}
            for label, one_page in modes:
                memo.one_page = one_page
                with CaptureQueriesContext(connection) as counts[label]:
                    client.get(path)
            for _ in range(ARGS.repeat):
                for label, one_page in modes:
                    memo.one_page = one_page
                    t = time.perf_counter()
                    response = client.get(path)
                    times[label].append((time.perf_counter() - t) * 1000)
                    assert response.status_code == 200
            memo.one_page = shared
            for label, _ in modes[1:]:
                print(f"{path + label:<28} {len(counts[label]):>7}  {_ms(times[label])}")
            queries, times = counts[""], times[""]
            if ARGS.sql:
                for q in queries.captured_queries:
                    print(f"  {float(q['time']) * 1000:6.1f} ms  {q['sql'][:300]}")
            sql_ms = sum(float(q["time"]) for q in queries.captured_queries) * 1000
            print(f"{path:<28} {len(queries):>7}  {_ms(times)}  (SQL {sql_ms:.0f} ms of one call)")
        from insights import selectors
        from insights.registry import METRICS
        from tenants.access import Actor

        start, end = selectors.last_days()
        actor = Actor(user=users["ops"])
        costs = []
        for metric in METRICS.values():
            filters = selectors.Filters(start=start, end=end, group_by=selectors.group_for(metric, "tenant"))
            query = selectors.query_for(actor=actor, filters=filters, tenants=None)
            metric.compute(query)
            t = time.perf_counter()
            with CaptureQueriesContext(connection) as queries:
                metric.compute(query)
            costs.append(((time.perf_counter() - t) * 1000, metric.key, len(queries)))
        print("\nops overview, per metric (ms, queries):")
        for ms, key, n in sorted(costs, reverse=True):
            print(f"  {key:<24} {ms:7.1f} ms  {n:>3} queries")
    finally:
        if ARGS.keep:
            print(f"kept database {db['NAME']}")
        else:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

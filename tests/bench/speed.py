"""How fast the pages and the API answer, next to a floor (a script, not a test).

    python tests/bench/speed.py [--n 2000] [--projects 20] [--db URL] [--rounds 5] [--per-round 10]
                                [--live 2000] [--submissions 100] [--sequential 100] [--conn-max-age 60] [--keep]

1. Makes a fresh, throwaway database (``--db`` or ``DATABASE_URL``: PostgreSQL ``<name>`` becomes
   ``speed_<pid>``; without either, an SQLite file under var/bench/), migrates it and seeds it with
   ``bulk_create`` (tests/bench/speedworld.py): the demo's tenants, users and quotas, ``--n`` requests
   (a fifth of them in acme-vision, the project every measured user looks at), ``--projects`` extra
   projects in extra tenants, quota requests, members, tokens and nodes. Only the newest ``--live`` requests
   may be running, queued or awaiting approval; the older ones are over.
2. Query counts, in this process (Django's test client, ``CaptureQueriesContext``): every endpoint of
   ``speedworld.ENDPOINTS`` once, after a warm-up call.
3. Latency over real HTTP: one gunicorn sync worker (DEBUG off, this database, ``DB_CONN_MAX_AGE`` from
   ``--conn-max-age``), ``--rounds`` x ``--per-round`` calls per endpoint, interleaved in a shuffled order
   so that every endpoint sees the same machine. Prints p50/p95 in ms and the ratio of each to the floor:
   ``tests/bench/floor.py``, a hand-written token-authenticated list and detail of the same rows (3 and 2
   queries). API details compare with the floor detail, everything else with the floor list. Then the API list
   (token) ``--sequential`` times one request after another: its p50/p95/max.
4. Submissions, in this process: ``--submissions`` POSTs to ``/api/v1/requests/`` with a read+submit token,
   each approved by the global rule; queries per submission and p50/p95 ms.
5. On PostgreSQL, ``EXPLAIN (ANALYZE, BUFFERS)`` of the hot queries (run twice, the second printed): the API
   list's page and count queries in full; those of the small project's session list, the ops request list
   and the approvals inbox in short (scans, rows filtered out, planning and execution time).

Without gunicorn installed (it is in requirements.txt) step 3 uses the test client in this process and says so.
The database is dropped at the end unless ``--keep``. At scale: ``--n 100000 --projects 1000`` (seeding takes
a minute or more on PostgreSQL).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="requests in the database (default 2000)")
    parser.add_argument("--projects", type=int, default=20, help="extra projects in extra tenants (default 20)")
    parser.add_argument("--db", default=os.environ.get("DATABASE_URL", ""),
                        help="database server URL (default DATABASE_URL; empty: SQLite); a fresh database is made on it")
    parser.add_argument("--rounds", type=int, default=5, help="measuring rounds (default 5)")
    parser.add_argument("--per-round", type=int, default=10, help="calls per endpoint per round (default 10)")
    parser.add_argument("--submissions", type=int, default=100, help="API submissions measured (default 100)")
    parser.add_argument("--sequential", type=int, default=100, help="API list calls one after another (default 100)")
    parser.add_argument("--live", type=int, default=2000,
                        help="only the newest LIVE requests may be running, queued or awaiting approval (default 2000)")
    parser.add_argument("--hot", type=float, default=0.2, help="share of the requests in acme-vision (default 0.2)")
    parser.add_argument("--conn-max-age", type=int, default=60, help="DB_CONN_MAX_AGE of the server (default 60)")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    parser.add_argument("--in-process", action="store_true", help="time with the test client, not gunicorn")
    parser.add_argument("--profile", action="append", default=[], metavar="ENDPOINT",
                        help="cProfile 20 in-process calls of this endpoint and print the top functions; repeatable")
    parser.add_argument("--show-queries", action="append", default=[], metavar="ENDPOINT",
                        help="print the queries of this endpoint (a name of the table, e.g. 'API list (token)'); repeatable")
    return parser.parse_args()


ARGS = parse_args()
RUN = f"{os.getpid()}"
VAR = REPO / "var" / "bench"
VAR.mkdir(parents=True, exist_ok=True)
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.bench.speed_settings"
os.environ["PORTAL_VAR_DIR"] = str(VAR)
os.environ["DEBUG"] = "0"
os.environ["PORTAL_KUBECONFIG"] = str(VAR / "no-cluster.kubeconfig")  # nothing talks to a cluster
# The throttles run (their cache reads and writes are part of each call) but never refuse the benchmark.
os.environ["API_RATE_USER"] = os.environ["API_RATE_SUBMIT"] = "1000000/min"
os.environ["SPEED_BROKER_PREFIX"] = f"speed-{RUN}:"
if ARGS.db:
    os.environ["DATABASE_URL"] = ARGS.db
else:
    os.environ.pop("DATABASE_URL", None)
if not (os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL")):
    os.environ["CELERY_BROKER_URL"] = f"portal+sqlite:///{VAR / f'speed-{RUN}-broker.sqlite3'}"

import django  # only now: the settings read the environment above

django.setup()

from django.conf import settings
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext, setup_test_environment

from tests.bench.speedworld import (
    ENDPOINTS, GPU_FLAVOR, HOT_PROJECT, World, count_queries, make_clients, seed_base, seed_rows,
)

POSTGRES = connection.vendor == "postgresql"


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------ HTTP
class Server:
    """One gunicorn sync worker serving this database with DEBUG off."""

    def __init__(self, database_url: str) -> None:
        self.port = free_port()
        env = os.environ | {"DATABASE_URL": database_url, "DB_CONN_MAX_AGE": str(ARGS.conn_max_age),
                            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "portal.wsgi:application", "--workers", "1", "--worker-class", "sync",
             "--bind", f"127.0.0.1:{self.port}", "--log-level", "warning", "--timeout", "120"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = self.get("/accounts/login/", {})
                if status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start: {self.proc.stderr.read() if self.proc.stderr else ''}")
            time.sleep(0.2)

    def get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def http_headers(world: World, by: dict) -> dict[str, dict[str, str]]:
    out = {"token": {"Authorization": f"Bearer {world.token_raw}", "Accept": "application/json"}}
    for who, client in by.items():
        if who != "token":
            out[who] = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"}
    return out


def measure(world: World, by: dict, database_url: str) -> tuple[dict[str, list[float]], list[float], str]:
    """Latencies (ms) per endpoint, interleaved; then the API list one call after another."""
    endpoints = [(name, who, world.path(path)) for name, _, who, path in ENDPOINTS]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in endpoints}
    sequential: list[float] = []
    api_list = next(e for e in endpoints if e[0] == "API list (token)")
    rng = random.Random(7)
    if ARGS.in_process:
        how = "in process (Django test client)"

        def call(who: str, path: str) -> int:
            return by[who].get(path).status_code
    else:
        try:
            import gunicorn  # noqa: F401 (only to know it is there)
        except ImportError:
            print("gunicorn is not installed (pip install -r requirements.txt): timing in process instead")
            ARGS.in_process = True
            return measure(world, by, database_url)
        server = Server(database_url)
        headers = http_headers(world, by)
        how = f"HTTP, one gunicorn sync worker, DEBUG off, DB_CONN_MAX_AGE={ARGS.conn_max_age}"

        def call(who: str, path: str) -> int:
            return server.get(path, headers[who])[0]
    try:
        for name, who, path in endpoints:  # warm-up: imports, templates, the connection
            for _ in range(3):
                status = call(who, path)
                if status != 200:
                    raise RuntimeError(f"{name}: {path} answered {status}")
        for _ in range(ARGS.rounds):
            for _ in range(ARGS.per_round):
                order = endpoints[:]
                rng.shuffle(order)
                for name, who, path in order:
                    start = time.perf_counter()
                    call(who, path)
                    samples[name].append((time.perf_counter() - start) * 1000)
        for _ in range(ARGS.sequential):
            start = time.perf_counter()
            call(api_list[1], api_list[2])
            sequential.append((time.perf_counter() - start) * 1000)
    finally:
        if not ARGS.in_process:
            server.stop()
    return samples, sequential, how


# --------------------------------------------------------------------------------------------- submissions
def bench_submissions(world: World) -> tuple[list[int], list[float], int]:
    import json

    from rest_framework.test import APIClient

    from tenants.access import Actor
    from tenants.models import Project
    from tenants.services import token_create

    _, raw = token_create(actor=Actor(user=world.users["carol"]), project=Project.objects.get(slug=HOT_PROJECT),
                          name="bench-submit", scope="read+submit")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    counts, times, approved = [], [], 0
    for i in range(ARGS.submissions + 3):
        body = {"template": "training", "flavor": GPU_FLAVOR, "gpus": 1, "duration_hours": 4, "name": f"sub-{RUN}-{i}",
                "image": "nvcr.io/nvidia/pytorch:26.10-py3", "parameters": {"command": "python train.py"}}
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            response = client.post("/api/v1/requests/", data=json.dumps(body), content_type="application/json",
                                   HTTP_IDEMPOTENCY_KEY=f"speed-{RUN}-{i}")
            elapsed = (time.perf_counter() - start) * 1000
        assert response.status_code == 201, response.content
        if i < 3:
            continue  # warm-up
        counts.append(len(ctx.captured_queries))
        times.append(elapsed)
        approved += response.json()["state"] == "approved"
    return counts, times, approved


def profile(by: dict, world: World, name: str) -> None:
    import cProfile
    import pstats

    who, path = next((w, world.path(p)) for n, _, w, p in ENDPOINTS if n == name)
    by[who].get(path)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        by[who].get(path)
    profiler.disable()
    print(f"\n--- profile of {name} (20 calls in process), by cumulative time")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(30)


# ------------------------------------------------------------------------------------------------ EXPLAIN
def short(sql: str, width: int) -> str:
    """A query with its column list folded: ``SELECT … FROM …``."""
    head, sep, tail = sql.partition(" FROM ")
    if sep and head.upper().startswith("SELECT") and len(head) > 60:
        sql = f"SELECT … FROM {tail}"
    return sql if len(sql) <= width else sql[:width] + " …"


# The hot queries: the API list's in full; the others' scans, row counts and times.
EXPLAIN_FULL = ["API list (token)"]
EXPLAIN_COMPACT = ["API list (session, small project)", "page ops requests", "API approvals inbox"]
COMPACT_WORDS = ("Scan", "Rows Removed", "Planning Time", "Execution Time", "Limit", "Aggregate", "Hash Join", "SubPlan")


def explain(sqls: dict[str, list[str]]) -> None:
    if not POSTGRES:
        print("\n(EXPLAIN ANALYZE: PostgreSQL only)")
        return
    table = '"workloads_workloadrequest"'
    for name in EXPLAIN_FULL + EXPLAIN_COMPACT:
        hot = [s for s in sqls.get(name, []) if f"FROM {table}" in s]
        picked = [("count", next((s for s in hot if s.startswith("SELECT COUNT(*)")), None)),
                  ("page", next((s for s in hot if re.search(r" LIMIT \d+$", s)), None))]
        for what, sql in picked:
            if sql is None:
                continue
            print(f"\n--- {name}: {what} query\n{short(sql, 400)}\n")
            with connection.cursor() as cursor:
                for _ in range(2):  # the second: plans and buffers warm, as a busy server has them
                    cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                    plan = [line for (line,) in cursor.fetchall()]
            if name not in EXPLAIN_FULL:
                plan = [line for n, line in enumerate(plan) if n == 0 or any(w in line for w in COMPACT_WORDS)]
            for line in plan:
                print("  " + line)


# ------------------------------------------------------------------------------------------------ main
def database_url_of(name: str) -> str:
    if not POSTGRES and connection.vendor == "sqlite":
        return f"sqlite:///{name}"
    parts = urlsplit(ARGS.db)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def cleanup_broker() -> None:
    url = settings.CELERY_BROKER_URL
    if url.startswith("redis"):
        import redis

        r = redis.Redis.from_url(url)
        keys = list(r.scan_iter(f"{os.environ['SPEED_BROKER_PREFIX']}*"))
        if keys:
            r.delete(*keys)
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(url.removeprefix("portal+sqlite:///") + suffix).unlink(missing_ok=True)


def main() -> int:
    setup_test_environment()
    settings.DEBUG = False
    db = connection.settings_dict
    db.setdefault("TEST", {})["NAME"] = f"speed_{RUN}" if POSTGRES else str(VAR / f"speed-{RUN}.sqlite3")
    started = time.monotonic()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    print(f"database {connection.vendor} {db['NAME']} (migrated in {time.monotonic() - started:.1f} s); "
          f"cache {settings.CACHES['default']['BACKEND'].rsplit('.', 1)[-1]}; broker {settings.CELERY_BROKER_URL.split('@')[-1]}")
    try:
        started = time.monotonic()
        world = seed_base()
        seed_rows(world, requests=ARGS.n, projects=ARGS.projects, members=20, tokens=10, nodes=16,
                  quota_requests=max(20, ARGS.n // 100), hot=ARGS.hot, live=ARGS.live)
        if POSTGRES:
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")  # as autovacuum would have: visibility map, statistics
        hot_rows = world.counts["_by_group"]["hot"]
        print(f"seeded in {time.monotonic() - started:.1f} s: {ARGS.n} requests ({hot_rows} in {HOT_PROJECT}), "
              f"{ARGS.projects} extra projects, {world.counts['quota_requests']} quota requests")

        by = make_clients(world)
        sqls = {name: count_queries(by[who], world.path(path)) for name, _, who, path in ENDPOINTS}
        queries = {name: len(sql) for name, sql in sqls.items()}

        samples, sequential, how = measure(world, by, database_url_of(db["NAME"]))
        floor = {"list": statistics.median(samples["floor list"]), "detail": statistics.median(samples["floor detail"])}
        floor95 = {"list": pct(samples["floor list"], 95), "detail": pct(samples["floor detail"], 95)}
        print(f"\nlatency: {how}; {ARGS.rounds} rounds x {ARGS.per_round} calls per endpoint, interleaved")
        print(f"{'endpoint':<34} {'p50 ms':>8} {'p95 ms':>8} {'x floor p50':>12} {'x floor p95':>12} {'queries':>8}")
        for name, kind, _, path in ENDPOINTS:
            base = "detail" if "detail" in name and kind != "page" else "list"
            p50, p95 = statistics.median(samples[name]), pct(samples[name], 95)
            print(f"{name:<34} {p50:8.1f} {p95:8.1f} {p50 / floor[base]:12.2f} {p95 / floor95[base]:12.2f} {queries[name]:8d}")
        print(f"\nAPI list (token), {len(sequential)} calls one after another: p50 {statistics.median(sequential):.1f} ms, "
              f"p95 {pct(sequential, 95):.1f} ms, max {max(sequential):.1f} ms")

        counts, times, approved = bench_submissions(world)
        print(f"\nsubmissions (in process, token, auto-approved {approved}/{len(times)}): "
              f"queries {statistics.median(counts):.0f} (min {min(counts)}, max {max(counts)}), "
              f"p50 {statistics.median(times):.1f} ms, p95 {pct(times, 95):.1f} ms")

        for name in ARGS.show_queries:
            print(f"\n--- queries of {name}")
            for n, sql in enumerate(sqls[name], 1):
                print(f"{n:3d}. {short(sql, 240)}")
        for name in ARGS.profile:
            profile(by, world, name)
        explain(sqls)
    finally:
        connections.close_all()
        cleanup_broker()
        if ARGS.keep:
            print(f"\nkept database {db['NAME']}")
        else:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

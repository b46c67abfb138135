"""How fast the pages and the API answer, next to a floor (a script, not a test).

    python tests/bench/speed.py [--n 2000] [--projects 20] [--db URL] [--rounds 5] [--per-round 10]
                                [--live 2000] [--submissions 100] [--sequential 100] [--conn-max-age 60] [--keep]
                                [--concurrency 4,16 [--workers 4] [--duration 10]] [--profile-top NAME] [--slowest N]
                                [--check]

1. Makes a fresh, throwaway database (``--db`` or ``DATABASE_URL``: PostgreSQL ``<name>`` becomes
   ``speed_<pid>``; without either, an SQLite file under var/bench/), migrates it and seeds it with
   ``bulk_create`` (tests/bench/speedworld.py): the demo's tenants, users and quotas, ``--n`` requests
   (a fifth of them in acme-vision, the project every measured user looks at), ``--projects`` extra
   projects in extra tenants, quota requests, members, tokens and nodes. Only the newest ``--live`` requests
   may be running, queued or awaiting approval; the older ones are over. On PostgreSQL then ``VACUUM ANALYZE`` (as
   autovacuum would have) and ``CHECKPOINT`` (the seeding's writes on disk before anything is timed).
2. Query counts, in this process (Django's test client, ``CaptureQueriesContext``): every endpoint of
   ``speedworld.ENDPOINTS`` once, after a warm-up call.
3. Latency over real HTTP: one gunicorn sync worker (DEBUG off, this database, ``DB_CONN_MAX_AGE`` from
   ``--conn-max-age``), ``--rounds`` x ``--per-round`` calls per endpoint, interleaved in a shuffled order
   so that every endpoint sees the same machine. Prints p50/p95 in ms and the ratio of each to the floor:
   ``tests/bench/floor.py``, a hand-written token-authenticated list and detail of the same rows (3 and 2
   queries). API details compare with the floor detail, everything else with the floor list. Then the API lists
   of ``SEQUENTIAL`` (token, session, a small project's session), ``--sequential`` times each, one request at a
   time: their p50/p95/max.
4. Submissions, in this process: ``--submissions`` POSTs to ``/api/v1/requests/`` with a read+submit token,
   each approved by the global rule; queries per submission and p50/p95 ms. After seeding, this process collects
   its garbage as a web worker does (``portal.gc_pacing.start_web_worker``, as ``portal/wsgi.py``); each timed
   call includes the collection it starts with (of what the call before left).
5. ``--concurrency 4,16``: throughput (req/s) of the floor list, the API list (token) and API submissions with
   4, then 16 concurrent clients (threads of this process, tests/bench/concurrency.py) against gunicorn with
   ``--workers`` sync workers, ``--duration`` seconds per endpoint and level in two interleaved halves; each
   next to the floor list's req/s at the same concurrency.
6. ``--profile-top NAME`` (an endpoint of the table, or ``submission``): cProfile 20 in-process calls; where the
   time goes (SQL, templates, serializers, cache), the portal's own 15 costliest functions by cumulative time
   and the stack's 8 by own time, in ms per call.
7. On PostgreSQL, ``EXPLAIN (ANALYZE, BUFFERS)`` of the hot queries (run twice, the second printed): the API
   list's page and count queries in full; those of the small project's session list, the ops request list
   and the approvals inbox in short (scans, rows filtered out, planning and execution time).
8. The **Targets** table: every target of the speed issue (``TARGET_*`` below), what this run measured and
   ``met`` / ``NOT MET``; ``--check`` exits 1 when one is not met. The at-scale row needs ``--n 100000`` on
   PostgreSQL (else "not measured at this N"); throughput has no target and is reported only. Its heading says how
   fast this machine is (``machine_speed``: a fixed Python workload and a ``SELECT 1`` round trip), for reading the
   absolute targets (ms) against other runs.
9. ``--slowest N``: the N timed calls of step 3 slowest next to their endpoint's p50, with when they ran. Slow calls
   of many endpoints within a second are the machine's; one endpoint's slow calls spread out are its own.

Without gunicorn installed (it is in requirements.txt) step 3 uses the test client in this process and says so.
The database is dropped at the end unless ``--keep``. At scale: ``--n 100000 --projects 1000`` (seeding takes
a minute or more on PostgreSQL).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
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
    parser.add_argument("--profile-top", action="append", default=[], metavar="ENDPOINT",
                        help="cProfile 20 in-process calls of this endpoint ('submission': the API POST) and print its 15 "
                             "costliest functions by cumulative time, the portal's own and the stack's; repeatable (environment: "
                             "PROFILE_TOP=N functions, PROFILE_ALL=N the stack's too, PROFILE_DUMP=file the raw profile "
                             "for pstats' callers and callees)")
    parser.add_argument("--trace-submission", action="store_true",
                        help="time the steps of 20 in-process submissions: each SQL statement, Redis command and the "
                             "broker publish, and what is left (Python)")
    parser.add_argument("--show-queries", action="append", default=[], metavar="ENDPOINT",
                        help="print the queries of this endpoint (a name of the table, e.g. 'API list (token)'); repeatable")
    parser.add_argument("--concurrency", default="", metavar="N,N",
                        help="throughput with N concurrent clients (e.g. 4,16) against gunicorn with --workers workers")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers for --concurrency (default 4)")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds per endpoint and concurrency, in two interleaved halves (default 10)")
    parser.add_argument("--slowest", type=int, default=0, metavar="N",
                        help="print the N timed calls slowest next to their endpoint's p50, with when they ran")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is not met")
    return parser.parse_args()


ARGS = parse_args()
try:
    LEVELS = [int(x) for x in ARGS.concurrency.split(",") if x.strip()]
except ValueError:
    raise SystemExit(f"--concurrency: numbers of clients, e.g. 4,16 (not {ARGS.concurrency!r})") from None
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

from portal import gc_pacing

from tests.bench.speedworld import (
    ENDPOINTS, GPU_FLAVOR, HOT_PROJECT, World, count_queries, make_clients, seed_base, seed_rows,
)

POSTGRES = connection.vendor == "postgresql"


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def machine_speed() -> str:
    """How fast this machine is, for reading the absolute targets (ms) next to other runs: the best of 5 timings of
    a fixed pure-Python workload (sorting 1,000 numbers by a key, 1,000 times) and the median of 200 ``SELECT 1``
    round trips on this database. The ratios to the floor do not need it: the floor runs on the same machine,
    interleaved."""
    import timeit

    python_ms = min(timeit.repeat("sorted(x, key=lambda v: -v)", "x = list(range(1000))", number=1000, repeat=5))
    trips = []
    with connection.cursor() as cursor:
        for _ in range(200):
            start = time.perf_counter()
            cursor.execute("SELECT 1")
            cursor.fetchone()
            trips.append((time.perf_counter() - start) * 1000)
    return f"Python workload {python_ms * 1000:.0f} ms, SELECT 1 round trip {statistics.median(trips):.2f} ms"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------ HTTP
class Server:
    """gunicorn sync workers (one unless told) serving this database with DEBUG off."""

    def __init__(self, database_url: str, workers: int = 1) -> None:
        self.port = free_port()
        env = os.environ | {"DATABASE_URL": database_url, "DB_CONN_MAX_AGE": str(ARGS.conn_max_age),
                            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "portal.wsgi:application", "--workers", str(workers), "--worker-class", "sync",
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


# Called one request at a time (none other in flight) after the rounds, in turn: the at-scale target's lists.
SEQUENTIAL = ["API list (token)", "API list (session)", "API list (session, small project)"]


# Every timed call of the rounds in order: (endpoint, start (perf_counter), ms), for --slowest.
TIMELINE: list[tuple[str, float, float]] = []


def print_slowest(samples: dict[str, list[float]], n: int) -> None:
    """The n calls slowest next to their endpoint's p50: when they ran (seconds into the rounds, call number) and what
    ran just before; slow calls of many endpoints close together are the machine's, one endpoint's alone its own."""
    if not TIMELINE or n <= 0:
        return
    t0 = TIMELINE[0][1]
    p50 = {name: statistics.median(values) for name, values in samples.items() if values}
    ranked = sorted(range(len(TIMELINE)), key=lambda i: TIMELINE[i][2] / p50[TIMELINE[i][0]], reverse=True)[:n]
    print(f"\nthe {n} calls slowest next to their endpoint's p50 (of {len(TIMELINE)} timed calls):")
    for i in sorted(ranked):
        name, start, ms = TIMELINE[i]
        before = TIMELINE[i - 1][0] if i else "-"
        print(f"  #{i:5d} {start - t0:7.2f} s  {name:<34} {ms:7.1f} ms = {ms / p50[name]:4.1f}x p50  (after {before})")


def measure(world: World, by: dict, database_url: str) -> tuple[dict[str, list[float]], dict[str, list[float]], str]:
    """Latencies (ms) per endpoint, interleaved; then the API lists of SEQUENTIAL one call after another."""
    endpoints = [(name, who, world.path(path)) for name, _, who, path in ENDPOINTS]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in endpoints}
    sequential: dict[str, list[float]] = {name: [] for name in SEQUENTIAL}
    lists = [e for e in endpoints if e[0] in SEQUENTIAL]
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
                    TIMELINE.append((name, start, samples[name][-1]))
        for _ in range(ARGS.sequential):
            for name, who, path in lists:
                start = time.perf_counter()
                call(who, path)
                sequential[name].append((time.perf_counter() - start) * 1000)
    finally:
        if not ARGS.in_process:
            server.stop()
    return samples, sequential, how


# --------------------------------------------------------------------------------------------- submissions
_SUBMIT_TOKEN: list[str] = []


def submit_token(world: World) -> str:
    """carol's read+submit token on the hot project (made once)."""
    if not _SUBMIT_TOKEN:
        from tenants.access import Actor
        from tenants.models import Project
        from tenants.services import token_create

        _, raw = token_create(actor=Actor(user=world.users["carol"]), project=Project.objects.get(slug=HOT_PROJECT),
                              name="bench-submit", scope="read+submit")
        _SUBMIT_TOKEN.append(raw)
    return _SUBMIT_TOKEN[0]


def submission_body(i: int) -> bytes:
    """A submission the global rule approves alone (1 GPU, 4 hours; the hot project has quota for the flavor)."""
    import json

    return json.dumps({"template": "training", "flavor": GPU_FLAVOR, "gpus": 1, "duration_hours": 4,
                       "name": f"sub-{RUN}-{i}", "image": "nvcr.io/nvidia/pytorch:26.10-py3",
                       "parameters": {"command": "python train.py"}}).encode()


def submit_client(world: World) -> Any:
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {submit_token(world)}")
    return client


def submit_once(client: Any, what: str, i: int) -> Any:
    return client.post("/api/v1/requests/", data=submission_body(i), content_type="application/json",
                       HTTP_IDEMPOTENCY_KEY=f"{what}-{RUN}-{i}")


def bench_submissions(world: World) -> tuple[list[int], list[float], int]:
    """Queries per submission (every fifth call, under ``CaptureQueriesContext``) and the time of the others (no
    query log: writing each statement out for the log is not part of a real request's time)."""
    client = submit_client(world)
    counts, times, approved = [], [], 0
    total = ARGS.submissions + max(1, ARGS.submissions // 4)
    for i in range(total + 3):
        counted = i >= 3 and i % 5 == 0
        with CaptureQueriesContext(connection) if counted else contextlib.nullcontext() as ctx:
            start = time.perf_counter()
            response = submit_once(client, "speed", i)
            elapsed = (time.perf_counter() - start) * 1000
        assert response.status_code == 201, response.content
        if i < 3:
            continue  # warm-up
        approved += response.json()["state"] == "approved"
        if counted:
            counts.append(len(ctx.captured_queries))
        else:
            times.append(elapsed)
    return counts, times, approved


# -------------------------------------------------------------------------------------------- concurrency
CONCURRENT = ["floor list", "API list (token)", "API submission (token)"]


def bench_concurrency(world: World, database_url: str, levels: list[int]) -> dict[tuple[str, int], Any]:
    """req/s of the floor list, the API list and submissions with each number of concurrent clients, against
    gunicorn with ``--workers`` sync workers; each endpoint ``--duration`` seconds per level, in two halves,
    interleaved (floor, list, submission, floor, ...)."""
    import itertools

    from tests.bench.concurrency import Result, hammer

    read = {"Authorization": f"Bearer {world.token_raw}", "Accept": "application/json"}
    submit = {"Authorization": f"Bearer {submit_token(world)}", "Accept": "application/json",
              "Content-Type": "application/json"}
    paths = {name: world.path(path) for name, _, _, path in ENDPOINTS}
    calls = {
        "floor list": (lambda i: ("GET", paths["floor list"], read, None), 200),
        "API list (token)": (lambda i: ("GET", paths["API list (token)"], read, None), 200),
        "API submission (token)": (lambda i: ("POST", "/api/v1/requests/", submit | {"Idempotency-Key": f"conc-{RUN}-{i}"},
                                              submission_body(100000 + i)), 201),
    }
    counter = itertools.count()
    results: dict[tuple[str, int], Any] = {}
    server = Server(database_url, workers=ARGS.workers)
    try:
        for name in CONCURRENT:  # warm-up: every worker imports, renders and connects
            call, expect = calls[name]
            warm = hammer(server.port, call, clients=ARGS.workers * 2, seconds=2, expect=expect, counter=counter)
            if not warm.ok:
                raise RuntimeError(f"{name} under concurrency: no call answered {expect} ({warm.statuses}, "
                                   f"{warm.errors} broken connections)")
        for clients in levels:
            for _ in range(2):
                for name in CONCURRENT:
                    call, expect = calls[name]
                    run = hammer(server.port, call, clients=clients, seconds=ARGS.duration / 2, expect=expect,
                                 counter=counter)
                    results.setdefault((name, clients), Result(clients=clients)).add(run)
    finally:
        server.stop()
    return results


def print_concurrency(results: dict[tuple[str, int], Any], levels: list[int]) -> None:
    print(f"\nthroughput: gunicorn, {ARGS.workers} sync workers, DEBUG off, DB_CONN_MAX_AGE={ARGS.conn_max_age}; "
          f"{ARGS.duration:g} s per endpoint and level (two interleaved halves); load average {os.getloadavg()[0]:.1f}")
    print(f"  the clients are threads of this process (one interpreter lock) on the server's {os.cpu_count()} CPUs: "
          "they take CPU the workers would otherwise have, so compare the ratios, not the req/s, across machines")
    print(f"{'endpoint':<26} {'clients':>7} {'req/s':>8} {'x floor':>8} {'p50 ms':>8} {'p95 ms':>8} {'calls':>6} "
          f"{'failed':>6}")
    for clients in levels:
        floor_rps = results[("floor list", clients)].rps
        for name in CONCURRENT:
            r = results[(name, clients)]
            print(f"{name:<26} {clients:7d} {r.rps:8.1f} {r.rps / floor_rps if floor_rps else 0:8.2f} "
                  f"{r.pct(50):8.1f} {r.pct(95):8.1f} {r.ok:6d} {r.failed + r.errors:6d}")


# ------------------------------------------------------------------------------------------------ profile
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


def _where(filename: str) -> str:
    """A profiled function's file: repo-relative for the portal's, from the package for the libraries'."""
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    try:
        return str(Path(filename).resolve().relative_to(REPO))
    except ValueError:
        return Path(filename).name


# What every call's time goes to, summed: (label, file suffix, function names).
PROFILE_PARTS = [
    ("SQL (cursor execute)", "django/db/backends/utils.py", {"_execute"}),
    ("templates (render)", "django/template/backends/django.py", {"render"}),
    ("DRF serializer .data", "rest_framework/serializers.py", {"data"}),
    ("cache (Redis)", "django/core/cache/backends/redis.py", {"get", "set", "add", "incr", "get_many", "set_many",
                                                             "delete", "touch", "has_key"}),
]


def _ours(filename: str) -> bool:
    return "site-packages" not in filename and filename.startswith(str(REPO)) and filename != __file__


def profile_top(by: dict, world: World, name: str, calls: int = 20, top: int = int(os.environ.get("PROFILE_TOP", "15"))) -> None:
    """cProfile ``calls`` in-process calls of an endpoint ('submission': the API POST) and print, in ms per call:
    where the time goes (SQL, templates, serializers, cache); the portal's own ``top`` functions by cumulative
    time (the view, the selectors, the serializers...); the stack's costliest functions by their own time."""
    import cProfile
    import pstats

    if name == "submission":
        client = submit_client(world)

        def once(i: int) -> None:
            submit_once(client, "profile", 200000 + i)
    else:
        who, path = next((w, world.path(p)) for n, _, w, p in ENDPOINTS if n == name)

        def once(i: int) -> None:
            by[who].get(path)
    for i in range(3):
        once(i)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for i in range(calls):
        once(3 + i)
    profiler.disable()
    wall = (time.perf_counter() - start) * 1000 / calls
    if os.environ.get("PROFILE_DUMP"):  # the raw profile, for pstats (callers, callees): PROFILE_DUMP=file
        profiler.dump_stats(os.environ["PROFILE_DUMP"])
    stats = pstats.Stats(profiler).stats  # (file, line, function) -> (primitive calls, calls, tottime, cumtime, callers)
    print(f"\n--- profile of {name}: {calls} calls in process, {wall:.1f} ms per call under cProfile")
    parts = []
    for label, suffix, funcs in PROFILE_PARTS:
        outer = [v for (f, _, fn), v in stats.items() if f.endswith(suffix) and fn in funcs
                 and not any(c[0].endswith(suffix) and c[2] in funcs for c in v[4])]
        if outer:
            parts.append(f"{label} {sum(v[3] for v in outer) * 1000 / calls:.1f} ms "
                         f"({sum(v[1] for v in outer) / calls:.0f} calls)")
    print("  per call: " + "; ".join(parts))

    def line(key: tuple[str, int, str]) -> str:
        _, n, tt, ct, _ = stats[key]
        return (f"  {ct * 1000 / calls:7.1f} {tt * 1000 / calls:7.2f} {n / calls:6.0f}  "
                f"{key[2]} ({_where(key[0])}:{key[1]})")

    ours = sorted((k for k in stats if _ours(k[0])), key=lambda k: stats[k][3], reverse=True)
    print(f"  the portal's code, top {top} by cumulative time:\n  {'cum ms':>7} {'own ms':>7} {'calls':>6}  function")
    for key in ours[:top]:
        print(line(key))
    if os.environ.get("PROFILE_ALL"):
        print("  everything by cumulative time:")
        for key in sorted(stats, key=lambda k: stats[k][3], reverse=True)[:int(os.environ["PROFILE_ALL"])]:
            print(line(key))
    heavy = sorted(stats, key=lambda k: stats[k][2], reverse=True)
    print(f"  everything, top 8 by own time:\n  {'cum ms':>7} {'own ms':>7} {'calls':>6}  function")
    for key in heavy[:8]:
        print(line(key))


# ------------------------------------------------------------------------------------------- trace
def trace_submission(world: World, calls: int = 20) -> None:
    """Where a submission's wall time goes, without a profiler's overhead: every SQL statement (by its first
    words), every Redis command and the Celery publish timed as they happen; the rest is Python."""
    from collections import defaultdict

    import kombu.messaging
    import redis.client

    spent: dict[str, list[float]] = defaultdict(list)
    statements: dict[str, tuple[str, Any]] = {}

    def sql_timer(execute, sql, params, many, context):
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            words = sql.split(" FROM ", 1)[1].split()[0] if sql.startswith("SELECT") and " FROM " in sql else \
                " ".join(sql.split()[:3])
            spent[f"SQL {sql.split()[0]} {words}"[:70]].append((time.perf_counter() - start) * 1000)
            statements.setdefault(f"SQL {sql.split()[0]} {words}"[:70], (sql, params))

    real_execute, real_publish = redis.client.Redis.execute_command, kombu.messaging.Producer.publish

    inside = [0.0, 0]  # Redis time spent inside the publish (counted once, in its Redis rows); publishing now?

    def redis_timer(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return real_execute(self, *args, **kwargs)
        finally:
            took = (time.perf_counter() - start) * 1000
            spent[f"Redis {args[0]}" + (" (publish)" if inside[1] else "")].append(took)
            inside[0] += took if inside[1] else 0.0

    def publish_timer(self, *args, **kwargs):
        start = time.perf_counter()
        inside[1] = 1
        try:
            return real_publish(self, *args, **kwargs)
        finally:
            inside[1] = 0
            spent["broker publish (whole, with its Redis)"].append((time.perf_counter() - start) * 1000)

    real_commit = type(connections["default"])._commit

    def commit_timer(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return real_commit(self, *args, **kwargs)
        finally:
            spent["SQL COMMIT"].append((time.perf_counter() - start) * 1000)

    client = submit_client(world)
    for i in range(3):
        submit_once(client, "trace-warm", 300000 + i)
    redis.client.Redis.execute_command, kombu.messaging.Producer.publish = redis_timer, publish_timer
    type(connections["default"])._commit = commit_timer
    total = 0.0
    try:
        with connection.execute_wrapper(sql_timer):
            for i in range(calls):
                start = time.perf_counter()
                response = submit_once(client, "trace", 300100 + i)
                total += (time.perf_counter() - start) * 1000
                assert response.status_code == 201, response.content
    finally:
        redis.client.Redis.execute_command, kombu.messaging.Producer.publish = real_execute, real_publish
        type(connections["default"])._commit = real_commit
    print(f"\n--- where a submission's time goes: {calls} calls in process, {total / calls:.1f} ms per call (mean)")
    print(f"  {'ms/call':>8} {'n/call':>7} {'ms each':>8}  step")
    accounted = 0.0
    for label, values in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
        per_call = sum(values) / calls
        print(f"  {per_call:8.2f} {len(values) / calls:7.1f} {statistics.median(values):8.2f}  {label}")
        accounted += per_call - (inside[0] / calls if label.startswith("broker publish") else 0.0)
    print(f"  {total / calls - accounted:8.2f} {'':7} {'':8}  the rest: Python (parsing, checks, models, "
          "rendering the answer) and the publish's own work outside Redis")
    if POSTGRES:  # planning and execution of each read (the writes would write again)
        print("  the reads' planning and execution in the database (EXPLAIN ANALYZE, second run):")
        with connection.cursor() as cursor:
            for label, (sql, params) in statements.items():
                if not sql.startswith("SELECT"):
                    continue
                for _ in range(2):
                    cursor.execute("EXPLAIN ANALYZE " + sql, params)
                    plan = [line for (line,) in cursor.fetchall()]
                times = [line.split(":")[1].strip() for line in plan if line.startswith(("Planning Time", "Execution Time"))]
                print(f"    {label}: planning {times[0]}, execution {times[1]}")


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


# ------------------------------------------------------------------------------------------------ targets
# The pages the target names (each: p50 and p95 <= PAGE_RATIO x the floor list's p50 and p95, <= PAGE_QUERIES
# queries).
TARGET_PAGES = [
    "page request list", "page request list (projects)", "page request list (small project)", "page project detail",
    "page ops requests", "page capacity", "page tenant quotas", "page project quota", "page quota requests",
    "page approvals inbox",
]
PAGE_RATIO, PAGE_QUERIES = 1.3, 10
# Every API list and detail measured (the request list and detail with a token and a session, a small project's list,
# the approvals inbox, the quota requests): p50 and p95 <= API_RATIO x the floor's (lists: the floor list; details: its
# detail).
TARGET_API = ["API list (token)", "API list (session)", "API detail (token)", "API detail (session)",
              "API list (session, small project)", "API approvals inbox", "API quota requests"]
API_RATIO = 1.0
# At scale (N >= SCALE_N requests, SCALE_PROJECTS projects, PostgreSQL): these lists one at a time, p95 <= SCALE_P95 ms.
TARGET_SCALE = ["API list (token)", "API list (session)"]
SCALE_N, SCALE_PROJECTS, SCALE_P95 = 100_000, 1000, 15.0
# An auto-approved submission: <= SUBMIT_QUERIES queries (the most of any measured), p50 <= SUBMIT_P50 ms.
SUBMIT_QUERIES, SUBMIT_P50 = 8, 10.0


def floor_of(name: str, kind: str) -> str:
    """The floor an endpoint compares with: API details with the floor detail, everything else with the list."""
    return "detail" if "detail" in name and kind != "page" else "list"


def targets(*, samples: dict[str, list[float]], queries: dict[str, int], sequential: dict[str, list[float]],
            submissions: tuple[list[int], list[float], int], concurrent: dict) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) rows; met None: reported, no target (or not measured in this run)."""
    kinds = {name: kind for name, kind, _, _ in ENDPOINTS}
    floor = {"list": statistics.median(samples["floor list"]), "detail": statistics.median(samples["floor detail"])}
    floor95 = {"list": pct(samples["floor list"], 95), "detail": pct(samples["floor detail"], 95)}
    rows: list[tuple[str, str, bool | None]] = []
    for name in TARGET_PAGES:
        ratio, ratio95 = statistics.median(samples[name]) / floor["list"], pct(samples[name], 95) / floor95["list"]
        rows.append((f"{name}: p50 <= {PAGE_RATIO:g}x floor list", f"{ratio:.2f}x", ratio <= PAGE_RATIO))
        rows.append((f"{name}: p95 <= {PAGE_RATIO:g}x floor list", f"{ratio95:.2f}x", ratio95 <= PAGE_RATIO))
        rows.append((f"{name}: <= {PAGE_QUERIES} queries", f"{queries[name]}", queries[name] <= PAGE_QUERIES))
    for name in TARGET_API:
        base = floor_of(name, kinds[name])
        ratio, ratio95 = statistics.median(samples[name]) / floor[base], pct(samples[name], 95) / floor95[base]
        rows.append((f"{name}: p50 <= {API_RATIO:g}x floor {base}", f"{ratio:.2f}x", ratio <= API_RATIO))
        rows.append((f"{name}: p95 <= {API_RATIO:g}x floor {base}", f"{ratio95:.2f}x", ratio95 <= API_RATIO))
    for name in TARGET_SCALE:
        label = f"{name} at N={SCALE_N:,}, one at a time: p95 <= {SCALE_P95:g} ms"
        if ARGS.n < SCALE_N or not POSTGRES:
            rows.append((label, f"not measured at this N ({ARGS.n:,}{'' if POSTGRES else ', SQLite'})", None))
            continue
        p95 = pct(sequential[name], 95)
        note = "" if ARGS.projects >= SCALE_PROJECTS else f" (only {ARGS.projects} projects)"
        rows.append((label, f"{p95:.1f} ms{note}", p95 <= SCALE_P95))
    counts, times, approved = submissions
    rows.append(("submission: every one auto-approved", f"{approved}/{len(times) + len(counts)}", approved == len(times) + len(counts)))
    rows.append((f"submission: <= {SUBMIT_QUERIES} queries", f"{max(counts)} (median {statistics.median(counts):.0f})",
                 max(counts) <= SUBMIT_QUERIES))
    p50 = statistics.median(times)
    rows.append((f"submission: p50 <= {SUBMIT_P50:g} ms (in process)", f"{p50:.1f} ms", p50 <= SUBMIT_P50))
    for clients in LEVELS:
        floor_rps = concurrent[("floor list", clients)].rps
        for name in CONCURRENT[1:]:
            r = concurrent[(name, clients)]
            rows.append((f"{name}, {clients} clients: req/s vs floor list (no target)",
                         f"{r.rps:.1f}/s = {r.rps / floor_rps if floor_rps else 0:.2f}x ({floor_rps:.1f}/s)", None))
    if not LEVELS:
        rows.append(("throughput under concurrency (no target)", "not measured (--concurrency 4,16)", None))
    return rows


def print_targets(rows: list[tuple[str, str, bool | None]]) -> int:
    """Print the table; return how many targets are not met."""
    width = max(len(t) for t, _, _ in rows)
    mwidth = max(len(m) for _, m, _ in rows)
    print(f"\nTargets (N={ARGS.n:,}, {ARGS.projects} extra projects, {connection.vendor}; floor and endpoints in one run, "
          f"interleaved; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; {machine_speed()})")
    print(f"{'target':<{width}}  {'measured':<{mwidth}}  status")
    for target, measured, met in rows:
        print(f"{target:<{width}}  {measured:<{mwidth}}  {'-' if met is None else 'met' if met else 'NOT MET'}")
    unmet = sum(met is False for _, _, met in rows)
    checked = sum(met is not None for _, _, met in rows)
    print(f"{checked - unmet} of {checked} targets met" + (f"; NOT MET: {unmet}" if unmet else ""))
    return unmet


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
    status = 0
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
                # The seeding's writes on disk now, not by the next timed checkpoint: spread over minutes, that one
                # ran under the timed calls (3,300 buffers over 155 s at N=100,000) on a machine that serves none.
                cursor.execute("CHECKPOINT")
        hot_rows = world.counts["_by_group"]["hot"]
        print(f"seeded in {time.monotonic() - started:.1f} s: {ARGS.n} requests ({hot_rows} in {HOT_PROJECT}), "
              f"{ARGS.projects} extra projects, {world.counts['quota_requests']} quota requests")

        # From here this process collects its garbage as a web worker does (portal/wsgi.py): what is alive now out
        # of the collector's sight, a collection as each request starts. Without it, the submissions timed in process
        # (and pages with --in-process) met Python's default pacing over the 150,000-odd objects the seeding left:
        # 3-5 ms of collections in a submission's p50 at N=100,000 that no web worker spends.
        gc_pacing.start_web_worker()
        by = make_clients(world)
        sqls = {name: count_queries(by[who], world.path(path)) for name, _, who, path in ENDPOINTS}
        queries = {name: len(sql) for name, sql in sqls.items()}

        samples, sequential, how = measure(world, by, database_url_of(db["NAME"]))
        floor = {"list": statistics.median(samples["floor list"]), "detail": statistics.median(samples["floor detail"])}
        floor95 = {"list": pct(samples["floor list"], 95), "detail": pct(samples["floor detail"], 95)}
        print(f"\nlatency: {how}; {ARGS.rounds} rounds x {ARGS.per_round} calls per endpoint, interleaved")
        print(f"{'endpoint':<34} {'p50 ms':>8} {'p95 ms':>8} {'x floor p50':>12} {'x floor p95':>12} {'queries':>8}")
        for name, kind, _, _ in ENDPOINTS:
            base = floor_of(name, kind)
            p50, p95 = statistics.median(samples[name]), pct(samples[name], 95)
            print(f"{name:<34} {p50:8.1f} {p95:8.1f} {p50 / floor[base]:12.2f} {p95 / floor95[base]:12.2f} {queries[name]:8d}")
        print_slowest(samples, ARGS.slowest)
        print(f"\nAPI lists, {ARGS.sequential} calls each, one request at a time (in turn):")
        for name, values in sequential.items():
            print(f"  {name:<34} p50 {statistics.median(values):6.1f} ms, p95 {pct(values, 95):6.1f} ms, "
                  f"max {max(values):6.1f} ms")

        counts, times, approved = bench_submissions(world)
        print(f"\nsubmissions (in process, token, auto-approved {approved}/{len(times) + len(counts)}; queries counted in {len(counts)}, {len(times)} timed): "
              f"queries {statistics.median(counts):.0f} (min {min(counts)}, max {max(counts)}), "
              f"p50 {statistics.median(times):.1f} ms, p95 {pct(times, 95):.1f} ms")

        concurrent = {}
        if LEVELS:
            concurrent = bench_concurrency(world, database_url_of(db["NAME"]), LEVELS)
            print_concurrency(concurrent, LEVELS)

        for name in ARGS.show_queries:
            print(f"\n--- queries of {name}")
            for n, sql in enumerate(sqls[name], 1):
                print(f"{n:3d}. {short(sql, 240)}")
        for name in ARGS.profile:
            profile(by, world, name)
        for name in ARGS.profile_top:
            profile_top(by, world, name)
        if ARGS.trace_submission:
            trace_submission(world)
        explain(sqls)

        rows = targets(samples=samples, queries=queries, sequential=sequential, submissions=(counts, times, approved),
                       concurrent=concurrent)
        unmet = print_targets(rows)
        if ARGS.check and unmet:
            status = 1
    finally:
        connections.close_all()
        cleanup_broker()
        if ARGS.keep:
            print(f"\nkept database {db['NAME']}")
        else:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    return status


if __name__ == "__main__":
    raise SystemExit(main())

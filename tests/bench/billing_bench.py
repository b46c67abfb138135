"""How fast a month is rated into statements (a script, not a test): wall time and peak memory.

    python tests/bench/billing_bench.py [--intervals 1000000] [--tenants 200] [--requests 4000] [--db URL] [--keep]

1. Makes a fresh, throwaway PostgreSQL database (``--db`` or ``DATABASE_URL``; ``<name>`` becomes
   ``billing_bench_<pid>``), migrates it and seeds the demo world plus ``--tenants`` tenants of ten projects each and
   ``--requests`` requests (``bulk_create`` in batches, tests/bench/speedworld.py), a price list (whole GPUs, CPU,
   memory; the GPU price changes mid-month) and a discount for every tenth tenant.
2. ``--intervals`` usage intervals with ``COPY``: each a request's run of 1 to 48 hours of GPUs, CPU or memory,
   starting anywhere from two days before the month to its last day (so some cross either month end), a few
   still open.
3. Measures, each with ``tracemalloc`` (peak of Python allocations) and ``getrusage`` (the process's peak RSS):
   ``rate_month`` alone (the one aggregate query: every tenant's lines), then ``finalise_month`` (rate, write a
   statement per tenant with its lines, number them, close the month). Prints the lines and the month's total,
   and checks it against one ``SUM`` over the same clipped seconds (no price windows) when the price is flat.

With ``--tenant-year N`` it measures the cost pages instead (docs/billing.md, "Cost views"): ``N`` intervals (e.g.
50,000) of one tenant (the demo's acme, its projects, ``--requests`` requests among them and other tenants) spread
over the twelve months up to now, a few still open, copied in as above; then, in this process with Django's test
client signed in as the tenant's admin, ``--repeat`` GETs (after one warming GET) of ``/costs/tenants/acme/``
(this month), ``/api/v1/costs/?group_by=day&tenant=acme`` (this month) and the same for the whole year, each
printed as p50/p95/max wall time.

The database is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import resource
import sys
import time
import tracemalloc
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", type=int, default=1_000_000, help="usage intervals (default 1,000,000)")
    parser.add_argument("--tenants", type=int, default=200, help="tenants with usage, ten projects each (default 200)")
    parser.add_argument("--requests", type=int, default=4000, help="requests the intervals belong to (default 4000)")
    parser.add_argument("--db", default=os.environ.get("DATABASE_URL", ""), help="PostgreSQL server URL (default DATABASE_URL)")
    parser.add_argument("--tenant-year", type=int, default=0, metavar="N",
                        help="instead: N intervals of one tenant over a year, and time its cost page and API")
    parser.add_argument("--repeat", type=int, default=30, help="GETs per page with --tenant-year (default 30)")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    return parser.parse_args()


ARGS = parse_args()
if not ARGS.db.startswith("postgres"):
    raise SystemExit("billing_bench needs PostgreSQL: --db postgres://... or DATABASE_URL")
RUN = f"{os.getpid()}"
VAR = REPO / "var" / "bench"
VAR.mkdir(parents=True, exist_ok=True)
os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
os.environ["PORTAL_VAR_DIR"] = str(VAR)
os.environ["DEBUG"] = "0"
os.environ["PORTAL_KUBECONFIG"] = str(VAR / "no-cluster.kubeconfig")  # nothing talks to a cluster
os.environ["DATABASE_URL"] = ARGS.db
if not (os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL")):
    os.environ["CELERY_BROKER_URL"] = f"portal+sqlite:///{VAR / f'billing-{RUN}-broker.sqlite3'}"

import django  # only now: the settings read the environment above

django.setup()

from django.db import connection
from django.test.utils import setup_test_environment

MONTH = date(2026, 10, 1)
M0 = datetime(2026, 10, 1, tzinfo=UTC)
M1 = datetime(2026, 11, 1, tzinfo=UTC)
CHANGE = datetime(2026, 10, 16, 12, tzinfo=UTC)
COLUMNS = ["request_id", "tenant_id", "project_id", "cluster_id", "run_key", "source", "object_uid", "object_name",
           "unit", "key", "quantity", "started_at", "ended_at", "end_reason", "created_at"]


def seed() -> tuple[int, str]:
    from billing import services
    from billing.models import ClusterClock
    from tenants.access import Actor
    from tests.bench.speedworld import seed_base, seed_rows
    from workloads.models import WorkloadRequest

    world = seed_base()
    seed_rows(world, requests=ARGS.requests, projects=ARGS.tenants * 10, live=0)
    gpu_key = world.flavor.gpu_model or world.flavor.name
    ops = Actor.system()
    services.price_create(actor=ops, unit="gpu", key=gpu_key, amount=Decimal("2.40"), effective_from=M0 - timedelta(days=60))
    services.price_create(actor=ops, unit="gpu", key=gpu_key, amount=Decimal("2.90"), effective_from=CHANGE)
    services.price_create(actor=ops, unit="cpu", amount=Decimal("0.031"), effective_from=M0 - timedelta(days=60))
    services.price_create(actor=ops, unit="memory", amount=Decimal("0.0042"), effective_from=M0 - timedelta(days=60))
    from tenants.models import Tenant

    for i, tenant in enumerate(Tenant.objects.filter(slug__startswith="bench-t").order_by("pk")):
        if i % 10 == 0:
            services.discount_create(actor=ops, tenant=tenant, percent=Decimal(15), effective_from=M0 + timedelta(days=i % 28))
    ClusterClock.objects.update_or_create(cluster=world.cluster, defaults={"cluster_time": M1 + timedelta(days=3),
                                                                           "seen_at": M1 + timedelta(days=3)})
    requests = list(WorkloadRequest.objects.filter(tenant__slug__startswith="bench-t")
                    .values_list("pk", "tenant_id", "project_id"))
    rng = random.Random(7)
    units = [("gpu", gpu_key, (1, 8)), ("cpu", "", (4, 64)), ("memory", "", (16, 512))]
    span = int((M1 - M0 + timedelta(days=2)).total_seconds())
    started = time.monotonic()
    with connection.cursor() as cursor:
        raw = cursor.cursor
        for chunk in range(0, ARGS.intervals, 100_000):
            buf = io.StringIO()
            for i in range(chunk, min(chunk + 100_000, ARGS.intervals)):
                req, tenant_id, project_id = requests[i % len(requests)]
                unit, key, (lo, hi) = units[i % 3]
                start = M0 - timedelta(days=2) + timedelta(seconds=rng.randrange(span))
                end = start + timedelta(seconds=rng.randrange(3600, 48 * 3600))
                ended = "\\N" if i % 1000 == 0 else end.isoformat()
                buf.write("\t".join([str(req), str(tenant_id), str(project_id), str(world.cluster.pk), f"bench/{i}",
                                     "workload", f"uid-{i}", f"job-{i}", unit, key, str(rng.randint(lo, hi)),
                                     start.isoformat(), ended, "" if ended == "\\N" else "finished",
                                     start.isoformat()]) + "\n")
            with raw.copy(f"COPY billing_usageinterval ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                copy.write(buf.getvalue())
        cursor.execute("VACUUM ANALYZE billing_usageinterval")
    print(f"copied {ARGS.intervals:,} intervals in {time.monotonic() - started:.1f} s "
          f"({len(requests):,} requests in {ARGS.tenants} tenants)")
    return world.cluster.pk, gpu_key


def seed_tenant_year() -> int:
    """``--tenant-year`` intervals of acme over the twelve months up to now (a few open); returns the admin's pk."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from billing import services
    from billing.models import ClusterClock
    from tenants.access import Actor
    from tests.bench.speedworld import seed_base, seed_rows
    from workloads.models import WorkloadRequest

    world = seed_base()
    seed_rows(world, requests=ARGS.requests, projects=20, acme_projects=4, live=0)
    gpu_key = world.flavor.gpu_model or world.flavor.name
    now = timezone.now()
    year_ago = now - timedelta(days=365)
    ops = Actor.system()
    services.price_create(actor=ops, unit="gpu", key=gpu_key, amount=Decimal("2.40"), effective_from=year_ago - timedelta(days=1))
    services.price_create(actor=ops, unit="gpu", key=gpu_key, amount=Decimal("2.90"), effective_from=now - timedelta(days=100))
    services.price_create(actor=ops, unit="cpu", amount=Decimal("0.031"), effective_from=year_ago - timedelta(days=1))
    services.price_create(actor=ops, unit="memory", amount=Decimal("0.0042"), effective_from=year_ago - timedelta(days=1))
    ClusterClock.objects.update_or_create(cluster=world.cluster, defaults={"cluster_time": now, "seen_at": now})
    requests = list(WorkloadRequest.objects.filter(tenant__slug="acme").values_list("pk", "tenant_id", "project_id"))
    rng = random.Random(7)
    units = [("gpu", gpu_key, (1, 8)), ("cpu", "", (4, 64)), ("memory", "", (16, 512))]
    span = int((now - year_ago).total_seconds()) - 49 * 3600
    with connection.cursor() as cursor:
        buf = io.StringIO()
        for i in range(ARGS.tenant_year):
            req, tenant_id, project_id = requests[i % len(requests)]
            unit, key, (lo, hi) = units[i % 3]
            start = year_ago + timedelta(seconds=rng.randrange(span))
            end = start + timedelta(seconds=rng.randrange(600, 48 * 3600))
            ended = "\\N" if i % 1000 == 0 else end.isoformat()
            buf.write("\t".join([str(req), str(tenant_id), str(project_id), str(world.cluster.pk), f"bench/{i}",
                                 "workload", f"uid-{i}", f"job-{i}", unit, key, str(rng.randint(lo, hi)),
                                 start.isoformat(), ended, "" if ended == "\\N" else "finished",
                                 start.isoformat()]) + "\n")
        with cursor.cursor.copy(f"COPY billing_usageinterval ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            copy.write(buf.getvalue())
        cursor.execute("VACUUM ANALYZE billing_usageinterval")
        cursor.execute("SELECT COUNT(*), COUNT(DISTINCT project_id), MIN(started_at), MAX(started_at) "
                       "FROM billing_usageinterval")
        n, projects, first, last = cursor.fetchone()
    print(f"copied {n:,} intervals of acme ({projects} projects, {len(requests)} requests), "
          f"{first:%Y-%m-%d} to {last:%Y-%m-%d}")
    return get_user_model().objects.get(username="alice").pk


def time_cost_pages(admin_pk: int) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone

    client = Client()
    client.force_login(get_user_model().objects.get(pk=admin_pk))
    since = (timezone.now() - timedelta(days=366)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for label, path in (("page /costs/tenants/acme/ (this month)", "/costs/tenants/acme/"),
                        ("API costs group_by=day (this month)", "/api/v1/costs/?group_by=day&tenant=acme"),
                        ("API costs group_by=day (the year)", f"/api/v1/costs/?group_by=day&tenant=acme&since={since}")):
        assert client.get(path).status_code == 200, path  # warm
        times = []
        for _ in range(ARGS.repeat):
            started = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (path, response.status_code)
        times.sort()
        p = lambda q, times=times: times[min(len(times) - 1, int(round(q * (len(times) - 1))))]
        print(f"{label:<42} n={len(times)}  p50 {p(0.5):7.1f} ms   p95 {p(0.95):7.1f} ms   max {times[-1]:7.1f} ms")


def measure(label: str, fn):
    tracemalloc.start()
    started = time.monotonic()
    result = fn()
    wall = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{label:<40} {wall:8.2f} s   peak Python allocations {peak / 2**20:7.1f} MiB   process peak RSS {rss:7.1f} MiB")
    return result


def main() -> int:
    setup_test_environment()
    db = connection.settings_dict
    db.setdefault("TEST", {})["NAME"] = f"billing_bench_{RUN}"
    started = time.monotonic()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    print(f"database {db['NAME']} (migrated in {time.monotonic() - started:.1f} s)")
    try:
        if ARGS.tenant_year:
            time_cost_pages(seed_tenant_year())
            return 0
        seed()
        from billing.models import Statement, StatementLine
        from billing.statements import finalise_month, rate_month

        now = M1 + timedelta(days=3)
        rated = measure("rate_month (one aggregate query)", lambda: rate_month(MONTH, now=now))
        lines = sum(len(v) for v in rated.values())
        print(f"  {len(rated)} tenants, {lines} lines")
        measure("finalise_month (rate, write, number)", lambda: finalise_month(MONTH, now=now))
        total = sum(Statement.objects.filter(month=MONTH).values_list("total", flat=True))
        print(f"  {Statement.objects.filter(month=MONTH).count()} statements, "
              f"{StatementLine.objects.filter(statement__month=MONTH).count()} lines, month total {total:,.2f} EUR; "
              f"numbers {Statement.objects.filter(month=MONTH).order_by('number').values_list('number', flat=True).first()}"
              f"..{Statement.objects.filter(month=MONTH).order_by('-number').values_list('number', flat=True).first()}")
        with connection.cursor() as cursor:  # the same seconds without price windows: the lines' quantities add up
            cursor.execute("""SELECT SUM(EXTRACT(EPOCH FROM LEAST(COALESCE(ended_at, %s), %s) - GREATEST(started_at, %s))
                                         * quantity) / 3600
                                FROM billing_usageinterval WHERE started_at < %s AND (ended_at IS NULL OR ended_at > %s)""",
                           [now, M1, M0, M1, M0])
            expected = cursor.fetchone()[0]
        got = sum(r.quantity for rows in rated.values() for r in rows)
        print(f"  unit-hours: lines {got:,.2f}, direct SUM {expected:,.2f} ({'equal' if abs(got - expected) < Decimal('0.01') else 'DIFFER'})")
    finally:
        if ARGS.keep:
            print(f"kept database {db['NAME']}")
        else:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fast the acceptance metrics are computed over a year of history (a script, not a test): latency and memory.

    python tests/bench/metrics.py [--requests 1000000] [--tenants 200] [--sample-queues 200] [--intervals 200000]
                                  [--days 365] [--repeat 5] [--db URL] [--keep]

1. Makes a fresh, throwaway PostgreSQL database (``--db`` or ``DATABASE_URL``; it becomes ``metrics_bench_<pid>``),
   migrates it and seeds the demo world plus ``--tenants`` tenants of ten projects each (tests/bench/speedworld.py).
2. Copies in with ``COPY`` (nothing is committed to the repository): ``--requests`` requests spread over ``--days``
   days up to now (approved, admitted after an exponential wait of mean 3 minutes, running half a minute later; 1%
   preempted once, with a timeline entry), ``--intervals`` metered GPU runs of them, and a 5-minute sample of
   ``--sample-queues`` project queues and of every GPU flavor for the whole span (what ``insights.samples_take``
   would have written).
3. Computes every registered metric as the page would (``METRICS[key].compute(Query(...))``) for ops and for one
   tenant admin, over the last 30 days by tenant per day and over the whole span by tenant per week, ``--repeat``
   times each after one warming run, and prints p50 / p95 wall time per metric and the peak Python allocations
   (``tracemalloc``, in one more run: it is off while timing) and the process's peak RSS (``getrusage``).
4. Backfills the daily request and preemption rollups (``insights.rollups.backfill``; ``--skip-backfill`` reuses
   them), the hourly sample rollup (``insights.sample_rollups.backfill``) and the daily cost rollup
   (``billing.rollup.backfill``), each timed, and times the metrics that read them again ("after"; before them,
   with nothing rolled up, they compute everything from the requests, the samples and the usage intervals).

The database is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1_000_000, help="requests (default 1,000,000)")
    parser.add_argument("--tenants", type=int, default=200, help="tenants, ten projects each (default 200)")
    parser.add_argument("--sample-queues", type=int, default=200, help="project queues sampled every 5 minutes (default 200)")
    parser.add_argument("--intervals", type=int, default=200_000, help="metered GPU runs (default 200,000)")
    parser.add_argument("--days", type=int, default=365, help="history span in days (default 365)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per metric and query (default 5)")
    parser.add_argument("--db", default=os.environ.get("DATABASE_URL", ""), help="PostgreSQL server URL (default DATABASE_URL)")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    parser.add_argument("--seed-only", action="store_true", help="migrate and seed, keep the database, time nothing")
    parser.add_argument("--reuse", default="", help="time on this already seeded database (from --seed-only or "
                        "--keep; a copy made with CREATE DATABASE ... TEMPLATE works too); it is kept")
    parser.add_argument("--only", default="", help="comma-separated metric keys to time (default all)")
    parser.add_argument("--skip-direct", action="store_true", help="time only after the rollups are refreshed")
    parser.add_argument("--skip-backfill", action="store_true", help="with --reuse: time on the rollups as they "
                        "are (backfilled by an earlier run) instead of backfilling them again")
    return parser.parse_args()


ARGS = parse_args()
if not ARGS.db.startswith("postgres"):
    raise SystemExit("metrics bench needs PostgreSQL: --db postgres://... or DATABASE_URL")
RUN = f"{os.getpid()}"
VAR = REPO / "var" / "bench"
VAR.mkdir(parents=True, exist_ok=True)
os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
os.environ["PORTAL_VAR_DIR"] = str(VAR)
os.environ["DEBUG"] = "0"
os.environ["PORTAL_KUBECONFIG"] = str(VAR / "no-cluster.kubeconfig")  # nothing talks to a cluster
os.environ["DATABASE_URL"] = ARGS.db
if not (os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL")):
    os.environ["CELERY_BROKER_URL"] = f"portal+sqlite:///{VAR / f'metrics-{RUN}-broker.sqlite3'}"

import django  # only now: the settings read the environment above

django.setup()

from django.db import connection
from django.test.utils import setup_test_environment

NOW = datetime.now(UTC).replace(microsecond=0)
CHUNK = 200_000
# The metrics that read a rollup when whole past days are rolled up (timed again after the backfill).
ROLLED = ("queue-wait", "scheduling-success", "preemptions", "pending-now", "quota-fulfilment", "guarantee-violations",
          "borrowing", "overcommit", "gpu-allocation", "idle-allocated", "mig-fragmentation", "spend",
          "cost-per-gpu-hour")


def _text(value: Any) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (dict, list)):
        return json.dumps(value).replace("\\", "\\\\")
    return str(value)


def copy_rows(model: Any, rows: Any, defaults: dict[str, Any]) -> int:
    """COPY ``rows`` (dicts of attnames) into ``model``'s table; every other column gets ``defaults`` or the
    field's default. Returns the count."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    columns = [f.column for f in fields]
    base = {f.attname: defaults.get(f.attname, f.get_default()) for f in fields}
    n = 0
    with connection.cursor() as cursor:
        buf = io.StringIO()
        for row in rows:
            values = base | row
            buf.write("\t".join(_text(values[f.attname]) for f in fields) + "\n")
            n += 1
            if n % CHUNK == 0:
                with cursor.cursor.copy(f"COPY {model._meta.db_table} ({', '.join(columns)}) FROM STDIN") as copy:
                    copy.write(buf.getvalue())
                buf = io.StringIO()
        if buf.tell():
            with cursor.cursor.copy(f"COPY {model._meta.db_table} ({', '.join(columns)}) FROM STDIN") as copy:
                copy.write(buf.getvalue())
        cursor.execute(f"ANALYZE {model._meta.db_table}")
    return n


def seed() -> dict[str, Any]:
    from billing import services
    from billing.models import UsageInterval
    from insights.models import PoolSample, QueueSample
    from quotas.models import Flavor, Quota
    from tenants.access import Actor
    from tests.bench.speedworld import seed_base, seed_rows
    from workloads.models import RequestEvent, WorkloadRequest

    world = seed_base()
    seed_rows(world, projects=ARGS.tenants * 10, live=0)
    gpu_key = world.flavor.gpu_model or world.flavor.name
    services.price_create(actor=Actor.system(), unit="gpu", key=gpu_key, amount=Decimal("2.40"),
                          effective_from=NOW - timedelta(days=ARGS.days + 2))
    projects = list(Quota.objects.filter(project__isnull=False, flavor=world.flavor)
                    .values_list("project_id", "project__tenant_id", "nominal"))
    template = world.templates["training"]
    rng = random.Random(7)
    span = ARGS.days * 86400
    requester = world.users["carol"].pk
    started = time.monotonic()

    def requests() -> Any:
        for i in range(ARGS.requests):
            project_id, tenant_id, _ = projects[i % len(projects)]
            approved = NOW - timedelta(seconds=rng.randrange(span))
            admitted = approved + timedelta(seconds=rng.expovariate(1 / 180))
            running = admitted + timedelta(seconds=30)
            yield {"tenant_id": tenant_id, "project_id": project_id, "cluster_id": world.cluster.pk,
                   "template_id": template.pk, "name": f"b{i}", "image": "nvcr.io/nvidia/pytorch:26.10-py3",
                   "flavor_id": world.flavor.pk, "gpus": 1 + i % 4, "parameters": {"command": "python train.py"},
                   "state": "succeeded", "requested_by_id": requester, "created_at": approved, "updated_at": running,
                   "approved_at": approved, "queued_at": approved + timedelta(seconds=5), "admitted_at": admitted,
                   "first_admitted_at": admitted, "started_at": running, "finished_at": running + timedelta(hours=2)}

    n = copy_rows(WorkloadRequest, requests(), {"cluster_status": {}})
    print(f"copied {n:,} requests in {time.monotonic() - started:.1f} s ({len(projects):,} projects, {ARGS.tenants} tenants)")
    ids = list(WorkloadRequest.objects.filter(name__startswith="b").values_list("pk", "tenant_id", "project_id",
                                                                                "started_at", "gpus"))
    started = time.monotonic()
    reasons = ["Preempted: Preempted to accommodate a workload (UID: x) due to prioritization in the ClusterQueue",
               "Preempted: Preempted to accommodate a workload (UID: x) due to reclamation within the cohort"]
    copy_rows(RequestEvent, ({"request_id": pk, "at": at + timedelta(minutes=30), "from_state": "running",
                              "to_state": "preempted", "actor_label": "cluster", "message": reasons[i % 2]}
                             for i, (pk, _, _, at, _) in enumerate(ids[::100])), {})
    copy_rows(UsageInterval, ({"request_id": pk, "tenant_id": t, "project_id": p, "cluster_id": world.cluster.pk,
                               "run_key": f"b/{pk}", "source": "workload", "object_uid": f"u{pk}",
                               "object_name": f"req-{pk}", "unit": "gpu", "key": gpu_key, "quantity": g,
                               "started_at": at, "ended_at": at + timedelta(hours=2), "end_reason": "finished",
                               "created_at": at}
                              for pk, t, p, at, g in ids[:: max(1, len(ids) // max(ARGS.intervals, 1))][:ARGS.intervals]), {})
    print(f"copied preemptions and usage intervals in {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    slots = ARGS.days * 288
    first = NOW - timedelta(minutes=5 * slots)
    first = first.replace(second=0, minute=first.minute - first.minute % 5)
    sampled = projects[:: max(1, len(projects) // ARGS.sample_queues)][:ARGS.sample_queues]

    def queue_samples() -> Any:
        for s in range(slots):
            at = first + timedelta(minutes=5 * s)
            for k, (project_id, tenant_id, nominal) in enumerate(sampled):
                wave = (s + 37 * k) % 288
                pending = 3 if wave < 24 else 0
                admitted = nominal if wave < 200 else nominal / 2
                yield {"at": at, "cluster_id": world.cluster.pk, "tenant_id": tenant_id, "project_id": project_id,
                       "flavor_id": world.flavor.pk, "nominal": nominal, "admitted": admitted,
                       "borrowed": 1 if wave < 12 else 0, "pending": pending, "pending_count": 1 if pending else 0,
                       "pending_smallest": 1 if pending else 0}

    nq = copy_rows(QueueSample, queue_samples(), {})
    from insights.samples import fill_lent

    fill_lent(first, first + timedelta(minutes=5 * slots))  # what the sampler computes as it writes each slot
    flavors = list(Flavor.objects.exclude(kind="cpu").values_list("pk", "cluster_id", "kind"))
    np_ = copy_rows(PoolSample, ({"at": first + timedelta(minutes=5 * s), "cluster_id": c, "flavor_id": f,
                                 "capacity": 64, "allocated": 40 + s % 24, "idle_allocated": s % 3,
                                 "pending": s % 7, "shape_mismatch": (s % 7) // 2 if kind == "mig" else 0,
                                 "promised": 80, "overcommit_percent": 25}
                                for s in range(slots) for f, c, kind in flavors), {})
    print(f"copied {nq:,} queue samples ({len(sampled)} queues) and {np_:,} pool samples in "
          f"{time.monotonic() - started:.1f} s")
    return {"tenant_admin": "alice"}


def timed(fn: Any, repeat: int) -> tuple[list[float], float, float]:
    from django.core.signals import request_started

    request_started.send(sender=None)
    fn()  # warm
    times = []
    for _ in range(repeat):  # timed without tracemalloc: it slows Python-heavy paths several times over
        request_started.send(sender=None)  # as each page view is (per-request caches start over)
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    tracemalloc.start()  # one more run for the peak allocations
    request_started.send(sender=None)
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return sorted(times), peak / 2**20, rss


def main() -> int:
    setup_test_environment()
    db = connection.settings_dict
    if ARGS.reuse:
        connection.close()
        db["NAME"] = ARGS.reuse
        old_name = None
        print(f"database {ARGS.reuse} (reused, not seeded)")
    else:
        db.setdefault("TEST", {})["NAME"] = f"metrics_bench_{RUN}"
        started = time.monotonic()
        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
        print(f"database {db['NAME']} (migrated in {time.monotonic() - started:.1f} s)")
    try:
        if not ARGS.reuse:
            seed()
        if ARGS.seed_only:
            return 0
        from django.contrib.auth import get_user_model

        from insights.registry import METRICS

        if ARGS.only:
            METRICS = {k: METRICS[k] for k in ARGS.only.split(",")}
        users = {u.username: u for u in get_user_model().objects.filter(username__in=["ops", "alice"])}
        cases = [("ops, 30 days by tenant per day", "ops", NOW - timedelta(days=30), "tenant", "day"),
                 ("alice, 30 days by project per day", "alice", NOW - timedelta(days=30), "project", "day"),
                 (f"ops, {ARGS.days} days by tenant per week", "ops", NOW - timedelta(days=ARGS.days), "tenant", "week")]
        from insights import rollups

        rolled = [k for k in METRICS if k in ROLLED]  # the metrics that read a rollup
        if not ARGS.skip_direct:
            run_cases(cases, users, METRICS, "before rollups (direct)")
        started = time.monotonic()
        if not ARGS.skip_backfill:
            done = rollups.backfill((NOW - timedelta(days=ARGS.days + 1)).date())
            print(f"\nbackfilled the request rollup: {done['days']} days, {done['rows']:,} rows in "
                  f"{time.monotonic() - started:.1f} s")
            started = time.monotonic()
        rollups.rollups_refresh()
        print(f"one refresh (beat task) in {time.monotonic() - started:.1f} s")
        from insights import sample_rollups

        started = time.monotonic()
        if not ARGS.skip_backfill:
            done = sample_rollups.backfill((NOW - timedelta(days=ARGS.days + 1)).date())
            print(f"backfilled the hourly sample rollup: {done['hours']} hours, {done['rows']:,} rows in "
                  f"{time.monotonic() - started:.1f} s")
        started = time.monotonic()
        sample_rollups.sample_rollups_refresh()
        print(f"one sample rollup refresh (beat task) in {time.monotonic() - started:.1f} s")
        from billing import rollup as cost_rollup

        started = time.monotonic()
        if not ARGS.skip_backfill:
            done = cost_rollup.backfill((NOW - timedelta(days=ARGS.days + 1)).date())
            print(f"backfilled the cost rollup: {done['days']} days, {done['rows']:,} rows in "
                  f"{time.monotonic() - started:.1f} s")
        started = time.monotonic()
        cost_rollup.refresh()
        print(f"one cost rollup refresh (beat task) in {time.monotonic() - started:.1f} s")
        run_cases(cases, users, {k: METRICS[k] for k in rolled}, "after rollups")
    finally:
        if ARGS.keep or ARGS.seed_only or ARGS.reuse:
            print(f"kept database {db['NAME']}")
        else:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


def run_cases(cases: list[Any], users: dict[str, Any], metrics: dict[str, Any], title: str) -> None:
    from insights.registry import Query
    from tenants.access import Actor, scope_of

    for label, who, start, group_by, bucket in cases:
        print(f"\n[{title}] {label} (p50 / p95 of {ARGS.repeat} runs; peak Python allocations; process peak RSS)")
        for key, metric in metrics.items():
            group = group_by if group_by in metric.groups else metric.groups[0]
            query = Query(scope=scope_of(Actor(user=users[who])), start=start, end=NOW, group_by=group, bucket=bucket)
            times, peak, rss = timed(lambda m=metric, q=query: m.compute(q), ARGS.repeat)
            p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
            rows = len(metric.compute(query).rows)
            print(f"  {key:<22} p50 {times[len(times) // 2] * 1000:8.1f} ms  p95 {p95 * 1000:8.1f} ms  "
                  f"{rows:5d} rows  peak {peak:7.1f} MiB  RSS {rss:7.1f} MiB", flush=True)


if __name__ == "__main__":
    sys.exit(main())

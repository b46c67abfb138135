"""How fast the measured-use pages answer at fleet scale (a script, not a test): latency and memory.

    python tests/bench/measured_bench.py [--tenants 200] [--gpus 1000] [--days 14] [--run-hours 12] [--repeat 10]
                                         [--db URL] [--keep]

1. Makes a fresh, throwaway PostgreSQL database (``--db`` or ``DATABASE_URL``; it becomes ``measured_bench_<pid>``),
   migrates it and seeds the demo world without a cluster (tests/bench/speedworld.py) plus ``--tenants`` tenants
   of one project each, a tenant admin of the first (``bench-admin``).
2. Copies in with ``COPY`` (nothing is committed to the repository): ``--gpus`` GPUs, spread evenly over the
   tenants and over the GPU flavors of the demo's one cluster, each held for the whole ``--days`` by back-to-back
   one-device requests of ``--run-hours`` (finished, the last one running), and one ``MeasuredSample`` per GPU and
   5-minute slot (what ``insights.measured_take`` writes): ``--gpus`` x 288 x ``--days`` rows, about 4 M at the
   default size. A year of 1,000 GPUs is about 105 M rows: pass ``--days 365`` where the disk and the time allow,
   or extrapolate (the pages sum the samples of the period shown over the ``(at, tenant)`` index, so their time
   grows linearly with the rows of that period).
3. Gets the three measured metric pages (``/ops/metrics/<key>/`` as ops, ``/tenants/<slug>/metrics/<key>/`` as
   the tenant admin) with Django's test client, over the default period (the last 7 days) and over the whole
   seeded range, once to warm up and then ``--repeat`` times each: prints p50 / p95 / max in ms, the rows of the
   period the page sums, and the process's peak RSS (``getrusage``) after each, with the rows seeded and the
   seeding time before.

The database is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--tenants", type=int, default=200, help="tenants, one project each (default 200)")
parser.add_argument("--gpus", type=int, default=1000, help="GPUs held all the time (default 1,000)")
parser.add_argument("--days", type=int, default=14, help="days of 5-minute samples up to now (default 14; a year "
                    "is 365, about 105 M rows at 1,000 GPUs)")
parser.add_argument("--run-hours", type=int, default=12, help="hours each request holds its GPU (default 12)")
parser.add_argument("--repeat", type=int, default=10, help="timed calls per page (default 10)")
parser.add_argument("--db", default=os.environ.get("DATABASE_URL", ""), help="PostgreSQL server URL (default DATABASE_URL)")
parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
ARGS = parser.parse_args()
if not ARGS.db.startswith("postgres"):
    raise SystemExit("measured bench needs PostgreSQL: --db postgres://... or DATABASE_URL")
if ARGS.tenants < 1 or ARGS.gpus < 1 or ARGS.days < 1 or ARGS.run_hours < 1 or ARGS.repeat < 1:
    raise SystemExit("--tenants, --gpus, --days, --run-hours and --repeat must be at least 1")
RUN = f"{os.getpid()}"
VAR = REPO / "var" / "bench"
VAR.mkdir(parents=True, exist_ok=True)
os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
os.environ["PORTAL_VAR_DIR"] = str(VAR)
os.environ["DEBUG"] = "0"
os.environ["PORTAL_KUBECONFIG"] = str(VAR / "no-cluster.kubeconfig")  # nothing talks to a cluster
os.environ["DATABASE_URL"] = ARGS.db
os.environ.setdefault("PORTAL_RUNTIME_DB_ROLE", "")
if not (os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL")):
    os.environ["CELERY_BROKER_URL"] = f"portal+sqlite:///{VAR / f'measured-{RUN}-broker.sqlite3'}"

import django  # only now: the settings read the environment above

django.setup()

from django.db import connection
from django.test import Client
from django.test.utils import setup_test_environment

SLOT = 300
CHUNK = 200_000
PAGES = ("measured-utilisation", "idle-gpu-hours", "memory-headroom")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


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


def _copy(table: str, columns: list[str], lines: Any) -> int:
    """COPY text ``lines`` (tab-separated, newline-ended) into ``table`` in chunks; returns the count."""
    n = 0
    with connection.cursor() as cursor:
        buf = io.StringIO()
        for line in lines:
            buf.write(line)
            n += 1
            if n % CHUNK == 0:
                with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    copy.write(buf.getvalue())
                buf = io.StringIO()
        if buf.tell():
            with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                copy.write(buf.getvalue())
        cursor.execute(f"ANALYZE {table}")
    return n


def seed(now: datetime) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from insights.measured import device_memory_mib
    from insights.models import MeasuredSample
    from quotas.models import Flavor
    from tenants.models import Membership, Project, Role, Tenant
    from tests.bench.speedworld import seed_base
    from workloads.models import WorkloadRequest

    world = seed_base()
    tenants = Tenant.objects.bulk_create([Tenant(name=f"Measured tenant {i}", slug=f"mt-{i}") for i in range(ARGS.tenants)])
    projects = Project.objects.bulk_create([Project(tenant=t, name=f"Measured project {i}", slug=f"mt-{i}-p",
                                                    cluster_namespace=f"mt-{i}-p") for i, t in enumerate(tenants)])
    User = get_user_model()
    admin = User(username="bench-admin", email="bench-admin@example.com")
    admin.set_unusable_password()
    admin.save()
    Membership.objects.create(user=admin, tenant=tenants[0], project=None, role=Role.TENANT_ADMIN)
    flavors = [(f.pk, device_memory_mib(f) or 80 * 1024) for f in
               Flavor.objects.filter(cluster=world.cluster).exclude(kind="cpu").order_by("pk")]
    template = world.templates["training"]
    requester = world.users["carol"].pk
    slots = ARGS.days * 86400 // SLOT
    first = now - timedelta(seconds=SLOT * slots)  # the first slot starts here; sample ``at`` is a slot's end
    per_run = ARGS.run_hours * 3600 // SLOT
    runs = -(-slots // per_run)
    lanes = [(g, projects[g % len(projects)], *flavors[g % len(flavors)]) for g in range(ARGS.gpus)]

    started = time.monotonic()
    fields = [f for f in WorkloadRequest._meta.concrete_fields if not f.primary_key]
    base = {f.attname: f.get_default() for f in fields} | {"cluster_status": {}}

    def requests() -> Any:
        for g, project, flavor_id, _ in lanes:
            for k in range(runs):
                start = first + timedelta(seconds=SLOT * per_run * k)
                end = start + timedelta(seconds=SLOT * per_run)
                live = k == runs - 1
                row = base | {
                    "tenant_id": project.tenant_id, "project_id": project.pk, "cluster_id": world.cluster.pk,
                    "template_id": template.pk, "name": f"mb-{g}-{k}", "image": "nvcr.io/nvidia/pytorch:26.10-py3",
                    "flavor_id": flavor_id, "gpus": 1, "parameters": {"command": "python train.py"},
                    "state": "running" if live else "succeeded", "requested_by_id": requester,
                    "created_at": start - timedelta(minutes=2), "updated_at": start,
                    "approved_at": start - timedelta(minutes=2), "queued_at": start - timedelta(minutes=1),
                    "admitted_at": start - timedelta(seconds=30), "first_admitted_at": start - timedelta(seconds=30),
                    "started_at": start, "finished_at": None if live else end}
                yield "\t".join(_text(row[f.attname]) for f in fields) + "\n"

    n_requests = _copy(WorkloadRequest._meta.db_table, [f.column for f in fields], requests())
    ids = dict(WorkloadRequest.objects.filter(name__startswith="mb-").values_list("name", "pk"))
    request_s = time.monotonic() - started

    started = time.monotonic()
    cluster_id = world.cluster.pk

    def samples() -> Any:
        for g, project, flavor_id, memory in lanes:
            head = f"{cluster_id}\t{project.tenant_id}\t{project.pk}\t{flavor_id}\t{SLOT}\t1\t{memory}\t"
            request_ids = [ids[f"mb-{g}-{k}"] for k in range(runs)]
            for s in range(slots):
                at = first + timedelta(seconds=SLOT * (s + 1))
                wave = (s + 17 * g) % 288  # a day: a quarter of each GPU's slots idle, the rest busy
                util = (wave % 4) * 0.9 if wave < 72 else 40 + (wave * 7 + g) % 60
                fb = memory * (0.05 if wave < 72 else 0.3 + ((g * 13 + wave) % 60) / 100)
                yield (f"{at.isoformat()}\t{request_ids[s // per_run]}\t{head}{util:.2f}\t{min(1.0, util / 110):.4f}\t"
                       f"{min(fb, memory):.1f}\t0\tf\n")

    columns = ["at", "request_id", "cluster_id", "tenant_id", "project_id", "flavor_id", "seconds", "gpus",
               "memory_mib", "util_avg", "sm_active_avg", "fb_used_max", "xid", "seeded"]
    n_samples = _copy(MeasuredSample._meta.db_table, columns, samples())
    sample_s = time.monotonic() - started
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s)", [MeasuredSample._meta.db_table])
        size = cursor.fetchone()[0]
    print(f"seeded {ARGS.tenants} tenants (one project each), {ARGS.gpus:,} GPUs on {len(flavors)} GPU flavors of "
          f"cluster {world.cluster.name}, {ARGS.days} days:")
    print(f"  {n_requests:,} requests in {request_s:.1f} s; {n_samples:,} measured samples in {sample_s:.1f} s "
          f"({n_samples / max(sample_s, 1e-9):,.0f} rows/s; table with indexes {size / 2**30:.2f} GiB)")
    print(f"  process peak RSS after seeding {_rss_mib():.0f} MiB")
    return {"admin": admin, "tenant": tenants[0], "first": first, "samples": n_samples}


def _ms(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
    return f"p50 {statistics.median(values):8.1f}  p95 {p95:8.1f}  max {values[-1]:8.1f} ms"


def main() -> int:
    setup_test_environment()
    db = connection.settings_dict
    db.setdefault("TEST", {})["NAME"] = f"measured_bench_{RUN}"
    started = time.monotonic()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    print(f"database {db['NAME']} (migrated in {time.monotonic() - started:.1f} s)")
    try:
        from django.contrib.auth import get_user_model

        from insights.models import MeasuredSample

        now = datetime.now(UTC).replace(second=0, microsecond=0)
        now -= timedelta(minutes=now.minute % 5)
        world = seed(now)
        ops = get_user_model().objects.get(username="ops")
        tenant = world["tenant"]
        first_day: date = world["first"].date()
        today = now.date()
        whole = f"?start={first_day:%Y-%m-%d}&end={today:%Y-%m-%d}"
        periods = [("default (last 7 days)", "", now.date() - timedelta(days=6)),
                   (f"whole range ({first_day} to {today})", whole, first_day)]
        who = [("ops", ops, "/ops/metrics/{key}/", None), (f"tenant admin of {tenant.slug}", world["admin"],
                                                            f"/tenants/{tenant.slug}/metrics/{{key}}/", tenant)]
        for label, user, pattern, only in who:
            client = Client()
            client.force_login(user)
            for period, params, since in periods:
                rows = MeasuredSample.objects.filter(at__gt=datetime(since.year, since.month, since.day, tzinfo=UTC))
                if only is not None:
                    rows = rows.filter(tenant=only)
                print(f"\n{label}, {period}: {rows.count():,} samples summed; {ARGS.repeat} calls after one warm-up")
                for key in PAGES:
                    path = pattern.format(key=key) + params
                    response = client.get(path)
                    assert response.status_code == 200, (path, response.status_code)
                    times = []
                    for _ in range(ARGS.repeat):
                        t = time.perf_counter()
                        response = client.get(path)
                        times.append((time.perf_counter() - t) * 1000)
                        assert response.status_code == 200, (path, response.status_code)
                    print(f"  {key:<22} {_ms(times)}  peak RSS {_rss_mib():6.0f} MiB", flush=True)
        print(f"\nprocess peak RSS {_rss_mib():.0f} MiB; load average {os.getloadavg()[0]:.2f} "
              f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
        rows_year = ARGS.gpus * 288 * 365
        print(f"a year of {ARGS.gpus:,} GPUs is {rows_year:,} samples ({rows_year / world['samples']:.1f} x these); "
              f"the pages' time grows linearly with the samples of the period shown")
    finally:
        if ARGS.keep:
            print(f"kept database {db['NAME']}")
        else:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

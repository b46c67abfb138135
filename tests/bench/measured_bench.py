"""How fast the measured-use pages answer at fleet scale (a script, not a test): latency and memory.

    python tests/bench/measured_bench.py [--tenants 200] [--gpus 1000] [--days 14] [--run-hours 12] [--repeat 10]
                                         [--rollups [--history-days 365]] [--db URL] [--keep]

1. Makes a fresh, throwaway PostgreSQL database (``--db`` or ``DATABASE_URL``; it becomes ``measured_bench_<pid>``),
   migrates it and seeds the demo world without a cluster (tests/bench/speedworld.py) plus ``--tenants`` tenants
   of one project each, a tenant admin of the first (``bench-admin``).
2. Copies in with ``COPY`` (nothing is committed to the repository): ``--gpus`` GPUs, spread evenly over the
   tenants and over the GPU flavors of the demo's one cluster, each held for the whole ``--days`` by back-to-back
   one-device requests of ``--run-hours`` (finished, the last one running), and one ``MeasuredSample`` per GPU and
   5-minute slot (what ``insights.measured_take`` writes) from 00:00 UTC ``--days`` days ago until now:
   ``--gpus`` x 288 x ``--days`` rows and today's, about 4 M at the default size.
3. With ``--rollups``, the ``measured`` rollup (insights/measured_rollup.py): times the backfill of the seeded
   days (``measured_rollup.backfill``, what ``manage.py rollups backfill --only measured`` runs), then covers the
   rest of ``--history-days`` (default 365) before them **by writing the rollup rows directly**, as the backfill
   would have produced them from the same samples, without seeding those samples: a year of 1,000 GPUs is about
   105 M rows (about 23 GiB with indexes), more than a development machine seeds in reasonable time, and the pages
   read only the rollup for those days. The rows are computed in Python from the formula the samples are made
   with (exact decimal sums; each day of a GPU is the same 288 slot figures, its 00:00 slot apart), and the script
   first checks the shortcut: for every whole seeded day, the rows the backfill computed from the samples in
   PostgreSQL equal the rows the formula gives, field by field, or it stops.
4. Gets the three measured metric pages (``/ops/metrics/<key>/`` as ops, ``/tenants/<slug>/metrics/<key>/`` as
   the tenant admin) with Django's test client, over the default period (the last 7 days) and over the whole
   range (the seeded days, or with ``--rollups`` the whole history), once to warm up and then ``--repeat`` times
   each: prints p50 / p95 / max in ms, the samples the period stands for (with ``--rollups``: the raw samples
   and rollup rows it reads), and the process's peak RSS (``getrusage``) after each, with the rows seeded and the
   seeding time before.

Without ``--rollups`` every page sums the raw samples of its period (what the pages did before the rollup), and a
year is a linear extrapolation of the time per sample.

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
from decimal import Decimal
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
parser.add_argument("--rollups", action="store_true", help="backfill the measured rollup over the seeded days and "
                    "write its rows directly for the rest of --history-days (see 3. above)")
parser.add_argument("--history-days", type=int, default=365, help="with --rollups: days of history in all "
                    "(default 365)")
parser.add_argument("--db", default=os.environ.get("DATABASE_URL", ""), help="PostgreSQL server URL (default DATABASE_URL)")
parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
ARGS = parser.parse_args()
if not ARGS.db.startswith("postgres"):
    raise SystemExit("measured bench needs PostgreSQL: --db postgres://... or DATABASE_URL")
if ARGS.tenants < 1 or ARGS.gpus < 1 or ARGS.days < 1 or ARGS.run_hours < 1 or ARGS.repeat < 1:
    raise SystemExit("--tenants, --gpus, --days, --run-hours and --repeat must be at least 1")
if ARGS.rollups and not ARGS.days < ARGS.history_days <= 399:
    raise SystemExit("--history-days must be more than --days and at most 399 (a page shows at most 400 days)")
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
    midnight = now.replace(hour=0, minute=0) - timedelta(days=ARGS.days)
    first = midnight - timedelta(seconds=SLOT)  # the first slot starts here; sample ``at`` is a slot's end: 00:00
    slots = int((now - first).total_seconds()) // SLOT
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
                util, sm, fb = figures(g, s, memory)
                yield f"{at.isoformat()}\t{request_ids[s // per_run]}\t{head}{util}\t{sm}\t{fb}\t0\tf\n"

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
    return {"admin": admin, "tenant": tenants[0], "first": first, "samples": n_samples, "lanes": lanes,
            "cluster_id": cluster_id, "midnight": midnight}


def figures(g: int, s: int, memory: int) -> tuple[str, str, str]:
    """GPU ``g``'s slot ``s`` (its sample at ``first + 5 min x (s + 1)``) as the samples' text: utilisation %, SM
    active, peak memory MiB. Over a day a quarter of each GPU's slots are idle, the rest busy."""
    wave = (s + 17 * g) % 288
    util = (wave % 4) * 0.9 if wave < 72 else 40 + (wave * 7 + g) % 60
    fb = memory * (0.05 if wave < 72 else 0.3 + ((g * 13 + wave) % 60) / 100)
    return f"{util:.2f}", f"{min(1.0, util / 110):.4f}", f"{min(fb, memory):.1f}"


def formula_rows(world: dict[str, Any], days: list[date], threshold: float) -> dict[tuple[Any, ...], list[Any]]:
    """(day, at_start, tenant, project, flavor) -> [samples, alloc, util, idle, mem_used, mem_total]: the rows the
    ``measured`` rollup's backfill makes of these days' samples, computed from ``figures`` (exact decimals, as the
    rollup's numerics). A whole day of a GPU is 288 consecutive slots, so its figures are every ``wave`` once: the
    day's sums are the same every day, and only which slot falls at 00:00 (the ``at_start`` row) moves."""
    from insights.measured_rollup import PLACES

    first = world["first"]
    quantum = Decimal(1).scaleb(-PLACES)

    def one(g: int, s: int, memory: int) -> list[Any]:
        util, _, fb = figures(g, s, memory)
        return [1, SLOT, Decimal(util).quantize(quantum) * SLOT, SLOT if float(util) < threshold else 0,
                Decimal(fb).quantize(quantum) * SLOT, memory * SLOT]

    def add(into: list[Any], values: list[Any]) -> None:
        for i, v in enumerate(values):
            into[i] += v

    full = world.setdefault("full-days", {})  # computed once per process
    for g, _, _, memory in world["lanes"]:
        if g not in full:
            full[g] = [0, 0, Decimal(0), 0, Decimal(0), 0]
            for s in range(288):
                add(full[g], one(g, s, memory))
    out: dict[tuple[Any, ...], list[Any]] = {}
    for day in days:
        midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
        s_mid = int((midnight - first).total_seconds()) // SLOT - 1  # the slot whose sample is taken at 00:00
        for g, project, flavor_id, memory in world["lanes"]:
            mid = one(g, s_mid, memory)
            key = (project.tenant_id, project.pk, flavor_id)
            add(out.setdefault((day, True, *key), [0, 0, Decimal(0), 0, Decimal(0), 0]), mid)
            add(out.setdefault((day, False, *key), [0, 0, Decimal(0), 0, Decimal(0), 0]),
                [a - b for a, b in zip(full[g], mid, strict=True)])
    return out


def roll(world: dict[str, Any], now: datetime) -> None:
    """Backfill the seeded days (timed), check the formula against it, write the older days' rollup rows."""
    from django.utils import timezone

    from insights import measured_rollup
    from insights.measured import idle_percent
    from insights.models import MeasuredDay, MeasuredRollup

    threshold = idle_percent()
    first_day, today = world["midnight"].date(), now.date()
    started = time.monotonic()
    counts = measured_rollup.backfill(first_day, today)
    took = time.monotonic() - started
    print(f"\nbackfill (measured rollup) of the {counts['days']} seeded days before today: {counts['rows']:,} rows in "
          f"{took:.1f} s ({ARGS.gpus * 288 * counts['days'] / took:,.0f} samples/s); peak RSS {_rss_mib():.0f} MiB")
    seeded = [first_day + timedelta(days=i) for i in range(counts["days"])]
    started = time.monotonic()
    expected = formula_rows(world, seeded, threshold)
    got = {tuple(r[:5]): list(r[5:]) for r in MeasuredRollup.objects.filter(day__in=seeded).values_list(
        "day", "at_start", "tenant_id", "project_id", "flavor_id", *measured_rollup.SUMS)}
    if got != expected:
        wrong = sorted(set(got) ^ set(expected)) or [k for k in expected if got[k] != expected[k]]
        raise SystemExit(f"the formula's rollup rows differ from the backfill's, e.g. {wrong[:3]}")
    print(f"checked: the formula gives the backfill's {len(got):,} rows of those days exactly "
          f"({time.monotonic() - started:.1f} s)")
    old = [today - timedelta(days=ARGS.history_days - i) for i in range(ARGS.history_days - len(seeded))]
    started = time.monotonic()
    cluster = world["cluster_id"]
    n = _copy(MeasuredRollup._meta.db_table, ["day", "at_start", "cluster_id", "tenant_id", "project_id",
                                              "flavor_id", *measured_rollup.SUMS],
              ("\t".join(map(_text, (day, at_start, cluster, t, p, f, *sums))) + "\n"
               for one_day in old  # a day at a time: the process holds one day's rows
               for (day, at_start, t, p, f), sums in formula_rows(world, [one_day], threshold).items()))
    per_day = ARGS.gpus * 288
    _copy(MeasuredDay._meta.db_table, ["day", "computed_at", "idle_percent", "samples", "dirty"],
          (f"{day}\t{timezone.now().isoformat()}\t{threshold}\t{per_day}\tf\n" for day in old))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s)", [MeasuredRollup._meta.db_table])
        size = cursor.fetchone()[0]
    print(f"wrote the rollup rows of the {len(old)} older days directly (standing for {per_day * len(old):,} samples): "
          f"{n:,} rows in {time.monotonic() - started:.1f} s; rollup table with indexes {size / 2**20:.0f} MiB; "
          f"peak RSS {_rss_mib():.0f} MiB")


def reads(start: datetime, end: datetime, tenant: Any) -> str:
    """What a page over ``(start, end]`` (by day) reads: raw samples and rollup rows, and the samples they stand for."""
    from django.db.models import Count, Q, Sum

    from insights import measured_rollup
    from insights.measured import idle_percent
    from insights.models import MeasuredRollup, MeasuredSample
    from portal.rollups import in_spans

    parts = measured_rollup.plan(start, end, "day", idle_percent())
    raw = MeasuredSample.objects.filter(measured_rollup.in_pieces(parts.raw))
    rolled = MeasuredRollup.objects.filter(Q(in_spans(parts.days), at_start=False)
                                           | Q(in_spans(parts.starts), at_start=True))
    if tenant is not None:
        raw, rolled = raw.filter(tenant=tenant), rolled.filter(tenant=tenant)
    n_raw, agg = raw.count(), rolled.aggregate(rows=Count("pk"), samples=Sum("samples"))
    return (f"{n_raw + (agg['samples'] or 0):,} samples, read as {n_raw:,} raw samples and "
            f"{agg['rows']:,} rollup rows")


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

        now = datetime.now(UTC).replace(second=0, microsecond=0)
        now -= timedelta(minutes=now.minute % 5)
        world = seed(now)
        ops = get_user_model().objects.get(username="ops")
        tenant = world["tenant"]
        first_day: date = world["midnight"].date()
        today = now.date()
        if ARGS.rollups:
            roll(world, now)
            first_day = today - timedelta(days=ARGS.history_days)
        whole = f"?start={first_day:%Y-%m-%d}&end={today:%Y-%m-%d}"
        periods = [("default (last 7 days)", "", today - timedelta(days=6)),
                   (f"whole range ({first_day} to {today})", whole, first_day)]
        who = [("ops", ops, "/ops/metrics/{key}/", None), (f"tenant admin of {tenant.slug}", world["admin"],
                                                            f"/tenants/{tenant.slug}/metrics/{{key}}/", tenant)]
        for label, user, pattern, only in who:
            client = Client()
            client.force_login(user)
            for period, params, since in periods:
                start_at = datetime(since.year, since.month, since.day, tzinfo=UTC)
                end_at = datetime(today.year, today.month, today.day, tzinfo=UTC) + timedelta(days=1)
                print(f"\n{label}, {period}: {reads(start_at, end_at, only)}; {ARGS.repeat} calls after one warm-up")
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
        if not ARGS.rollups:
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

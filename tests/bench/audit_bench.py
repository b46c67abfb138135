"""Audit append benchmark (a script, not a test): what publishing the chain's anchor adds to each append.

    DATABASE_URL=postgres://... REDIS_URL=redis://... python tests/bench/audit_bench.py [--appends 2000]

Creates a throw-away database on ``DATABASE_URL``'s server (dropped at the end; SQLite without it), then commits
``--appends`` transactions of one ``audit_record`` each, three ways: no anchor store, the anchor file, the file and
the Redis key (with ``REDIS_URL``); then the publication alone. Prints the time per committed append (median, 95th
percentile, mean). The anchor's log line goes to stderr: ``2>/dev/null`` keeps the table readable.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000)
    options = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="audit-bench-"))
    os.environ["PORTAL_VAR_DIR"] = str(workdir)
    scratch = f"audit_bench_{uuid.uuid4().hex[:8]}"
    os.environ["PORTAL_AUDIT_ANCHOR_REDIS_KEY"] = f"bench:{scratch}:anchor"
    base = os.environ.get("DATABASE_URL", "")
    if base.startswith("postgres"):
        import psycopg

        with psycopg.connect(base.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{scratch}"')
        os.environ["DATABASE_URL"] = base.rsplit("/", 1)[0] + "/" + scratch
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections, transaction
    from django.test.utils import override_settings

    try:
        call_command("migrate", "--no-input", "-v", "0")
        from tenants.access import Actor
        from tenants.audit import audit_record
        from tenants.models import Tenant

        tenant = Tenant.objects.create(name="Bench", slug="bench")
        actor = Actor.system()
        redis_url = settings.REDIS_URL
        ways = [("no anchor store", {"AUDIT_ANCHOR_FILE": "", "REDIS_URL": ""}),
                ("anchor file", {"AUDIT_ANCHOR_FILE": str(workdir / "anchor.json"), "REDIS_URL": ""})]
        if redis_url:
            ways.append(("anchor file + Redis key", {"AUDIT_ANCHOR_FILE": str(workdir / "anchor.json"),
                                                     "REDIS_URL": redis_url,
                                                     "AUDIT_ANCHOR_REDIS_KEY": f"bench:{scratch}:anchor"}))
        for _ in range(200):  # warm up: connections, prepared statements, the Redis script
            with transaction.atomic():
                audit_record(actor=actor, action="bench.warm", target=tenant)
        print(f"{'':26} {'median':>9} {'p95':>9} {'mean':>9}   ({options.appends} committed appends, µs each)")
        for _round in range(2):  # twice, interleaved, so a noisy moment shows as a disagreement
            for name, overrides in ways:
                with override_settings(**overrides):
                    times = []
                    for _ in range(options.appends):
                        started = time.perf_counter()
                        with transaction.atomic():
                            audit_record(actor=actor, action="bench.append", target=tenant)
                        times.append((time.perf_counter() - started) * 1e6)
                times.sort()
                print(f"{name:26} {statistics.median(times):9.0f} {times[int(len(times) * 0.95)]:9.0f} "
                      f"{statistics.fmean(times):9.0f}")
        # The publication alone (what runs after each commit), without the database's noise around it.
        from tenants.anchor import anchor_flush, anchor_publish

        for name, overrides in ways:
            with override_settings(**overrides):
                times = []
                for n in range(options.appends):
                    started = time.perf_counter()
                    anchor_publish(seq=10**6 + n, entry_hash="a" * 64)
                    times.append((time.perf_counter() - started) * 1e6)
            times.sort()
            print(f"publish only: {name:13} {statistics.median(times):9.0f} {times[int(len(times) * 0.95)]:9.0f} "
                  f"{statistics.fmean(times):9.0f}")
        anchor_flush()
        Path(workdir / "anchor.json").unlink(missing_ok=True)
        if redis_url:
            import redis

            redis.Redis.from_url(redis_url).delete(f"bench:{scratch}:anchor")
        out = __import__("io").StringIO()
        call_command("audit_verify", "--allow-unanchored", stdout=out)
        print(out.getvalue().strip()[:90])
        if redis_url:
            import redis

            redis.Redis.from_url(redis_url).delete(f"bench:{scratch}:anchor")
    finally:
        connections.close_all()
        if base.startswith("postgres"):
            import psycopg

            with psycopg.connect(base.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


if __name__ == "__main__":
    main()

"""`make test`: run the whole suite on PostgreSQL and Redis when they are reachable, else SQLite.

Explicit DATABASE_URL / REDIS_URL win. Prints which database and broker the run uses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def main(argv: list[str]) -> int:
    env = os.environ
    if "DATABASE_URL" not in env and reachable("127.0.0.1", 5432):
        env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:5432/portal"
    if "REDIS_URL" not in env and "CELERY_BROKER_URL" not in env and reachable("127.0.0.1", 6379):
        env["REDIS_URL"] = "redis://127.0.0.1:6379/15"
    # Each run gets its own id: it names the PostgreSQL test databases (test_portal_<id>_gw0, ...),
    # prefixes Redis keys and picks a runtime folder, so two runs on one machine never collide.
    # Set PORTAL_TEST_RUN_ID to choose it (e.g. to keep the databases with --reuse-db).
    run_id = env.setdefault("PORTAL_TEST_RUN_ID", f"{os.getpid():x}{int(time.time()) % 100000:x}")
    # Tests never share runtime files with a `make run` in the same checkout, nor with another run.
    env.setdefault("PORTAL_VAR_DIR", str(ROOT / "var" / "test" / run_id))
    database = env.get("DATABASE_URL", "sqlite (var/test)").split("@")[-1]
    broker = (env.get("CELERY_BROKER_URL") or env.get("REDIS_URL") or "sqlite (var/test)").split("@")[-1]
    print(f"make test: database {database}, broker {broker}, run {run_id}", flush=True)
    workers = env.get("PYTEST_WORKERS", "2")
    # The 25 slowest tests at the end: where a run's time went (CI has 90 minutes on a 2-core machine).
    durations = [] if any(a.startswith("--durations") for a in argv) else ["--durations=25"]
    args = [sys.executable, "-m", "pytest", "-n", workers, "--dist", "loadgroup", *durations, *argv]
    try:
        return subprocess.run(args, cwd=ROOT, env=env, check=False).returncode
    except KeyboardInterrupt:
        return 130
    finally:
        # The run's own runtime folder (SQLite test files, broker folders) goes with it.
        if env["PORTAL_VAR_DIR"] == str(ROOT / "var" / "test" / run_id):
            shutil.rmtree(env["PORTAL_VAR_DIR"], ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

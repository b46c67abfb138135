#!/usr/bin/env python3
"""The image's one entry point: ``entrypoint.py ROLE [ARGS...]`` (docs/operations.md, README "Run it in production").

Roles:

* ``web``: gunicorn with ``deploy/gunicorn.conf.py`` (``WEB_WORKERS`` processes, ``WEB_THREADS`` threads each,
  port ``PORT``; SIGTERM lets in-flight requests finish).
* ``worker``: a Celery worker (``CELERY_CONCURRENCY`` processes, ``CELERY_QUEUES`` if set). SIGTERM is a
  soft shutdown: running tasks get ``CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT`` seconds (45), then are cancelled
  and, never acknowledged (late acks), handed out again by the broker.
* ``beat``: the Celery scheduler (one per installation); its schedule file lives under /tmp.
* ``migrate``: ``manage.py migrate`` (as the owner role ``--database migrate`` when ``DATABASE_MIGRATE_URL`` is
  set), then ``createcachetable`` (a no-op with Redis as the cache).
* ``manage ARGS``: any ``manage.py`` command, e.g. ``manage check --deploy`` or ``manage createsuperuser``.
* ``healthcheck [ROLE]``: a liveness check (the image's HEALTHCHECK, the worker and beat probes): ``web`` GETs
  ``/healthz/live``; ``worker`` and ``beat`` check that their heartbeat file ``$TMPDIR/portal-ROLE.alive``
  (portal/beat.py: touched every 10 s by the worker's event loop, on every beat tick) is younger than
  ``PORTAL_HEARTBEAT_MAX_AGE`` seconds (120); no round trip through the broker. Without ROLE: the container's.

``--dry-run`` prints the command lines as JSON instead of running them (tests and the curious).
The process is replaced by the role's program (exec), so signals reach it directly.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("web", "worker", "beat", "migrate", "manage", "healthcheck")
USAGE = f"usage: entrypoint.py [--dry-run] {{{'|'.join(ROLES)}}} [args...]"


def _python() -> str:
    return sys.executable or "python3"


def _manage(*args: str) -> list[str]:
    return [_python(), str(ROOT / "manage.py"), *args]


def commands(role: str, args: list[str], env: dict[str, str]) -> tuple[list[list[str]], dict[str, str]]:
    """The command lines of ``role`` (run in order; the last one replaces this process) and the environment."""
    env = dict(env)
    env.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    env["PORTAL_ROLE"] = role
    if role in ("web", "worker"):
        # Prometheus multiprocess mode: every gunicorn worker / Celery process writes its counters here and a
        # scrape sums them (portal/prometheus.py); emptied before the role starts (``metrics_dir_reset``).
        env.setdefault("PROMETHEUS_MULTIPROC_DIR", str(Path(env.get("TMPDIR", "/tmp")) / f"portal-metrics-{role}"))
    if role == "web":
        return [[_python(), "-m", "gunicorn", "--config", str(ROOT / "deploy" / "gunicorn.conf.py"),
                 "portal.wsgi:application", *args]], env
    if role == "worker":
        # SIGTERM becomes Celery's cold shutdown with a soft part (running tasks get the timeout to finish).
        env.setdefault("REMAP_SIGTERM", "SIGQUIT")
        env.setdefault("CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT", "45")
        cmd = [_python(), "-m", "celery", "--app", "portal", "worker", "--loglevel", env.get("LOG_LEVEL", "INFO"),
               "--concurrency", env.get("CELERY_CONCURRENCY", "2"), "--without-mingle", "--without-gossip"]
        if env.get("CELERY_QUEUES"):
            cmd += ["--queues", env["CELERY_QUEUES"]]
        return [cmd + args], env
    if role == "beat":
        schedule = Path(env.get("TMPDIR", "/tmp")) / "celerybeat-schedule"
        return [[_python(), "-m", "celery", "--app", "portal", "beat", "--loglevel", env.get("LOG_LEVEL", "INFO"),
                 "--schedule", str(schedule), *args]], env
    if role == "migrate":
        database = ["--database", "migrate"] if env.get("DATABASE_MIGRATE_URL") else []
        return [_manage("migrate", "--noinput", *database, *args), _manage("createcachetable")], env
    if role == "manage":
        if not args:
            raise SystemExit("manage: which command? e.g. `manage check --deploy`")
        return [_manage(*args)], env
    if role == "healthcheck":
        return [], env
    raise SystemExit(USAGE)


def metrics_dir_reset(env: dict[str, str]) -> None:
    """Empty the Prometheus folder: a restarted container's old files would count twice (its /tmp may survive)."""
    folder = env.get("PROMETHEUS_MULTIPROC_DIR")
    if not folder:
        return
    path = Path(folder)
    if path.is_dir():
        for item in path.glob("*.db"):
            item.unlink(missing_ok=True)
    path.mkdir(parents=True, exist_ok=True)


def _running_role(env: dict[str, str]) -> str:
    """The role of the container's main process (a HEALTHCHECK runs beside it, without its environment)."""
    try:
        environ = Path("/proc/1/environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    for item in environ:
        if item.startswith(b"PORTAL_ROLE="):
            return item.split(b"=", 1)[1].decode()
    return env.get("PORTAL_ROLE", "web")


def heartbeat_age(role: str, env: dict[str, str]) -> float | None:
    """Seconds since the ``role`` process last touched its heartbeat file, None without one."""
    try:
        return time.time() - (Path(env.get("TMPDIR", "/tmp")) / f"portal-{role}.alive").stat().st_mtime
    except OSError:
        return None


def healthcheck(env: dict[str, str], role: str | None = None) -> int:
    role = role or _running_role(env)
    if role in ("worker", "beat"):
        age = heartbeat_age(role, env)
        limit = float(env.get("PORTAL_HEARTBEAT_MAX_AGE", "120"))
        if age is None or age > limit:
            print(f"healthcheck: {role} heartbeat " + ("missing" if age is None else f"{age:.0f}s old (limit {limit:.0f}s)"),
                  file=sys.stderr)
            return 1
        return 0
    if role != "web":
        return 0
    url = f"http://127.0.0.1:{env.get('PORT', '8000')}/healthz/live"
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:  # a fixed loopback URL
            return 0 if answer.status == 200 else 1
    except OSError:
        return 1


def main(argv: list[str]) -> int:
    dry_run = bool(argv) and argv[0] == "--dry-run"
    if dry_run:
        argv = argv[1:]
    if not argv or argv[0] not in ROLES:
        print(USAGE, file=sys.stderr)
        return 2
    role, args = argv[0], argv[1:]
    if role == "healthcheck":
        return healthcheck(dict(os.environ), args[0] if args else None)
    cmds, env = commands(role, args, dict(os.environ))
    if dry_run:
        shown = {k: env[k] for k in ("PORTAL_ROLE", "REMAP_SIGTERM", "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT") if k in env}
        print(json.dumps({"role": role, "commands": cmds, "env": shown}))
        return 0
    os.chdir(ROOT)
    if role in ("web", "worker"):
        metrics_dir_reset(env)
    for cmd in cmds[:-1]:
        print(f"entrypoint: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        code = subprocess.run(cmd, env=env).returncode
        if code:
            return code
    print(f"entrypoint: {shlex.join(cmds[-1])}", file=sys.stderr, flush=True)
    os.execvpe(cmds[-1][0], cmds[-1], env)
    return 127  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

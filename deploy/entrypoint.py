#!/usr/bin/env python3
"""The image's one entry point: ``entrypoint.py ROLE [ARGS...]`` (docs/operations.md, README "Run it in production").

Roles:

* ``web``: gunicorn with ``deploy/gunicorn.conf.py`` (``WEB_WORKERS`` processes, ``WEB_THREADS`` threads each,
  port ``PORT``; SIGTERM lets in-flight requests finish).
* ``worker``: a Celery worker (``CELERY_CONCURRENCY`` processes, ``CELERY_QUEUES`` if set). SIGTERM is a
  soft shutdown: running tasks get ``CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT`` seconds (45), then are cancelled
  and, never acknowledged (late acks), handed out again by the broker.
* ``beat``: the Celery scheduler (one per installation, portal/beat.py); its schedule's state is in the shared cache
  (``--schedule`` is accepted and ignored).
* ``migrate``: ``manage.py migrate`` (as the owner role ``--database migrate`` when ``DATABASE_MIGRATE_URL`` is
  set), then ``createcachetable`` (a no-op with Redis as the cache); with ``DATABASE_MIGRATE_URL`` and
  ``PORTAL_RUNTIME_DB_ROLE`` also ``manage.py db_runtime_role $PORTAL_RUNTIME_DB_ROLE --apply`` (the runtime role's
  grants, its password from ``PORTAL_RUNTIME_DB_PASSWORD`` when set).
* ``await-migrations``: waits until every migration this code knows is applied (``manage.py migrate --check``,
  the plan ``/healthz/ready`` checks for web), every ``PORTAL_AWAIT_MIGRATIONS_INTERVAL`` seconds (5), for at most
  ``PORTAL_AWAIT_MIGRATIONS_TIMEOUT`` seconds (1800), then exits 1. The worker's and beat's init container: they
  start new code only once the migration Job has finished (web's readiness waits the same way).
* ``manage ARGS``: any ``manage.py`` command, e.g. ``manage check --deploy`` or ``manage createsuperuser``.
* ``healthcheck [ROLE]``: a liveness check (the image's HEALTHCHECK, the worker and beat probes): ``web`` GETs
  ``/healthz/live``; ``worker`` and ``beat`` check that their heartbeat file ``$TMPDIR/portal-ROLE.alive``
  (portal/beat.py: touched every 10 s by the worker's event loop, on every beat tick) is younger than
  ``PORTAL_HEARTBEAT_MAX_AGE`` seconds (120); no round trip through the broker. Without ROLE: the container's.

``--dry-run`` prints the command lines as JSON instead of running them (tests and the curious).
The process is replaced by the role's program (exec), so signals reach it directly.

With ``LOG_FORMAT=json`` (the image's default) file descriptors 1 and 2 themselves become pipes before anything
runs (``json_fds``): a small forwarding process, a child of the role's program that ignores the stop signals,
passes JSON lines through to the real stdout/stderr and wraps any other line as a record of the logger ``stdout``
or ``stderr``. That catches what bypasses Python's ``sys.stdout`` (Celery's shutdown messages are ``os.write``s
to the descriptor, C libraries, subprocesses); it exits once every writer has closed its end, so nothing written
before the role exits is lost. An interactive ``manage`` command (stdin a terminal) keeps the terminal.
"""

from __future__ import annotations

import json
import os
import selectors
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("web", "worker", "beat", "migrate", "await-migrations", "manage", "healthcheck")
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
        commands = [_manage("migrate", "--noinput", *database, *args), _manage("createcachetable")]
        if database and env.get("PORTAL_RUNTIME_DB_ROLE"):
            # Grants on the tables this migration created: the runtime role owns none (docs/security.md).
            commands.append(_manage("db_runtime_role", env["PORTAL_RUNTIME_DB_ROLE"], "--apply"))
        return commands, env
    if role == "await-migrations":
        return [_manage("migrate", "--check", "--skip-checks", *args)], env
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


def say(message: str, env: dict[str, str], level: str = "INFO") -> None:
    """One line on stderr: a JSON object like every other line when ``LOG_FORMAT=json`` (portal/logging.py)."""
    if env.get("LOG_FORMAT", "").lower() == "json":
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
        message = json.dumps({"time": stamp, "level": level, "logger": "entrypoint", "message": message,
                              "request_id": None})
    print(message, file=sys.stderr, flush=True)


def _json_line(line: bytes, stream: str) -> bytes:
    """``line`` (without its newline) as one JSON line: a JSON object as it is, anything else wrapped; blank: b""."""
    text = line.decode("utf-8", "replace").rstrip("\r")
    if not text.strip():
        return b""
    if text.startswith("{") and text.endswith("}"):
        try:
            if isinstance(json.loads(text), dict):
                return text.encode() + b"\n"
        except ValueError:
            pass
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
    return (json.dumps({"time": stamp, "level": "INFO" if stream == "stdout" else "WARNING", "logger": stream,
                        "message": text, "request_id": None}, ensure_ascii=False) + "\n").encode()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


# A line longer than this (no newline yet) goes out in pieces rather than filling the forwarder's memory.
_LONGEST_LINE = 1 << 20


def _forward(sources: dict[int, tuple[int, str]]) -> None:
    """Copy each pipe (read end -> (real descriptor, stream name)) line by line as JSON, until every pipe ends."""
    pending = {fd: b"" for fd in sources}
    with selectors.DefaultSelector() as selector:
        for fd in sources:
            selector.register(fd, selectors.EVENT_READ)
        while pending:
            for key, _ in selector.select():
                fd = key.fd
                target, stream = sources[fd]
                chunk = os.read(fd, 65536)
                *lines, rest = (pending[fd] + chunk).split(b"\n")
                if not chunk or len(rest) > _LONGEST_LINE:
                    lines, rest = [*lines, rest], b""
                out = b"".join(_json_line(line, stream) for line in lines)
                if out:
                    _write_all(target, out)
                if chunk:
                    pending[fd] = rest
                else:
                    selector.unregister(fd)
                    os.close(fd)
                    del pending[fd]


def json_fds(role: str, env: dict[str, str]) -> None:
    """With ``LOG_FORMAT=json``: descriptors 1 and 2 of this process (and what it execs or starts) become pipes
    whose lines a forwarding child writes out as JSON (the module's docstring)."""
    if env.get("LOG_FORMAT", "").lower() != "json" or (role == "manage" and os.isatty(0)):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pipes = {1: (os.pipe(), "stdout"), 2: (os.pipe(), "stderr")}
    if os.fork() == 0:  # the forwarder: lives until the role and all its children have closed the pipes
        code = 0
        try:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            for (_, write_end), _ in pipes.values():
                os.close(write_end)
            _forward({read_end: (target, stream) for target, ((read_end, _), stream) in pipes.items()})
        except BaseException:  # the real stderr still works here: say why, then go
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    for target, ((read_end, write_end), _) in pipes.items():
        os.dup2(write_end, target)
        os.close(read_end)
        os.close(write_end)


def await_migrations(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``migrate --check`` until it passes (0) or the timeout passes (1); a database not yet up waits too."""
    interval = float(env.get("PORTAL_AWAIT_MIGRATIONS_INTERVAL", "5"))
    deadline = time.monotonic() + float(env.get("PORTAL_AWAIT_MIGRATIONS_TIMEOUT", "1800"))
    while True:
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode == 0
        if done:
            say("entrypoint: every migration is applied", env)
            return 0
        if time.monotonic() + interval > deadline:
            say("entrypoint: migrations still unapplied (or the database unreachable); giving up", env, "ERROR")
            return 1
        say(f"entrypoint: waiting for the migration Job (unapplied migrations); again in {interval:g}s", env)
        time.sleep(interval)


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
    if role == "await-migrations" and not dry_run:
        os.chdir(ROOT)
        json_fds(role, env)
        return await_migrations(cmds[0], env)
    if dry_run:
        shown = {k: env[k] for k in ("PORTAL_ROLE", "REMAP_SIGTERM", "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT") if k in env}
        print(json.dumps({"role": role, "commands": cmds, "env": shown}))
        return 0
    os.chdir(ROOT)
    json_fds(role, env)
    if role in ("web", "worker"):
        metrics_dir_reset(env)
    for cmd in cmds[:-1]:
        say(f"entrypoint: {shlex.join(cmd)}", env)
        code = subprocess.run(cmd, env=env, check=False).returncode
        if code:
            return code
    say(f"entrypoint: {shlex.join(cmds[-1])}", env)
    os.execvpe(cmds[-1][0], cmds[-1], env)
    return 127  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""A production-like stack on one machine: every process through the image's entry point (deploy/entrypoint.py),
with the production settings, against the PostgreSQL and Redis already running on 127.0.0.1.

    .venv/bin/python deploy/prodstack.py            # start it, print the URL, serve until Ctrl-C
    .venv/bin/python tests/bench/prodload.py         # start it, load it for 3 minutes with faults, check, stop

What runs (each in its own process group, restarted after a crash as Kubernetes would):

* the sandbox cluster (``python -m sandbox``), registered as the demo's cluster;
* ``web``: gunicorn with 4 workers (``WEB_WORKERS``) of 4 threads;
* ``worker`` twice: two Celery workers of 2 processes each;
* ``beat`` (the singleton scheduler, portal/beat.py);
* ``manage follow_cluster`` twice: two status followers, one active per cluster through its lease, the other
  standing by (workloads/status.py).

Before they start: a fresh database ``portal_prodstack_<time>`` (``--database`` to name it), the Redis database
``--redis-db`` (11) emptied, ``migrate``, ``manage check --deploy --fail-level WARNING`` (must be clean: DEBUG off,
HTTPS settings, a random SECRET_KEY) and the demo seed (``seed_demo``). The stack sits behind no TLS proxy, so
clients send ``X-Forwarded-Proto: https`` as the ingress would. The per-user API rate limits are lifted (a load
test shares three demo accounts between its users).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
ENTRYPOINT = str(ROOT / "deploy" / "entrypoint.py")
PG = "postgres://postgres@127.0.0.1:5432"
DROP = {"PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST", "DJANGO_SETTINGS_MODULE", "CELERY_TASK_ALWAYS_EAGER",
        "PORTAL_TEST_RUN_ID", "DATABASE_MIGRATE_URL", "CELERY_BROKER_URL"}


def say(text: str) -> None:
    print(f"prodstack: {text}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Child:
    """One process (group) of the stack; ``check()`` starts it again when it died (after a second)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.died_at = 0.0

    def start(self) -> None:
        out = self.log.open("a")
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        out.close()

    def check(self) -> None:
        if self.proc is None or self.proc.poll() is None:
            return
        if not self.died_at:
            self.died_at = time.monotonic()
            say(f"{self.name} exited ({self.proc.returncode}); starting it again")
        elif time.monotonic() - self.died_at >= 1:
            self.died_at = 0.0
            self.restarts += 1
            self.start()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)


class Stack:
    def __init__(self, *, var: Path, port: int = 0, database: str | None = None, redis_db: int = 11,
                 web_workers: int = 4, celery_workers: int = 2, followers: int = 2, speed: float = 60) -> None:
        self.var = var
        self.port = port or free_port()
        self.database = database or f"portal_prodstack_{int(time.time())}"
        self.redis_url = f"redis://127.0.0.1:6379/{redis_db}"
        self.kubeconfig = var / "sandbox.kubeconfig"
        self.web_workers, self.celery_workers, self.followers, self.speed = web_workers, celery_workers, followers, speed
        self.children: dict[str, Child] = {}
        self.env = self._env()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in DROP}
        env.update({
            "PORTAL_ENV": "production", "DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50),
            "PORTAL_ENCRYPTION_KEY": "", "DATABASE_URL": f"{PG}/{self.database}", "REDIS_URL": self.redis_url,
            "ALLOWED_HOSTS": "127.0.0.1,localhost", "CSRF_TRUSTED_ORIGINS": f"https://127.0.0.1:{self.port}",
            "PORTAL_BASE_URL": f"https://127.0.0.1:{self.port}", "HOST": "127.0.0.1", "PORT": str(self.port),
            "WEB_WORKERS": str(self.web_workers), "WEB_THREADS": "4", "CELERY_CONCURRENCY": "2",
            "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT": "10", "LOG_FORMAT": "json", "LOG_LEVEL": "WARNING",
            "PORTAL_VAR_DIR": str(self.var / "var"), "STATIC_ROOT": str(self.var / "static"), "TMPDIR": str(self.var / "tmp"),
            "PORTAL_KUBECONFIG": str(self.kubeconfig), "API_RATE_USER": "", "API_RATE_SUBMIT": "",
            "PORTAL_ACCESS_LOG": "0", "PYTHONUNBUFFERED": "1",
        })
        from cryptography.fernet import Fernet

        env["PORTAL_ENCRYPTION_KEY"] = Fernet.generate_key().decode()
        return env

    def _run(self, *args: str, timeout: float = 600) -> str:
        out = subprocess.run([PY, ENTRYPOINT, *args], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        if out.returncode:
            raise SystemExit(f"prodstack: `{' '.join(args)}` failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out.stdout

    def prepare(self) -> None:
        import psycopg
        import redis

        for sub in ("var", "tmp", "static", "logs"):
            (self.var / sub).mkdir(parents=True, exist_ok=True)
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}"')
            conn.execute(f'CREATE DATABASE "{self.database}"')
        redis.Redis.from_url(self.redis_url).flushdb()
        say(f"database {self.database}, Redis {self.redis_url} (emptied)")
        self._run("migrate")
        say("migrated")
        checked = self._run("manage", "check", "--deploy", "--fail-level", "WARNING")
        say(f"check --deploy: {checked.strip().splitlines()[-1]}")

    def _child(self, name: str, argv: list[str], **env: str) -> Child:
        child = Child(name, argv, {**self.env, **env}, self.var / "logs" / f"{name}.log")
        self.children[name] = child
        return child

    def start(self) -> None:
        self.prepare()
        sandbox = self._child("sandbox", [PY, "-m", "sandbox", "--kubeconfig", str(self.kubeconfig), "--speed", str(self.speed)])
        sandbox.start()
        deadline = time.monotonic() + 60
        while not self.kubeconfig.exists():
            if time.monotonic() > deadline:
                raise SystemExit("prodstack: the sandbox cluster did not start (logs/sandbox.log)")
            time.sleep(0.2)
        self._run("manage", "seed_demo")
        say("demo seeded (the sandbox is its cluster)")
        self._child("web", [PY, ENTRYPOINT, "web"]).start()
        for n in range(1, self.celery_workers + 1):
            (self.var / "tmp" / f"worker-{n}").mkdir(exist_ok=True)  # each worker's own heartbeat file
            self._child(f"worker-{n}", [PY, ENTRYPOINT, "worker", "--hostname", f"worker-{n}@%h"],
                        TMPDIR=str(self.var / "tmp" / f"worker-{n}")).start()
        self._child("beat", [PY, ENTRYPOINT, "beat"]).start()
        for n in range(1, self.followers + 1):
            self._child(f"follower-{n}", [PY, ENTRYPOINT, "manage", "follow_cluster", "--watch", "2"]).start()
        self.wait_ready()

    def wait_ready(self, timeout: float = 180) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while True:
            try:
                req = urllib.request.Request(f"{self.base}/healthz/ready")
                with urllib.request.urlopen(req, timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("prodstack: the web role did not turn ready (logs/web.log)")
            self.check()
            time.sleep(0.5)
        say(f"ready: {self.base}/ (send X-Forwarded-Proto: https), logs in {self.var / 'logs'}")

    def check(self) -> None:
        for child in self.children.values():
            child.check()

    def pids(self, name: str) -> list[int]:
        """The live processes of a child's group (the group leader first)."""
        child = self.children[name]
        if child.proc is None:
            return []
        pgid = child.proc.pid
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2:].split()
                if int(fields[2]) == pgid and fields[0] not in "ZX":
                    out.append(int(entry.name))
        return sorted(out, key=lambda pid: (pid != pgid, pid))

    def stop(self) -> None:
        order = [n for n in self.children if n != "sandbox"] + ["sandbox"]
        for name in order:
            self.children[name].signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for name in order:
            proc = self.children[name].proc
            if proc is not None:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.children[name].signal(signal.SIGKILL)
                    proc.wait()
        say("stopped")

    def drop_database(self) -> None:
        import psycopg

        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--var", default=str(ROOT / "var" / "prodstack"), help="runtime folder (logs, kubeconfig)")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--database", default=None, help="the database to create (dropped first if it exists)")
    parser.add_argument("--redis-db", type=int, default=11, help="the Redis database to use (emptied first)")
    args = parser.parse_args(argv)
    stack = Stack(var=Path(args.var), port=args.port, database=args.database, redis_db=args.redis_db)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        stack.start()
        while not stopping:
            stack.check()
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`make run`: the portal with demo data on http://127.0.0.1:8000/, plus everything it needs.

Migrates, seeds the demo, starts the embedded sandbox cluster, the web server and a Celery worker
(with beat), prints the URL and the logins, and stops everything it started on Ctrl-C.
Without DATABASE_URL / REDIS_URL it needs no server: SQLite and a filesystem broker under var/.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("PORTAL_VAR_DIR", ROOT / "var"))
PY = sys.executable
HOST = os.environ.get("PORTAL_HOST", "127.0.0.1")
PORT = os.environ.get("PORTAL_PORT", "8000")
SPEED = os.environ.get("SANDBOX_SPEED", "60")


def manage(*args: str) -> None:
    subprocess.run([PY, "manage.py", *args], cwd=ROOT, check=True)


def main() -> int:
    VAR.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    kubeconfig = VAR / "sandbox.kubeconfig"
    os.environ.setdefault("PORTAL_KUBECONFIG", str(kubeconfig))
    database = (os.environ.get("DATABASE_URL") or f"sqlite {VAR / 'portal.sqlite3'}").split("@")[-1]
    broker = (os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or "filesystem (var/celery)").split("@")[-1]
    print(f"database: {database}\nbroker:   {broker}", flush=True)

    manage("migrate", "--no-input", "-v", "0")
    children: list[subprocess.Popen] = []

    def stop(*_: object) -> None:
        for child in reversed(children):
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + 10
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        print("\nstopped: web server, worker, sandbox cluster", flush=True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    if kubeconfig.exists():
        kubeconfig.unlink()
    children.append(
        subprocess.Popen(
            [PY, "-m", "sandbox", "--kubeconfig", str(kubeconfig), "--speed", SPEED,
             "--state-file", str(VAR / "sandbox-state.json")],
            cwd=ROOT,
        )
    )
    for _ in range(200):
        if kubeconfig.exists() or children[0].poll() is not None:
            break
        time.sleep(0.05)
    if not kubeconfig.exists():
        print("the sandbox cluster did not start; see its output above", file=sys.stderr)
        stop()

    manage("seed_demo")
    children.append(
        subprocess.Popen(
            [PY, "-m", "celery", "-A", "portal", "worker", "--beat", "--loglevel", "warning",
             "--pool", "threads", "--concurrency", "4",
             "--schedule", str(VAR / "celerybeat-schedule")],
            cwd=ROOT,
        )
    )
    children.append(subprocess.Popen([PY, "manage.py", "runserver", f"{HOST}:{PORT}", "--noreload"], cwd=ROOT))
    time.sleep(1.5)
    print(
        f"\n  GPU portal:  http://{HOST}:{PORT}/    (API docs: http://{HOST}:{PORT}/api/docs/)\n"
        f"  kubectl:     kubectl --kubeconfig {kubeconfig.relative_to(ROOT) if kubeconfig.is_relative_to(ROOT) else kubeconfig} get nodes,clusterqueues,localqueues -A\n"
        "  Ctrl-C stops everything.\n",
        flush=True,
    )
    while True:
        for child in children:
            if child.poll() is not None:
                print(f"{child.args[2] if len(child.args) > 2 else child.args} exited with {child.returncode}", file=sys.stderr)
                stop()
        time.sleep(0.5)


if __name__ == "__main__":
    raise SystemExit(main())

"""Embedded broker candidates: push N tasks through each and print throughput and latency (not a test).

    .venv/bin/python tests/bench/broker_bench.py [--tasks 500]

Candidates: kombu's filesystem transport (the old default, for reference), the portal's SQLite
transport (portal/broker.py: kombu's SQLAlchemy transport, hardened), and Redis (a redis-server this
script starts on a free port when one is installed). Each run: one producer publishes N tasks as fast
as it can while a worker (4 threads, as `make run`) consumes; latency is publish to task start.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu.transport import TRANSPORT_ALIASES

TRANSPORT_ALIASES.setdefault("portal", "portal.broker:Transport")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(name: str, url: str, n: int, options: dict | None = None) -> None:
    app = Celery(f"bench-{name}", broker=url, set_as_current=False)
    app.conf.update(broker_transport_options=options or {}, task_ignore_result=True, task_acks_late=True,
                    worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True)
    latencies: list[float] = []
    lock = threading.Lock()
    done = threading.Event()

    @app.task(name="bench.stamp")
    def stamp(sent: float) -> None:
        with lock:
            latencies.append(time.time() - sent)
            if len(latencies) >= n:
                done.set()

    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="ERROR", shutdown_timeout=30):
        stamp.delay(time.time())  # warm up (queue created, connections open)
        deadline = time.monotonic() + 30
        while not latencies and time.monotonic() < deadline:
            time.sleep(0.05)
        with lock:
            latencies.clear()
        start = time.monotonic()
        for _ in range(n):
            stamp.delay(time.time())
        published = time.monotonic() - start
        done.wait(timeout=max(60, n / 5))
        total = time.monotonic() - start
    got = len(latencies)
    lat = sorted(latencies) or [float("nan")]
    print(
        f"{name:12} {n / published:8.0f} pub/s {got / total:8.0f} tasks/s  "
        f"latency p50 {statistics.median(lat) * 1000:7.1f} ms  p95 {lat[int(len(lat) * 0.95) - 1] * 1000:7.1f} ms  "
        f"{got}/{n} done",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--only", nargs="*", default=["filesystem", "sqlite", "redis"])
    args = parser.parse_args()
    if len(args.only) > 1:  # each candidate in a process of its own (Celery apps share more than they seem)
        for name in args.only:
            subprocess.run([sys.executable, __file__, "--tasks", str(args.tasks), "--only", name], check=False)
        return 0
    logging.getLogger("celery").setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="broker-bench-"))
    try:
        if "filesystem" in args.only:
            folder = tmp / "fs"
            for sub in ("queue", "processed"):
                (folder / sub).mkdir(parents=True)
            run("filesystem", "filesystem://", args.tasks, {
                "data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
                "processed_folder": str(folder / "processed"), "store_processed": False})
        if "sqlite" in args.only:
            run("sqlite", f"portal+sqlite:///{tmp / 'broker.sqlite3'}", args.tasks)
        if "redis" in args.only:
            server = shutil.which("redis-server")
            if not server:
                print("redis       (redis-server not installed)")
            else:
                port = free_port()
                proc = subprocess.Popen([server, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                                        stdout=subprocess.DEVNULL)
                try:
                    for _ in range(100):
                        try:
                            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                            break
                        except OSError:
                            time.sleep(0.05)
                    run("redis", f"redis://127.0.0.1:{port}/0", args.tasks)
                finally:
                    proc.terminate()
                    proc.wait(10)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

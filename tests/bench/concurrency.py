"""Throughput under concurrency: N client threads calling one HTTP endpoint for a fixed time (stdlib only).

``tests/bench/speed.py --concurrency 4,16`` uses it against gunicorn with several sync workers. Each client is a
thread with its own ``http.client`` connection, reused while the server keeps it open (gunicorn's sync workers
close it after every response, so those clients reconnect each time, as a browser behind no proxy would). The
clients start together (a barrier) and stop at the deadline; a call in flight at the deadline finishes and counts.

The clients share the machine (and, being threads, one interpreter lock) with the server: on a small machine
they take CPU the workers would otherwise have, so a figure is "this machine serving and loading itself", and
the ratios between endpoints measured the same way are what carries over.
"""

from __future__ import annotations

import http.client
import itertools
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Callable

# (method, path, headers, body) of the i-th call; i counts over all clients, from 0.
Call = Callable[[int], tuple[str, str, dict[str, str], bytes | None]]


@dataclass
class Result:
    clients: int
    seconds: float = 0.0
    ok: int = 0
    failed: int = 0  # an unexpected status
    errors: int = 0  # the connection broke
    latencies: list[float] = field(default_factory=list)  # ms, of the calls that answered as expected
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        values = sorted(self.latencies)
        if not values:
            return 0.0
        return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]

    def add(self, other: Result) -> None:
        self.seconds += other.seconds
        self.ok += other.ok
        self.failed += other.failed
        self.errors += other.errors
        self.latencies += other.latencies
        for status, n in other.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + n


def hammer(port: int, call: Call, *, clients: int, seconds: float, expect: int = 200, counter=None) -> Result:
    """``clients`` threads calling ``call(i)`` on 127.0.0.1:``port`` for ``seconds``; the calls answering ``expect``
    count. ``counter`` (an ``itertools.count``) numbers the calls across several runs (unique keys)."""
    counter = counter if counter is not None else itertools.count()
    lock = threading.Lock()
    result = Result(clients=clients)
    barrier = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client() -> None:
        ok = failed = errors = 0
        latencies: list[float] = []
        statuses: dict[int, int] = {}
        conn: http.client.HTTPConnection | None = None
        barrier.wait()
        while time.perf_counter() < deadline[0]:
            method, path, headers, body = call(next(counter))
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            start = time.perf_counter()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                errors += 1
                conn.close()
                conn = None
                continue
            elapsed = (time.perf_counter() - start) * 1000
            statuses[response.status] = statuses.get(response.status, 0) + 1
            if response.status == expect:
                ok += 1
                latencies.append(elapsed)
            else:
                failed += 1
            if response.will_close:
                conn.close()
                conn = None
        if conn is not None:
            conn.close()
        with lock:
            result.ok += ok
            result.failed += failed
            result.errors += errors
            result.latencies += latencies
            for status, n in statuses.items():
                result.statuses[status] = result.statuses.get(status, 0) + n

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    start = time.perf_counter()
    deadline[0] = start + seconds
    barrier.wait()
    for thread in threads:
        thread.join()
    result.seconds = time.perf_counter() - start
    return result

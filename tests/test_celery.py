"""The Celery app runs tasks through the configured broker (Redis in CI) with a real worker."""

from __future__ import annotations

import os
import threading
import time

from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun

from portal.celery import app, ping


def test_worker_runs_a_task_through_the_broker() -> None:
    done = threading.Event()
    results: dict[str, object] = {}

    def record(sender=None, task_id=None, retval=None, state=None, **kwargs) -> None:
        results[task_id] = (state, retval)
        done.set()

    task_postrun.connect(record, weak=False)
    # A queue of its own: tasks other tests queued on commit are not this worker's business.
    queue = f"ping-{os.getpid()}"
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", queues=[queue]):
            sent = ping.apply_async(queue=queue)
            deadline = time.monotonic() + 30
            while sent.id not in results and time.monotonic() < deadline:
                done.wait(timeout=0.5)
                done.clear()
    finally:
        task_postrun.disconnect(record)
    assert results.get(sent.id) == ("SUCCESS", "pong"), results

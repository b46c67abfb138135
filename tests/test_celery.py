"""The Celery app runs tasks through the configured broker with a real worker."""

from __future__ import annotations

from celery.contrib.testing.worker import start_worker
from django.conf import settings

from portal.celery import app, ping


def test_worker_runs_a_task_through_the_broker() -> None:
    backend = settings.REDIS_URL or "cache+memory://"
    app.conf.update(result_backend=backend, task_ignore_result=False)
    app._local.__dict__.pop("backend", None)  # Celery caches the backend per thread; re-read the setting
    app.control.purge()  # tasks other tests queued on commit are not this worker's business
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
            assert ping.apply_async(ignore_result=False).get(timeout=20) == "pong"
    finally:
        app.conf.update(result_backend=None, task_ignore_result=True)
        app._local.__dict__.pop("backend", None)

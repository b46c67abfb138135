"""The Celery app. Tasks live in each app's ``tasks.py`` and are discovered from INSTALLED_APPS."""

import os

from celery import Celery, bootsteps, signals
from kombu.transport import TRANSPORT_ALIASES

from portal.beat import touch_heartbeat
from portal.logs import request_id_var
from portal.prometheus import celery_connect

# The embedded broker of `make run` (no REDIS_URL): portal+sqlite:///var/celery-broker.sqlite3.
TRANSPORT_ALIASES.setdefault("portal", "portal.broker:Transport")

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.task(name="portal.ping")
def ping() -> str:
    """A no-op used by health checks and tests to prove the broker and a worker are alive."""
    return "pong"


@app.task(name="portal.rollups_refresh")
def rollups_refresh() -> dict:
    """Refresh every registered rollup (portal/rollups.py): recent, dirty and missing periods. Idempotent."""
    from portal.rollups import refresh_all

    return refresh_all()


# Logs: a task's records carry its task id where a request's carry the request id (portal/logs.py).
@signals.task_prerun.connect
def _log_task_id(task_id: str | None = None, **_: object) -> None:
    request_id_var.set(task_id or "-")


@signals.task_postrun.connect
def _log_task_id_clear(**_: object) -> None:
    request_id_var.set("-")


# Task run times for /metrics, and prefork children marked dead when they exit (portal/prometheus.py).
celery_connect()


class _Heartbeat(bootsteps.StartStopStep):
    """Touches ``$TMPDIR/portal-worker.alive`` every ``PORTAL_HEARTBEAT_SECONDS`` from the worker's own event loop:
    the liveness probe (``entrypoint.py healthcheck worker``) sees a hung worker without asking the broker."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs) -> None:
        self.tref = None

    def start(self, worker) -> None:
        from django.conf import settings

        touch_heartbeat("worker")
        self.tref = worker.timer.call_repeatedly(float(settings.PORTAL_HEARTBEAT_SECONDS), touch_heartbeat, ("worker",))

    def stop(self, worker) -> None:
        if self.tref is not None:
            self.tref.cancel()


app.steps["worker"].add(_Heartbeat)

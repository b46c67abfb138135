"""The Celery app. Tasks live in each app's ``tasks.py`` and are discovered from INSTALLED_APPS."""

import os

from celery import Celery, signals
from kombu.transport import TRANSPORT_ALIASES

from portal.logs import request_id_var

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


# Logs: a task's records carry its task id where a request's carry the request id (portal/logs.py).
@signals.task_prerun.connect
def _log_task_id(task_id: str | None = None, **_: object) -> None:
    request_id_var.set(task_id or "-")


@signals.task_postrun.connect
def _log_task_id_clear(**_: object) -> None:
    request_id_var.set("-")

"""The Celery app. Tasks live in each app's ``tasks.py`` and are discovered from INSTALLED_APPS."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.task(name="portal.ping")
def ping() -> str:
    """A no-op used by health checks and tests to prove the broker and a worker are alive."""
    return "pong"

"""/healthz/live and /healthz/ready through HTTP, and the request id on every log record (portal/health.py, portal/logs.py)."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from portal import health
from portal.logs import JsonFormatter, RequestIdFilter


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket goes


@pytest.fixture
def production_like(settings):
    """The probes come from the kubelet: the pod's IP as the host, plain HTTP, no session."""
    settings.ALLOWED_HOSTS = ["gpu.example.org"]
    settings.SECURE_SSL_REDIRECT = True
    return settings


def test_live_answers_without_database_host_check_or_https_redirect(client, production_like):
    # No django_db mark: any database access here would raise.
    answer = client.get("/healthz/live", HTTP_HOST="10.1.2.3:8000")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}
    assert answer["X-Request-ID"]


@pytest.mark.django_db
def test_ready_is_200_when_database_broker_and_migrations_are_fine(client, production_like):
    answer = client.get("/healthz/ready", HTTP_HOST="10.1.2.3:8000")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["status"] == "ok"
    assert {k: body["checks"][k] for k in ("database", "broker", "migrations")} == {"database": "ok", "broker": "ok",
                                                                                  "migrations": "ok"}


@pytest.mark.django_db
def test_ready_is_503_naming_the_broker_when_its_port_is_closed(client, production_like):
    production_like.CELERY_BROKER_URL = f"redis://127.0.0.1:{closed_port()}/0"
    production_like.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    answer = client.get("/healthz/ready", HTTP_HOST="10.1.2.3:8000")
    assert answer.status_code == 503
    body = answer.json()
    assert body["status"] == "unavailable"
    assert body["failed"] == ["broker"]
    assert body["checks"]["database"] == "ok"
    assert "onnect" in body["checks"]["broker"]  # connection refused, said so


@pytest.mark.django_db
def test_ready_is_503_naming_unapplied_migrations(client, production_like, monkeypatch):
    # A migration this code knows but the database lacks: forget one applied row for the duration of the test.
    from django.db import connection

    monkeypatch.setattr(health, "_migrations_applied", False)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = 'workloads'")
    answer = client.get("/healthz/ready", HTTP_HOST="10.1.2.3:8000")
    assert answer.status_code == 503
    body = answer.json()
    assert body["failed"] == ["migrations"]
    assert "workloads." in body["checks"]["migrations"]


def test_probe_paths_need_no_login_and_ignore_other_methods(client, production_like):
    assert client.get("/healthz/live/", HTTP_HOST="10.1.2.3").status_code == 200
    # Only GET/HEAD are probes; anything else goes through the usual stack (the host check refuses this host).
    assert client.post("/healthz/live", HTTP_HOST="10.1.2.3").status_code == 400


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict] = []
        self.addFilter(RequestIdFilter())
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def json_lines(settings):
    settings.PORTAL_ACCESS_LOG = True
    handler = _Capture()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)


@pytest.mark.django_db
def test_request_id_is_taken_returned_and_on_every_record_of_the_request(client, json_lines):
    answer = client.get("/no-such-page/", HTTP_X_REQUEST_ID="trace-42.a_b:c")
    assert answer.status_code == 404
    assert answer["X-Request-ID"] == "trace-42.a_b:c"
    mine = [line for line in json_lines if line["request_id"] == "trace-42.a_b:c"]
    loggers = {line["logger"] for line in mine}
    assert {"portal.access", "django.request"} <= loggers  # the access line and Django's own "Not Found"
    access = next(line for line in mine if line["logger"] == "portal.access")
    assert access["status"] == 404 and access["method"] == "GET" and access["path"] == "/no-such-page/"
    assert set(access) >= {"time", "level", "message", "duration_ms"}
    # After the request, records carry no id.
    logging.getLogger("after").warning("outside")
    assert json_lines[-1]["request_id"] == "-"


@pytest.mark.django_db
def test_a_request_id_that_does_not_look_like_one_is_replaced(client, json_lines):
    answer = client.get("/healthz/live", HTTP_X_REQUEST_ID="bad id\r\nX-Injected: 1")
    made = answer["X-Request-ID"]
    assert made != "bad id" and len(made) == 32 and made.isalnum()
    other = client.get("/healthz/live")["X-Request-ID"]
    assert other != made


def test_plain_logs_stay_readable_by_default():
    from django.conf import settings

    if settings.LOG_FORMAT == "plain":
        assert settings.LOGGING["handlers"]["console"]["formatter"] == "plain"
        assert settings.LOGGING["formatters"]["plain"]["format"] == "%(message)s"

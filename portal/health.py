"""Health endpoints for probes: ``/healthz/live`` and ``/healthz/ready``.

* ``live``: 200 ``{"status": "ok"}`` while the process answers; touches no database, broker or cluster.
* ``ready``: 200 when the database answers, the broker accepts a connection and every migration this code
  knows is applied; else 503 with ``{"status": "unavailable", "failed": [...], "checks": {name: "ok" | why}}``.
  It also says when the scheduler (Celery beat, portal/beat.py) was last seen: ``"scheduler": "last seen 3 s ago"``.
  Past ``PORTAL_BEAT_STALE_SECONDS`` (or never seen) the answer stays 200 (a dead beat is no reason to take the web
  servers out of service) but carries ``"degraded": ["scheduler"]`` and the reason in ``checks["scheduler"]``: no
  periodic work runs then (status following, sweeps, reconciles). Alert on ``degraded`` (docs/operations.md).

``HealthMiddleware`` sits first in ``MIDDLEWARE`` (before the host check, the HTTPS redirect, sessions and
logins), so probes from the kubelet (which send the pod's IP as the host, over plain HTTP) get the answer
itself; nothing here reads a session, a user or a rate limit. The paths are also in ``portal/urls.py``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import JsonResponse

log = logging.getLogger(__name__)

LIVE_PATH = "/healthz/live"
READY_PATH = "/healthz/ready"
BROKER_TIMEOUT = 2.0  # seconds to connect to the broker
_migrations_applied = False  # once true it stays true for this process (its code knows no newer migration)


def _database() -> None:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _broker() -> None:
    import portal.celery  # noqa: F401  (registers the embedded broker's transport alias)
    from kombu import Connection

    options = dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {})
    options.setdefault("socket_connect_timeout", BROKER_TIMEOUT)
    options.setdefault("socket_timeout", BROKER_TIMEOUT)
    options["max_retries"] = 0
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=BROKER_TIMEOUT, transport_options=options) as conn:
        conn.connect()
        if conn.transport.driver_type == "redis":  # a connection alone may be lazy: ask the server
            conn.default_channel.client.ping()


def _migrations() -> None:
    global _migrations_applied  # noqa: PLW0603 a per-process memo: once applied, migrations stay applied
    if _migrations_applied:
        return
    from django.db.migrations.executor import MigrationExecutor

    connection = connections[DEFAULT_DB_ALIAS]
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
        raise RuntimeError(f"{len(plan)} unapplied migration(s): {names}")
    _migrations_applied = True


CHECKS = (("database", _database), ("broker", _broker), ("migrations", _migrations))


def scheduler_status(now: float | None = None) -> dict[str, Any]:
    """The scheduler as its heartbeat in the shared cache says: ``{"ok": bool, "age": seconds | None, "text": ...}``.
    Shown by ``/healthz/ready`` and the ops pages (quotas' capacity page)."""
    from portal.beat import beat_last_seen

    bound = float(settings.PORTAL_BEAT_STALE_SECONDS)
    try:
        seen = beat_last_seen()
    except Exception as exc:  # the cache is down: say so, the scheduler cannot hold its lease either
        return {"ok": False, "age": None, "text": f"unknown: the cache does not answer ({exc.__class__.__name__})"}
    if seen is None:
        return {"ok": False, "age": None, "text": "never seen: no scheduler (Celery beat) is sending the periodic tasks"}
    age = max(0.0, (now if now is not None else time.time()) - float(seen["at"]))
    if age > bound:
        return {"ok": False, "age": age, "text": f"last seen {age:.0f} s ago (more than {bound:.0f} s): the scheduler "
                                                 "(Celery beat) is down, no periodic task is sent"}
    return {"ok": True, "age": age, "text": f"last seen {age:.0f} s ago"}


def live(request: Any) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def ready(request: Any) -> JsonResponse:
    results: dict[str, str] = {}
    for name, check in CHECKS:
        if name == "migrations" and results.get("database") != "ok":
            results[name] = "not checked: the database is unavailable"
            continue
        try:
            check()
        except Exception as exc:  # any failure means not ready: say which and why
            results[name] = f"{exc.__class__.__name__}: {exc}"[:500]
        else:
            results[name] = "ok"
    failed = [name for name, result in results.items() if result != "ok"]
    scheduler = scheduler_status()
    extra: dict[str, Any] = {"scheduler": scheduler["text"]}
    if not scheduler["ok"]:
        results["scheduler"] = scheduler["text"]
        extra["degraded"] = ["scheduler"]
        log.warning("degraded: scheduler %s", scheduler["text"])
    if failed:
        log.warning("not ready: %s", "; ".join(f"{n}: {results[n]}" for n in failed))
        return JsonResponse({"status": "unavailable", "failed": failed, "checks": results, **extra}, status=503)
    return JsonResponse({"status": "ok", "checks": results, **extra})


class HealthMiddleware:
    """Answers the two probe paths before anything else runs (no host check, redirect, session or login)."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        if request.method in ("GET", "HEAD"):
            if request.path == LIVE_PATH or request.path == LIVE_PATH + "/":
                return live(request)
            if request.path == READY_PATH or request.path == READY_PATH + "/":
                return ready(request)
        return self.get_response(request)

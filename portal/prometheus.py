"""The Prometheus kit: the process-level metrics, the scrape-time collectors and ``/metrics`` (docs/insights.md,
"Prometheus").

Two kinds of metric, each counted where it adds up:

* **Events in a process** (a materialization error, a Celery task's run time, an HTTP request): counters and
  histograms of the official client, defined here. Several gunicorn workers and Celery processes each count their
  own, so with ``PROMETHEUS_MULTIPROC_DIR`` set (the image's ``web`` and ``worker`` roles and ``make run`` set it and
  empty it at start) every process writes its values to files in that folder and a scrape sums the files
  (the client's multiprocess mode; gunicorn's ``child_exit`` and Celery's ``worker_process_shutdown`` mark a
  process dead). Without it (tests, a shell) they live in the process's default registry.
* **State in the database** (pending requests, quota in use, the queue wait): read at scrape time by the
  collectors named in ``settings.PROMETHEUS_COLLECTORS`` (dotted paths: the kit never imports a higher app), one
  place, so nothing needs adding up across processes.

``/metrics`` is answered by :class:`MetricsMiddleware` before the host check and the HTTPS redirect (Prometheus
scrapes a pod's address over plain HTTP), and only with ``Authorization: Bearer <METRICS_TOKEN>``; with no token
set, only from loopback and only with ``DEBUG`` on.
"""

from __future__ import annotations

import hmac
import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"

# Seconds: from sub-second tasks and requests up to the long waits of a queue (the queue wait's own buckets are
# in insights/prometheus.py).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

MATERIALIZE_ERRORS = Counter(
    "gpuportal_materialize_errors", "Requests whose objects could not be applied to the cluster, by why "
    "(rejected: the cluster refused an object and the request failed; unavailable: the cluster did not answer, "
    "the task retries).", ["cluster", "reason"],
)
TASK_SECONDS = Histogram(
    "gpuportal_celery_task_seconds", "Run time of Celery tasks (task_prerun to task_postrun), by task and "
    "final state.", ["task", "state"], buckets=LATENCY_BUCKETS,
)
HTTP_REQUESTS = Counter("gpuportal_http_requests", "HTTP requests answered, by method and status class.",
                        ["method", "status"])
HTTP_SECONDS = Histogram("gpuportal_http_request_seconds", "Time to answer an HTTP request, by URL name.",
                         ["view"], buckets=LATENCY_BUCKETS)


# ------------------------------------------------------------------------------------------------ recording
def materialize_error(*, cluster: str, reason: str) -> None:
    """Count one request that could not be materialized (``reason``: ``rejected`` | ``unavailable``)."""
    MATERIALIZE_ERRORS.labels(cluster=cluster, reason=reason).inc()


_task_started: dict[str, float] = {}


def task_started(task_id: str | None) -> None:
    if task_id:
        _task_started[task_id] = time.perf_counter()


def task_finished(task_id: str | None, task_name: str, state: str | None) -> None:
    started = _task_started.pop(task_id or "", None)
    if started is not None:
        TASK_SECONDS.labels(task=task_name, state=state or "UNKNOWN").observe(time.perf_counter() - started)


# ------------------------------------------------------------------------------------------------ multiprocess mode
def multiprocess_dir() -> str:
    """The folder the processes write their values to ('' = single-process mode). The client reads the
    environment variable when it is imported, so this does too: a setting could not switch the mode."""
    return os.environ.get(ENV_DIR, "")


def multiprocess_reset(path: str | os.PathLike[str]) -> None:
    """Empty (or create) the folder before the first process starts: files left by an earlier run would be
    summed into this one's counters. Only the entry points call this (deploy/entrypoint.py, deploy/devstack.py)."""
    folder = Path(path)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)


def process_dead(pid: int) -> None:
    """A worker process exited (gunicorn ``child_exit``, Celery ``worker_process_shutdown``): drop its live gauges.
    Its counters and histograms stay in the folder and keep counting in the sums."""
    if multiprocess_dir():
        multiprocess.mark_process_dead(pid)


# ------------------------------------------------------------------------------------------------ exposition
def _collectors() -> list[Any]:
    from django.conf import settings
    from django.utils.module_loading import import_string

    return [import_string(path)() for path in getattr(settings, "PROMETHEUS_COLLECTORS", [])]


def process_registry(path: str | None = None) -> CollectorRegistry:
    """The process-level metrics as a scrape sees them: every process's files summed (multiprocess mode, or the
    folder ``path``), else this process's own."""
    folder = path if path is not None else multiprocess_dir()
    if not folder:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=folder)
    return registry


def exposition(collectors: Iterable[Any] | None = None, *, path: str | None = None) -> bytes:
    """The text format of a scrape: the process metrics, then the database's (``collectors``, by default those of
    ``PROMETHEUS_COLLECTORS``). A failing database collector is logged and left out; the rest still answers."""
    out = [generate_latest(process_registry(path))]
    for collector in _collectors() if collectors is None else collectors:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        try:
            out.append(generate_latest(registry))
        except Exception:  # a scrape answers what it can; the error is logged
            log.exception("metrics collector %s failed", collector.__class__.__name__)
    return b"".join(out)


def token_ok(request: Any) -> bool:
    """``Authorization: Bearer <METRICS_TOKEN>``; with no token set, loopback only and only with DEBUG on."""
    from django.conf import settings

    expected = getattr(settings, "METRICS_TOKEN", "")
    if expected:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())
    return bool(settings.DEBUG) and request.META.get("REMOTE_ADDR") in ("127.0.0.1", "::1")


def metrics(request: Any) -> Any:
    from django.http import HttpResponse

    if not token_ok(request):
        answer = HttpResponse("Metrics need Authorization: Bearer <METRICS_TOKEN>.\n", status=401,
                              content_type="text/plain; charset=utf-8")
        answer["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return answer
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    """Answers ``/metrics`` before the host check, the HTTPS redirect, sessions and logins (like the probes), and
    times every other request (``gpuportal_http_requests`` / ``gpuportal_http_request_seconds``)."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        if request.path in (METRICS_PATH, METRICS_PATH + "/") and request.method in ("GET", "HEAD"):
            return metrics(request)
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        view = (match.view_name if match else "") or "unmatched"
        HTTP_SECONDS.labels(view=view).observe(time.perf_counter() - started)
        HTTP_REQUESTS.labels(method=request.method if request.method in _METHODS else "other",
                             status=f"{response.status_code // 100}xx").inc()
        return response


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


# ------------------------------------------------------------------------------------------------ Celery
def celery_connect() -> None:
    """Time every task and mark prefork children dead when they exit (called once by portal/celery.py)."""
    from celery import signals

    def prerun(task_id: str | None = None, **_: Any) -> None:
        task_started(task_id)

    def postrun(task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any) -> None:
        task_finished(task_id, getattr(task, "name", "unknown"), state)

    def child_exit(pid: int | None = None, **_: Any) -> None:
        process_dead(pid or os.getpid())

    signals.task_prerun.connect(prerun, weak=False)
    signals.task_postrun.connect(postrun, weak=False)
    signals.worker_process_shutdown.connect(child_exit, weak=False)
    signals.worker_ready.connect(_worker_exporter, weak=False)


def _worker_exporter(**_: Any) -> None:
    """A worker in its own pod (Kubernetes) has its own folder: with ``METRICS_PORT`` set, its main process serves
    the folder's sums on that port (the web's ``/metrics`` serves the web pods' own)."""
    port = os.environ.get("METRICS_PORT", "")
    if not port or not multiprocess_dir():
        return
    from prometheus_client import start_http_server

    start_http_server(int(port), addr=os.environ.get("METRICS_ADDR", "0.0.0.0"), registry=process_registry())
    log.info("worker metrics on port %s", port)

"""gunicorn settings of the image's `web` role (deploy/entrypoint.py), read from the environment.

SIGTERM (a rollout, a scale-down) is gunicorn's graceful stop: the listener closes, workers finish the requests
they hold for up to ``graceful_timeout`` seconds, then exit. Kubernetes waits ``terminationGracePeriodSeconds``
(60 s in deploy/kubernetes) and the pod's preStop sleep lets endpoints drop it before the stop begins.
"""

import os

bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_WORKERS") or os.environ.get("WEB_CONCURRENCY") or 2)
threads = int(os.environ.get("WEB_THREADS", "4"))
worker_class = "gthread" if threads > 1 else "sync"
timeout = int(os.environ.get("WEB_TIMEOUT", "60"))  # a worker silent this long is restarted
graceful_timeout = int(os.environ.get("WEB_GRACEFUL_TIMEOUT", "30"))  # in-flight requests finish within this
keepalive = 5
max_requests = int(os.environ.get("WEB_MAX_REQUESTS", "2000"))  # recycle workers now and then
max_requests_jitter = max_requests // 10
# The root filesystem is read-only: the workers' heartbeat files go to /tmp (an emptyDir in Kubernetes).
worker_tmp_dir = os.environ.get("TMPDIR", "/tmp")
# Behind the ingress: trust its X-Forwarded-* (the Service is not reachable from outside the cluster).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "*")
# The portal writes its own access line per request with the request id (portal/logs.py): none from gunicorn.
accesslog = None
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info").lower()
if os.environ.get("LOG_FORMAT", "").lower() == "json":
    # The master's and the workers' stray writes (warnings, print()) as JSON lines too (portal/logs.py).
    from portal.logs import json_stdio

    json_stdio()
    logconfig_dict = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "portal.logs.JsonFormatter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout", "formatter": "json"}},
        "loggers": {"gunicorn.error": {"handlers": ["console"], "level": loglevel.upper(), "propagate": False}},
    }


def child_exit(server, worker) -> None:
    """A worker exited: its live gauges leave the Prometheus sums; its counters stay (portal/prometheus.py)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)

"""Logs: a request id on every record of a request, and JSON lines for production (``LOG_FORMAT=json``).

``RequestIdMiddleware`` (first in ``MIDDLEWARE``) takes the caller's ``X-Request-ID`` when it looks like one
(letters, digits, ``.``, ``_``, ``:``, ``-``; at most 128 characters), else makes one (32 hex characters),
answers it in the ``X-Request-ID`` header and keeps it in a context variable for the request. The
``RequestIdFilter`` on the console handler copies it onto every record (``record.request_id``, ``-`` outside
a request); a Celery task's records carry its task id the same way (``portal/celery.py``).

``JsonFormatter`` writes one JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
``message``, ``request_id``, ``exc_info`` when there is one, and any ``extra=`` fields. With JSON logs the
middleware also writes one access line per request (logger ``portal.access``: method, path, status,
duration in ms; probes that succeed are left out); the development server prints its own.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from django.core.signals import request_finished

REQUEST_ID_HEADER = "X-Request-ID"
_VALID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
access_log = logging.getLogger("portal.access")

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "request_id"}


def request_id_from(header: str | None) -> str:
    """The caller's id when it is a plausible one, else a new one."""
    if header and _VALID.match(header):
        return header
    return uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", request_id_var.get()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class RequestIdMiddleware:
    def __init__(self, get_response: Any) -> None:
        from django.conf import settings

        self.get_response = get_response
        self.access = getattr(settings, "PORTAL_ACCESS_LOG", False)

    def __call__(self, request: Any) -> Any:
        rid = request_id_from(request.META.get("HTTP_X_REQUEST_ID"))
        # Kept until the response is closed (request_finished, below): Django logs an error answer
        # ("django.request") after the middleware returned, and that record belongs to the request too.
        request_id_var.set(rid)
        request.request_id = rid
        started = time.monotonic()
        response = self.get_response(request)
        response[REQUEST_ID_HEADER] = rid
        if self.access and not (response.status_code == 200 and request.path.startswith("/healthz/")):
            access_log.info("%s %s %s", request.method, request.path, response.status_code,
                            extra={"method": request.method, "path": request.path, "status": response.status_code,
                                   "duration_ms": round((time.monotonic() - started) * 1000, 1)})
        return response


def _request_finished(**_: Any) -> None:
    request_id_var.set("-")


request_finished.connect(_request_finished, dispatch_uid="portal.logs.request_finished")


def logging_config(*, json_format: bool, level: str) -> dict[str, Any]:
    """The ``LOGGING`` dict: readable lines by default, JSON lines with ``json_format``; request ids either way."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": "portal.logs.RequestIdFilter"}},
        "formatters": {
            "json": {"()": "portal.logs.JsonFormatter"},
            "plain": {"format": "%(message)s"},  # as before: the development stack's lines are unchanged
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout" if json_format else "ext://sys.stderr",
                                 "filters": ["request_id"], "formatter": "json" if json_format else "plain"}},
        "root": {"handlers": ["console"], "level": level},
        # JSON: Django's own console handler (DEBUG only) would add plain lines; its records go to the root's.
        "loggers": {"django.db.backends": {"level": "INFO"},
                    **({"django": {"handlers": [], "level": "INFO"}} if json_format else {})},
    }

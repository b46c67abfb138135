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

``json_stdio()`` (JSON logs only; settings and deploy/gunicorn.conf.py call it) makes what bypasses logging
JSON too: ``sys.stdout`` and ``sys.stderr`` (and ``sys.__stdout__``/``sys.__stderr__``, which Celery's banner
and Python's last-chance warnings use) become ``JsonLines`` streams, which pass a JSON line through and wrap
any other line (a ``print()``, a warning printed at exit, a thread's traceback) as a record of the logger
``stdout`` / ``stderr``. Writes to the file descriptors themselves (Celery's shutdown messages, C libraries)
bypass it; the image's entry point catches those by making descriptors 1 and 2 pipes to a forwarding process that
wraps them the same way (deploy/entrypoint.py, ``json_fds``).
"""

from __future__ import annotations

import contextvars
import io
import json
import logging
import re
import sys
import threading
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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonLines(io.TextIOBase):
    """A text stream that writes only JSON lines: JSON objects pass, anything else is wrapped as a record."""

    def __init__(self, raw: Any, name: str, level: str) -> None:
        self.raw, self.name, self.level = raw, name, level
        self._pending = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def _line(self, line: str) -> str:
        text = line.rstrip("\r")
        if text.startswith("{") and text.endswith("}"):
            try:
                if isinstance(json.loads(text), dict):
                    return text
            except ValueError:
                pass
        return json.dumps({"time": _now(), "level": self.level, "logger": self.name, "message": text,
                           "request_id": request_id_var.get()}, ensure_ascii=False)

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._pending = (self._pending + text).split("\n")
            if lines:
                self.raw.write("".join(self._line(line) + "\n" for line in lines if line.strip()))
                self.raw.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending.strip():
                self.raw.write(self._line(self._pending) + "\n")
            self._pending = ""
            self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", "utf-8")


def json_stdio() -> None:
    """Wrap this process's stdout and stderr in ``JsonLines`` (once; forked children inherit it)."""
    if isinstance(sys.stdout, JsonLines) or sys.__stdout__ is None or sys.__stderr__ is None:
        return
    out = JsonLines(sys.__stdout__, "stdout", "INFO")
    err = JsonLines(sys.__stderr__, "stderr", "WARNING")
    sys.stdout, sys.stderr = out, err
    sys.__stdout__, sys.__stderr__ = out, err  # Python restores these at exit, and Celery prints to them
    logging.captureWarnings(True)


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

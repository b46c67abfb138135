"""Fault injection for the sandbox cluster's HTTP front end.

The settings are read and replaced through ``GET/PUT /sandbox/faults`` (see CONTRACT.md)::

    {"error_rate": 0.0, "error_codes": [500, 503, 429], "retry_after": 1,
     "latency_ms": 0, "drop_watches_after_s": null, "drop_watches_mode": "clean"}

* ``error_rate``: probability (0..1) that an ordinary API request is answered with one of
  ``error_codes`` (a Kubernetes Status; 429 and 503 carry ``Retry-After: retry_after``).
* ``latency_ms``: delay added before every API answer.
* ``drop_watches_after_s``: watch streams end after this many seconds. With ``drop_watches_mode`` "clean"
  (default) the stream ends properly, as when an apiserver closes a watch early (``watch.Watch().stream`` then
  reconnects from the last resourceVersion); with "reset" the connection is cut without the final chunk
  (the client sees a protocol error).

Control endpoints (``/sandbox/...``), discovery and OpenAPI are never failed on purpose.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

MESSAGES = {
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected fault",
    503: "The server is currently unable to handle the request (injected fault)",
}

DEFAULTS = {
    "error_rate": 0.0,
    "error_codes": [500, 503, 429],
    "retry_after": 1,
    "latency_ms": 0,
    "drop_watches_after_s": None,
    "drop_watches_mode": "clean",
}


@dataclass(frozen=True)
class InjectedError:
    code: int
    reason: str
    message: str
    retry_after: int | None


class Faults:
    """Thread-safe fault settings, shared by every request handler."""

    def __init__(self, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._cfg: dict = dict(DEFAULTS)
        self._rng = random.Random(seed)

    # -- settings -------------------------------------------------------------------------
    def get(self) -> dict:
        with self._lock:
            cfg = dict(self._cfg)
            cfg["error_codes"] = list(cfg["error_codes"])
            return cfg

    def update(self, values: dict) -> dict:
        """Validate and merge ``values`` into the settings; raise ValueError on bad input."""
        if not isinstance(values, dict):
            raise ValueError("fault settings must be a JSON object")
        unknown = set(values) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"unknown fault setting(s): {', '.join(sorted(unknown))}")
        new = self.get()
        for key, given in values.items():
            val = given  # checked and converted below
            if key == "error_rate":
                val = float(val)
                if not 0.0 <= val <= 1.0:
                    raise ValueError("error_rate must be between 0 and 1")
            elif key == "error_codes":
                if not isinstance(val, list) or not val:
                    raise ValueError("error_codes must be a non-empty list")
                val = [int(c) for c in val]
                if any(c < 400 or c > 599 for c in val):
                    raise ValueError("error_codes must be HTTP error codes (4xx/5xx)")
            elif key == "retry_after":
                val = int(val)
                if val < 0:
                    raise ValueError("retry_after must be >= 0")
            elif key == "latency_ms":
                val = float(val)
                if val < 0:
                    raise ValueError("latency_ms must be >= 0")
            elif key == "drop_watches_mode":
                if val not in ("clean", "reset"):
                    raise ValueError('drop_watches_mode must be "clean" or "reset"')
            elif key == "drop_watches_after_s" and val is not None:
                val = float(val)
                if val < 0:
                    raise ValueError("drop_watches_after_s must be >= 0 or null")
            new[key] = val
        with self._lock:
            self._cfg = new
        return self.get()

    def replace(self, values: dict) -> dict:
        """PUT semantics: unspecified settings go back to their defaults."""
        merged = dict(DEFAULTS)
        merged.update(values if isinstance(values, dict) else {})
        with self._lock:
            saved, self._cfg = self._cfg, dict(DEFAULTS)
        try:
            return self.update(merged)
        except ValueError:
            with self._lock:
                self._cfg = saved
            raise

    def reset(self) -> None:
        with self._lock:
            self._cfg = dict(DEFAULTS)

    # -- decisions ------------------------------------------------------------------------
    @property
    def latency_s(self) -> float:
        return float(self._cfg["latency_ms"]) / 1000.0

    @property
    def drop_watches_after_s(self) -> float | None:
        return self._cfg["drop_watches_after_s"]

    @property
    def drop_watches_reset(self) -> bool:
        return self._cfg["drop_watches_mode"] == "reset"

    def roll(self) -> InjectedError | None:
        """Decide whether this request fails; returns the error to send or None."""
        cfg = self._cfg
        rate = cfg["error_rate"]
        if rate <= 0:
            return None
        with self._lock:
            if self._rng.random() >= rate:
                return None
            code = self._rng.choice(cfg["error_codes"])
        retry = cfg["retry_after"] if code in (429, 503) else None
        return InjectedError(
            code=code,
            reason=REASONS.get(code, "InternalError" if code >= 500 else "BadRequest"),
            message=MESSAGES.get(code, f"injected fault (HTTP {code})"),
            retry_after=retry,
        )

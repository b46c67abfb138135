"""Simulated time for the sandbox cluster.

``simulated now = start + (real seconds elapsed since the clock was created) * speed + manual advances``

* ``speed`` > 1 makes the cluster run faster than real time (``Clock(speed=60)``: an eight-hour job ends in
  eight minutes); ``speed=0`` freezes time so that only :meth:`Clock.advance` moves it (deterministic tests).
* Every controller reads time through :meth:`Clock.now`; nothing in the simulation calls ``datetime.now``.
* ``speed`` may be changed at run time; the simulated time already elapsed is kept.
* :meth:`Clock.resume` moves the clock forward to a saved instant (the state file keeps the clock, see
  ``Sandbox.start``), so that a restarted cluster never shows timestamps from its own future.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta


def format_time(dt: datetime) -> str:
    """RFC 3339 with second precision, as Kubernetes writes metav1.Time (``2026-01-02T03:04:05Z``)."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> datetime | None:
    """Parse a metav1.Time / MicroTime string; ``None`` for empty or malformed input."""
    if not s:
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(UTC)
    except (TypeError, ValueError):
        return None


def format_precise(dt: datetime) -> str:
    """RFC 3339 with microseconds (the state file's clock; ``parse_time`` reads it back)."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def latest_timestamp(value, _depth: int = 0) -> datetime | None:
    """The latest metav1.Time found under a key ending in ``Time``/``Timestamp`` (or ``time``) in ``value``."""
    best: datetime | None = None
    if _depth > 40:
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str):
                if k.endswith(("Time", "Timestamp")) or k == "time":
                    t = parse_time(v) if len(v) >= 20 and v[4:5] == "-" else None
                    if t is not None and (best is None or t > best):
                        best = t
            elif isinstance(v, (dict, list)):
                t = latest_timestamp(v, _depth + 1)
                if t is not None and (best is None or t > best):
                    best = t
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, (dict, list)):
                t = latest_timestamp(v, _depth + 1)
                if t is not None and (best is None or t > best):
                    best = t
    return best


class Clock:
    def __init__(self, speed: float = 1.0, *, start: datetime | None = None):
        if speed < 0:
            raise ValueError("speed must be >= 0")
        self._lock = threading.Lock()
        self._base = (start or datetime.now(UTC)).astimezone(UTC)  # simulated time at the last re-anchor
        self._real = time.monotonic()  # real time of the last re-anchor
        self._speed = float(speed)

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        if value < 0:
            raise ValueError("speed must be >= 0")
        with self._lock:
            self._reanchor()
            self._speed = float(value)

    def _reanchor(self) -> None:
        real = time.monotonic()
        self._base = self._base + timedelta(seconds=(real - self._real) * self._speed)
        self._real = real

    def now(self) -> datetime:
        """Simulated time, timezone-aware UTC."""
        with self._lock:
            return self._base + timedelta(seconds=(time.monotonic() - self._real) * self._speed)

    def advance(self, seconds: float) -> None:
        """Jump simulated time forward (negative values are refused: time never goes back)."""
        if seconds < 0:
            raise ValueError("cannot move the clock backwards")
        with self._lock:
            self._base = self._base + timedelta(seconds=seconds)

    def resume(self, at: datetime) -> None:
        """Continue from ``at`` if it is later than now (a restart from a state file); never moves time back."""
        with self._lock:
            self._reanchor()
            at = at.astimezone(UTC)
            self._base = max(self._base, at)

    def timestamp(self) -> str:
        """``now()`` as a Kubernetes timestamp string."""
        return format_time(self.now())

    def __repr__(self) -> str:
        return f"Clock(speed={self._speed}, now={self.timestamp()})"

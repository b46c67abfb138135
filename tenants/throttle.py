"""Login throttling: too many failed sign-ins for one username or from one address block both for a while.

Failures are kept in Django's cache (Redis in production, so every web process sees the same
counts). A failure list per key holds the timestamps of recent failures; when it reaches
``settings.LOGIN_THROTTLE_ATTEMPTS`` within ``settings.LOGIN_THROTTLE_WINDOW`` seconds, a block
key is set for one window. Attempts made while blocked are refused before the password is
checked and are not counted, so a blocked user is free again when the window ends.

Read-modify-write on the cache is not atomic: two parallel failures may count as one. That is
fine for slowing down guessing, which is all this is for.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache


@dataclass(frozen=True)
class Blocked:
    """A refusal: how many seconds are left before the next attempt is allowed."""

    retry_after: int

    @property
    def message(self) -> str:
        minutes = max(1, math.ceil(self.retry_after / 60))
        unit = "minute" if minutes == 1 else "minutes"
        return f"Too many failed sign-in attempts. Sign-in is paused for {minutes} {unit}; please try again later."


def _keys(*, username: str, ip: str | None) -> list[str]:
    # Hash the username: cache keys must be short and safe whatever people type.
    name = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
    keys = [f"login-throttle:user:{name}"]
    if ip:
        keys.append(f"login-throttle:ip:{ip}")
    return keys


def login_blocked(*, username: str, ip: str | None) -> Blocked | None:
    """A ``Blocked`` when the username or the address is blocked now, else None."""
    now = time.time()
    until = max((cache.get(f"{key}:blocked", 0) for key in _keys(username=username, ip=ip)), default=0)
    if until > now:
        return Blocked(retry_after=math.ceil(until - now))
    return None


def login_failed(*, username: str, ip: str | None) -> Blocked | None:
    """Count one failure; returns a ``Blocked`` when this failure used up the last attempt."""
    window = settings.LOGIN_THROTTLE_WINDOW
    attempts = settings.LOGIN_THROTTLE_ATTEMPTS
    now = time.time()
    blocked = None
    for key in _keys(username=username, ip=ip):
        recent = [t for t in cache.get(key, []) if t > now - window]
        recent.append(now)
        if len(recent) >= attempts:
            cache.set(f"{key}:blocked", now + window, timeout=window)
            cache.delete(key)
            blocked = Blocked(retry_after=window)
        else:
            cache.set(key, recent, timeout=window)
    return blocked


def login_succeeded(*, username: str) -> None:
    """Forget the username's failures. The address keeps its count: one good password elsewhere
    must not reset a guesser working through many usernames from the same address."""
    key = _keys(username=username, ip=None)[0]
    cache.delete(key)

"""API rate limits: DRF throttles that read their rates from settings at each request.

Kept apart from portal/api.py on purpose: DRF imports ``DEFAULT_THROTTLE_CLASSES`` while it builds
``APIView``, so this module must not import ``rest_framework.views`` (or anything that does), or the
first import of the API plumbing becomes circular.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from rest_framework import throttling

# Counted in the cache per API token when a token authenticates, else per user. The rates are read
# from settings at each request (API_RATE_USER, API_RATE_SUBMIT), so a test or an operator's override
# applies at once; an empty rate means no limit. A throttled request answers 429 with Retry-After.


# DRF's sliding window (the times of the calls within the last ``duration`` seconds, newest first) costs two cache
# round trips per call: read the list, write it back. With Redis as the cache the same window is a sorted set of
# the calls' times, checked and appended by this script in one round trip, atomically (two concurrent calls can no
# longer both read the same list and both pass). Same decisions and the same Retry-After as DRF's
# (``tests/test_throttle_api.py`` compares them call by call).
_WINDOW_SCRIPT = """
local key, limit = KEYS[1], tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[2])
local count = redis.call('ZCARD', key)
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] or ''
if count >= limit then
  return {0, count, oldest}
end
redis.call('ZADD', key, ARGV[1], ARGV[4])
redis.call('EXPIRE', key, ARGV[5])
return {1, count, oldest}
"""


_script: Any = None


def _redis_backend(cache: Any) -> Any:
    """Django's ``RedisCache`` behind ``cache``, else None (another cache: DRF's own way)."""
    from django.core.cache import cache as default_cache, caches
    from django.core.cache.backends.redis import RedisCache

    backend = caches["default"] if cache is default_cache else cache
    return backend if isinstance(backend, RedisCache) else None


def _window(backend: Any, key: str, args: list[Any]) -> list[Any]:
    """Run the script (by its sha, sent again only when the server lost it) on ``backend``'s Redis."""
    global _script
    client = backend._cache.get_client(key, write=True)
    if _script is None:
        _script = client.register_script(_WINDOW_SCRIPT)
    return _script(keys=[key], args=args, client=client)


class _SettingsRateThrottle(throttling.SimpleRateThrottle):
    setting = ""

    def __init__(self) -> None:  # the rate is read per request, not when the class is made
        self._window: tuple[int, float | None] | None = None

    def get_rate(self) -> str | None:
        return getattr(settings, self.setting, None) or None

    def allow_request(self, request: Any, view: Any) -> bool:
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self._window = None
        backend = _redis_backend(self.cache) if self.rate is not None else None
        if backend is None:
            return super().allow_request(request, view)
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.now = self.timer()
        allowed, count, oldest = _window(backend, backend.make_and_validate_key(self.key) + ":window", [
            # Times as Python writes them (Lua would round its numbers to 14 digits).
            repr(self.now), repr(self.now - self.duration), self.num_requests, f"{self.now!r}:{secrets.token_hex(4)}",
            int(self.duration),
        ])
        # What DRF's list holds at this point: ``count`` calls, the oldest at ``oldest`` (or this one's).
        self._window = (int(count), float(oldest) if oldest else None)
        return bool(allowed)

    def wait(self) -> float | None:
        if self._window is None:
            return super().wait()
        count, oldest = self._window
        remaining = self.duration - (self.now - oldest) if oldest is not None else self.duration
        available = self.num_requests - count + 1
        return None if available <= 0 else remaining / float(available)

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None  # refused with 401/403 before anything else
        token = request.auth if getattr(request.auth, "pk", None) is not None else None
        ident = f"token-{token.pk}" if token is not None else f"user-{user.pk}"
        return f"throttle_{self.scope}_{ident}"


class UserRateThrottle(_SettingsRateThrottle):
    """Every API call: API_RATE_USER per token or user."""

    scope = "user"
    setting = "API_RATE_USER"


class SubmitRateThrottle(_SettingsRateThrottle):
    """Submissions (POST /api/v1/requests/), on top of the user's rate: API_RATE_SUBMIT per token or user."""

    scope = "submit"
    setting = "API_RATE_SUBMIT"

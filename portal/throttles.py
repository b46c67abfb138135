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


# The same, reading the request's cache versions (``portal.cache.versions_to_read``, KEYS[2..]) in the same round trip:
# a token's API call, whose first cache read is its rate limit, then needs no other round trip for its versions.
_WINDOW_READ_SCRIPT = """
local key, limit = KEYS[1], tonumber(ARGV[3])
local read = redis.call('MGET', unpack(KEYS, 2))
redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[2])
local count = redis.call('ZCARD', key)
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] or ''
if count >= limit then
  return {0, count, oldest, read}
end
redis.call('ZADD', key, ARGV[1], ARGV[4])
redis.call('EXPIRE', key, ARGV[5])
return {1, count, oldest, read}
"""


# Several windows (a submission's user rate and submit rate) in one round trip: the same steps for each key.
_WINDOWS_SCRIPT = """
local out = {}
for i, key in ipairs(KEYS) do
  local a = (i - 1) * 5
  local limit = tonumber(ARGV[a + 3])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[a + 2])
  local count = redis.call('ZCARD', key)
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] or ''
  if count >= limit then
    table.insert(out, {0, count, oldest})
  else
    redis.call('ZADD', key, ARGV[a + 1], ARGV[a + 4])
    redis.call('EXPIRE', key, ARGV[a + 5])
    table.insert(out, {1, count, oldest})
  end
end
return out
"""


# The same, reading the request's cache versions in the same round trip: KEYS are the windows' keys (ARGV[1] of them),
# then the versions' (``portal.cache.versions_to_read``); the versions' values come last in the answer.
_WINDOWS_READ_SCRIPT = """
local windows = tonumber(ARGV[1])
local out = {}
for i = 1, windows do
  local key, a = KEYS[i], (i - 1) * 5 + 1
  local limit = tonumber(ARGV[a + 3])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[a + 2])
  local count = redis.call('ZCARD', key)
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] or ''
  if count >= limit then
    table.insert(out, {0, count, oldest})
  else
    redis.call('ZADD', key, ARGV[a + 1], ARGV[a + 4])
    redis.call('EXPIRE', key, ARGV[a + 5])
    table.insert(out, {1, count, oldest})
  end
end
table.insert(out, redis.call('MGET', unpack(KEYS, windows + 1)))
return out
"""


_script: Any = None
_scripts: dict[str, Any] = {}


def _redis_backend(cache: Any) -> Any:
    """Django's ``RedisCache`` behind ``cache``, else None (another cache: DRF's own way)."""
    from django.core.cache import cache as default_cache, caches
    from django.core.cache.backends.redis import RedisCache

    backend = caches["default"] if cache is default_cache else cache
    return backend if isinstance(backend, RedisCache) else None


def _window(backend: Any, key: str, args: list[Any]) -> list[Any]:
    """Run the script (by its sha, sent again only when the server lost it) on ``backend``'s Redis."""
    global _script  # noqa: PLW0603 the Lua script object, registered once per process
    client = backend._cache.get_client(key, write=True)
    if _script is None:
        _script = client.register_script(_WINDOW_SCRIPT)
    return _script(keys=[key], args=args, client=client)


def _window_and_versions(backend: Any, key: str, args: list[Any]) -> list[Any]:
    """``_window``, and the request's cache versions read in the same script call when none is read yet (the
    default cache only): handed to ``portal.cache.versions_read``."""
    from django.core.cache import caches

    from .cache import versions_read, versions_to_read

    names = versions_to_read() if backend is caches["default"] else []
    if not names:
        return _window(backend, key, args)
    client = backend._cache.get_client(key, write=True)
    if "read" not in _scripts:
        _scripts["read"] = client.register_script(_WINDOW_READ_SCRIPT)
    keys = [backend.make_and_validate_key(name) for name in names]
    allowed, count, oldest, values = _scripts["read"](keys=[key, *keys], args=args, client=client)
    loads = backend._cache._serializer.loads
    versions_read({name: loads(value) for name, value in zip(names, values, strict=True) if value is not None})
    return [allowed, count, oldest]


def _windows(backend: Any, keys: list[str], args: list[Any]) -> list[list[Any]]:
    """Each window's verdict, and the request's cache versions read in the same script call when none is read yet
    (the default cache only; as ``_window_and_versions``)."""
    from django.core.cache import caches

    from .cache import versions_read, versions_to_read

    client = backend._cache.get_client(keys[0], write=True)
    names = versions_to_read() if backend is caches["default"] else []
    if not names:
        if "many" not in _scripts:
            _scripts["many"] = client.register_script(_WINDOWS_SCRIPT)
        return _scripts["many"](keys=keys, args=args, client=client)
    if "many-read" not in _scripts:
        _scripts["many-read"] = client.register_script(_WINDOWS_READ_SCRIPT)
    extra = [backend.make_and_validate_key(name) for name in names]
    *verdicts, values = _scripts["many-read"](keys=[*keys, *extra], args=[len(keys), *args], client=client)
    loads = backend._cache._serializer.loads
    versions_read({name: loads(value) for name, value in zip(names, values, strict=True) if value is not None})
    return verdicts


def allow_each(throttles: list[Any], request: Any, view: Any) -> list[bool] | None:
    """Each throttle's ``allow_request``, all windows checked and appended in one round trip to Redis (each throttle's
    ``wait()`` then answers as after its own call); None when that cannot be done (not all are these throttles,
    another cache, a rate turned off): the caller asks them one by one."""
    if len(throttles) < 2 or not all(isinstance(t, _SettingsRateThrottle) for t in throttles):
        return None
    backends = []
    for throttle in throttles:
        throttle.rate = throttle.get_rate()
        backend = _redis_backend(throttle.cache) if throttle.rate is not None else None
        if backend is None or (backends and backend is not backends[0]):
            return None
        backends.append(backend)
    keys, args, asked = [], [], []
    for throttle in throttles:
        throttle.num_requests, throttle.duration = throttle.parse_rate(throttle.rate)
        throttle._window = None
        throttle.key = throttle.get_cache_key(request, view)
        if throttle.key is None:
            continue
        throttle.now = throttle.timer()
        keys.append(backends[0].make_and_validate_key(throttle.key) + ":window")
        args.extend(throttle._window_args())
        asked.append(throttle)
    verdicts = dict.fromkeys(map(id, throttles), True)
    if keys:
        for throttle, (allowed, count, oldest) in zip(asked, _windows(backends[0], keys, args), strict=True):
            throttle._window = (int(count), float(oldest) if oldest else None)
            verdicts[id(throttle)] = bool(allowed)
    return [verdicts[id(t)] for t in throttles]


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
        allowed, count, oldest = _window_and_versions(backend, backend.make_and_validate_key(self.key) + ":window",
                                                      self._window_args())
        # What DRF's list holds at this point: ``count`` calls, the oldest at ``oldest`` (or this one's).
        self._window = (int(count), float(oldest) if oldest else None)
        return bool(allowed)

    def _window_args(self) -> list[Any]:
        # Times as Python writes them (Lua would round its numbers to 14 digits).
        return [repr(self.now), repr(self.now - self.duration), self.num_requests,
                f"{self.now!r}:{secrets.token_hex(4)}", int(self.duration)]

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

"""Rarely written tables read once per process and version, not once per request.

A ``Versioned`` keeps values computed from some tables in process memory under a version string that lives in the
shared cache. Every write to those tables calls ``changed()``: this process forgets its copy at once, and a new
version is set once the write commits, so every process loads again. The versions are looked up once per HTTP
request, all of them in one round trip (``version_key``: reset on ``request_started``), and on every call outside
one (tasks, the shell).

Inside a transaction nothing is remembered or served from memory: the caller reads the tables (it may be looking at
its own uncommitted write, which must never outlive a rollback in the memo).
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.cache import cache
from django.core.signals import request_started
from django.db import connection

from .events import after_commit

T = TypeVar("T")
_all: weakref.WeakSet[Versioned] = weakref.WeakSet()

# Every version key a request may look up (``Versioned``'s, ``shared``'s, other apps' through ``version_key``). The
# first lookup in an HTTP request reads them all in one ``get_many``; the others of that request are then free.
_keys: set[str] = set()
_request = threading.local()  # .versions: the request's versions (None outside a request: always read)


def _request_versions() -> dict[str, str] | None:
    return getattr(_request, "versions", None)


def version_key(key: str) -> str:
    """The version under ``key`` (made if missing), read once per HTTP request together with every other known
    version key (one round trip for all of them); outside a request (tasks, the shell) read on every call."""
    _keys.add(key)
    versions = _request_versions()
    if versions is not None and key in versions:
        return versions[key]
    got = cache.get_many(_request_keys() if versions is not None else [key])
    return _remember(key, got)


def _request_keys() -> list[str]:
    """What the request's first read fetches: every version key and every ``read_with_versions`` key."""
    return [*sorted(_keys), *sorted(_values)]


def _remember(key: str, got: dict[str, Any]) -> str:
    """``key``'s version from ``got`` (a ``get_many`` of version keys, made if missing), and the request's others."""
    version = got.get(key)
    if version is None:
        cache.add(key, uuid.uuid4().hex, None)
        version = cache.get(key) or "unversioned"
    versions = _request_versions()
    if versions is not None:
        versions.update({k: v for k, v in got.items() if k in _keys})
        versions[key] = version
        _request.values = {k: got.get(k) for k in _values}
    return version


def versions_to_read() -> list[str]:
    """The version keys for a caller that makes the request's first cache read (the session's load, the rate limit)
    to fetch in its own round trip and hand to ``versions_read``; [] outside an HTTP request or once they are read."""
    versions = _request_versions()
    return _request_keys() if versions is not None and not versions else []


def versions_read(got: dict[str, Any]) -> None:
    """The version keys another caller fetched (``versions_to_read``) become the request's: later lookups are free.
    A key that was missing is looked up (and made) by its first ``version_key`` as before."""
    versions = _request_versions()
    if versions is not None:
        versions.update({k: v for k, v in got.items() if k in _keys})
        _request.values = {k: got.get(k) for k in _values}


# Plain cache values (not versions) that many requests read: fetched with the request's versions, in the same round
# trip (``read_with_versions``), as they were at that moment.
_values: set[str] = set()


def read_with_versions(key: str) -> Any:
    """``cache.get(key)``, fetched with the request's versions once the process has asked for ``key`` (one round trip
    for all); outside a request, or not fetched with them, read now. A caller that writes ``key`` calls
    ``read_forget(key)`` so that the rest of its request reads it again."""
    _values.add(key)
    values = getattr(_request, "values", None)
    if _request_versions() is None or values is None or key not in values:
        return cache.get(key)
    return values[key]


def read_forget(key: str) -> None:
    values = getattr(_request, "values", None)
    if values is not None:
        values.pop(key, None)


def version_forget(key: str) -> None:
    """(A write to what ``key`` versions) read ``key`` again at its next lookup, in this request too."""
    versions = _request_versions()
    if versions is not None:
        versions.pop(key, None)


class Versioned:
    """``also``: other names (``changed(name)``) whose writes this memo depends on too: it is loaded again when its own
    version or one of theirs changes."""

    def __init__(self, name: str, *, also: tuple[str, ...] = ()) -> None:
        self.key = f"versioned:{name}"
        self.also = tuple(f"versioned:{other}" for other in also)
        self._memo: dict[str, Any] = {}
        self._memo_version: str | None = None
        _keys.update((self.key, *self.also))
        _all.add(self)

    def usable(self) -> bool:
        """Whether the memo may be used here (not inside a transaction)."""
        return not connection.in_atomic_block

    def version(self) -> str:
        if not self.also:
            return version_key(self.key)
        return "/".join(version_key(key) for key in (self.key, *self.also))

    def get(self, part: str, load: Callable[[], T]) -> T:
        """``part`` as ``load()`` gives it, remembered for this version; inside a transaction always ``load()``."""
        if not self.usable():
            return load()
        version = self.version()
        if self._memo_version != version:
            self._memo, self._memo_version = {}, version
        if part not in self._memo:
            self._memo[part] = load()
        return self._memo[part]

    def forget(self) -> None:
        self._memo, self._memo_version = {}, None
        version_forget(self.key)

    def changed(self) -> None:
        """(A write to the tables) forget this process's copy now, and every process's once the write commits."""
        self.forget()
        after_commit(self._bump, once=True)

    def _bump(self) -> None:
        cache.set(self.key, uuid.uuid4().hex, None)
        self.forget()


def _request_started(**kwargs: Any) -> None:
    _request.versions = {}
    _request.values = None


request_started.connect(_request_started, dispatch_uid="portal-cache-versioned")


def changed(name: str) -> None:
    """``Versioned(name).changed()`` for a writer that does not hold the instance (a lower app's write to a table
    a higher app's memo reads, or a queryset ``update()`` that sends no signal)."""
    key = f"versioned:{name}"
    version_forget(key)
    held = [v for v in list(_all) if v.key == key]
    for versioned in held:
        versioned.changed()
    if not held:
        after_commit(_new_version, key, once=True)


def _new_version(key: str) -> None:
    cache.set(key, uuid.uuid4().hex, None)
    version_forget(key)


def shared[V](name: str, key: str, load: Callable[[], V], timeout: int = 120) -> V:
    """``load()``, kept in the shared cache under ``key`` for the current version of ``name`` (``changed(name)``
    sets a new one after every write that can change it): one round trip (``get_many`` of the version and the
    value) when it is there, so a value per user costs one cache read instead of a query; none when this process
    read or wrote it at the request's version (``_held``; the version comes with the request's one read of every
    version). ``timeout`` bounds how long a value outlives a write that forgot to call ``changed`` (the shared copy
    carries its expiry time, and the process's copy keeps it).

    Inside a transaction the value is loaded and not kept (it may include the caller's uncommitted writes). The
    version is read before ``load()`` runs, so a value computed while a write commits is kept under the older
    version and loaded again by the next caller.
    """
    if connection.in_atomic_block:
        return load()
    vkey = f"versioned:{name}"
    _keys.add(vkey)
    versions = _request_versions()
    if versions is not None and vkey in versions:
        version = versions[vkey]
        mine = _held.get(key)
        if mine is not None and mine[0] == version and mine[2] > time.time():
            return _copy(mine[1])  # this process read it at this version: no round trip
        held = cache.get(key)
    else:  # the value with the version(s): still one round trip
        got = cache.get_many([key, *(_request_keys() if versions is not None else [vkey])])
        version, held = _remember(vkey, got), got.get(key)
    if isinstance(held, tuple) and len(held) == 3 and held[0] == version and held[2] > time.time():
        _hold(key, held)
        return held[1]
    value = load()
    kept = (version, value, time.time() + timeout)
    cache.set(key, kept, timeout)
    _hold(key, kept)
    return value


# ``shared``'s values as this process last read or wrote them: key -> (version, value, the time the shared copy
# expires). Used while the request's version is still that one and until that time, so the value itself costs no
# round trip: only the version, which comes with the request's one read of every version. At most _HELD_MAX keys.
_held: dict[str, tuple[str, Any, float]] = {}
_HELD_MAX = 10_000


def _copy(value: Any) -> Any:
    """A list, dict or set handed out from ``_held`` is a copy (a caller may change it, as it could change the one it
    unpickled); what it holds is shared: ``shared``'s values are plain data (numbers, strings, tuples)."""
    return value.copy() if isinstance(value, list | dict | set) else value


def _hold(key: str, kept: tuple[str, Any, float]) -> None:
    if len(_held) >= _HELD_MAX and key not in _held:
        _held.clear()
    _held[key] = kept

"""Rarely written tables read once per process and version, not once per request.

A ``Versioned`` keeps values computed from some tables in process memory under a version string that lives in the
shared cache. Every write to those tables calls ``changed()``: this process forgets its copy at once, and a new
version is set once the write commits, so every process loads again. The version is looked up once per HTTP
request (reset on ``request_started``) and on every call outside one (tasks, the shell).

Inside a transaction nothing is remembered or served from memory: the caller reads the tables (it may be looking at
its own uncommitted write, which must never outlive a rollback in the memo).
"""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import Any, Callable, TypeVar

from django.core.cache import cache
from django.core.signals import request_started
from django.db import connection

from .events import after_commit

T = TypeVar("T")
_all: weakref.WeakSet[Versioned] = weakref.WeakSet()


class Versioned:
    def __init__(self, name: str) -> None:
        self.key = f"versioned:{name}"
        self._memo: dict[str, Any] = {}
        self._memo_version: str | None = None
        self._local = threading.local()
        _all.add(self)

    def usable(self) -> bool:
        """Whether the memo may be used here (not inside a transaction)."""
        return not connection.in_atomic_block

    def version(self) -> str:
        known = getattr(self._local, "version", None)
        if known is not None:
            return known
        version = cache.get(self.key)
        if version is None:
            cache.add(self.key, uuid.uuid4().hex, None)
            version = cache.get(self.key) or "unversioned"
        if getattr(self._local, "active", False):
            self._local.version = version
        return version

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
        self._local.version = None

    def changed(self) -> None:
        """(A write to the tables) forget this process's copy now, and every process's once the write commits."""
        self.forget()
        after_commit(self._bump, once=True)

    def _bump(self) -> None:
        cache.set(self.key, uuid.uuid4().hex, None)
        self.forget()

    def _request_started(self) -> None:
        self._local.active = True
        self._local.version = None


def _request_started(**kwargs: Any) -> None:
    for versioned in list(_all):
        versioned._request_started()


request_started.connect(_request_started, dispatch_uid="portal-cache-versioned")


def changed(name: str) -> None:
    """``Versioned(name).changed()`` for a writer that does not hold the instance (a lower app's write to a table
    a higher app's memo reads, or a queryset ``update()`` that sends no signal)."""
    key = f"versioned:{name}"
    held = [v for v in list(_all) if v.key == key]
    for versioned in held:
        versioned.changed()
    if not held:
        after_commit(_new_version, key, once=True)


def _new_version(key: str) -> None:
    cache.set(key, uuid.uuid4().hex, None)


def shared(name: str, key: str, load: Callable[[], T], timeout: int = 120) -> T:
    """``load()``, kept in the shared cache under ``key`` for the current version of ``name`` (``changed(name)``
    sets a new one after every write that can change it): one round trip (``get_many`` of the version and the
    value) when it is there, so a value per user costs one cache read instead of a query. ``timeout`` bounds how
    long a value outlives a write that forgot to call ``changed``.

    Inside a transaction the value is loaded and not kept (it may include the caller's uncommitted writes). The
    version is read before ``load()`` runs, so a value computed while a write commits is kept under the older
    version and loaded again by the next caller.
    """
    if connection.in_atomic_block:
        return load()
    version_key = f"versioned:{name}"
    got = cache.get_many([version_key, key])
    version = got.get(version_key)
    if version is None:
        cache.add(version_key, uuid.uuid4().hex, None)
        version = cache.get(version_key)
    held = got.get(key)
    if version is not None and isinstance(held, tuple) and len(held) == 2 and held[0] == version:
        return held[1]
    value = load()
    if version is not None:
        cache.set(key, (version, value), timeout)
    return value

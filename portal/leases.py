"""Leases: at most one holder of a named job across every process of an installation (docs/operations.md,
"Scaling out").

A lease is a key in the shared cache (Redis in production; the database cache without ``REDIS_URL``) whose value
names its holder (``host:pid:random``) and which expires ``ttl`` seconds after its last renewal. ``hold()``
takes a free lease or renews one's own; a holder that dies stops renewing, and another process takes over once the
TTL has run out, so takeover is bounded by the TTL (plus the taker's retry period). Holders renew well within the
TTL (a third of it), so a lease only lapses when its holder is gone or stalled, and what the holders do is
idempotent anyway (docs/operations.md, "Tasks").

Used by: Celery beat (``portal.beat.SingletonScheduler``, one scheduler sends the periodic tasks) and the status
follower (``workloads.status``, one follower per cluster).
"""

from __future__ import annotations

import os
import socket
import uuid

from django.core.cache import cache

PREFIX = "portal:lease:"


def holder_token() -> str:
    """This process as a lease holder: ``host:pid:random`` (the pid lets an operator find the holder)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    def __init__(self, name: str, ttl: float, token: str | None = None) -> None:
        self.key = PREFIX + name
        self.ttl = max(1, int(round(ttl)))
        self.token = token or holder_token()

    def hold(self) -> bool:
        """Take the lease if it is free, renew it if it is ours; False while someone else holds it."""
        if cache.add(self.key, self.token, timeout=self.ttl):
            return True
        if cache.get(self.key) == self.token:
            cache.touch(self.key, timeout=self.ttl)
            return True
        return False

    def release(self) -> None:
        """Give the lease up at once (a clean stop); someone else's lease is left alone."""
        if cache.get(self.key) == self.token:
            cache.delete(self.key)

    def holder(self) -> str | None:
        return cache.get(self.key)


def lease_holder(name: str) -> str | None:
    """Who holds ``name`` now (``host:pid:random``), or None."""
    return cache.get(PREFIX + name)

"""Celery beat as a singleton (``CELERY_BEAT_SCHEDULER``; the image's ``beat`` role).

Two beat processes started by mistake (a second Deployment, a manual ``celery beat``, a rollout overlap) must
not send each periodic task twice. Each beat holds the lease ``beat`` (``portal.leases``) to send anything: the
holder renews it on every tick (ticks are at most a third of the TTL apart), the others tick idle and retry.
When the holder dies, another beat takes over within ``PORTAL_BEAT_LEASE_SECONDS`` (30 s) and sends what is
due then (the tasks are idempotent: docs/operations.md, "Tasks"). A clean stop hands the lease back at once.

Every tick, active or idle, touches the heartbeat file ``$TMPDIR/portal-beat.alive``; the liveness probe is
``entrypoint.py healthcheck beat`` (a stuck beat stops touching it).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from celery.beat import PersistentScheduler

logger = logging.getLogger("portal.beat")


def heartbeat_path(role: str) -> Path:
    """The heartbeat file of a ``worker`` or ``beat`` process (``entrypoint.py healthcheck ROLE`` reads it)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"portal-{role}.alive"


def touch_heartbeat(role: str) -> None:
    try:
        heartbeat_path(role).touch()
    except OSError:  # a full or read-only /tmp must not stop the process; the probe will say so
        logger.warning("cannot touch %s", heartbeat_path(role))


class SingletonScheduler(PersistentScheduler):
    """The persistent (file) scheduler, sending only while it holds the ``beat`` lease."""

    def __init__(self, *args, **kwargs) -> None:
        import django
        from django.apps import apps

        if not apps.ready:  # Celery's Django fixup has set Django up already in `celery beat` (set up again, it
            django.setup()  # would send the logs into Celery's redirected stderr)
        from django.conf import settings

        from portal.leases import Lease

        self.lease = Lease("beat:" + settings.PORTAL_INSTALLATION_ID, float(settings.PORTAL_BEAT_LEASE_SECONDS))
        self.active: bool | None = None  # unknown until the first tick
        super().__init__(*args, **kwargs)
        # Renew (and, idle, retry) at least three times per TTL.
        self.max_interval = min(self.max_interval, max(self.lease.ttl / 3, 0.5))

    def tick(self, *args, **kwargs) -> float:
        touch_heartbeat("beat")
        try:
            held = self.lease.hold()
        except Exception:  # the cache is down: send nothing (the holder cannot renew either), retry
            logger.exception("beat: cannot reach the lease store")
            held = False
        if held != self.active:
            self.active = held
            logger.warning("beat: %s (lease %s)", "active, sending the schedule" if held else "standing by", self.lease.key)
        if not held:
            return self.max_interval
        return min(super().tick(*args, **kwargs), self.max_interval)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.active:
                self.lease.release()

"""Celery beat as a singleton (``CELERY_BEAT_SCHEDULER``; the image's ``beat`` role, ``make run``'s ``beat`` child).

Two beat processes started by mistake (a second Deployment, a manual ``celery beat``, a rollout overlap, a restart
while the old process still runs) must not send each periodic task twice. Each beat holds the lease ``beat``
(``portal.leases``) to send anything: the holder renews it on every tick (ticks are at most a third of the TTL apart),
the others tick idle and retry. When the holder dies, another beat takes over within ``PORTAL_BEAT_LEASE_SECONDS``
(10 s) plus one tick, and a clean stop hands the lease back at once.

The schedule's state (when each entry was last sent) is kept in the shared cache next to the lease, never in a file:
a shelve file written by two processes (a killed beat's successor, a worker's embedded beat) got corrupted
("locking protocol") and beat died. The holder records each send; a beat that takes over reads the record, so it sends
what its predecessor had not sent yet, and nothing twice. What is overdue at a takeover is sent one entry per
``CATCH_UP_GAP`` seconds rather than all at once (the tasks are idempotent: docs/operations.md, "Tasks"). An entry
with no record at all (a fresh start, or an entry added since) is overdue too: missed schedules run at start.

The holder also writes a heartbeat to the cache on every tick (``beat_last_seen()``): ``/healthz/ready`` and the ops
pages say when the scheduler was last seen and flag it past ``PORTAL_BEAT_STALE_SECONDS`` (portal/health.py).
Every tick, active or idle, touches the heartbeat file ``$TMPDIR/portal-beat.alive``; the liveness probe is
``entrypoint.py healthcheck beat`` (a stuck beat stops touching it).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime, timedelta, UTC
from pathlib import Path
from typing import Any

from celery.beat import Scheduler

logger = logging.getLogger("portal.beat")

CATCH_UP_GAP = 1.0  # seconds between two overdue sends after a takeover
NEVER_SENT_AGE = timedelta(days=400)  # an entry with no record of a send counts as last sent this long ago: due now


def heartbeat_path(role: str) -> Path:
    """The heartbeat file of a ``worker`` or ``beat`` process (``entrypoint.py healthcheck ROLE`` reads it)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"portal-{role}.alive"


def touch_heartbeat(role: str) -> None:
    try:
        heartbeat_path(role).touch()
    except OSError:  # a full or read-only /tmp must not stop the process; the probe will say so
        logger.warning("cannot touch %s", heartbeat_path(role))


def _keys() -> tuple[str, str]:
    from django.conf import settings

    installation = settings.PORTAL_INSTALLATION_ID
    return f"portal:beat:sent:{installation}", f"portal:beat:heartbeat:{installation}"


def beat_last_seen() -> dict[str, Any] | None:
    """The active scheduler's last heartbeat: ``{"at": epoch seconds, "holder": "host:pid:random"}``, or None
    when no beat has sent anything (within a day). Read with the request's cache versions (one round trip)."""
    from .cache import read_with_versions

    seen = read_with_versions(_keys()[1])
    return seen if isinstance(seen, dict) and "at" in seen else None


class SingletonScheduler(Scheduler):
    """Celery's in-memory scheduler, sending only while it holds the ``beat`` lease, its state in the shared cache."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import django
        from django.apps import apps

        if not apps.ready:  # Celery's Django fixup has set Django up already in `celery beat` (set up again, it
            django.setup()  # would send the logs into Celery's redirected stderr)
        from django.conf import settings

        from portal.leases import Lease

        kwargs.pop("schedule_filename", None)  # `--schedule FILE` is accepted and ignored: nothing is kept in files
        self.lease = Lease("beat:" + settings.PORTAL_INSTALLATION_ID, float(settings.PORTAL_BEAT_LEASE_SECONDS))
        self.sent_key, self.heartbeat_key = _keys()
        self.active: bool | None = None  # unknown until the first tick
        self.catching_up = False
        super().__init__(*args, **kwargs)
        # Renew (and, idle, retry) at least three times per TTL.
        self.max_interval = min(self.max_interval, max(self.lease.ttl / 3, 0.5))

    # -- the schedule's state, shared -------------------------------------------------------------------------
    def _sent(self) -> dict[str, float]:
        from django.core.cache import cache

        sent = cache.get(self.sent_key)
        return sent if isinstance(sent, dict) else {}

    def _take_over(self) -> None:
        """Start from what the previous holder sent: an entry it sent recently is not sent again, and an entry never
        sent (a fresh start: an empty cache, a new entry) is due now, not one interval after the start (the ended
        month's statement would wait an hour)."""
        sent = self._sent()
        never = datetime.now(UTC) - NEVER_SENT_AGE
        for name, entry in self.schedule.items():
            at = sent.get(name)
            entry.last_run_at = datetime.fromtimestamp(at, tz=UTC) if isinstance(at, (int, float)) else never
        self._heap = None  # rebuilt from the entries on the next tick
        self.catching_up = True

    def reserve(self, entry: Any) -> Any:
        from django.core.cache import cache

        new_entry = super().reserve(entry)
        try:
            sent = self._sent()
            sent[entry.name] = new_entry.last_run_at.timestamp()
            cache.set(self.sent_key, sent, timeout=None)
        except Exception:  # the cache is down: the send goes ahead; a successor may send this entry once more
            logger.exception("beat: cannot record %s as sent", entry.name)
        return new_entry

    def tick(self, *args: Any, **kwargs: Any) -> float:
        from django.core.cache import cache

        touch_heartbeat("beat")
        try:
            held = self.lease.hold()
        except Exception:  # the cache is down: send nothing (the holder cannot renew either), retry
            logger.exception("beat: cannot reach the lease store")
            held = False
        if held != self.active:
            self.active = held
            logger.warning("beat: %s (lease %s)", "active, sending the schedule" if held else "standing by", self.lease.key)
            if held:
                self._take_over()
        if not held:
            return self.max_interval
        try:
            cache.set(self.heartbeat_key, {"at": time.time(), "holder": self.lease.token}, timeout=86400)
        except Exception:
            logger.exception("beat: cannot write the heartbeat")
        delay = super().tick(*args, **kwargs)
        if self.catching_up:
            if delay <= 0:  # it sent an overdue entry: the next one waits a moment (no burst after a takeover)
                return CATCH_UP_GAP
            self.catching_up = False
        return min(delay, self.max_interval)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.active:
                self.lease.release()

"""Celery entry points for MIG changes (docs/mig-changes.md). Thin: take an id, call ``flow.mig_change_advance``.

``maintenance.mig_change_advance`` does one step and queues itself again when the change wants to go on (after a
few seconds while it waits on the cluster); ``maintenance.mig_changes_sweep`` (beat, every minute) queues it for
every change whose window opened and every running one, so a lost message only delays a change. Two runs for the
same change never overlap (a cache lock); a run that finds it held does nothing, and every step is a
compare-and-set, so a redelivered task is harmless.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.core.cache import cache

from portal.kube import ClusterUnavailable

log = logging.getLogger(__name__)
LOCK_SECONDS = 300


def change_lock(change_id: int) -> str:
    return f"maintenance:mig-change:{change_id}"


@shared_task(name="maintenance.mig_change_advance", bind=True, autoretry_for=(ClusterUnavailable,), retry_backoff=5,
             retry_backoff_max=120, max_retries=20)
def mig_change_advance_task(self, change_id: int) -> dict | None:
    from .flow import mig_change_advance

    lock = change_lock(change_id)
    if not cache.add(lock, self.request.id or "local", LOCK_SECONDS):
        return {"skipped": True}
    try:
        delay = mig_change_advance(change_id)
    finally:
        cache.delete(lock)
    if delay is not None:
        self.apply_async(args=[change_id], countdown=delay)
    return {"again_in": delay}


@shared_task(name="maintenance.mig_changes_sweep")
def mig_changes_sweep_task() -> dict:
    from portal.events import enqueue

    from .selectors import due_changes

    due = due_changes()
    for change_id in due:
        enqueue("maintenance.mig_change_advance", change_id)
    return {"queued": len(due)}

"""Celery entry points for capacity and materialization. Thin: take ids, re-read, call one function.

Each task may run twice (acks late, retries, the periodic run overlapping an on-commit one): inventory
sync and reconcile converge to the same state whatever ran before. Beat schedule (portal/settings.py):

    CELERY_BEAT_SCHEDULE = {
        "quotas-reconcile-all": {"task": "quotas.reconcile_all", "schedule": 60.0},
        "quotas-inventory-all": {"task": "quotas.inventory_sync_all", "schedule": 300.0},
    }

The reconcile period is the drift-repair promise: an object deleted or edited by hand is restored
within one period.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.core.cache import cache

from portal.kube import ClusterUnavailable

from .models import Cluster

log = logging.getLogger(__name__)
LOCK_SECONDS = 600


def reconcile_lock(cluster_id: int) -> str:
    """The cache key held while anything writes a cluster's capacity objects: one writer per cluster."""
    return f"quotas:reconcile:{cluster_id}"


@shared_task(name="quotas.inventory_sync", bind=True, autoretry_for=(ClusterUnavailable,), retry_backoff=10,
             retry_backoff_max=300, retry_jitter=True, max_retries=5)
def inventory_sync_task(self, cluster_id: int) -> dict | None:
    from .inventory import inventory_sync

    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return None
    return inventory_sync(cluster)


@shared_task(name="quotas.reconcile_cluster", bind=True, autoretry_for=(ClusterUnavailable,), retry_backoff=5,
             retry_backoff_max=300, retry_jitter=True, max_retries=8)
def reconcile_cluster_task(self, cluster_id: int) -> dict | None:
    """Reconcile one cluster. One run per cluster at a time (a cache lock); a run that finds the lock
    held is dropped — the holder reads the database after it started, or the next period catches up."""
    from .reconcile import reconcile

    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return None
    lock = reconcile_lock(cluster_id)
    if not cache.add(lock, self.request.id or "local", LOCK_SECONDS):
        log.info("reconcile of cluster %s already running; skipped", cluster_id)
        return {"skipped": True}
    try:
        result = reconcile(cluster)
    except Exception as exc:  # a missing kubeconfig, a broken one: shown on the ops pages, then raised as before
        cluster.health_record(error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        cache.delete(lock)
    if result.unavailable:
        cluster.health_record(error=f"Unavailable: {len(result.failed)} object(s) not applied")
        # Recorded per object already; raise so Celery retries with backoff and resumes.
        raise ClusterUnavailable(f"cluster {cluster.name}: {len(result.failed)} object(s) not applied")
    cluster.health_record()
    return {"applied": result.applied, "deleted": result.deleted, "failed": len(result.failed)}


@shared_task(name="quotas.architecture_change_apply", bind=True, max_retries=120)
def architecture_change_apply_task(self, change_id: int) -> dict | None:
    """Apply a requested architecture change (``quotas/architecture.py``) under the cluster's reconcile
    lock. While a reconcile holds the lock the change waits (retried every few seconds), it is not dropped."""
    from .architecture import architecture_change_apply
    from .models import ArchitectureChange

    cluster_id = ArchitectureChange.objects.filter(pk=change_id).values_list("cluster_id", flat=True).first()
    if cluster_id is None:
        return None
    lock = reconcile_lock(cluster_id)
    if not cache.add(lock, self.request.id or "local", LOCK_SECONDS):
        raise self.retry(countdown=5)
    try:
        change = architecture_change_apply(change_id)
    finally:
        cache.delete(lock)
    return {"state": change.state} if change is not None else None


@shared_task(name="quotas.reconcile_all")
def reconcile_all_task() -> int:
    """Periodic: queue a reconcile for every cluster."""
    ids = list(Cluster.objects.values_list("pk", flat=True))
    for cluster_id in ids:
        reconcile_cluster_task.delay(cluster_id)
    return len(ids)


@shared_task(name="quotas.inventory_sync_all")
def inventory_sync_all_task() -> int:
    """Periodic: queue an inventory sync for every cluster."""
    ids = list(Cluster.objects.values_list("pk", flat=True))
    for cluster_id in ids:
        inventory_sync_task.delay(cluster_id)
    return len(ids)


@shared_task(name="quotas.quota_requests_expire")
def quota_requests_expire_task() -> dict:
    """Revert approved quota requests whose end date passed; close lapsed pending ones."""
    from django.utils import timezone

    from .jobs import quota_requests_expire

    return quota_requests_expire(timezone.now())


@shared_task(name="quotas.namespace_housekeeping")
def namespace_housekeeping_task() -> int:
    """Periodic: release archived projects' namespaces whose retention passed, then reconcile (which
    deletes them, ours only). Idempotent."""
    from .namespaces import namespaces_housekeeping

    released = namespaces_housekeeping()
    if released:
        reconcile_all_task.delay()
    return released

"""Celery entry points of the request lifecycle: thin wrappers around ``materialize`` and ``status``.

Each takes ids, re-reads, and may run twice (docs/conventions.md, "Transactions and Celery"). A cluster that cannot answer
(``ClusterUnavailable``) retries the task with exponential backoff; everything else is decided inside.

Beat (``CELERY_BEAT_SCHEDULE`` in portal/settings.py): ``requests_sync_task`` every 5 s (one status cycle per
cluster; or run ``manage.py follow_cluster`` instead), ``requests_housekeeping_task`` every 60 s,
``requests_sweep_approved_task`` every 10 s, ``approvals_remind_task`` every 5 minutes.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from portal.kube import ClusterUnavailable

from . import materialize, status

RETRY = {
    "autoretry_for": (ClusterUnavailable,),
    "retry_backoff": 2,
    "retry_backoff_max": 300,
    "retry_jitter": True,
    "max_retries": 30,
}



@shared_task(acks_late=True, **RETRY)
def request_materialize_task(request_id: int | None = None) -> dict[str, int]:
    """An approved request (or None: whatever is approved): create its objects in the cluster and record it queued,
    together with up to ``materialize.BATCH`` - 1 other approved requests no other run has claimed, then further
    batches while approvals keep arriving (``materialize.requests_materialize_until_done``; approvals meanwhile queue
    no run of their own). A full batch queues one more run, so a backlog is shared among the worker's processes."""
    return materialize.requests_materialize_until_done(
        request_id=request_id, more=lambda: request_materialize_task.delay(None))


@shared_task(acks_late=True, **RETRY)
def request_changed_task(request_id: int, action: str) -> str:
    """A lifecycle action a service recorded (stop, cancel, delete, scale, extend, restart): make the cluster match."""
    return materialize.request_act(request_id=request_id, action=action)


@shared_task(ignore_result=True)
def requests_sync_task() -> dict[str, dict[str, Any]]:
    """One status-following cycle for every cluster."""
    out = status.requests_sync()
    return {name: {"events": s.events, "moves": s.moves, "db_writes": s.db_writes, "cluster_calls": s.cluster_calls}
            for name, s in out.items()}


@shared_task(ignore_result=True)
def requests_housekeeping_task() -> dict[str, int]:
    """Deadlines and idle notebooks; approved requests whose materialization got lost are queued again; extension
    requests of requests that ended lapse."""
    expired = materialize.requests_expire()
    culled = materialize.notebooks_cull_idle() + materialize.requests_stop_measured_idle()
    from .extensions import extension_requests_lapse

    lapsed = extension_requests_lapse()
    from . import routing, services

    moved = routing.zones_redispatch(usable=services.redispatch_usable)  # drained or long-unhealthy clusters
    return {"expired": expired, "culled": culled, "extensions_lapsed": lapsed,
            "redispatched": sum(c.get("moved", 0) for c in moved.values())}


@shared_task(ignore_result=True)
def requests_redispatch_task(cluster_id: int) -> dict[str, int]:
    """A drained cluster: its pending work that has not started moves elsewhere, once (``routing.requests_redispatch``)."""
    from . import routing, services

    return routing.requests_redispatch(cluster_id=cluster_id, usable=services.redispatch_usable)


@shared_task(ignore_result=True)
def requests_sweep_approved_task() -> dict[str, int]:
    """Approved requests whose materialization got lost (a killed worker's claim lapsed, a lost message): one
    materializer run takes them on, in batches (beat, every 10 s: docs/operations.md, "Recovery bounds")."""
    swept = materialize.requests_sweep_approved()
    if swept:
        request_materialize_task.delay(swept[0])
    return {"requeued": len(swept)}


@shared_task(ignore_result=True)
def approvals_remind_task() -> dict[str, int]:
    """Remind approvers of requests still waiting for them (``approvals.approvals_remind``; once per period)."""
    from .approvals import approvals_remind

    return approvals_remind()

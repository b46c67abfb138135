"""Side effects that quota changes schedule for after their transaction commits (through ``portal.events``)."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS

from portal.events import after_commit, enqueue


def reconcile_queue(cluster_id: int) -> None:
    """Queue ``reconcile_cluster_task(cluster_id)`` (run after commit)."""
    # By name: the task module imports the services (through jobs) and the cluster client.
    enqueue("quotas.reconcile_cluster", cluster_id)


def schedule_reconcile(cluster_id: int, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Queue ``reconcile_cluster_task(cluster_id)`` once the current transaction commits.

    An approval touches two quota rows and a service may call this for each; one reconcile per
    cluster and transaction is enough (the task re-reads everything). A broker outage is logged,
    never turned into an error for a change that is already committed; the periodic reconcile
    catches up.
    """
    after_commit(reconcile_queue, cluster_id, using=using, once=True)

"""Side effects that quota changes schedule for after their transaction commits."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections, transaction


class _Reconcile:
    """The on-commit callback that queues one cluster's reconcile; equal per cluster, so queued once."""

    def __init__(self, cluster_id: int):
        self.cluster_id = cluster_id
        self.__qualname__ = f"schedule_reconcile({cluster_id})"  # Django logs failed hooks by this name

    def __call__(self) -> None:
        # Imported here: the task module imports the cluster client, which services need not load.
        from quotas.tasks import reconcile_cluster_task

        reconcile_cluster_task.delay(self.cluster_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reconcile) and other.cluster_id == self.cluster_id

    def __hash__(self) -> int:
        return hash(("reconcile", self.cluster_id))

    def __repr__(self) -> str:
        return f"<reconcile cluster {self.cluster_id}>"


def schedule_reconcile(cluster_id: int, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Queue ``reconcile_cluster_task(cluster_id)`` once the current transaction commits.

    An approval touches two quota rows and a service may call this for each; one reconcile per
    cluster and transaction is enough (the task re-reads everything). ``robust``: a broker outage
    is logged by Django, never turned into an error for a change that is already committed; the
    periodic reconcile catches up.
    """
    callback = _Reconcile(cluster_id)
    connection = connections[using]
    if connection.in_atomic_block and any(func == callback for _, func, _ in connection.run_on_commit):
        return
    transaction.on_commit(callback, using=using, robust=True)

"""Architecture changes as a service: ops apply a plan they reviewed to a cluster, which may switch
its reference architecture.

    architecture_change_start(actor, cluster, architecture, fingerprint)   the view and the API call this
        -> checks the plan against the fingerprint the person reviewed, records an ArchitectureChange
           (requested), audits it and queues ``quotas.architecture_change_apply`` after commit
    architecture_change_apply(change_id)   the Celery task calls this, under the cluster's reconcile lock
        -> applying: re-plans, checks the fingerprint again, records the new architecture (audited
           ``cluster.apply``), applies the plan -> applied | failed, with what it did

The states live in ``quotas/architecture_states.py``. A failed apply leaves the objects it did apply;
the recorded architecture is the new one, and the periodic reconcile converges the rest.
"""

from __future__ import annotations

from django.db import transaction

from portal.cache import changed as cache_changed
from portal.events import after_commit, enqueue
from portal.exceptions import ConflictError, Invalid, NotAllowed
from tenants.access import Actor
from tenants.audit import audit_record

from . import architecture_states as states
from . import reconcile
from .exceptions import NothingToApply, PlanChanged
from .models import Architecture, ArchitectureChange, Cluster

S = ArchitectureChange.State


def plan_for(cluster: Cluster, architecture: str) -> reconcile.Plan:
    """The plan that applying ``architecture`` to ``cluster`` would carry out (one try per cluster call)."""
    if architecture != cluster.architecture:
        return reconcile.plan_for_architecture_change(cluster, architecture)
    return reconcile.plan_build(cluster)


def architecture_change_start(*, actor: Actor, cluster: Cluster, architecture: str, fingerprint: str,
                              queue: bool = True) -> ArchitectureChange:
    """Start applying the plan the person reviewed (``fingerprint``) for ``architecture`` to ``cluster``.
    Raises PlanChanged when the plan differs now, NothingToApply when there is nothing to do, and a
    ConflictError while another change of the cluster is in progress. Applied by a Celery task
    (``queue=False``: the caller applies it itself, holding the cluster's reconcile lock)."""
    if actor.user is not None and not actor.is_ops:
        raise NotAllowed("Only platform ops apply plans to clusters.")
    if architecture not in Architecture.values:
        raise Invalid("Choose one of the reference architectures.", field="architecture")
    plan = plan_for(cluster, architecture)  # a ClusterError propagates: nothing was recorded
    if reconcile.plan_fingerprint(plan) != fingerprint:
        raise PlanChanged("Nothing was applied: the plan changed since you reviewed it. Review the new plan.",
                          field="fingerprint")
    if plan.empty and architecture == cluster.architecture:
        raise NothingToApply("Nothing to apply: the cluster already matches the desired state.")
    with transaction.atomic():
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()  # one start per cluster at a time
        if ArchitectureChange.objects.filter(cluster=cluster, state__in=states.IN_PROGRESS).exists():
            raise ConflictError("A change of this cluster is already in progress; wait for it to finish.")
        change = ArchitectureChange.objects.create(
            cluster=cluster, from_architecture=cluster.architecture, to_architecture=architecture,
            fingerprint=fingerprint, requested_by=actor.user,
        )
        audit_record(actor=actor, action="architecture_change.requested", target=change,
                     after={"cluster": cluster.name, "from": cluster.architecture, "to": architecture,
                            "plan": plan.summary()})
        if queue:
            after_commit(_queue, change.pk)
    return change


def _queue(change_id: int) -> None:
    enqueue("quotas.architecture_change_apply", change_id)


def _actor_of(change: ArchitectureChange) -> Actor:
    return Actor(user=change.requested_by) if change.requested_by_id else Actor.system()


def architecture_change_apply(change_id: int) -> ArchitectureChange | None:
    """Apply a requested change. Call it holding the cluster's reconcile lock. Idempotent: a change
    that already left ``requested`` is not touched again (None)."""
    change = ArchitectureChange.objects.select_related("cluster", "requested_by").filter(pk=change_id).first()
    if change is None:
        return None
    actor = _actor_of(change)
    if not states.move(change, to=S.APPLYING, actor=actor):
        return None
    try:
        return _apply(change, actor)
    except Exception as exc:
        # Never leave a change "applying": it would block the cluster's next change.
        states.move(change, to=S.FAILED, actor=actor, reason=f"{type(exc).__name__}: {exc}")
        raise


def _apply(change: ArchitectureChange, actor: Actor) -> ArchitectureChange:
    from portal.kube import ClusterError

    cluster = Cluster.objects.get(pk=change.cluster_id)
    try:
        plan = plan_for(cluster, change.to_architecture)
    except ClusterError as exc:
        states.move(change, to=S.FAILED, actor=actor, reason=f"The plan could not be made: {exc}")
        return change
    if reconcile.plan_fingerprint(plan) != change.fingerprint:
        states.move(change, to=S.FAILED, actor=actor,
                    reason="The plan changed since it was reviewed; nothing was applied. Review the new plan.")
        return change
    with transaction.atomic():
        before = {"architecture": cluster.architecture}
        if change.to_architecture != cluster.architecture:
            Cluster.objects.filter(pk=cluster.pk).update(architecture=change.to_architecture)
            cluster.architecture = change.to_architecture
            cache_changed("catalogue")  # the flavors' enforcement, kept with the submission catalogue
        audit_record(actor=actor, action="cluster.apply", target=cluster, before=before,
                     after={"architecture": plan.architecture, "create": len(plan.creates),
                            "change": len(plan.changes), "delete": len(plan.deletes)})
    result = reconcile.plan_apply(plan)
    done = {"applied": result.applied, "deleted": result.deleted, "skipped": result.skipped,
            "failed": [list(f) for f in result.failed]}
    if result.ok:
        states.move(change, to=S.APPLIED, actor=actor, fields={"result": done},
                    reason=f"{result.applied} applied, {result.deleted} deleted.")
    else:
        label, text = result.failed[0]
        states.move(change, to=S.FAILED, actor=actor, fields={"result": done},
                    reason=f"{result.applied} applied, {result.deleted} deleted, {len(result.failed)} failed, "
                           f"{result.skipped} not attempted. First failure: {label}: {text}. The periodic "
                           f"reconcile retries the rest.")
    return change


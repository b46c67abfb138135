"""Architecture changes as a service: ops apply a plan they reviewed to a cluster, which may switch
its reference architecture.

    architecture_change_start(actor, cluster, architecture, fingerprint)   the view and the API call this
        -> checks the plan against the fingerprint the person reviewed, records an ArchitectureChange
           (requested), audits it and queues ``quotas.architecture_change_apply`` after commit
    architecture_change_apply(change_id)   the Celery task calls this, under the cluster's reconcile lock
        -> applying: re-plans, checks the fingerprint again, records the new architecture (audited
           ``cluster.apply``), applies the plan -> applied | failed, with what it did

What the change does to work in the queues is part of the plan (``plan.impact``: running work in ClusterQueues it
removes, pending work it moves to other queues, maybe under looser limits), and ops choose a policy for the running
work (``reconcile.POLICIES``: drain, requeue, keep; recorded in ``result["policy"]``). docs/architecture.md,
"Architecture changes and running work".

The states live in ``quotas/architecture_states.py``. A failed apply leaves the objects it did apply;
the recorded architecture is the new one, and the periodic reconcile converges the rest.
"""

from __future__ import annotations

import copy
from typing import Any

from django.db import transaction

from portal.cache import changed as cache_changed
from portal.events import after_commit, enqueue
from portal.exceptions import ConflictError, Invalid, NotAllowed
from tenants.access import Actor
from tenants.audit import audit_record

from . import architecture_states as states
from . import manifests as m
from . import reconcile, services
from .exceptions import NothingToApply, PlanChanged
from .models import Architecture, ArchitectureChange, Cluster

S = ArchitectureChange.State


def plan_for(cluster: Cluster, architecture: str, *, kube: Any = None) -> reconcile.Plan:
    """The plan that applying ``architecture`` to ``cluster`` would carry out (one try per cluster call), with
    ``plan.impact``: the Workloads it moves (one more list call)."""
    from portal.kube import kube_for

    kube = kube or kube_for(cluster)
    if architecture != cluster.architecture:
        plan = reconcile.plan_for_architecture_change(cluster, architecture, kube=kube)
    else:
        plan = reconcile.plan_build(cluster, kube=kube)
    moves = plan.removed_queues or set(plan.queue_of.items()) != set(plan.live_queue_of.items())
    plan.impact = reconcile.workload_impact(plan, kube.list(m.KUEUE, "Workload")[0]) if moves else []
    return plan


def architecture_change_start(*, actor: Actor, cluster: Cluster, architecture: str, fingerprint: str,
                              policy: str = reconcile.DRAIN, queue: bool = True) -> ArchitectureChange:
    """Start applying the plan the person reviewed (``fingerprint``) for ``architecture`` to ``cluster``.
    Raises PlanChanged when the plan differs now, NothingToApply when there is nothing to do, and a
    ConflictError while another change of the cluster is in progress. Applied by a Celery task
    (``queue=False``: the caller applies it itself, holding the cluster's reconcile lock)."""
    if actor.user is not None and not actor.is_ops:
        raise NotAllowed("Only platform ops apply plans to clusters.")
    if architecture not in Architecture.values:
        raise Invalid("Choose one of the reference architectures.", field="architecture")
    if policy not in reconcile.POLICIES:
        raise Invalid("Choose what happens to running work: drain, requeue or keep.", field="policy")
    if architecture != cluster.architecture:  # a MultiKueue manager and its workers keep the same queues
        services.multikueue_match_check(_with_architecture(cluster, architecture), {"architecture"})
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
            fingerprint=fingerprint, requested_by=actor.user, result={"policy": policy},
        )
        audit_record(actor=actor, action="architecture_change.requested", target=change,
                     after={"cluster": cluster.name, "from": cluster.architecture, "to": architecture,
                            "plan": plan.summary(), "policy": policy,
                            "workloads": [reconcile.impact_text(e, policy) for e in plan.impact or []]})
        if queue:
            after_commit(_queue, change.pk)
    return change


def _with_architecture(cluster: Cluster, architecture: str) -> Cluster:
    """A copy of ``cluster`` (not saved) with ``architecture``: what the checks see once the change applied."""
    probe = copy.copy(cluster)
    probe.architecture = architecture
    return probe


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
    from portal.kube import ClusterError, kube_for

    cluster = Cluster.objects.get(pk=change.cluster_id)
    policy = (change.result or {}).get("policy", reconcile.DRAIN)
    try:
        kube = kube_for(cluster)
        plan = plan_for(cluster, change.to_architecture, kube=kube)
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
    work: dict[str, Any] = {}
    if policy == reconcile.DRAIN:
        # Hold the removed queues that still run work before anything else, and leave them in place (drained).
        work = reconcile.running_work_handle(plan, policy, kube=kube, impact=plan.impact)
        held = set(work.get("draining") or [])
        plan.items = [i for i in plan.items if not (i.action == "delete" and i.key[1] == "ClusterQueue" and i.key[3] in held)]
    result = reconcile.plan_apply(plan, kube=kube)
    if policy != reconcile.DRAIN:
        work = reconcile.running_work_handle(plan, policy, kube=kube, impact=plan.impact)
    done = {"applied": result.applied, "deleted": result.deleted, "skipped": result.skipped,
            "failed": [list(f) for f in result.failed], "policy": policy, "work": work,
            "workloads": [reconcile.impact_text(e, policy) for e in plan.impact or []]}
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


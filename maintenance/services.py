"""MIG changes as services: propose (with the impact shown before anyone approves), approve, reject, cancel.

    mig_change_propose(actor, pool, to_layout, window_start, deadline, reason, tenant)
        -> checks who may, the layout against the pool's GPU model and the window, computes the impact
           (impact.py; the running requests are read from the cluster), records the change (proposed),
           audits ``mig_change.propose``, tells ops after commit
    mig_change_approve / mig_change_reject / mig_change_cancel
        -> through ``states.move`` (compare-and-set + audit); an approval queues
           ``maintenance.mig_change_advance`` after commit (it waits for the window; beat sweeps every minute)

The window itself is carried out by ``flow.py``. Docs: docs/mig-changes.md.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from portal.events import after_commit, enqueue
from portal.exceptions import ConflictError, Invalid, NotAllowed
from portal.notify import notify_send, portal_link
from quotas.models import Cluster, NodePool
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.guards import require
from tenants.models import Tenant
from tenants.policy import holders

from . import cluster as cl
from . import impact as impact_mod
from . import notices, policy, selectors
from . import states
from .layouts import validate_layout
from .models import MigChange

log = logging.getLogger(__name__)
S = MigChange.Status


def _queue(change_id: int) -> None:
    enqueue("maintenance.mig_change_advance", change_id)


def _running_on(cluster: Cluster, nodes: list[str]) -> list[dict[str, Any]] | None:
    """The requests with GPU pods on ``nodes`` now (None when the cluster cannot say)."""
    from portal.kube import ClusterError, kube_for

    try:
        pods = cl.gpu_pods_on(kube_for(cluster), nodes)
    except (ClusterError, OSError, ValueError) as exc:
        log.warning("MIG change impact: pods of %s not readable: %s", cluster.name, exc)
        return None
    by_request: dict[int, set[str]] = {}
    foreign = [p for p in pods if p["request"] is None]
    for pod in pods:
        if pod["request"] is not None:
            by_request.setdefault(pod["request"], set()).add(pod["node"])
    rows = [{"id": r.pk, "name": r.name, "project": r.project.slug, "tenant": r.tenant.slug, "state": r.state,
             "owner": r.requested_by.get_username(), "nodes": sorted(by_request[r.pk])}
            for r in selectors.requests_by_id(set(by_request))]
    rows += [{"id": None, "name": f"{p['namespace']}/{p['name']}", "project": "", "tenant": "", "state": "pod",
              "owner": "", "nodes": [p["node"]]} for p in foreign]
    return rows


def impact_preview(*, cluster: Cluster, pool: NodePool, to_layout: str) -> dict[str, Any]:
    """The impact of switching ``pool`` to ``to_layout`` (validated), computed now; nothing is written."""
    nodes = selectors.pool_nodes(pool)
    model, gpus = selectors.pool_model(nodes)
    to_layout = validate_layout(model, to_layout)
    names = [n.name for n in nodes]
    running = _running_on(cluster, names)
    return impact_mod.impact_build(
        cluster=cluster, flavors=selectors.cluster_flavors(cluster), nodes=selectors.cluster_nodes(cluster),
        pool_nodes=names, model=model, gpus=gpus, from_layout=pool.mig_config, to_layout=to_layout,
        quotas=selectors.cluster_quota_rows(cluster), running=running if running is not None else [],
    ) | {"running_known": running is not None}


def _check_window(window_start: Any, deadline: Any) -> None:
    if not isinstance(window_start, datetime):
        raise Invalid("Give the start of the maintenance window.", field="window_start")
    if not isinstance(deadline, datetime):
        raise Invalid("Give the deadline for running work.", field="deadline")
    if deadline < window_start:
        raise Invalid("The deadline for running work cannot be before the window starts.", field="deadline")


def mig_change_propose(*, actor: Actor, pool: NodePool, to_layout: str, window_start: datetime, deadline: datetime,
                       reason: str = "", tenant: Tenant | None = None) -> MigChange:
    """Propose switching ``pool`` to ``to_layout`` in the window. Ops propose for any MIG pool; a tenant admin for
    a pool ``tenant`` uses (their tenant; the only one when they administer one). Raises ``Invalid`` (with the
    field), ``NotAllowed``, ``ConflictError`` (an open change already touches these nodes)."""
    if tenant is None and not actor.is_ops and actor.user is not None:
        mine = list(selectors.admin_tenants_for(actor=actor)[:2])
        tenant = mine[0] if len(mine) == 1 else None
    if actor.is_ops or actor.user is None:
        tenant = None  # ops propose as ops; the tenant field is for tenant admins' proposals
    require(policy.may_propose_mig_change(actor, tenant),
            "Only platform ops and tenant admins (for pools their tenant uses) propose MIG changes.")
    if pool is None or pool.sharing != NodePool.Sharing.MIG:
        raise Invalid("Choose a MIG node pool.", field="pool")
    nodes = selectors.pool_nodes(pool)
    if not nodes:
        raise Invalid("The pool has no nodes.", field="pool")
    if tenant is not None and tenant.pk not in selectors.pool_tenant_ids(pool, nodes):
        raise NotAllowed(f"Tenant {tenant.slug} holds no quota on the flavors of pool {pool.name}.")
    model, gpus = selectors.pool_model(nodes)
    to_layout = validate_layout(model, to_layout)
    if not gpus:
        raise Invalid(f"The GPUs of pool {pool.name} cannot be counted (layout {pool.mig_config!r} is not one the portal "
                      "knows, or a change is in progress).", field="pool")
    if to_layout == pool.mig_config:
        raise Invalid(f"The pool already runs {to_layout}.", field="to_layout")
    _check_window(window_start, deadline)
    reason = (reason or "").strip()
    if len(reason) > 2000:
        raise Invalid("At most 2000 characters.", field="reason")
    cluster = Cluster.objects.get(pk=pool.cluster_id)
    names = [n.name for n in nodes]
    impact = impact_preview(cluster=cluster, pool=pool, to_layout=to_layout)  # cluster read: before the transaction
    if tenant is not None:
        _refuse_cuts_of_others(impact, tenant)
    with transaction.atomic():
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()  # one open change per node at a time
        other = selectors.open_change_of(cluster, names)
        if other is not None:
            raise ConflictError(f"MIG change #{other.pk} of these nodes is still {other.get_status_display().lower()}; "
                                "wait for it or cancel it first.")
        change = MigChange.objects.create(
            cluster=cluster, pool=pool, pool_name=pool.name, nodes=names, gpu_model=model, gpus_per_node=gpus,
            from_layout=pool.mig_config, to_layout=to_layout, tenant=tenant, reason=reason, proposed_by=actor.user,
            window_start=window_start, deadline=deadline, impact=impact,
        )
        audit_record(actor=actor, action="mig_change.propose", target=change, tenant=tenant,
                     after={"pool": pool.name, "from": change.from_layout, "to": to_layout, "nodes": names,
                            "window_start": window_start.isoformat(), "deadline": deadline.isoformat(),
                            "quotas_to_change": len(impact["quotas"]["changes"])})
        states.log(change, step=MigChange.Step.WAITING, outcome=states.O.INFO,
                   message=f"Proposed by {actor.label}: {change.from_layout} → {to_layout} on {len(names)} node(s).")
        after_commit(_tell_ops, change.pk)
    return change


def others_cut(impact: dict[str, Any], tenant: Tenant) -> list[dict[str, Any]]:
    """The quota rows of tenants other than ``tenant`` that the change's plan would cut."""
    return [c for c in (impact.get("quotas") or {}).get("changes") or [] if c.get("tenant") != tenant.slug]


MIG_LAYOUT_NOT_AVAILABLE = ("This layout is not available to your tenant: it would cut quota that is not your tenant's. "
                            "Only platform ops may propose such a change; ask them, or choose a layout that keeps "
                            "the quotas of others.")


def _refuse_cuts_of_others(impact: dict[str, Any], tenant: Tenant) -> None:
    """A tenant admin's proposal may cut only their own tenant's quotas; cutting another tenant's promise is for
    platform ops, who see the whole plan (docs/mig-changes.md, "Who may do what"). The refusal names nothing of
    the others' (their tenants, projects, flavors, amounts): to a tenant admin those are 404s everywhere else
    (docs/security.md); ops, proposing the same layout, see the whole impact on the proposal's page."""
    if others_cut(impact, tenant):
        raise Invalid(MIG_LAYOUT_NOT_AVAILABLE, field="to_layout")


def _tell_ops(change_id: int) -> None:
    change = MigChange.objects.select_related("proposed_by").filter(pk=change_id).first()
    if change is None:
        return
    notify_send(
        subject=f"MIG change #{change.pk} waits for approval: {change.pool_name} → {change.to_layout}",
        body=(f"{change.proposed_by.get_username()} proposes switching pool {change.pool_name} "
              f"({len(change.nodes)} node(s)) from {change.from_layout} to {change.to_layout}, window from "
              f"{change.window_start:%Y-%m-%d %H:%M} UTC, running work stopped at {change.deadline:%Y-%m-%d %H:%M} UTC.\n"
              f"Review the impact and decide: {portal_link(f'/ops/mig-changes/{change.pk}/')}"),
        to=[u.email for u in holders(policy.may_decide_mig_change, change).order_by("username")
            if u.email and u.pk != change.proposed_by_id],
        payload={"event": "mig_change.proposed", "id": change.pk, "pool": change.pool_name, "to": change.to_layout},
        topic="mig change",
    )


def _fresh(change: MigChange) -> MigChange:
    return MigChange.objects.select_related("cluster", "tenant", "proposed_by").get(pk=change.pk)


def mig_change_approve(*, actor: Actor, change: MigChange, comment: str = "") -> MigChange:
    change = _fresh(change)
    if not policy.may_decide_mig_change(actor, change):
        if actor.is_ops:
            raise NotAllowed("Another ops person approves this change: you proposed it (see PORTAL_MIG_SINGLE_OPS).")
        raise NotAllowed("Only platform ops approve MIG changes.")
    with transaction.atomic():
        if not states.move(change, to=S.APPROVED, actor=actor, reason=comment.strip(),
                           fields={"approved_by": actor.user, "decided_at": _now(), "decision_comment": comment.strip()[:2000]}):
            raise ConflictError(f"A {change.status} MIG change cannot be approved.")
        after_commit(_queue, change.pk)
        after_commit(notices.tell_tenants, change.pk, applied=False)  # whose quota it will cut
    return change


def mig_change_reject(*, actor: Actor, change: MigChange, comment: str) -> MigChange:
    change = _fresh(change)
    require(policy.may_decide_mig_change(actor, change), "Only platform ops (other than the proposer) reject MIG changes.")
    comment = (comment or "").strip()
    if not comment:
        raise Invalid("Say why the change is rejected.", field="comment")
    if not states.move(change, to=S.REJECTED, actor=actor, reason=comment,
                       fields={"approved_by": None, "decided_at": _now(), "decision_comment": comment[:2000]}):
        raise ConflictError(f"A {change.status} MIG change cannot be rejected.")
    return change


def mig_change_cancel(*, actor: Actor, change: MigChange, reason: str = "") -> MigChange:
    change = _fresh(change)
    require(policy.may_cancel_mig_change(actor, change), "Only ops and the proposer withdraw a MIG change.")
    text = f"Cancelled by {actor.label}" + (f": {reason.strip()}" if reason and reason.strip() else ".")
    if not states.move(change, to=S.CANCELLED, actor=actor, reason=text):
        raise ConflictError(f"A {change.get_status_display().lower()} MIG change cannot be cancelled any more.")
    return change


def _now() -> datetime:
    from django.utils import timezone

    return timezone.now()

"""Carrying out an approved MIG change in its window, one step per call (docs/mig-changes.md, "Steps").

``mig_change_advance(change_id)`` is what the Celery task ``maintenance.mig_change_advance`` runs. It reads the
change, does the one step it is at (reading the cluster first, so that running it twice does no harm: cordoning a
cordoned node and setting a label to its value change nothing), moves the step with a compare-and-set
(``states.step_to``) and answers after how many seconds it wants to run again (None: nothing more to do).

    running:      cordon → drain → relabel → reconfigure → verify → quotas → uncordon → succeeded
    rolling_back: rollback_relabel → rollback_wait → rollback_uncordon → rolled_back
                  (entered when the MIG manager reports ``failed``, times out, or verification fails)

Stopped requests (deadline passed) and their owners' notices go through ``workloads.services.request_stop`` and
``portal.notify`` (after commit).
"""

from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.events import after_commit
from portal.exceptions import PortalError
from portal.kube import ClusterRejected, ClusterUnavailable, Kube, kube_for
from portal.notify import notify_send, portal_link
from tenants.access import Actor

from . import cluster as cl
from . import notices, selectors, states
from .layouts import layout_resources
from .models import MigChange, MigChangeStep

log = logging.getLogger(__name__)
S = MigChange.Status
STEP = MigChange.Step
O = MigChangeStep.Outcome
SYSTEM = Actor.system()
NOW_AGAIN = 0.0  # the next step can run at once
POLL = 5.0  # waiting on the cluster (MIG manager, pods)
RETRY = 15.0  # the cluster did not answer


def mig_change_advance(change_id: int, *, now: datetime | None = None) -> float | None:
    """Do the next step of a change. Returns seconds until it should run again, or None when there is nothing to
    do (not approved, window not open yet: the beat sweep starts it; or finished)."""
    now = now or timezone.now()
    change = MigChange.objects.select_related("cluster", "tenant").filter(pk=change_id).first()
    if change is None or change.status in states.FINAL or change.status == S.PROPOSED:
        return None
    if change.status == S.APPROVED:
        if change.window_start > now:
            return None
        if not states.move(change, to=S.RUNNING, actor=SYSTEM, step=STEP.CORDON, reason="The maintenance window opened."):
            return None
        states.log(change, step=STEP.CORDON, outcome=O.STARTED, message=STEP.CORDON.label + ".")
        return NOW_AGAIN
    handler = STEPS.get(change.step)
    if handler is None:  # pragma: no cover - every active step has a handler
        return None
    try:
        kube = kube_for(change.cluster)
        return handler(change, kube, now)
    except ClusterUnavailable as exc:
        states.log(change, step=change.step, outcome=O.PROGRESS, message=f"The cluster did not answer ({exc}); retrying.")
        return RETRY
    except (ClusterRejected, PortalError, OSError, ValueError) as exc:
        return _fail(change, f"{type(exc).__name__}: {exc}")


def _fail(change: MigChange, reason: str) -> float | None:
    """A forward step failed: roll back. A rollback step failed: give up, loudly (the nodes may stay cordoned)."""
    if change.status == S.RUNNING:
        return _rollback(change, reason)
    states.move(change, to=S.FAILED, actor=SYSTEM,
                reason=f"The rollback failed: {reason}. Nodes {', '.join(change.nodes)} may still be cordoned; "
                       "check them and the label nvidia.com/mig.config by hand.")
    after_commit(_tell_owner_of_change, change.pk)
    return None


def _rollback(change: MigChange, reason: str) -> float | None:
    relabelled = bool((change.rollback or {}).get("relabelled"))
    info = {**(change.rollback or {}), "reason": reason, "started": timezone.now().isoformat()}
    first = STEP.ROLLBACK_RELABEL if relabelled else STEP.ROLLBACK_UNCORDON
    if not states.move(change, to=S.ROLLING_BACK, actor=SYSTEM, step=first, fields={"rollback": info},
                       reason=f"{reason} Rolling back to {change.from_layout} automatically."):
        return None
    states.log(change, step=first, outcome=O.STARTED, message=STEP(first).label + ".")
    return NOW_AGAIN


# Forward steps ------------------------------------------------------------------------------------------------


def _cordon(change: MigChange, kube: Kube, now: datetime) -> float | None:
    cl.cordon(kube, change.nodes)
    info = {**(change.rollback or {}), "cordoned": True}
    states.step_to(change, step=STEP.DRAIN, actor=SYSTEM, expect_step=STEP.CORDON, fields={"rollback": info},
                   message=f"Cordoned {len(change.nodes)} node(s): {', '.join(change.nodes)}.")
    return NOW_AGAIN


def _drain(change: MigChange, kube: Kube, now: datetime) -> float | None:
    pods = cl.gpu_pods_on(kube, change.nodes)
    if not pods:
        states.step_to(change, step=STEP.RELABEL, actor=SYSTEM, expect_step=STEP.DRAIN,
                       message="No GPU work is left on the nodes.")
        return NOW_AGAIN
    request_ids = {p["request"] for p in pods if p["request"] is not None}
    requests = selectors.active_requests_on(request_ids)
    seen = change.steps.filter(step=STEP.DRAIN, outcome=O.PROGRESS).order_by("-seq", "-id").first()
    count = {"pods": len(pods), "requests": sorted(request_ids)}
    if now < change.deadline:
        if seen is None:
            after_commit(_tell_owners, change.pk, [r.pk for r in requests], False)
        if seen is None or seen.detail != count:
            states.log(change, step=STEP.DRAIN, outcome=O.PROGRESS, detail=count,
                       message=f"Waiting for {len(pods)} GPU pod(s) of {len(request_ids)} request(s) to finish; "
                               f"what still runs at {change.deadline:%Y-%m-%d %H:%M} UTC is stopped.")
        return POLL
    stopped = _stop(change, requests)
    if stopped:
        states.log(change, step=STEP.DRAIN, outcome=O.INFO, detail={"stopped": stopped},
                   message=f"The deadline passed: stopped {len(stopped)} request(s) ({', '.join(f'#{i}' for i in stopped)}); "
                           "their owners were told.")
    elif seen is None or seen.detail != count:
        states.log(change, step=STEP.DRAIN, outcome=O.PROGRESS, detail=count,
                   message=f"The deadline passed; waiting for {len(pods)} GPU pod(s) to go away.")
    limit = float(getattr(settings, "PORTAL_MIG_RECONFIGURE_TIMEOUT", 1200) or 1200)
    if (now - change.deadline).total_seconds() > limit:
        names = ", ".join(f"{p['namespace']}/{p['name']}" for p in pods[:5])
        return _rollback(change, f"GPU pods still run on the nodes {int(limit)} s after the deadline ({names}).")
    return POLL


def _stop(change: MigChange, requests: list[Any]) -> list[int]:
    from workloads.services import request_stop

    stopped = []
    for req in requests:
        try:
            with transaction.atomic():
                request_stop(actor=SYSTEM, request=req,
                             reason=f"MIG change #{change.pk} of pool {change.pool_name}: the maintenance window's "
                                    "deadline passed")
                after_commit(_tell_owners, change.pk, [req.pk], True)
        except PortalError as exc:  # it ended meanwhile
            log.info("MIG change %s: request %s not stopped: %s", change.pk, req.pk, exc)
            continue
        stopped.append(req.pk)
    return stopped


def _relabel(change: MigChange, kube: Kube, now: datetime) -> float | None:
    info = {**(change.rollback or {}), "layout": change.from_layout, "relabelled": True}
    # Recorded before the label is set: a worker dying in between still rolls the label back.
    MigChange.objects.filter(pk=change.pk).update(rollback=info)
    change.rollback = info
    cl.set_layout(kube, change.nodes, change.to_layout)
    states.step_to(change, step=STEP.RECONFIGURE, actor=SYSTEM, expect_step=STEP.RELABEL,
                   message=f"Set nvidia.com/mig.config={change.to_layout} on {len(change.nodes)} node(s).")
    return POLL


def _settled(change: MigChange, kube: Kube, layout: str) -> tuple[list[str], list[str], list[str]]:
    """(nodes done, nodes failed, nodes missing) for ``layout``: done = the label says ``layout``, the state
    ``success`` and the node advertises exactly the layout's GPU resources."""
    objs = cl.nodes_read(kube, change.nodes)
    expected = layout_resources(change.gpu_model, layout, change.gpus_per_node)
    done, failed = [], []
    for name, obj in objs.items():
        config, state = cl.node_layout(obj)
        if state == "failed":
            failed.append(name)
        elif config == layout and state == "success" and cl.node_gpu_resources(obj) == expected:
            done.append(name)
    missing = [n for n in change.nodes if n not in objs]
    return done, failed, missing


def _timed_out(change: MigChange, now: datetime) -> bool:
    limit = float(getattr(settings, "PORTAL_MIG_RECONFIGURE_TIMEOUT", 1200) or 1200)
    return change.step_started_at is not None and (now - change.step_started_at).total_seconds() > limit


def _reconfigure(change: MigChange, kube: Kube, now: datetime) -> float | None:
    done, failed, missing = _settled(change, kube, change.to_layout)
    if failed or missing:
        what = (f"the MIG manager reported failed on {', '.join(failed)}" if failed
                else f"node(s) {', '.join(missing)} left the cluster")
        return _rollback(change, f"Changing to {change.to_layout}: {what}.")
    base = states.progress_of(STEP.RECONFIGURE)
    span = states.progress_of(STEP.VERIFY) - base
    states.progress_set(change, progress=base + span * len(done) // max(1, len(change.nodes)),
                        expect_step=STEP.RECONFIGURE)
    if len(done) == len(change.nodes):
        states.step_to(change, step=STEP.VERIFY, actor=SYSTEM, expect_step=STEP.RECONFIGURE,
                       message=f"The MIG manager reports success on {len(done)} node(s).")
        return NOW_AGAIN
    if _timed_out(change, now):
        return _rollback(change, f"The MIG manager did not finish {change.to_layout} in time "
                                 f"({len(done)} of {len(change.nodes)} node(s) done).")
    return POLL


def _verify(change: MigChange, kube: Kube, now: datetime) -> float | None:
    from quotas.capacity import capacity_by_flavor
    from quotas.inventory import inventory_sync

    inventory_sync(change.cluster, kube=kube)
    expected = layout_resources(change.gpu_model, change.to_layout, change.gpus_per_node)
    nodes = [n for n in selectors.cluster_nodes(change.cluster) if n.name in set(change.nodes)]
    wrong = []
    for node in nodes:
        offers = {k: int(Decimal(str(v))) for k, v in (node.allocatable or {}).items()
                  if (k == "nvidia.com/gpu" or k.startswith("nvidia.com/mig-")) and int(Decimal(str(v)))}
        if not node.counts_capacity or offers != expected:
            wrong.append(f"{node.name} offers {offers or 'nothing'}")
    if wrong or len(nodes) != len(change.nodes):
        return _rollback(change, f"Verification failed: expected {expected} per node; {'; '.join(wrong) or 'nodes missing'}.")
    capacity = capacity_by_flavor(change.cluster, flavors=selectors.cluster_flavors(change.cluster), nodes=nodes)
    total = {f"{fid}:{res}": str(v) for (fid, res), v in capacity.items() if v}
    states.step_to(change, step=STEP.QUOTAS, actor=SYSTEM, expect_step=STEP.VERIFY, detail={"pool_capacity": total},
                   message=f"Verified: each of {len(nodes)} node(s) offers "
                           f"{', '.join(f'{v} x {k}' for k, v in sorted(expected.items()))}.")
    return NOW_AGAIN


def _quotas(change: MigChange, kube: Kube, now: datetime) -> float | None:
    from quotas.inventory import flavors_discover, node_taints
    from quotas.services import flavor_create, quota_set

    notes = []
    wanted = set(layout_resources(change.gpu_model, change.to_layout, change.gpus_per_node))
    for proposal in flavors_discover(change.cluster, taints_by_node=node_taints(kube)):
        if proposal.kind != "mig" or not set(proposal.resource_names) & wanted:
            continue
        flavor_create(actor=SYSTEM, cluster=change.cluster, name=proposal.name, kind=proposal.kind,
                      gpu_product=proposal.gpu_product, gpu_model=proposal.gpu_model, mig_profile=proposal.mig_profile,
                      pool_label=proposal.pool_label, node_labels=proposal.node_labels, taints=proposal.taints,
                      tolerations=proposal.tolerations, order=proposal.order)
        notes.append(f"created flavor {proposal.name}")
    plan = ((change.impact or {}).get("quotas") or {}).get("changes") or []
    rows = selectors.quota_rows_by_id([p["id"] for p in plan])
    # Projects shrink before their tenant (a tenant's promise never drops below what its projects hold).
    for item in sorted(plan, key=lambda p: p["project"] is None):
        row = rows.get(item["id"])
        new = Decimal(item["new_nominal"])
        if row is None or row.nominal <= new:
            continue
        try:
            if row.project_id is not None:
                quota_set(actor=SYSTEM, project=row.project, flavor=row.flavor, resource=row.resource, nominal=new,
                          borrowing_limit=row.borrowing_limit, lending_limit=row.lending_limit)
            else:
                quota_set(actor=SYSTEM, tenant=row.tenant, flavor=row.flavor, resource=row.resource, nominal=new)
        except PortalError as exc:
            notes.append(f"quota #{row.pk} not changed: {exc}")
            continue
        who = f"{row.tenant.slug}/{row.project.slug}" if row.project_id else row.tenant.slug
        notes.append(f"{who} {row.flavor.name} {row.nominal.normalize()} → {new.normalize()}")
    moved = states.step_to(change, step=STEP.UNCORDON, actor=SYSTEM, expect_step=STEP.QUOTAS, detail={"notes": notes},
                           message=("Flavors and quotas: " + "; ".join(notes) + ".") if notes
                           else "Flavors and quotas: nothing to change.")
    if moved and plan:
        after_commit(notices.tell_tenants, change.pk, applied=True)  # the tenants whose quota was cut, once
    return NOW_AGAIN


def _uncordon(change: MigChange, kube: Kube, now: datetime) -> float | None:
    cl.cordon(kube, change.nodes, cordoned=False)
    if states.move(change, to=S.SUCCEEDED, actor=SYSTEM,
                   reason=f"{len(change.nodes)} node(s) run {change.to_layout}; uncordoned.",
                   done=(STEP.UNCORDON, f"Uncordoned {len(change.nodes)} node(s).")):
        after_commit(_tell_owner_of_change, change.pk)
    return None


# Rollback steps -----------------------------------------------------------------------------------------------


def _rollback_relabel(change: MigChange, kube: Kube, now: datetime) -> float | None:
    cl.set_layout(kube, change.nodes, change.from_layout)
    states.step_to(change, step=STEP.ROLLBACK_WAIT, actor=SYSTEM, expect_step=STEP.ROLLBACK_RELABEL,
                   message=f"Set nvidia.com/mig.config={change.from_layout} again.")
    return POLL


def _rollback_wait(change: MigChange, kube: Kube, now: datetime) -> float | None:
    done, failed, missing = _settled(change, kube, change.from_layout)
    if len(done) == len(change.nodes):
        states.step_to(change, step=STEP.ROLLBACK_UNCORDON, actor=SYSTEM, expect_step=STEP.ROLLBACK_WAIT,
                       message=f"{len(done)} node(s) run {change.from_layout} again.")
        return NOW_AGAIN
    if missing or _timed_out(change, now):
        return _fail(change, f"{change.from_layout} did not come back on "
                             f"{', '.join(sorted(set(change.nodes) - set(done)))}")
    return POLL


def _rollback_uncordon(change: MigChange, kube: Kube, now: datetime) -> float | None:
    from quotas.inventory import inventory_sync

    cl.cordon(kube, change.nodes, cordoned=False)
    inventory_sync(change.cluster, kube=kube)
    why = (change.rollback or {}).get("reason", "")
    if states.move(change, to=S.ROLLED_BACK, actor=SYSTEM,
                   reason=f"Rolled back automatically: the pool runs {change.from_layout} again. Why: {why}",
                   done=(STEP.ROLLBACK_UNCORDON, f"Uncordoned {len(change.nodes)} node(s).")):
        after_commit(_tell_owner_of_change, change.pk)
    return None


STEPS: dict[str, Callable[[MigChange, Kube, datetime], float | None]] = {
    STEP.CORDON: _cordon, STEP.DRAIN: _drain, STEP.RELABEL: _relabel, STEP.RECONFIGURE: _reconfigure,
    STEP.VERIFY: _verify, STEP.QUOTAS: _quotas, STEP.UNCORDON: _uncordon,
    STEP.ROLLBACK_RELABEL: _rollback_relabel, STEP.ROLLBACK_WAIT: _rollback_wait,
    STEP.ROLLBACK_UNCORDON: _rollback_uncordon,
}


# Notices (after commit) ---------------------------------------------------------------------------------------


def _tell_owners(change_id: int, request_ids: list[int], stopped: bool) -> None:
    change = MigChange.objects.filter(pk=change_id).first()
    if change is None:
        return
    for req in selectors.requests_by_id(set(request_ids)):
        if stopped:
            subject = f"Request {req.name} was stopped for maintenance"
            body = (f"Your request {req.name} (#{req.pk}) in {req.project.slug} was stopped: the MIG layout of pool "
                    f"{change.pool_name} changes to {change.to_layout} and the maintenance window's deadline "
                    f"({change.deadline:%Y-%m-%d %H:%M} UTC) passed. Restart it when the change is done.")
        else:
            subject = f"Request {req.name} will be stopped at {change.deadline:%Y-%m-%d %H:%M} UTC"
            body = (f"Your request {req.name} (#{req.pk}) in {req.project.slug} runs on nodes whose MIG layout changes "
                    f"to {change.to_layout}. New work is not placed there any more; if it still runs at "
                    f"{change.deadline:%Y-%m-%d %H:%M} UTC it is stopped.")
        body += f"\n\nThe request: {portal_link(f'/requests/{req.pk}/')}"
        notify_send(subject=subject, body=body, to=[req.requested_by.email],
                    payload={"event": "mig_change.stopped" if stopped else "mig_change.notice", "change": change.pk,
                             "request": req.pk}, topic="mig change")


def _tell_owner_of_change(change_id: int) -> None:
    change = MigChange.objects.select_related("proposed_by", "approved_by").filter(pk=change_id).first()
    if change is None:
        return
    people = {u.email for u in (change.proposed_by, change.approved_by) if u is not None and u.email}
    notify_send(subject=f"MIG change #{change.pk} {change.get_status_display().lower()}: {change.pool_name}",
                body=f"{change.status_reason}\n\nThe change: {portal_link(f'/ops/mig-changes/{change.pk}/')}",
                to=sorted(people),
                payload={"event": f"mig_change.{change.status}", "id": change.pk}, topic="mig change")

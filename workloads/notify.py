"""Telling people about requests, through the portal's notifier (``portal.notify``): the requester what
was decided, the approvers what waits for them. Email (one per recipient) and the optional JSON webhook
(``PORTAL_WEBHOOK_URL``).

Called after the transaction commits; a failing mail server or webhook is logged and never undoes
or blocks the decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from portal.notify import notify_send, portal_link


def _addresses(people: Iterable[Any]) -> list[str]:
    return sorted({p.email for p in people if p is not None and p.is_active and p.email})


def _send(*, subject: str, body: str, to: list[str], payload: dict[str, Any]) -> None:
    """One email per address, then the webhook; failures are logged (``portal.notify``)."""
    notify_send(subject=subject, body=body, to=to, payload=payload, topic="request")


def request_decided_notify(request_id: int) -> None:
    """Email the requester (and call the webhook) that their request was approved or rejected, with the reason."""
    from .models import WorkloadRequest

    req = (
        WorkloadRequest.objects.select_related("project", "template", "requested_by", "flavor")
        .filter(pk=request_id)
        .first()
    )
    if req is None:
        return
    decision = req.get_state_display().lower()
    last = req.events.order_by("-at", "-id").first()
    by = last.actor_label if last else "the portal"
    comment = req.decision_comment
    subject = f"[GPU portal] {req.project.slug}/{req.name} {decision}"
    lines = [
        f"Your request {req.name} ({req.template.name}, {req.gpus} x {req.flavor}) in project {req.project.slug} was {decision} by {by}.",
    ]
    if comment:
        lines.append(("Reason: " if req.state == "rejected" else "Comment: ") + comment)
    lines.append(f"The request: {portal_link(f'/requests/{req.pk}/')}")
    address = getattr(req.requested_by, "email", "")
    notify_send(
        subject=subject, body="\n\n".join(lines), to=[address] if address else [], topic="request",
        payload={
            "event": f"request.{req.state}",
            "request": req.pk,
            "name": req.name,
            "project": req.project.slug,
            "state": req.state,
            "by": by,
            "comment": comment,
            "requested_by": req.requested_by.get_username(),
        },
    )


def request_preempted_notify(request_id: int) -> None:
    """Email the requester that the cluster preempted their request: by whom (named only if the requester may see
    it), at what priority, and what happens next (``workloads.preemption``)."""
    from tenants.access import Actor

    from .models import RequestState, WorkloadRequest
    from .preemption import notice

    req = (WorkloadRequest.objects.select_related("project", "template", "requested_by", "flavor")
           .filter(pk=request_id).first())
    if req is None:
        return
    event = req.events.filter(to_state=RequestState.PREEMPTED).order_by("-at", "-id").first()
    said = notice(req, event.message if event else "", actor=Actor(user=req.requested_by))
    if said is None:
        return
    subject = f"[GPU portal] {req.project.slug}/{req.name} was preempted"
    lines = [f"Your request {req.name} ({req.template.name}, {req.gpus} x {req.flavor}) in project {req.project.slug} "
             "was preempted.", said.text, said.next, f"The request's page: {portal_link(f'/requests/{req.pk}/')}"]
    _send(subject=subject, body="\n\n".join(lines) + "\n", to=_addresses([req.requested_by]),
          payload={"event": "request.preempted", "request": req.pk, "name": req.name, "project": req.project.slug,
                   "priority": req.priority, "why": said.text,
                   "preemptor": said.preemptor.name if said.preemptor is not None else None,
                   "requested_by": req.requested_by.get_username()})


# The approvers' side: something waits for them --------------------------------------------------------------------


def request_waiting_notify(request_id: int, *, reminder: bool = False) -> None:
    """Email the request's eligible approvers (``selectors.request_approvers``) that it waits for a decision
    (``reminder``: still waits), and post the webhook."""
    from .models import RequestState, WorkloadRequest
    from .selectors import request_approvers

    req = (
        WorkloadRequest.objects.select_related("project__tenant", "template", "requested_by", "flavor")
        .filter(pk=request_id, state=RequestState.PENDING_APPROVAL)
        .first()
    )
    if req is None:  # decided or cancelled meanwhile: nothing waits
        return
    approvers = request_approvers(project=req.project, exclude_user_id=req.requested_by_id)
    what = f"{req.template.name}, {req.gpus} x {req.flavor}" + (f" x {req.replicas}" if req.replicas > 1 else "")
    head = "Still waiting for a decision" if reminder else "Approval needed"
    subject = f"[GPU portal] {head}: {req.project.slug}/{req.name}"
    lines = [
        f"{req.requested_by.get_username()} asks for {req.name} ({what}, {req.duration_hours} h, priority "
        f"{req.priority}) in project {req.project.slug} ({req.project.tenant.name}).",
        f"Why it needs an approver: {req.pending_reason or 'no approval rule lets it through.'}",
        f"Submitted {req.created_at:%Y-%m-%d %H:%M} UTC.",
        f"Decide on the portal's Approvals page ({portal_link('/approvals/')}), or with POST /api/v1/requests/"
        f"{req.pk}/approve/ or /reject/.",
    ]
    _send(
        subject=subject, body="\n\n".join(lines) + "\n", to=_addresses(approvers),
        payload={
            "event": "request.approval_reminder" if reminder else "request.awaiting_approval",
            "request": req.pk, "name": req.name, "project": req.project.slug, "tenant": req.project.tenant.slug,
            "requested_by": req.requested_by.get_username(), "gpus": req.gpus, "flavor": req.flavor.name,
            "replicas": req.replicas, "duration_hours": req.duration_hours, "priority": req.priority,
            "why": req.pending_reason, "approvers": [u.get_username() for u in approvers],
        },
    )


def request_withdrawn_notify(request_id: int, *, actor_user_id: int | None = None) -> None:
    """Email the approvers who were asked to decide on a request (``selectors.request_approvers``, less whoever
    cancelled it) that it was cancelled while it waited: it no longer waits for them, and has left their inbox."""
    from .models import RequestState, WorkloadRequest
    from .selectors import request_approvers

    req = (
        WorkloadRequest.objects.select_related("project__tenant", "template", "requested_by", "flavor")
        .filter(pk=request_id, state=RequestState.CANCELLED)
        .first()
    )
    if req is None:
        return
    approvers = [u for u in request_approvers(project=req.project, exclude_user_id=req.requested_by_id)
                 if u.pk != actor_user_id]
    last = req.events.order_by("-at", "-id").first()
    by = last.actor_label if last else req.requested_by.get_username()
    subject = f"[GPU portal] Withdrawn, no decision needed: {req.project.slug}/{req.name}"
    lines = [
        f"{req.name} ({req.template.name}, {req.gpus} x {req.flavor}) in project {req.project.slug}, which waited "
        f"for your decision, was cancelled by {by}. Nothing is left to decide; it is no longer in your inbox.",
    ]
    if last and last.message:
        lines.append(last.message)
    lines.append(f"Your Approvals page: {portal_link('/approvals/')}")
    _send(subject=subject, body="\n\n".join(lines) + "\n", to=_addresses(approvers),
          payload={"event": "request.withdrawn", "request": req.pk, "name": req.name, "project": req.project.slug,
                   "tenant": req.project.tenant.slug, "by": by, "approvers": [u.get_username() for u in approvers]})


def _extension(extension_id: int) -> Any:
    from .models import ExtensionRequest

    return (
        ExtensionRequest.objects.select_related(
            "request__project__tenant", "request__template", "request__flavor", "requested_by", "decided_by"
        )
        .filter(pk=extension_id)
        .first()
    )


def _extension_payload(ext: Any, event: str) -> dict[str, Any]:
    req = ext.request
    return {
        "event": f"extension_request.{event}", "extension_request": ext.pk, "request": req.pk, "name": req.name,
        "project": req.project.slug, "tenant": req.project.tenant.slug, "hours": ext.hours, "replicas": ext.replicas, "reason": ext.reason,
        "status": ext.status, "requested_by": ext.requested_by.get_username(),
        "decided_by": ext.decided_by.get_username() if ext.decided_by_id else None, "comment": ext.comment,
    }


def extension_waiting_notify(extension_id: int, *, reminder: bool = False) -> None:
    """Email the eligible approvers that an extension request waits for them (``reminder``: still waits)."""
    from .models import ExtensionRequest
    from .selectors import request_approvers

    ext = _extension(extension_id)
    if ext is None or ext.status != ExtensionRequest.Status.PENDING:
        return
    req = ext.request
    approvers = request_approvers(project=req.project, exclude_user_id=ext.requested_by_id)
    head = "Still waiting for a decision" if reminder else ("Scaling asked for" if ext.is_scale else "Extension asked for")
    subject = f"[GPU portal] {head}: {req.project.slug}/{req.name} {ext.short}"
    if ext.is_scale:
        asked = (f"{ext.requested_by.get_username()} asks to scale {req.name} ({req.template.name}, {req.gpus} x "
                 f"{req.flavor} per replica) in project {req.project.slug} from {req.replicas} to {ext.replicas} replicas.")
    else:
        asked = (f"{ext.requested_by.get_username()} asks for {ext.hours} more hours for {req.name} ({req.template.name}, "
                 f"{req.gpus} x {req.flavor}) in project {req.project.slug}: {req.duration_hours} h now, "
                 f"{req.duration_hours + ext.hours} h with the extension.")
    lines = [
        asked,
        f"Reason: {ext.reason}",
        f"Decide on the portal's Approvals page ({portal_link('/approvals/')}), or with POST /api/v1/extension-requests/"
        f"{ext.pk}/approve/ or /reject/.",
    ]
    _send(subject=subject, body="\n\n".join(lines) + "\n", to=_addresses(approvers),
          payload=_extension_payload(ext, "reminder" if reminder else "submitted")
          | {"approvers": [u.get_username() for u in approvers]})


def extension_withdrawn_notify(extension_id: int) -> None:
    """Email the approvers who were asked about an extension request that the requester withdrew it."""
    from .models import ExtensionRequest
    from .selectors import request_approvers

    ext = _extension(extension_id)
    if ext is None or ext.status != ExtensionRequest.Status.CANCELLED:
        return
    req = ext.request
    approvers = request_approvers(project=req.project, exclude_user_id=ext.requested_by_id)
    subject = f"[GPU portal] Withdrawn, no decision needed: {req.project.slug}/{req.name} {ext.short}"
    lines = [f"{ext.requested_by.get_username()} withdrew the request for {ext.asked} for {req.name} in "
             f"project {req.project.slug}. Nothing is left to decide; it is no longer in your inbox.",
             f"Your Approvals page: {portal_link('/approvals/')}"]
    _send(subject=subject, body="\n\n".join(lines) + "\n", to=_addresses(approvers),
          payload=_extension_payload(ext, "withdrawn") | {"approvers": [u.get_username() for u in approvers]})


def extension_decided_notify(extension_id: int) -> None:
    """Email the requester what was decided on their extension request (with the reason of a rejection)."""
    ext = _extension(extension_id)
    if ext is None:
        return
    req = ext.request
    decision = ext.get_status_display().lower()
    by = ext.decided_by.get_username() if ext.decided_by_id else "the portal"
    what = "Scaling" if ext.is_scale else "Extension"
    subject = f"[GPU portal] {what} of {req.project.slug}/{req.name} {decision}"
    lines = [f"Your request for {ext.asked} for {req.name} in project {req.project.slug} was {decision} by {by}."]
    if ext.status == "approved":
        lines.append(f"It now has {req.replicas} replicas." if ext.is_scale
                     else f"It may now run for {req.duration_hours} hours in all.")
    if ext.comment:
        lines.append(("Reason: " if ext.status == "rejected" else "Comment: ") + ext.comment)
    lines.append(f"The request: {portal_link(f'/requests/{req.pk}/')}")
    _send(subject=subject, body="\n\n".join(lines) + "\n", to=_addresses([ext.requested_by]),
          payload=_extension_payload(ext, ext.status))


def quota_request_remind_notify(quota_request_id: int) -> None:
    """Email the approvers of a quota request (at the tier it was routed to) that it still waits."""
    from quotas.models import QuotaRequest
    from quotas.notify import request_payload
    from quotas.selectors import quota_request_approvers

    qr = (
        QuotaRequest.objects.select_related("project__tenant", "flavor__cluster", "requested_by", "decided_by")
        .filter(pk=quota_request_id, status=QuotaRequest.Status.PENDING)
        .first()
    )
    if qr is None:
        return
    approvers = [u for u in quota_request_approvers(request=qr) if u.pk != qr.requested_by_id]

    subject = f"[GPU portal] Still waiting for a decision: quota request #{qr.pk}"
    lines = [
        f"Quota request #{qr.pk}: {qr.what} for {qr.project.slug}, "
        f"asked by {qr.requested_by.get_username()} on {qr.created_at:%Y-%m-%d %H:%M} UTC.",
        f"Decided by: {qr.get_approver_display()}.",
        f"Reason: {qr.reason}",
        f"Decide on the portal's Quota requests page ({portal_link('/quota-requests/')}).",
    ]
    _send(subject=subject, body="\n\n".join(lines) + "\n", to=_addresses(approvers),
          payload=request_payload(qr, event="reminder", actor_label="system"))

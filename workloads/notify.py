"""Telling the requester what happened to their request, through the portal's notifier
(``portal.notify``): email, and the optional JSON webhook (``PORTAL_WEBHOOK_URL``).

Called after the transaction commits; a failing mail server or webhook is logged and never undoes
or blocks the decision.
"""

from __future__ import annotations

from portal.notify import notify_send


def request_decided_notify(request_id: int) -> None:
    """Email the requester (and call the webhook) that their request was approved or rejected."""
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
    comment = req.state_reason
    subject = f"[GPU portal] {req.project.slug}/{req.name} {decision}"
    lines = [
        f"Your request {req.name} ({req.template.name}, {req.gpus} x {req.flavor}) in project {req.project.slug} was {decision} by {by}.",
    ]
    if comment:
        lines.append(f"Comment: {comment}")
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

"""Telling everyone involved about a quota request, through the portal's notifier (``portal.notify``):
email, plus the optional JSON webhook (``settings.PORTAL_WEBHOOK_URL``).

Who and what are decided inside the service's transaction (the rows as they are then); sending
happens after commit, so a rolled-back decision notifies nobody and a slow mail server or webhook
never holds a row lock. Failures are logged, never raised: the change itself has been committed.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from portal.events import after_commit
from portal.notify import notify_send, portal_link
from portal.quantities import fmt

from .models import QuotaRequest

EVENTS = {
    "submitted": "new request",
    "approved": "approved",
    "rejected": "rejected",
    "cancelled": "cancelled",
    "reverted": "ended; the extra quota was removed",
    "lapsed": "ended before anyone decided",
}


def request_payload(request: QuotaRequest, *, event: str, actor_label: str) -> dict[str, Any]:
    return {
        "event": f"quota_request.{event}",
        "at": timezone.now().isoformat(),
        "actor": actor_label,
        "request": {
            "id": request.pk,
            "tenant": request.project.tenant.slug,
            "project": request.project.slug,
            "cluster": request.flavor.cluster.name,
            "flavor": request.flavor.name,
            "resource": request.resource,
            "amount": fmt(request.amount),
            "what": request.what,
            "share": ({"memory_mib": request.share_memory_mib, "cores_percent": request.share_cores_percent,
                       "rows": {resource: fmt(amount) for resource, amount in request.share_rows()}}
                      if request.is_share else None),
            "until": request.until.isoformat() if request.until else None,
            "reason": request.reason,
            "status": request.status,
            "approver": request.approver,
            "requested_by": request.requested_by.get_username(),
            "decided_by": request.decided_by.get_username() if request.decided_by_id else None,
            "comment": request.comment,
            "applied": request.applied or {},
        },
    }


def _message(request: QuotaRequest, *, event: str, actor_label: str) -> tuple[str, str]:
    what = f"{request.what} for {request.project.slug}"
    if request.is_share:
        what += f" ({request.share_totals} in all; approval raises the vGPU slots, cores and memory together)"
    subject = f"[GPU portal] Quota request #{request.pk}: {EVENTS.get(event, event)}"
    lines = [
        f"Quota request #{request.pk}: {what}",
        f"Status: {request.get_status_display()} ({EVENTS.get(event, event)}, by {actor_label})",
        f"Requested by: {request.requested_by.get_username()}",
        f"Decided by: {request.get_approver_display()} (who owns the headroom)",
        f"Until: {request.until.isoformat() if request.until else 'permanent'}",
        "",
        "Reason:",
        request.reason,
    ]
    if request.comment:
        lines += ["", "Comment:", request.comment]
    lines += ["", f"The quota request: {portal_link(f'/quota-requests/{request.pk}/')}"]
    return subject, "\n".join(lines) + "\n"


def quota_request_notify(*, request: QuotaRequest, event: str, actor_label: str, also: list[Any] | None = None) -> None:
    """Email the requester, the eligible approvers and ``also`` (the decider), and post the webhook,
    once the current transaction commits."""
    from .selectors import quota_request_approvers

    people = [request.requested_by, *quota_request_approvers(request=request), *(also or [])]
    addresses = sorted({p.email for p in people if p is not None and p.is_active and p.email})
    subject, body = _message(request, event=event, actor_label=actor_label)
    payload = request_payload(request, event=event, actor_label=actor_label)
    after_commit(notify_send, subject=subject, body=body, to=addresses, payload=payload, topic="quota")

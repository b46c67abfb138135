"""Telling the requester what happened to their request: email, and an optional webhook.

Called after the transaction commits; a failing mail server or webhook is logged and never undoes
or blocks the decision. ``PORTAL_WEBHOOK_URL`` (a setting, empty by default) receives a JSON POST.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

logger = logging.getLogger(__name__)


def _webhook(payload: dict[str, Any]) -> None:
    url = getattr(settings, "PORTAL_WEBHOOK_URL", "")
    if not url:
        return
    from quotas.notify import webhook_post  # one webhook client for the portal: the quota notifications' one

    webhook_post(payload)


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
    if address:
        try:
            send_mail(subject, "\n\n".join(lines), None, [address], fail_silently=False)
        except Exception:
            logger.exception("could not email %s about request %s", address, req.pk)
    _webhook(
        {
            "event": f"request.{req.state}",
            "request": req.pk,
            "name": req.name,
            "project": req.project.slug,
            "state": req.state,
            "by": by,
            "comment": comment,
            "requested_by": req.requested_by.get_username(),
        }
    )

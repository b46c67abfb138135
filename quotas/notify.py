"""Telling everyone involved about a quota request: email through Django's mail settings, plus an
optional JSON webhook (``settings.PORTAL_WEBHOOK_URL``).

Who and what are decided inside the service's transaction (the rows as they are then); sending
happens after commit, so a rolled-back decision notifies nobody and a slow mail server or webhook
never holds a row lock. Failures are logged, never raised: the change itself has been committed.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from .models import QuotaRequest

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_SECONDS = 3.0

EVENTS = {
    "submitted": "new request",
    "approved": "approved",
    "rejected": "rejected",
    "cancelled": "cancelled",
    "reverted": "ended; the extra quota was removed",
    "lapsed": "ended before anyone decided",
}


def _num(value: Any) -> str:
    from .services import fmt

    return fmt(value)


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
            "amount": _num(request.amount),
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
    what = f"+{_num(request.amount)} {request.resource} ({request.flavor.name}) for {request.project.slug}"
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
    return subject, "\n".join(lines) + "\n"


def quota_request_notify(*, request: QuotaRequest, event: str, actor_label: str, also: list[Any] | None = None) -> None:
    """Email the requester, the eligible approvers and ``also`` (the decider), and post the webhook,
    once the current transaction commits."""
    from .selectors import quota_request_approvers

    people = [request.requested_by, *quota_request_approvers(request=request), *(also or [])]
    addresses = sorted({p.email for p in people if p is not None and p.is_active and p.email})
    subject, body = _message(request, event=event, actor_label=actor_label)
    payload = request_payload(request, event=event, actor_label=actor_label)
    transaction.on_commit(lambda: notify_send(subject=subject, body=body, to=addresses, payload=payload), robust=True)


def notify_send(*, subject: str, body: str, to: list[str], payload: dict[str, Any]) -> None:
    """One email per recipient (nobody sees the others' addresses), then the webhook."""
    if to:
        try:
            messages = [EmailMessage(subject, body, settings.DEFAULT_FROM_EMAIL, [address]) for address in to]
            get_connection().send_messages(messages)
        except Exception:
            logger.exception("quota notification email failed: %s", subject)
    webhook_post(payload)


def webhook_post(payload: dict[str, Any]) -> bool:
    """POST ``payload`` as JSON to ``PORTAL_WEBHOOK_URL`` (when set). True when the hook answered 2xx."""
    url = str(getattr(settings, "PORTAL_WEBHOOK_URL", "") or "")
    if not url:
        return False
    if urlsplit(url).scheme not in ("http", "https"):
        logger.error("PORTAL_WEBHOOK_URL must be an http(s) URL; not posting to %r", url)
        return False
    data = json.dumps(payload, cls=DjangoJSONEncoder).encode("utf-8")
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json", "User-Agent": "gpu-portal"}
    )
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_SECONDS) as response:
            return 200 <= response.status < 300
    except Exception as exc:
        logger.warning("quota webhook to %s failed: %s", urlsplit(url).netloc, exc)
        return False

"""The approvers' side of requests: deciding many at once, and reminding them of what still waits.

Bulk decisions are a loop over the single decision services (``services.request_approve`` and
``request_reject``, ``extensions.extension_request_approve``/``reject``, ``quotas.services.quota_request_approve``/
``reject``): each item in its own transaction, with the same checks, locks and notifications as one click,
so one refusal (decided meanwhile, quota no longer enough, not yours to decide) never stops the others and
is reported for that item. An item the actor cannot see is reported as not found, exactly as a 404.

Reminders (``approvals_remind``, run by beat through ``tasks.approvals_remind_task``): every request still
waiting for a decision ``PORTAL_APPROVAL_REMIND_AFTER`` after it arrived, or after its last reminder, gets one
reminder to its approvers. The reminder is claimed with a compare-and-set on its ``*_reminded_at`` column
before it is sent, so two overlapping runs never remind twice in one period.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.bulk import MAX_ITEMS, BulkOutcome, Kind, decide_each
from portal.events import after_commit
from portal.exceptions import Invalid
from tenants.access import Actor

from . import extensions, notify, selectors, services
from .models import ExtensionRequest, RequestState, WorkloadRequest

S = RequestState
DECISIONS = ("approve", "reject")
KINDS = ("request", "extension_request", "quota_request")


def _kinds(actor: Actor, decision: str, comment: str) -> dict[str, Kind]:
    from quotas import services as quota_services
    from quotas.selectors import quota_requests_for

    approve = decision == "approve"
    request_call = services.request_approve if approve else services.request_reject
    extension_call = extensions.extension_request_approve if approve else extensions.extension_request_reject
    quota_call = quota_services.quota_request_approve if approve else quota_services.quota_request_reject
    return {
        "request": Kind(
            find=lambda pk: selectors.requests_for(actor=actor).filter(pk=pk).first(),
            decide=lambda item: request_call(actor=actor, request=item, comment=comment),
            describe=lambda item: (item.state, f"{item.project.slug}/{item.name}"),
        ),
        "extension_request": Kind(
            find=lambda pk: selectors.extension_requests_for(actor=actor).filter(pk=pk).first(),
            decide=lambda item: extension_call(actor=actor, extension=item, comment=comment),
            describe=lambda item: (item.status, f"{item.short} for {item.request.project.slug}/{item.request.name}"),
        ),
        "quota_request": Kind(
            find=lambda pk: quota_requests_for(actor=actor).filter(pk=pk).first(),
            decide=lambda item: quota_call(actor=actor, request=item, comment=comment),
            describe=lambda item: (item.status, f"quota request #{item.pk}"),
        ),
    }


def decide_many(*, actor: Actor, items: Iterable[tuple[str, int]], decision: str, comment: str = "") -> BulkOutcome:
    """Approve or reject each ``(kind, id)`` through its single decision service; per item: done, or why not.

    Refused as a whole (``Invalid``, nothing decided) only when the call itself is wrong: an unknown decision
    or kind, no items, too many, or a rejection without a reason (every rejection needs one).
    """
    if decision not in DECISIONS:
        raise Invalid("Choose approve or reject.", field="decision")
    wanted = list(dict.fromkeys(items))
    if any(kind not in KINDS for kind, _ in wanted):
        raise Invalid(f"Unknown kind; one of {', '.join(KINDS)}.", field="items")
    if not wanted:
        raise Invalid("Choose at least one request.", field="items")
    if len(wanted) > MAX_ITEMS:
        raise Invalid(f"At most {MAX_ITEMS} at once.", field="items")
    comment = (comment or "").strip()
    if decision == "reject" and not comment:
        raise Invalid(services.REJECT_REASON_MISSING, field="comment")
    return decide_each(decision=decision, items=wanted, kinds=_kinds(actor, decision, comment))


# Reminders ----------------------------------------------------------------------------------------------------------


def remind_after() -> timedelta | None:
    """``PORTAL_APPROVAL_REMIND_AFTER`` (seconds; settings parse "4h", "30m"...); None or 0: no reminders."""
    seconds = getattr(settings, "PORTAL_APPROVAL_REMIND_AFTER", 0) or 0
    return timedelta(seconds=int(seconds)) if seconds > 0 else None


def _due(*, created: str, reminded: str, cutoff: datetime) -> Q:
    """Waiting since before ``cutoff`` and never reminded, or last reminded before ``cutoff``."""
    return Q(**{f"{reminded}__isnull": True, f"{created}__lte": cutoff}) | Q(**{f"{reminded}__lte": cutoff})


def _claim(model: Any, pk: int, *, waiting: Q, due: Q, reminded: str, now: datetime) -> bool:
    """Compare-and-set: record the reminder of ``pk`` for this period; False when another run did already
    (or it stopped waiting). Not a status write: only the reminder's time changes."""
    return model.objects.filter(waiting, due, pk=pk).update(**{reminded: now}) == 1


def approvals_remind(*, now: datetime | None = None, after: timedelta | None = None, limit: int = 500) -> dict[str, int]:
    """Remind the approvers of every request still waiting ``after`` (default: the setting) since it arrived or
    since its last reminder. Returns how many reminders of each kind were sent. Idempotent per period."""
    from quotas.models import QuotaRequest

    after = after if after is not None else remind_after()
    if after is None:
        return {"request": 0, "extension_request": 0, "quota_request": 0}
    now = now or timezone.now()
    cutoff = now - after
    kinds: list[tuple[str, Any, Q, str, str, Callable[[int], None]]] = [
        ("request", WorkloadRequest, Q(state=S.PENDING_APPROVAL), "approval_reminded_at", "created_at",
         lambda pk: notify.request_waiting_notify(pk, reminder=True)),
        ("extension_request", ExtensionRequest, Q(status=ExtensionRequest.Status.PENDING), "reminded_at", "created_at",
         lambda pk: notify.extension_waiting_notify(pk, reminder=True)),
        ("quota_request", QuotaRequest, Q(status=QuotaRequest.Status.PENDING), "reminded_at", "created_at",
         notify.quota_request_remind_notify),
    ]
    sent = {}
    for kind, model, waiting, reminded, created, send in kinds:
        due = _due(created=created, reminded=reminded, cutoff=cutoff)
        count = 0
        for pk in list(model.objects.filter(waiting, due).order_by(created).values_list("pk", flat=True)[:limit]):
            with transaction.atomic():
                claimed = _claim(model, pk, waiting=waiting, due=due, reminded=reminded, now=now)
                if claimed:
                    after_commit(send, pk)
            count += int(claimed)
        sent[kind] = count
    return sent

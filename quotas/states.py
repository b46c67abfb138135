"""The quota request state machine: the one place that knows which status may follow which.

    pending ─┬─> approved ──> reverted   (its end date passed: what approval added is taken back)
             ├─> rejected                (by an approver, or by the system when it lapsed undecided)
             └─> cancelled               (withdrawn by the requester)

Only ``quotas/services.py`` calls ``move()``. It is a compare-and-set on the status, so of two
deciders clicking at once (or a decider and the expiry job) exactly one moves the request. The
audit log is the request's timeline: every move writes one entry, in the same transaction as the
row, with the request's snapshot before and after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from tenants.access import Actor, approvals_changed
from tenants.audit import audit_record

from .models import QuotaRequest

S = QuotaRequest.Status

ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.APPROVED, S.REJECTED, S.CANCELLED},
    S.APPROVED: {S.REVERTED},
}
FINAL: frozenset[str] = frozenset({S.REJECTED, S.CANCELLED, S.REVERTED})


def sources_of(to: str) -> list[str]:
    """The statuses from which ``to`` may be reached."""
    return sorted(status for status, targets in ALLOWED.items() if to in targets)


def can_move(current: str, to: str) -> bool:
    return to in ALLOWED.get(current, set())


def move(
    request: QuotaRequest,
    *,
    to: str,
    actor: Actor,
    action: str,
    fields: dict[str, Any] | None = None,
    where: dict[str, Any] | None = None,
    effect: Callable[[QuotaRequest], None] | None = None,
    snapshot: Callable[[QuotaRequest], dict[str, Any]] = lambda r: {"status": r.status},
) -> QuotaRequest | None:
    """Compare-and-set the request with ``request.pk`` to ``to``. None: it is no longer in a status
    that may move there (another decider or worker got there first); nothing was written then.

    On success, in one transaction: the row (``fields`` are further columns of the same UPDATE,
    ``where`` further conditions of the compare, e.g. ``until__lte``), then ``effect(request)`` (the
    quota writes of an approval or a revert, under the row lock), then one audit entry ``action``
    with ``snapshot`` of the request before and after.
    Returns the request, reloaded.
    """
    if to not in S.values:
        raise ValueError(f"Unknown quota request status {to!r}.")
    sources = sources_of(to)
    if not sources:
        raise ValueError(f"No status may move to {to!r}.")
    values = {"status": to, **(fields or {})}
    with transaction.atomic():
        # Read the current row under the lock the UPDATE takes: it is the "before" of the audit entry;
        # the filter on status is what makes this a compare-and-set.
        locked = (
            QuotaRequest.objects.select_for_update(of=("self",))
            .select_related("project__tenant", "flavor__cluster", "requested_by", "decided_by")
            .filter(pk=request.pk, status__in=sources, **(where or {}))
            .first()
        )
        if locked is None:
            return None
        before = snapshot(locked)
        won = QuotaRequest.objects.filter(pk=request.pk, status=locked.status).update(**values) == 1
        if not won:  # pragma: no cover - the lock above makes this unreachable on PostgreSQL
            return None
        for name, value in values.items():
            setattr(locked, name, value)
        if effect is not None:
            effect(locked)
        locked = (
            QuotaRequest.objects.select_related("project__tenant", "flavor__cluster", "requested_by", "decided_by")
            .get(pk=request.pk)
        )
        audit_record(actor=actor, action=action, target=locked, tenant=locked.project.tenant, project=locked.project,
                     before=before, after=snapshot(locked))
        approvals_changed()
    return locked


def current_status(request_id: int) -> str | None:
    return QuotaRequest.objects.filter(pk=request_id).values_list("status", flat=True).first()

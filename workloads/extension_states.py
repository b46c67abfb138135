"""The extension request state machine: the one place that knows which status may follow which.

    pending ─┬─> approved    (an approver granted the hours or replicas; the request runs longer, or is scaled)
             ├─> rejected    (an approver said no, and why)
             ├─> cancelled   (the requester withdrew it)
             └─> lapsed      (the request ended before anyone decided)

Only ``workloads/extensions.py`` calls ``move()``. It is a compare-and-set on the status (an UPDATE
filtered on it, under the row lock), so of two approvers clicking at once, or an approver and the
requester's cancel, exactly one moves it. Every move writes the row, a timeline entry on the request
it extends and an audit entry, in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from tenants.access import Actor, approvals_changed
from tenants.audit import audit_record

from .models import ExtensionRequest, RequestEvent

S = ExtensionRequest.Status

ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.APPROVED, S.REJECTED, S.CANCELLED, S.LAPSED},
}
FINAL: frozenset[str] = frozenset({S.APPROVED, S.REJECTED, S.CANCELLED, S.LAPSED})


def sources_of(to: str) -> list[str]:
    """The statuses from which ``to`` may be reached."""
    return sorted(status for status, targets in ALLOWED.items() if to in targets)


def can_move(current: str, to: str) -> bool:
    return to in ALLOWED.get(current, set())


def move(
    extension: ExtensionRequest,
    *,
    to: str,
    actor: Actor,
    message: str,
    fields: dict[str, Any] | None = None,
    effect: Callable[[ExtensionRequest], None] | None = None,
) -> ExtensionRequest | None:
    """Compare-and-set the extension request with ``extension.pk`` to ``to``. None: it is no longer in a
    status that may move there (someone else decided, or it was withdrawn); nothing was written then.

    On success, in one transaction: the row (``fields`` are further columns of the same UPDATE), then
    ``effect(extension)`` (an approval's extension of the request, under the row lock; raising rolls
    everything back), a timeline entry ``message`` on the request, and an audit entry
    ``extension_request.<to>``. Returns the extension request, reloaded.
    """
    if to not in S.values:
        raise ValueError(f"Unknown extension request status {to!r}.")
    sources = sources_of(to)
    if not sources:
        raise ValueError(f"No status may move to {to!r}.")
    values = {"status": to, **(fields or {})}
    with transaction.atomic():
        locked = (
            ExtensionRequest.objects.select_for_update(of=("self",))
            .select_related("request__project__tenant", "request__template", "request__flavor", "requested_by")
            .filter(pk=extension.pk, status__in=sources)
            .first()
        )
        if locked is None:
            return None
        current = locked.status
        won = ExtensionRequest.objects.filter(pk=locked.pk, status=current).update(**values) == 1
        if not won:  # pragma: no cover - the lock above makes this unreachable on PostgreSQL
            return None
        for name, value in values.items():
            setattr(locked, name, value)
        if effect is not None:
            effect(locked)
        req = locked.request
        RequestEvent.objects.create(request=req, actor_label=actor.label[:200], message=message[:1000])
        audit_record(
            actor=actor, action=f"extension_request.{to}", target=locked, tenant=req.project.tenant, project=req.project,
            before={"status": current}, after={"status": to, "hours": locked.hours, "replicas": locked.replicas,
                   "comment": locked.comment[:500]},
        )
        approvals_changed()
    return (
        ExtensionRequest.objects.select_related("request__project__tenant", "request__template", "request__flavor",
                                                "requested_by", "decided_by")
        .get(pk=extension.pk)
    )


def current_status(extension_id: int) -> str | None:
    return ExtensionRequest.objects.filter(pk=extension_id).values_list("status", flat=True).first()

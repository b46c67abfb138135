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

from portal.machine import Machine, Move
from tenants.access import Actor, approvals_changed
from tenants.audit import audit_record

from .models import ExtensionRequest, RequestEvent

S = ExtensionRequest.Status


def _timeline(move: Move) -> None:
    """The timeline entry on the request it extends, then the approvers' counts."""
    RequestEvent.objects.create(request=move.obj.request, actor_label=move.actor.label[:200],
                                message=move.context["message"][:1000])
    approvals_changed()


MACHINE = Machine(
    ExtensionRequest, field="status", audit_as="extension_request", record=audit_record,
    allowed={S.PENDING: {S.APPROVED, S.REJECTED, S.CANCELLED, S.LAPSED}},
    final={S.APPROVED, S.REJECTED, S.CANCELLED, S.LAPSED},
    scope=lambda e: (e.request.project.tenant, e.request.project),
    describe=lambda e: {"hours": e.hours, "replicas": e.replicas, "comment": e.comment[:500]},
    related=("request__project__tenant", "request__template", "request__flavor", "requested_by", "decided_by"),
    reload=True, effects=[_timeline],
)
ALLOWED, FINAL = MACHINE.allowed, MACHINE.final
sources_of, can_move, current_status = MACHINE.sources_of, MACHINE.can_move, MACHINE.current


def move(extension: ExtensionRequest, *, to: str, actor: Actor, message: str, fields: dict[str, Any] | None = None,
         effect: Callable[[ExtensionRequest], None] | None = None) -> ExtensionRequest | None:
    """Compare-and-set the extension request to ``to``; None when it no longer may (someone else decided, or it
    was withdrawn). In one transaction: the row (``fields``: further columns), ``effect(extension)`` (an
    approval's extension of the request, under the row lock; raising rolls everything back), a timeline entry
    ``message`` on the request and an audit entry ``extension_request.<to>``. Returns it, reloaded."""
    return MACHINE.move(extension, to=to, actor=actor, fields=fields, effect=effect, context={"message": message})

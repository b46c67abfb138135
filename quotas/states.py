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

from portal.machine import Machine
from tenants.access import Actor, approvals_changed
from tenants.audit import audit_record

from .models import QuotaRequest

S = QuotaRequest.Status

MACHINE = Machine(
    QuotaRequest, field="status", audit_as="quota_request", record=audit_record,
    allowed={S.PENDING: {S.APPROVED, S.REJECTED, S.CANCELLED}, S.APPROVED: {S.REVERTED}},
    final={S.REJECTED, S.CANCELLED, S.REVERTED},
    scope=lambda r: (r.project.tenant, r.project), snapshot=lambda r: {"status": r.status}, reload=True,
    related=("project__tenant", "flavor__cluster", "requested_by", "decided_by"),
    effects=[lambda move: approvals_changed()],  # the quota inboxes' counts
)
ALLOWED, FINAL = MACHINE.allowed, MACHINE.final
sources_of, can_move, current_status = MACHINE.sources_of, MACHINE.can_move, MACHINE.current


def move(request: QuotaRequest, *, to: str, actor: Actor, action: str, fields: dict[str, Any] | None = None,
         where: dict[str, Any] | None = None, effect: Callable[[QuotaRequest], None] | None = None,
         snapshot: Callable[[QuotaRequest], dict[str, Any]] | None = None) -> QuotaRequest | None:
    """Compare-and-set the request to ``to``; None when it no longer may (nothing written). In one transaction: the
    row (``fields``: further columns, ``where``: further conditions of the compare, e.g. ``until__lte``), then
    ``effect(request)`` (the quota writes of an approval or a revert, under the row lock), then one audit entry
    ``action`` with ``snapshot`` of the request before and after. Returns the request, reloaded."""
    return MACHINE.move(request, to=to, actor=actor, action=action, fields=fields, where=where, effect=effect,
                        snapshot=snapshot)

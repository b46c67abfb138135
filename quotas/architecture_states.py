"""The architecture change state machine: the one place that knows which state may follow which.

    requested ──> applying ─┬─> applied
        │                   └─> failed
        └──────────────────────> failed   (the task could not start it: the cluster or the plan changed)

Only ``quotas/architecture.py`` calls ``move()``. It is a compare-and-set on the state, so two
workers handed the same change (a redelivered task) never both apply it. The change row is its own
timeline (created, started, finished, the reason of the last move); every move also writes one audit
entry in the same transaction.
"""

from __future__ import annotations

from typing import Any

from portal.machine import NOW, Machine
from tenants.access import Actor
from tenants.audit import audit_record

from .models import ArchitectureChange

S = ArchitectureChange.State
FINAL: frozenset[str] = frozenset({S.APPLIED, S.FAILED})

MACHINE = Machine(
    ArchitectureChange, field="state", audit_as="architecture_change", record=audit_record,
    allowed={S.REQUESTED: {S.APPLYING, S.FAILED}, S.APPLYING: {S.APPLIED, S.FAILED}},
    final=FINAL,
    stamps={S.APPLYING: {"started_at": NOW}, FINAL: {"finished_at": NOW}},
    reason_field="state_reason", reason_length=2000,
    describe=lambda change: {"architecture": change.to_architecture},
)
ALLOWED = MACHINE.allowed
IN_PROGRESS: frozenset[str] = frozenset({S.REQUESTED, S.APPLYING})
sources_of, can_move = MACHINE.sources_of, MACHINE.can_move


def move(change: ArchitectureChange, *, to: str, actor: Actor, reason: str = "",
         fields: dict[str, Any] | None = None) -> bool:
    """Compare-and-set ``change`` to ``to``. False: it is no longer in a state that may move there; nothing was
    written then. On success the row and an audit entry ``architecture_change.<to>`` are written in one
    transaction, and ``change`` is updated in memory."""
    return MACHINE.move(change, to=to, actor=actor, reason=reason, fields=fields) is not None

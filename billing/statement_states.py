"""The statement state machine: a tenant's month is a draft, recomputed on request, until the month is finalised.

    draft ──> final   (the month closed: numbered, never changed again; billing/models.py refuses writes)

Only ``billing/statements.py:finalise_month`` moves statements, all of a month at once under the month's lock:
one compare-and-set UPDATE (``portal.machine.Machine.move_many``) gives each draft its number and stamps
``finalised_at``. The month's finalisation is audited once (``billing.statements_finalise``), not per statement.
"""

from __future__ import annotations

from datetime import datetime

from portal.machine import NOW, Machine
from tenants.audit import audit_record

from .models import Statement

S = Statement.Status

MACHINE = Machine(
    Statement, field="status", audit_as="statement", record=audit_record,
    allowed={S.DRAFT: {S.FINAL}}, final={S.FINAL}, stamps={S.FINAL: {"finalised_at": NOW}},
    scope=lambda statement: (statement.tenant, None),
)
ALLOWED, FINAL = MACHINE.allowed, MACHINE.final
can_move = MACHINE.can_move


def finalise(drafts: list[Statement], *, numbers: dict[int, str], now: datetime) -> list[Statement]:
    """Move ``drafts`` to final with their ``numbers`` (statement pk -> number) and ``finalised_at = now``. Returns
    the statements that moved (a statement no longer a draft is left as it is)."""
    each = {pk: {"number": number} for pk, number in numbers.items()}
    return MACHINE.move_many(drafts, to=S.FINAL, fields_each=each, now=now)

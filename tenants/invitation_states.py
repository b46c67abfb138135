"""The invitation state machine: the one place that knows which status may follow which.

    pending ─┬─> accepted   (someone with the link signed in or signed up and took the role)
             ├─> expired    (its link outlived ``PORTAL_INVITATION_DAYS``)
             └─> revoked    (an admin withdrew it)
    expired ─┬─> pending    (an admin sent it again: a new link, a new expiry)
             └─> revoked

Only ``tenants/services.py`` calls ``move()``. It is a compare-and-set on the status, so of two
people using the same link at once (or an admin revoking it while it is accepted) exactly one wins.
Every move writes one audit entry in the same transaction as the row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from portal.machine import Machine

from .access import Actor
from .audit import audit_record
from .models import Invitation

S = Invitation.Status

INVITATION_FIELDS = ["email", "tenant", "project", "role", "status", "expires_at", "send_count"]


def invitation_snapshot(invitation: Invitation) -> dict[str, Any]:
    """What the audit log keeps of an invitation (never the link's secret or its hash)."""
    return {
        "email": invitation.email,
        "tenant": invitation.tenant.slug,
        "project": invitation.project.slug if invitation.project_id else None,
        "role": invitation.role,
        "status": invitation.status,
        "expires_at": invitation.expires_at.isoformat() if invitation.expires_at else None,
        "send_count": invitation.send_count,
    }


MACHINE = Machine(
    Invitation, field="status", audit_as="invitation", record=audit_record,
    allowed={S.PENDING: {S.ACCEPTED, S.EXPIRED, S.REVOKED}, S.EXPIRED: {S.PENDING, S.REVOKED}},
    final={S.ACCEPTED, S.REVOKED},
    scope=lambda i: (i.tenant, i.project), snapshot=invitation_snapshot, reload=True,
    related=("tenant", "project", "invited_by", "accepted_by"),
)
ALLOWED, FINAL = MACHINE.allowed, MACHINE.final
sources_of, can_move = MACHINE.sources_of, MACHINE.can_move


def move(invitation: Invitation, *, to: str, actor: Actor, action: str, fields: dict[str, Any] | None = None,
         where: dict[str, Any] | None = None, effect: Callable[[Invitation], None] | None = None) -> Invitation | None:
    """Compare-and-set the invitation to ``to``; None when it no longer may (someone else got there first). In one
    transaction: the row (``fields``: further columns, ``where``: further conditions of the compare), then
    ``effect(invitation)`` (the membership of an acceptance, under the row lock), then one audit entry ``action``
    with the invitation before and after. Returns it, reloaded."""
    return MACHINE.move(invitation, to=to, actor=actor, action=action, fields=fields, where=where, effect=effect)

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

from django.db import transaction

from .access import Actor
from .audit import audit_record
from .models import Invitation

S = Invitation.Status

ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.ACCEPTED, S.EXPIRED, S.REVOKED},
    S.EXPIRED: {S.PENDING, S.REVOKED},
}
FINAL: frozenset[str] = frozenset({S.ACCEPTED, S.REVOKED})

INVITATION_FIELDS = ["email", "tenant", "project", "role", "status", "expires_at", "send_count"]


def sources_of(to: str) -> list[str]:
    """The statuses from which ``to`` may be reached."""
    return sorted(status for status, targets in ALLOWED.items() if to in targets)


def can_move(current: str, to: str) -> bool:
    return to in ALLOWED.get(current, set())


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


def move(
    invitation: Invitation,
    *,
    to: str,
    actor: Actor,
    action: str,
    fields: dict[str, Any] | None = None,
    where: dict[str, Any] | None = None,
    effect: Callable[[Invitation], None] | None = None,
) -> Invitation | None:
    """Compare-and-set the invitation with ``invitation.pk`` to ``to``. None: it is no longer in a
    status that may move there (someone else got there first); nothing was written then.

    In one transaction: the row (``fields`` are further columns of the same UPDATE, ``where`` further
    conditions of the compare), then ``effect(invitation)`` (the membership of an acceptance, under
    the row lock), then one audit entry ``action`` with the invitation before and after.
    """
    if to not in S.values:
        raise ValueError(f"Unknown invitation status {to!r}.")
    sources = sources_of(to)
    if not sources:
        raise ValueError(f"No status may move to {to!r}.")
    values = {"status": to, **(fields or {})}
    with transaction.atomic():
        locked = (
            Invitation.objects.select_for_update(of=("self",)).select_related("tenant", "project")
            .filter(pk=invitation.pk, status__in=sources, **(where or {})).first()
        )
        if locked is None:
            return None
        before = invitation_snapshot(locked)
        won = Invitation.objects.filter(pk=locked.pk, status=locked.status).update(**values) == 1
        if not won:  # pragma: no cover - the lock above makes this unreachable on PostgreSQL
            return None
        for name, value in values.items():
            setattr(locked, name, value)
        if effect is not None:
            effect(locked)
        locked = Invitation.objects.select_related("tenant", "project", "invited_by", "accepted_by").get(pk=locked.pk)
        audit_record(actor=actor, action=action, target=locked, tenant=locked.tenant, project=locked.project,
                     before=before, after=invitation_snapshot(locked))
    return locked

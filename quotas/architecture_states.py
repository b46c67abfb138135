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

from django.db import transaction
from django.utils import timezone

from tenants.access import Actor
from tenants.audit import audit_record

from .models import ArchitectureChange

S = ArchitectureChange.State

ALLOWED: dict[str, set[str]] = {
    S.REQUESTED: {S.APPLYING, S.FAILED},
    S.APPLYING: {S.APPLIED, S.FAILED},
}
FINAL: frozenset[str] = frozenset({S.APPLIED, S.FAILED})
IN_PROGRESS: frozenset[str] = frozenset({S.REQUESTED, S.APPLYING})


def sources_of(to: str) -> list[str]:
    return sorted(state for state, targets in ALLOWED.items() if to in targets)


def can_move(current: str, to: str) -> bool:
    return to in ALLOWED.get(current, set())


def _timestamps(to: str, now: Any) -> dict[str, Any]:
    if to == S.APPLYING:
        return {"started_at": now}
    if to in FINAL:
        return {"finished_at": now}
    return {}


def move(change: ArchitectureChange, *, to: str, actor: Actor, reason: str = "",
         fields: dict[str, Any] | None = None) -> bool:
    """Compare-and-set ``change`` to ``to``. False: it is no longer in a state that may move there;
    nothing was written then. On success the row and an audit entry ``architecture_change.<to>`` are
    written in one transaction, and ``change`` is updated in memory."""
    if to not in S.values:
        raise ValueError(f"Unknown architecture change state {to!r}.")
    sources = sources_of(to)
    if not sources:
        raise ValueError(f"No state may move to {to!r}.")
    values: dict[str, Any] = {"state": to, "state_reason": reason[:2000], **_timestamps(to, timezone.now()),
                              **(fields or {})}
    with transaction.atomic():
        current = (
            ArchitectureChange.objects.select_for_update()
            .filter(pk=change.pk, state__in=sources)
            .values_list("state", flat=True)
            .first()
        )
        if current is None:
            return False
        won = ArchitectureChange.objects.filter(pk=change.pk, state=current).update(**values) == 1
        if not won:  # pragma: no cover - the lock above makes this unreachable on PostgreSQL
            return False
        after: dict[str, Any] = {"state": to, "architecture": change.to_architecture}
        if reason:
            after["reason"] = reason[:500]
        audit_record(actor=actor, action=f"architecture_change.{to}", target=change,
                     before={"state": current}, after=after)
    for name, value in values.items():
        setattr(change, name, value)
    return True

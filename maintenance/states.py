"""The MIG change state machine: the one place that writes a change's ``status`` and ``step``.

    proposed ──> approved ──> running ──> succeeded
       │  │         │           │
       │  │         │           └──> rolling_back ──> rolled_back
       │  │         │           └──> failed                └──> failed
       │  └─────────┴──> cancelled
       └──> rejected

Inside ``running`` the ``step`` goes cordon → drain → relabel → reconfigure → verify → quotas → uncordon;
inside ``rolling_back`` rollback_relabel → rollback_wait → rollback_uncordon (docs/mig-changes.md).

``move()`` is a compare-and-set on the status (and ``step_to()`` on status and step), under the row's lock:
of two workers handed the same change (a redelivered task, the beat sweep overlapping a re-queue) exactly one
moves it; the loser writes nothing. Every move writes a step log row (``MigChangeStep``) and an audit entry
``mig_change.<status>`` / ``mig_change.step`` in the same transaction.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from portal.events import after_commit
from tenants.access import Actor
from tenants.audit import audit_record

from .models import MigChange, MigChangeStep

S = MigChange.Status
STEP = MigChange.Step
O = MigChangeStep.Outcome

ALLOWED: dict[str, set[str]] = {
    S.PROPOSED: {S.APPROVED, S.REJECTED, S.CANCELLED},
    S.APPROVED: {S.RUNNING, S.CANCELLED},
    S.RUNNING: {S.SUCCEEDED, S.ROLLING_BACK, S.FAILED},
    S.ROLLING_BACK: {S.ROLLED_BACK, S.FAILED},
}
FINAL: frozenset[str] = frozenset({S.SUCCEEDED, S.ROLLED_BACK, S.FAILED, S.REJECTED, S.CANCELLED})
OPEN: frozenset[str] = frozenset({S.PROPOSED, S.APPROVED, S.RUNNING, S.ROLLING_BACK})
ACTIVE: frozenset[str] = frozenset({S.RUNNING, S.ROLLING_BACK})  # the worker moves these on
FORWARD: list[str] = [STEP.CORDON, STEP.DRAIN, STEP.RELABEL, STEP.RECONFIGURE, STEP.VERIFY, STEP.QUOTAS, STEP.UNCORDON]
BACKWARD: list[str] = [STEP.ROLLBACK_RELABEL, STEP.ROLLBACK_WAIT, STEP.ROLLBACK_UNCORDON]


def sources_of(to: str) -> list[str]:
    return sorted(state for state, targets in ALLOWED.items() if to in targets)


def can_move(current: str, to: str) -> bool:
    return to in ALLOWED.get(current, set())


def progress_of(step: str) -> int:
    """Percent done when ``step`` starts (forward steps; a rollback counts its own steps)."""
    if step in FORWARD:
        return FORWARD.index(step) * 100 // len(FORWARD)
    if step in BACKWARD:
        return BACKWARD.index(step) * 100 // len(BACKWARD)
    return 100 if step == STEP.DONE else 0


def _timestamps(to: str, now: Any) -> dict[str, Any]:
    if to == S.RUNNING:
        return {"started_at": now}
    if to in FINAL:
        return {"finished_at": now}
    return {}


def log(change: MigChange, *, step: str, outcome: str, message: str, detail: dict[str, Any] | None = None) -> MigChangeStep:
    """Append a line to the change's step log (not a state write). Its ``seq`` is the next in the change's log,
    taken under the change's row lock, so the log reads in the order it was written whatever the clocks say."""
    with transaction.atomic():
        MigChange.objects.select_for_update().filter(pk=change.pk).values_list("pk", flat=True).first()
        last = MigChangeStep.objects.filter(change_id=change.pk).aggregate(m=Max("seq"))["m"] or 0
        return MigChangeStep.objects.create(change=change, step=step, outcome=outcome, message=message[:1000],
                                            detail=detail or {}, seq=last + 1)


def move(change: MigChange, *, to: str, actor: Actor, reason: str = "", step: str | None = None,
         fields: dict[str, Any] | None = None, done: tuple[str, str] | None = None) -> bool:
    """Compare-and-set ``change.status`` to ``to`` (optionally starting ``step``). False: it is no longer in a
    status that may move there; nothing was written. On success: the row, a log line and an audit entry.
    ``done``: (step, message) of the step this move finishes, logged as done before the status line, so the log
    reads "Uncordon · done" and then "Succeeded"."""
    if to not in S.values:
        raise ValueError(f"Unknown MIG change status {to!r}.")
    sources = sources_of(to)
    if not sources:
        raise ValueError(f"No status may move to {to!r}.")
    now = timezone.now()
    values: dict[str, Any] = {"status": to, "status_reason": reason[:2000], **_timestamps(to, now), **(fields or {})}
    if step is not None:
        values.update(step=step, step_started_at=now, progress=progress_of(step))
    if to == S.SUCCEEDED:
        values.update(step=STEP.DONE, progress=100)
    with transaction.atomic():
        current = (MigChange.objects.select_for_update().filter(pk=change.pk, status__in=sources)
                   .values_list("status", flat=True).first())
        if current is None:
            return False
        won = MigChange.objects.filter(pk=change.pk, status=current).update(**values) == 1
        if not won:  # pragma: no cover - the lock above makes this unreachable on PostgreSQL
            return False
        for name, value in values.items():
            setattr(change, name, value)
        after: dict[str, Any] = {"status": to, "pool": change.pool_name, "to_layout": change.to_layout}
        if step is not None:
            after["step"] = step
        if reason:
            after["reason"] = reason[:500]
        audit_record(actor=actor, action=f"mig_change.{to}", target=change, tenant=change.tenant,
                     before={"status": current}, after=after)
        if done is not None:
            log(change, step=done[0], outcome=O.DONE, message=done[1])
        failed = to in (S.FAILED, S.ROLLING_BACK, S.REJECTED)
        log(change, step=change.step, outcome=O.FAILED if failed else O.INFO,
            message=f"{S(to).label}" + (f": {reason}" if reason else "."))
        after_commit(notices_forget)  # the quota pages' notices (notices.py) read the new status
    return True


def notices_forget() -> None:
    from .notices import cutting_changes_forget

    cutting_changes_forget()


def step_to(change: MigChange, *, step: str, actor: Actor, message: str, expect_step: str,
            detail: dict[str, Any] | None = None, fields: dict[str, Any] | None = None) -> bool:
    """Compare-and-set the step of an active change from ``expect_step`` to ``step`` (status unchanged).
    False when another worker moved it first (nothing written)."""
    if step not in STEP.values:
        raise ValueError(f"Unknown MIG change step {step!r}.")
    now = timezone.now()
    values: dict[str, Any] = {"step": step, "step_started_at": now, "progress": progress_of(step), **(fields or {})}
    with transaction.atomic():
        locked = (MigChange.objects.select_for_update()
                  .filter(pk=change.pk, status__in=ACTIVE, step=expect_step).values_list("status", flat=True).first())
        if locked is None:
            return False
        MigChange.objects.filter(pk=change.pk).update(**values)
        for name, value in values.items():
            setattr(change, name, value)
        log(change, step=expect_step, outcome=O.DONE, message=message, detail=detail)
        log(change, step=step, outcome=O.STARTED, message=STEP(step).label + ".")
        audit_record(actor=actor, action="mig_change.step", target=change, tenant=change.tenant,
                     before={"step": expect_step}, after={"step": step, "message": message[:500]})
    return True


def progress_set(change: MigChange, *, progress: int, expect_step: str) -> None:
    """Within-step progress (e.g. 1 of 2 nodes reconfigured); not audited, not a status."""
    MigChange.objects.filter(pk=change.pk, step=expect_step).update(progress=max(0, min(100, progress)))
    change.progress = progress

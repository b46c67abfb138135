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
from portal.machine import NOW, Machine, Move
from tenants.access import Actor
from tenants.audit import audit_record

from .models import MigChange, MigChangeStep

S = MigChange.Status
STEP = MigChange.Step
O = MigChangeStep.Outcome

FINAL: frozenset[str] = frozenset({S.SUCCEEDED, S.ROLLED_BACK, S.FAILED, S.REJECTED, S.CANCELLED})
OPEN: frozenset[str] = frozenset({S.PROPOSED, S.APPROVED, S.RUNNING, S.ROLLING_BACK})
ACTIVE: frozenset[str] = frozenset({S.RUNNING, S.ROLLING_BACK})  # the worker moves these on
FORWARD: list[str] = [STEP.CORDON, STEP.DRAIN, STEP.RELABEL, STEP.RECONFIGURE, STEP.VERIFY, STEP.QUOTAS, STEP.UNCORDON]
BACKWARD: list[str] = [STEP.ROLLBACK_RELABEL, STEP.ROLLBACK_WAIT, STEP.ROLLBACK_UNCORDON]


def progress_of(step: str) -> int:
    """Percent done when ``step`` starts (forward steps; a rollback counts its own steps)."""
    if step in FORWARD:
        return FORWARD.index(step) * 100 // len(FORWARD)
    if step in BACKWARD:
        return BACKWARD.index(step) * 100 // len(BACKWARD)
    return 100 if step == STEP.DONE else 0


def log(change: MigChange, *, step: str, outcome: str, message: str, detail: dict[str, Any] | None = None) -> MigChangeStep:
    """Append a line to the change's step log (not a state write). Its ``seq`` is the next in the change's log,
    taken under the change's row lock, so the log reads in the order it was written whatever the clocks say."""
    with transaction.atomic():
        MigChange.objects.select_for_update().filter(pk=change.pk).values_list("pk", flat=True).first()
        last = MigChangeStep.objects.filter(change_id=change.pk).aggregate(m=Max("seq"))["m"] or 0
        return MigChangeStep.objects.create(change=change, step=step, outcome=outcome, message=message[:1000],
                                            detail=detail or {}, seq=last + 1)


def _step_log(move: Move) -> None:
    """The step log's lines of a status move (the finished step first, then the status), and the quota notices."""
    change, done = move.obj, move.context.get("done")
    if done is not None:
        log(change, step=done[0], outcome=O.DONE, message=done[1])
    failed = move.to in (S.FAILED, S.ROLLING_BACK, S.REJECTED)
    log(change, step=change.step, outcome=O.FAILED if failed else O.INFO,
        message=f"{S(move.to).label}" + (f": {move.reason}" if move.reason else "."))
    after_commit(notices_forget)  # the quota pages' notices (notices.py) read the new status


MACHINE = Machine(
    MigChange, field="status", audit_as="mig_change", record=audit_record,
    allowed={S.PROPOSED: {S.APPROVED, S.REJECTED, S.CANCELLED}, S.APPROVED: {S.RUNNING, S.CANCELLED},
             S.RUNNING: {S.SUCCEEDED, S.ROLLING_BACK, S.FAILED}, S.ROLLING_BACK: {S.ROLLED_BACK, S.FAILED}},
    final=FINAL, stamps={S.RUNNING: {"started_at": NOW}, S.SUCCEEDED: {"finished_at": NOW, "step": STEP.DONE, "progress": 100},
                         FINAL: {"finished_at": NOW}},
    reason_field="status_reason", reason_length=2000, effects=[_step_log],
    scope=lambda change: (change.tenant, None),
    describe=lambda change: {"pool": change.pool_name, "to_layout": change.to_layout},
)
ALLOWED = MACHINE.allowed
sources_of, can_move = MACHINE.sources_of, MACHINE.can_move


def move(change: MigChange, *, to: str, actor: Actor, reason: str = "", step: str | None = None,
         fields: dict[str, Any] | None = None, done: tuple[str, str] | None = None) -> bool:
    """Compare-and-set ``change.status`` to ``to`` (optionally starting ``step``). False: it is no longer in a
    status that may move there; nothing was written. On success: the row, a log line and an audit entry.
    ``done``: (step, message) of the step this move finishes, logged as done before the status line, so the log
    reads "Uncordon · done" and then "Succeeded"."""
    extra = dict(fields or {})
    if step is not None:
        extra.update(step=step, step_started_at=timezone.now(), progress=progress_of(step))
    return MACHINE.move(change, to=to, actor=actor, reason=reason, fields=extra, context={"done": done},
                        detail={"step": step} if step is not None else None) is not None


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

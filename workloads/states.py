"""The request state machine: the one place that knows which state may follow which.

    submitted ─┬─> pending_approval ─┬─> approved ──> queued ──> running ──> succeeded | failed | stopped
               │                     └─> rejected            ^  │    ^        expired
               └─> approved                                  │  v    │
                                                             preempted (requeued by the cluster)

cancelled is reachable from every state before running; stopped, failed and expired from the
active ones; a stopped or failed request may be restarted (back to approved). Only services and
the cluster-status watcher call ``move()``; it is a compare-and-set, so two workers (or a worker
and a user's cancel) can never both move one request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from django.db import transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from tenants.access import Actor, approvals_changed
from tenants.audit import audit_append, audit_entry

from .models import RequestEvent, RequestState, WorkloadRequest

S = RequestState

ALLOWED: dict[str, set[str]] = {
    S.SUBMITTED: {S.PENDING_APPROVAL, S.APPROVED, S.REJECTED, S.CANCELLED},
    S.PENDING_APPROVAL: {S.APPROVED, S.REJECTED, S.CANCELLED, S.EXPIRED},
    # approved: the portal is creating the cluster objects. The watcher may see it running (or even
    # finished) before it ever saw it queued, so those edges exist too.
    S.APPROVED: {S.QUEUED, S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.STOPPED, S.EXPIRED},
    S.QUEUED: {S.RUNNING, S.SUCCEEDED, S.FAILED, S.STOPPED, S.CANCELLED, S.EXPIRED, S.PREEMPTED},
    S.RUNNING: {S.SUCCEEDED, S.FAILED, S.STOPPED, S.EXPIRED, S.PREEMPTED},
    S.PREEMPTED: {S.QUEUED, S.RUNNING, S.SUCCEEDED, S.FAILED, S.STOPPED, S.EXPIRED},
    # restart: the objects are created again from the same (already approved) request.
    S.STOPPED: {S.APPROVED},
    S.FAILED: {S.APPROVED},
}

# States in which the request holds (or is about to hold) cluster capacity.
ACTIVE: frozenset[str] = frozenset({S.APPROVED, S.QUEUED, S.RUNNING, S.PREEMPTED})
# Nothing more happens to these by itself.
FINAL: frozenset[str] = frozenset({S.SUCCEEDED, S.FAILED, S.STOPPED, S.REJECTED, S.CANCELLED, S.EXPIRED})
# A cancel is only possible before the request ever ran.
CANCELLABLE: frozenset[str] = frozenset({S.SUBMITTED, S.PENDING_APPROVAL, S.APPROVED, S.QUEUED})
# Waiting for something: the request page answers "why is it pending?" for these.
WAITING: frozenset[str] = frozenset({S.SUBMITTED, S.PENDING_APPROVAL, S.APPROVED, S.QUEUED, S.PREEMPTED})


def sources_of(to: str) -> list[str]:
    """The states from which ``to`` may be reached."""
    return sorted(state for state, targets in ALLOWED.items() if to in targets)


def can_move(current: str, to: str) -> bool:
    return to in ALLOWED.get(current, set())


@dataclass(frozen=True)
class LabelledActor(Actor):
    """A non-user cause (an approval rule, the cluster watcher) that still has a name in the audit log."""

    name: str = "system"

    @property
    def label(self) -> str:
        return self.name


def _timestamps(to: str, now: Any) -> dict[str, Any]:
    if to == S.APPROVED:
        # Also a restart: the request starts a new run, so the old end (and admissions) no longer apply.
        return {"approved_at": now, "finished_at": None, "admitted_at": None, "first_admitted_at": None}
    if to == S.QUEUED:
        return {"queued_at": now}
    if to == S.RUNNING:
        return {"started_at": now}
    if to == S.PREEMPTED:
        # The run lost its admission; the follower stamps the next one (``first_admitted_at`` stays).
        return {"admitted_at": None}
    if to in FINAL:
        return {"finished_at": now}
    return {}


def move_records(
    request: WorkloadRequest, *, from_state: str, to: str, actor_label: str, reason: str = "", actor: Actor | None = None,
) -> tuple[RequestEvent, Any]:
    """The timeline entry and the audit entry (both unsaved) of ``request`` moving ``from_state`` → ``to``."""
    event = RequestEvent(
        request_id=request.pk,
        from_state=from_state,
        to_state=to,
        actor_label=actor_label[:200],
        message=(reason or f"{from_state} → {to}")[:1000],
    )
    audit_actor = actor if actor is not None else LabelledActor(user=None, name=actor_label[:200])
    entry = audit_entry(
        actor=audit_actor,
        action=f"request.{to}",
        target=request,
        tenant=request.tenant,
        project=request.project,
        before={"state": from_state},
        after={"state": to, "reason": reason[:500]} if reason else {"state": to},
    )
    return event, entry


def first_state(request: WorkloadRequest, *, to: str, reason: str, fields: dict[str, Any] | None = None) -> None:
    """Put a new, unsaved request straight into the state its submission leads to (``submitted`` → ``to``).

    The row is inserted in that state, so no compare-and-set is needed (nobody else can see it yet); the
    service writes the timeline and audit entries of both steps (``move_records``) with the row.
    """
    if not can_move(S.SUBMITTED, to):
        raise ValueError(f"A new request cannot move to {to!r}.")
    now = timezone.now()
    values: dict[str, Any] = {"state": to, "state_reason": reason[:500], "pending_reason": "", **_timestamps(to, now)}
    values.update(fields or {})
    for name, value in values.items():
        setattr(request, name, value)


def move(
    request: WorkloadRequest,
    *,
    to: str,
    actor_label: str,
    reason: str = "",
    actor: Actor | None = None,
    fields: dict[str, Any] | None = None,
    only_from: Iterable[str] | None = None,
) -> bool:
    """Compare-and-set ``request`` to ``to``. False: it is no longer in a state that may move there
    (another worker, an approver or a cancel got there first); nothing was written then.

    On success the row, a timeline entry and an audit entry are written in one transaction, and
    ``request`` is updated in memory. ``fields`` are further columns to set in the same UPDATE
    (``approved_by``, ``pending_reason``...). ``only_from`` narrows the allowed sources for this
    move (an approval moves pending requests only, though a restart also reaches approved).
    ``actor`` is the user behind the move, if any; ``actor_label`` says who or what caused it
    ("alice", "approval rule", "cluster").
    """
    if to not in RequestState.values:
        raise ValueError(f"Unknown request state {to!r}.")
    sources = sources_of(to)
    if only_from is not None:
        sources = [state for state in sources if state in set(only_from)]
    if not sources:
        raise ValueError(f"No state may move to {to!r}" + (f" from {sorted(only_from)}." if only_from is not None else "."))
    now = timezone.now()
    # A pending reason describes the state it was written for; a move clears it unless it brings one.
    values: dict[str, Any] = {
        "state": to, "state_reason": reason[:500], "pending_reason": "", "updated_at": now, **_timestamps(to, now),
    }
    values.update(fields or {})
    with transaction.atomic():
        # The row's current state, read under the same lock the UPDATE takes, is the "from" of the
        # timeline entry; the filter on state is what makes this a compare-and-set.
        current = (
            WorkloadRequest.objects.select_for_update(of=("self",))
            .filter(pk=request.pk, state__in=sources)
            .values_list("state", flat=True)
            .first()
        )
        if current is None:
            return False
        won = WorkloadRequest.objects.filter(pk=request.pk, state__in=sources).update(**values) == 1
        if not won:  # pragma: no cover - the lock above makes this unreachable on PostgreSQL
            return False
        event, entry = move_records(request, from_state=current, to=to, actor_label=actor_label, reason=reason,
                                    actor=actor)
        event.save(force_insert=True)
        audit_append([entry])
        if S.PENDING_APPROVAL in (current, to):
            approvals_changed()
    for name, value in values.items():
        setattr(request, name, value)
    return True


def move_many(
    requests: list[WorkloadRequest],
    *,
    to: str,
    actor_label: str,
    reason: str = "",
    fields: dict[str, Any] | None = None,
    fields_each: dict[int, dict[str, Any]] | None = None,
    only_from: Iterable[str] | None = None,
) -> list[WorkloadRequest]:
    """``move()`` for many requests at once (the materializer's batch): the same compare-and-set under the rows'
    locks, one UPDATE, one INSERT of the timeline entries and one append to the audit chain. Returns the requests
    that moved (the others were no longer in a source state: nothing was written for them).

    ``fields_each``: per request id, further columns that differ by row (``applied_hash``).
    """
    if not requests:
        return []
    sources = sources_of(to)
    if only_from is not None:
        sources = [state for state in sources if state in set(only_from)]
    if not sources:
        raise ValueError(f"No state may move to {to!r}.")
    now = timezone.now()
    values: dict[str, Any] = {
        "state": to, "state_reason": reason[:500], "pending_reason": "", "updated_at": now, **_timestamps(to, now),
    }
    values.update(fields or {})
    by_pk = {r.pk: r for r in requests}
    with transaction.atomic():
        current = dict(
            WorkloadRequest.objects.select_for_update(of=("self",))
            .filter(pk__in=list(by_pk), state__in=sources)
            .order_by("pk")  # one lock order for every batch: two batches never deadlock
            .values_list("pk", "state")
        )
        if not current:
            return []
        update = dict(values)
        for name in {n for each in (fields_each or {}).values() for n in each}:
            whens = [When(pk=pk, then=Value(each[name])) for pk, each in (fields_each or {}).items()
                     if pk in current and name in each]
            update[name] = Case(*whens, default=F(name))
        WorkloadRequest.objects.filter(pk__in=list(current), state__in=sources).update(**update)
        moved = [by_pk[pk] for pk in current]
        records = [move_records(r, from_state=current[r.pk], to=to, actor_label=actor_label, reason=reason)
                   for r in moved]
        RequestEvent.objects.bulk_create([event for event, _ in records])
        audit_append([entry for _, entry in records])
        if to == S.PENDING_APPROVAL or S.PENDING_APPROVAL in current.values():
            approvals_changed()
    for req in moved:
        for name, value in {**values, **(fields_each or {}).get(req.pk, {})}.items():
            setattr(req, name, value)
    return moved

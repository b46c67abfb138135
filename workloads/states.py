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
from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from portal.machine import NOW, Machine, Move
from tenants.access import Actor, approvals_changed
from tenants.audit import audit_append, audit_entry, audit_record

from .models import RequestEvent, RequestState, WorkloadRequest

S = RequestState

ALLOWED: dict[str, set[str]] = {
    S.SUBMITTED: {S.PENDING_APPROVAL, S.APPROVED, S.REJECTED, S.CANCELLED},
    S.PENDING_APPROVAL: {S.APPROVED, S.REJECTED, S.CANCELLED, S.EXPIRED},
    # approved: the portal is creating the cluster objects. The watcher may see it running (or even
    # finished) before it ever saw it queued, so those edges exist too.
    S.APPROVED: {S.QUEUED, S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.STOPPED, S.EXPIRED},
    # queued -> approved: re-dispatched to another cluster before it started (workloads/routing.py), at most once.
    S.QUEUED: {S.RUNNING, S.SUCCEEDED, S.FAILED, S.STOPPED, S.CANCELLED, S.EXPIRED, S.PREEMPTED, S.APPROVED},
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


@dataclass(frozen=True)
class LabelledActor(Actor):
    """A non-user cause (an approval rule, the cluster watcher) that still has a name in the audit log."""

    name: str = "system"

    @property
    def label(self) -> str:
        return self.name


def _timeline(move: Move) -> None:
    """The request's timeline entry; the approvers' counts when it entered or left pending approval."""
    RequestEvent.objects.create(request_id=move.obj.pk, from_state=move.source, to_state=move.to,
                                actor_label=move.context["actor_label"][:200],
                                message=(move.reason or f"{move.source} → {move.to}")[:1000])
    if S.PENDING_APPROVAL in (move.source, move.to):
        approvals_changed()


MACHINE = Machine(
    WorkloadRequest, field="state", allowed=ALLOWED, final=FINAL, audit_as="request", record=audit_record,
    stamps={
        # Also a restart: the request starts a new run, so the old end (and admissions) no longer apply.
        S.APPROVED: {"approved_at": NOW, "finished_at": None, "admitted_at": None, "first_admitted_at": None},
        S.QUEUED: {"queued_at": NOW}, S.RUNNING: {"started_at": NOW},
        # The run lost its admission; the follower stamps the next one (``first_admitted_at`` stays).
        S.PREEMPTED: {"admitted_at": None}, FINAL: {"finished_at": NOW},
    },
    # A pending reason describes the state it was written for; a move clears it unless it brings one.
    reason_field="state_reason", every={"pending_reason": "", "updated_at": NOW},
    scope=lambda req: (req.tenant, req.project), effects=[_timeline],
)
sources_of, can_move = MACHINE.sources_of, MACHINE.can_move


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
    for name, value in MACHINE.values(to, reason=reason, fields=fields, now=timezone.now()).items():
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
    who = actor if actor is not None else LabelledActor(user=None, name=actor_label[:200])
    return MACHINE.move(request, to=to, actor=who, reason=reason, fields=fields, only_from=only_from,
                        context={"actor_label": actor_label}) is not None


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
    def records(moved: list[tuple[WorkloadRequest, str]]) -> None:
        pairs = [move_records(r, from_state=source, to=to, actor_label=actor_label, reason=reason)
                 for r, source in moved]
        RequestEvent.objects.bulk_create([event for event, _ in pairs])
        audit_append([entry for _, entry in pairs])
        if to == S.PENDING_APPROVAL or any(source == S.PENDING_APPROVAL for _, source in moved):
            approvals_changed()

    return MACHINE.move_many(requests, to=to, reason=reason, fields=fields, fields_each=fields_each,
                             only_from=only_from, then=records)

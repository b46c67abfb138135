"""Extension requests: the requester asks the project's approvers for more hours than the approval rule
grants by itself (``services.request_extend`` applies what it grants at once and refuses the rest), or, for an
inference service, for more replicas (a scale request: ``services.request_scale`` refuses a member's scale-up that
needs a project admin; approving one calls it as the approver).

Every write here checks the rules, writes (status moves through ``extension_states.move()``), audits and
tells people after commit (``notify``). Approving extends the request in the same transaction as the move
(``services.extend_apply``), so an approved extension request and the longer request never disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.events import after_commit
from portal.exceptions import ConflictError, Invalid, NotAllowed
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.guards import require

from . import kinds, notify, policy
from .extension_states import current_status, move
from .models import ExtensionRequest, RequestEvent, RequestState, WorkloadRequest
from .services import (
    REJECT_REASON_MISSING,
    _check_can_ever_run,
    _require_usable,
    extend_apply,
    request_demand,
    request_scale,
)
from .states import FINAL
from .submission_checks import MAX_REPLICAS

S = RequestState
X = ExtensionRequest.Status
# An extension request is for a request that already has its approval and has not ended; a request still
# waiting for approval is extended directly (its approver decides on the new duration).
EXTENDABLE = frozenset({S.APPROVED, S.QUEUED, S.RUNNING, S.PREEMPTED})
# A scale request likewise (a request still waiting for approval is scaled directly).
SCALABLE = EXTENDABLE
MAX_HOURS = 24 * 366


def _after_commit(call: Callable[[], object]) -> None:
    after_commit(call)


def _check_hours(req: WorkloadRequest, hours: int) -> None:
    if not isinstance(hours, int) or hours < 1:
        raise Invalid("Ask for at least 1 hour.", field="hours")
    if hours > MAX_HOURS:
        raise Invalid(f"At most {MAX_HOURS} hours.", field="hours")
    total = req.duration_hours + hours
    limit = req.template.max_duration_hours
    if total > limit:
        raise Invalid(
            f"{total} hours is more than {req.template.name}'s maximum of {limit} hours "
            f"(it has {req.duration_hours}; at most {max(0, limit - req.duration_hours)} more).",
            field="hours",
        )


def _check_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise Invalid("Say why it needs more: the approvers decide on it.", field="reason")
    if len(reason) > 2000:
        raise Invalid("At most 2000 characters.", field="reason")
    return reason


def _check_replicas(req: WorkloadRequest, replicas: int) -> None:
    """A scale-up the project could ever run (the same checks as ``services.request_scale`` before its rule)."""
    if not kinds.allows(req.template.kind, "scale"):
        raise Invalid("Only inference services scale.", field="replicas")
    if not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
        raise Invalid(f"Between 1 and {MAX_REPLICAS} replicas.", field="replicas")
    if replicas <= req.replicas:
        raise Invalid(f"It has {req.replicas} replica(s) now: ask for more (scaling down needs nobody's approval).",
                      field="replicas")
    size_check = kinds.get(req.template.kind).size_check  # the template's bound on replicas (docs/inference.md)
    for _field, message in size_check(req.template.parameters_schema or {}, req.parameters or {}, replicas) if size_check else []:
        raise Invalid(message, field="replicas")
    demand = request_demand(flavor=req.flavor, gpus=req.gpus, replicas=replicas, cpu=req.cpu)
    _check_can_ever_run(project=req.project, flavor=req.flavor, demand=demand, field="replicas")


@transaction.atomic
def scale_request_create(*, actor: Actor, request: WorkloadRequest, replicas: int, reason: str) -> ExtensionRequest:
    """The requester of an inference service asks the approvers to scale it to ``replicas``, saying why (a scale-up
    the approval rule does not grant them). One pending scale request per request (409)."""
    req = WorkloadRequest.objects.select_related("project__tenant", "tenant", "template", "flavor").get(pk=request.pk)
    require(policy.may_ask_extension(actor, req),
            "Only the requester asks to scale; the project's approvers scale requests directly.")
    _require_usable(req.project, "scaling up")
    if req.state not in SCALABLE:
        if req.state in FINAL:
            raise ConflictError(f"A {req.state} request cannot be scaled.")
        raise ConflictError("This request still waits for its approval: scale it directly; its approver decides "
                            "on the new size.")
    _check_replicas(req, replicas)
    reason = _check_reason(reason)
    busy = ConflictError("A scale request for this request already waits for a decision; withdraw it to ask again.")
    if ExtensionRequest.objects.filter(request=req, status=X.PENDING, replicas__isnull=False).exists():
        raise busy
    try:
        with transaction.atomic():
            ext = ExtensionRequest.objects.create(request=req, hours=0, replicas=replicas, reason=reason,
                                                  requested_by=actor.user)
    except IntegrityError:  # a concurrent ask won (the partial unique constraint decides)
        raise busy from None
    RequestEvent.objects.create(request=req, actor_label=actor.label[:200],
                                message=f"Asked to scale from {req.replicas} to {replicas} replicas: {reason}"[:1000])
    audit_record(actor=actor, action="extension_request.create", target=ext, tenant=req.tenant, project=req.project,
                 after={"request": req.pk, "replicas": replicas, "reason": reason[:500]})
    pk = ext.pk
    _after_commit(lambda: notify.extension_waiting_notify(pk))
    return ext


@transaction.atomic
def extension_request_create(*, actor: Actor, request: WorkloadRequest, hours: int, reason: str) -> ExtensionRequest:
    """The requester asks for ``hours`` more, saying why. One pending extension request per request (409)."""
    req = WorkloadRequest.objects.select_related("project__tenant", "tenant", "template", "flavor").get(pk=request.pk)
    require(policy.may_ask_extension(actor, req),
            "Only the requester asks for an extension; the project's approvers extend requests directly.")
    _require_usable(req.project, "extending a request")
    if req.state not in EXTENDABLE:
        if req.state in FINAL:
            raise ConflictError(f"A {req.state} request cannot be extended.")
        raise ConflictError("This request still waits for its approval: extend it directly; its approver decides "
                            "on the new duration.")
    _check_hours(req, hours)
    reason = (reason or "").strip()
    if not reason:
        raise Invalid("Say why it needs more time: the approvers decide on it.", field="reason")
    reason = _check_reason(reason)
    if ExtensionRequest.objects.filter(request=req, status=X.PENDING, replicas__isnull=True).exists():
        raise ConflictError("An extension of this request already waits for a decision; withdraw it to ask again.")
    try:
        with transaction.atomic():
            ext = ExtensionRequest.objects.create(request=req, hours=hours, reason=reason, requested_by=actor.user)
    except IntegrityError:  # a concurrent ask won (the partial unique constraint decides)
        raise ConflictError("An extension of this request already waits for a decision; withdraw it to ask again.") from None
    RequestEvent.objects.create(request=req, actor_label=actor.label[:200],
                                message=f"Asked for {hours} more hours: {reason}"[:1000])
    audit_record(actor=actor, action="extension_request.create", target=ext, tenant=req.tenant, project=req.project,
                 after={"request": req.pk, "hours": hours, "reason": reason[:500]})
    pk = ext.pk
    _after_commit(lambda: notify.extension_waiting_notify(pk))
    return ext


def _decidable(actor: Actor, extension: ExtensionRequest) -> ExtensionRequest:
    ext = ExtensionRequest.objects.select_related("request__project__tenant", "request__template").get(pk=extension.pk)
    require(policy.may_decide(actor, ext.request.project),
            "Only project admins, tenant admins and ops decide on extension requests.")
    return ext


def _what(ext: ExtensionRequest) -> str:
    """The timeline's words for it: "Extension by 4 h", "Scaling to 3 replicas"."""
    return f"Scaling to {ext.replicas} replicas" if ext.is_scale else f"Extension by {ext.hours} h"


def _already(ext: ExtensionRequest) -> ConflictError:
    return ConflictError(f"The extension request is {current_status(ext.pk)} now: someone already decided on it, "
                         "or it was withdrawn.")


@transaction.atomic
def extension_request_approve(*, actor: Actor, extension: ExtensionRequest, comment: str = "") -> ExtensionRequest:
    """Grant the hours: the request runs longer at once (its deadline moves); or the replicas: the service is scaled
    at once (``services.request_scale`` as the approver: quota is checked again). Of two approvers, one wins (409)."""
    ext = _decidable(actor, extension)
    comment = (comment or "").strip()
    if len(comment) > 1000:
        raise Invalid("At most 1000 characters.", field="comment")
    _require_usable(ext.request.project, "scaling up" if ext.is_scale else "extending a request")

    def extend(locked: ExtensionRequest) -> None:
        req = WorkloadRequest.objects.select_for_update(of=("self",)).select_related(
            "project__tenant", "tenant", "template", "flavor").get(pk=locked.request_id)
        if req.state in FINAL:
            raise ConflictError(f"The request is {req.state}: there is nothing left to "
                                f"{'scale' if locked.is_scale else 'extend'}.")
        if locked.is_scale:
            if req.replicas >= locked.replicas:
                raise ConflictError(f"It has {req.replicas} replicas already: there is nothing to scale up; reject "
                                    "the scale request instead.")
            request_scale(actor=actor, request=req, replicas=locked.replicas)  # checks the quota again
            return
        _check_hours(req, locked.hours)  # another extension may have used the template's maximum meanwhile
        extend_apply(actor=actor, request=req, hours=locked.hours,
                     message=f"Extended by {locked.hours} h to {req.duration_hours + locked.hours} h: "
                             f"{actor.label} approved the extension request.")

    moved = move(ext, to=X.APPROVED, actor=actor, effect=extend,
                 message=f"{_what(ext)} approved by {actor.label}" + (f": {comment}" if comment else "."),
                 fields={"decided_by": actor.user, "decided_at": timezone.now(), "comment": comment})
    if moved is None:
        raise _already(ext)
    pk = moved.pk
    _after_commit(lambda: notify.extension_decided_notify(pk))
    return moved


@transaction.atomic
def extension_request_reject(*, actor: Actor, extension: ExtensionRequest, comment: str = "") -> ExtensionRequest:
    """Turn the extension down; the reason (``comment``) is required and the requester sees it."""
    ext = _decidable(actor, extension)
    comment = (comment or "").strip()
    if not comment:
        raise Invalid(REJECT_REASON_MISSING, field="comment")
    if len(comment) > 1000:
        raise Invalid("At most 1000 characters.", field="comment")
    moved = move(ext, to=X.REJECTED, actor=actor, message=f"{_what(ext)} rejected by {actor.label}: {comment}",
                 fields={"decided_by": actor.user, "decided_at": timezone.now(), "comment": comment})
    if moved is None:
        raise _already(ext)
    pk = moved.pk
    _after_commit(lambda: notify.extension_decided_notify(pk))
    return moved


@transaction.atomic
def extension_request_cancel(*, actor: Actor, extension: ExtensionRequest) -> ExtensionRequest:
    """The requester withdraws a pending extension request."""
    ext = ExtensionRequest.objects.select_related("request__project__tenant").get(pk=extension.pk)
    if actor.user is None or actor.user.pk != ext.requested_by_id:
        raise NotAllowed("Only the requester withdraws an extension request; approvers reject it.")
    moved = move(ext, to=X.CANCELLED, actor=actor, message=f"{_what(ext)} withdrawn by {actor.label}.",
                 fields={"decided_at": timezone.now()})
    if moved is None:
        raise _already(ext)
    after_commit(notify.extension_withdrawn_notify, moved.pk)  # the approvers asked: nothing waits for them now
    return moved


def extension_requests_lapse(*, now: datetime | None = None) -> int:
    """Pending extension requests of requests that have ended are closed (``lapsed``); nothing is left to extend.
    Idempotent: a second run (or a concurrent one) finds nothing to move."""
    now = now or timezone.now()
    system = Actor.system()
    lapsed = 0
    stale = ExtensionRequest.objects.filter(status=X.PENDING, request__state__in=FINAL).values_list("pk", flat=True)
    for pk in list(stale[:500]):
        with transaction.atomic():
            if move(ExtensionRequest(pk=pk), to=X.LAPSED, actor=system,
                    message="The extension request lapsed: the request ended before anyone decided.",
                    fields={"decided_at": now}) is not None:
                lapsed += 1
    return lapsed

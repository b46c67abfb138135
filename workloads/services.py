"""Every write to requests: check the rules, write, audit, schedule side effects.

The request lifecycle up to "approved" lives here (submit, the approval rules, approve, reject) plus
the user's actions on a request (cancel, stop, restart, delete, extend, scale). The checks a submission passes
before anything is written are in ``workloads.submission_checks``; writes to the catalogue (templates, images),
approval rules and volumes are in ``workloads.catalogue_services``. What happens in the
cluster afterwards is scheduled through ``workloads.hooks`` on commit; this module never talks to
the cluster. State changes go through ``states.move()`` only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q

from portal.compiled import Compiled, KeptInsert
from portal.events import after_commit
from portal.exceptions import (
    ConflictError,
    IdempotencyKeyReused,
    Invalid,
    NotAllowed,
    PortalError,
    ReadOnlyTenant,
)
from portal.extensions import submission_guard
from portal.quantities import fmt
from quotas import manifests as quota_manifests
from quotas.capacity import TOTAL_GPUCORES, TOTAL_GPUMEM, is_enforced
from quotas.models import Flavor, gib_words
from tenants.access import Actor
from tenants.audit import audit_append, audit_entry, audit_record, snapshot
from tenants.guards import require
from tenants.models import Project

from . import hooks, kinds, manifests, notify, policy, routing, selectors
from .models import (
    APPROVER_ONLY_PRIORITIES,
    LIVE_STATES,
    ApprovalRule,
    Image,
    Priority,
    RequestEvent,
    RequestPreset,
    RequestState,
    ServiceTemplate,
    Volume,
    WorkloadRequest,
    default_self_service_priorities,
)
from .states import ACTIVE, CANCELLABLE, FINAL, first_state, move, move_records
from .submission_checks import (
    MAX_REPLICAS,
    _allowed_flavors,
    _check_flavor,
    _check_name,
    _check_parameters,
    _check_share,
    _check_size,
    _check_submitted_image,
    _check_topology,
    _Errors,
    _name_taken,
    _name_taken_message,
    _Size,
)

S = RequestState
RULE_LABEL = "approval rule"
REQUEST_FIELDS = ["name", "image", "flavor", "gpus", "replicas", "cpu", "memory_gib", "duration_hours", "priority", "state"]


# Small checks shared by the services -----------------------------------------------------------


def _require_usable(project: Project, doing: str) -> None:
    """Nothing that adds usage happens in a suspended tenant or an archived project (not even by ops)."""
    if not project.tenant.is_active:
        raise ReadOnlyTenant(f"Tenant {project.tenant.slug} is suspended: {doing} is not possible.")
    if not project.is_active:
        raise Invalid(f"Project {project.slug} is archived: {doing} is not possible.", field="project")


def _require_owner_or_approver(actor: Actor, req: WorkloadRequest, doing: str) -> None:
    """The requester (while they may still submit in the project) or an approver of the project."""
    require(policy.may_act_on(actor, req), f"Only the requester or a project admin may {doing} this request.")


def _fresh(req: WorkloadRequest) -> WorkloadRequest:
    """Re-read the request with what the services need; the caller's copy may be stale."""
    return WorkloadRequest.objects.select_related("project__tenant", "tenant", "template", "flavor").get(pk=req.pk)


def _event(req: WorkloadRequest, *, actor_label: str, message: str) -> RequestEvent:
    """A timeline entry that is not a state change (an extension, a scale, a deletion)."""
    return RequestEvent.objects.create(request=req, actor_label=actor_label[:200], message=message[:1000])


def _on_commit_changed(req: WorkloadRequest, action: str) -> None:
    after_commit(hooks.request_changed, req.pk, action)


def _on_commit_approved(req: WorkloadRequest, *, notify_requester: bool) -> None:
    if notify_requester:
        after_commit(notify.request_decided_notify, req.pk)
    after_commit(hooks.request_approved, req.pk)


# Quota: what can never run --------------------------------------------------------------------


# The quota ceiling is a read (workloads.selectors); the services check submissions against it.
Ceiling = selectors.Ceiling
quota_ceiling = selectors.quota_ceiling


def request_demand(*, flavor: Flavor, gpus: int, replicas: int, cpu: Decimal) -> Decimal:
    """How much of the flavor's primary resource the whole request needs at once."""
    per_pod = Decimal(cpu) if flavor.kind == Flavor.Kind.CPU else Decimal(gpus)
    return per_pod * replicas


def _check_can_ever_run(*, project: Project, flavor: Flavor, demand: Decimal, field: str = "gpus",
                        ceilings: selectors.Ceilings | None = None) -> None:
    """``ceilings``: the project's, as the caller read them (``selectors.quota_ceilings_kept``; None: read now)."""
    ceiling = selectors.ceiling_of(ceilings, project=project, flavor=flavor)
    if demand <= ceiling.total:
        return
    what = f"{fmt(demand)} x {flavor} ({ceiling.resource})"
    if ceiling.total == 0:
        message = f"This can never run: project {project.slug} has no quota for {flavor}. Ask for quota or choose another flavor."
    else:
        borrow = "no borrowing limit" if ceiling.borrowable is None else f"{fmt(ceiling.borrowable)} borrowable"
        message = (
            f"This can never run: {what} is more than project {project.slug} can ever get "
            f"({fmt(ceiling.nominal)} nominal + {borrow} = {fmt(ceiling.total)}). Ask for more quota or request less."
        )
    raise Invalid(message, field=field)


def _check_share_fits_quota(*, project: Project, flavor: Flavor, vgpus: int, share: tuple[int, int],
                            field: str = "", ceilings: selectors.Ceilings | None = None) -> None:
    """A HAMi request's vGPUs count against the project's GPU memory and cores quota too (Kueue's resource
    transformations: ``total-gpumem`` = vGPUs x the share's MiB, ``total-gpucores`` = vGPUs x its %): refuse a share
    size that could never fit, in GiB and % as it was asked."""
    memory_mib, cores_percent = share
    checks = ((TOTAL_GPUMEM, memory_mib, "share_memory_gib"), (TOTAL_GPUCORES, cores_percent, "share_cores_percent"))
    for resource, per_vgpu, share_field in checks:
        need = Decimal(per_vgpu) * vgpus
        ceiling = selectors.ceiling_of(ceilings, project=project, flavor=flavor, resource=resource)
        if need <= ceiling.total:
            continue
        if resource == TOTAL_GPUMEM:
            each, total, room = f"{gib_words(per_vgpu)} GiB", f"{gib_words(need)} GiB of GPU memory", f"{gib_words(ceiling.total)} GiB"
        else:
            each, total, room = f"{per_vgpu} %", f"{fmt(need)} % of a card's cores", f"{fmt(ceiling.total)} %"
        raise Invalid(f"This can never run: {vgpus} vGPU(s) of {each} need {total}, more than project {project.slug} "
                      f"can ever get on {flavor} ({room}). Ask for more quota or choose a smaller share.", field=field or share_field)


def _routable_here(project: Project, template: ServiceTemplate, flavor: Flavor, demand: Decimal,
                   offered: set[int] | None = None, ceilings: selectors.Ceilings | None = None) -> bool:
    """Whether the submission's own rules let the request run on ``flavor`` (a routing candidate): enforced, sized,
    the project's quota enough, its queues admit the kind (``offered``: see ``_check_queue_admits``)."""
    if not is_enforced(flavor) or not flavor.hami_sized or kinds.kueue_cannot_admit(kind=template.kind, flavor=flavor):
        return False
    try:
        _check_can_ever_run(project=project, flavor=flavor, demand=demand, ceilings=ceilings)
        _check_queue_admits(project=project, template=template, flavor=flavor, offered=offered)
    except Invalid:
        return False
    return True


def redispatch_usable(req: WorkloadRequest, flavor: Flavor) -> bool:
    """``_routable_here`` for a request being moved off a drained or unhealthy cluster (workloads/routing.py)."""
    demand = request_demand(flavor=flavor, gpus=req.gpus, replicas=req.replicas, cpu=req.cpu)
    return _routable_here(req.project, req.template, flavor, demand)


def _check_queue_admits(*, project: Project, template: ServiceTemplate, flavor: Flavor, offered: set[int] | None = None) -> None:
    """Refuse what the project's queues could never admit, whatever the free capacity (``quotas.manifests.queue_admits``,
    the rule the form and the API offer by): say which queue it would wait in, and what would let it run. ``offered``:
    the ids of the flavors the project's queues offer the template's kind on, as the caller read them (None: read now)."""
    if offered is None:
        offered = selectors.queue_offered_flavors(projects=[project], kind=template.kind).get(project.pk, set())
    if flavor.pk in offered:
        return
    queue = quota_manifests.local_queue_name(flavor.cluster, project.slug, serving=kinds.get(template.kind).serving)
    raise Invalid(
        f"This can never run: a {template.get_kind_display().lower()} on {flavor} in project {project.slug} goes to "
        f"queue {queue}, which has no quota for {flavor} on cluster {flavor.cluster.name}. Choose a flavor the form "
        f"offers for this project, or ask for quota for it.", field="flavor")


# Approval rules --------------------------------------------------------------------------------


def approval_rule_for(*, project: Project, template: ServiceTemplate) -> ApprovalRule | None:
    """The most specific rule: project + template, project, template, global; None if there is none."""
    remembered = selectors.approval_rules()  # the catalogue's copy outside a transaction
    if remembered is not None:
        candidates = [r for r in remembered if r.project_id in (None, project.pk) and r.template_slug in (template.slug, "")]
    else:
        candidates = list(
            ApprovalRule.objects.filter(project__in=[project], template_slug__in=[template.slug, ""])
            | ApprovalRule.objects.filter(project__isnull=True, template_slug__in=[template.slug, ""])
        )

    def specificity(rule: ApprovalRule) -> tuple[int, int]:
        return (rule.project_id is not None, rule.template_slug != "")

    return max(candidates, key=specificity, default=None)


_ASK = object()  # approval_decide: look the rule up


@dataclass(frozen=True)
class Decision:
    auto: bool
    reason: str


def _self_service(priorities: Any) -> list[str]:
    """A rule's priority list, without what only an approver may grant (whatever the row says)."""
    return [p for p in (priorities or []) if p in Priority.values and p not in APPROVER_ONLY_PRIORITIES]


def approval_decide(
    *, actor: Actor, project: Project, template: ServiceTemplate, gpus_total: int, hours: int,
    priority: str = Priority.BATCH, approver_decides: bool = False, rule: Any = _ASK,
) -> Decision:
    """Whether a request (or an extension or scale-up) is approved without a human, and why (not).

    The priority counts: members get only their rule's ``member_priorities`` automatically, approvers'
    own submissions only its ``admin_priorities``; ``production`` always waits for an approver's decision.
    ``approver_decides``: the actor's call is itself the decision when they may approve (an extension or a
    scale-up by a project admin), whatever the priority. ``rule``: already looked up (``approval_rule_for``).
    """
    rule = approval_rule_for(project=project, template=template) if rule is _ASK else rule
    if actor.token is None and actor.user is not None and policy.may_decide(actor, project):
        if approver_decides:
            return Decision(True, f"Approved by {actor.label}, who may approve requests in {project.slug}.")
        allowed = _self_service(rule.admin_priorities if rule else default_self_service_priorities())
        if priority in allowed:
            return Decision(True, f"Approved on submission: {actor.label} may approve requests in {project.slug}.")
        return Decision(False, _priority_needs_approver(priority, allowed))
    if rule is None:
        return Decision(False, "No approval rule applies, so a project admin decides.")
    if kinds.get(template.kind).needs_admin_rule and rule.require_admin_for_inference:
        return Decision(False, "Inference services need a project admin's approval.")
    allowed = _self_service(rule.member_priorities)
    if priority not in allowed:
        return Decision(False, _priority_needs_approver(priority, allowed))
    if gpus_total > rule.auto_approve_max_gpus:
        return Decision(False, f"{gpus_total} GPUs is more than the {rule.auto_approve_max_gpus} approved automatically.")
    if hours > rule.auto_approve_max_hours:
        return Decision(False, f"{hours} hours is more than the {rule.auto_approve_max_hours} approved automatically.")
    return Decision(
        True,
        f"Within the automatic limit ({rule.auto_approve_max_gpus} GPUs, {rule.auto_approve_max_hours} hours) of {rule}.",
    )


def _priority_needs_approver(priority: str, allowed: list[str]) -> str:
    without = f" (without one: {', '.join(allowed)})" if allowed else ""
    return f"Priority {priority} needs a project admin's approval{without}."


def _gpus_total(*, flavor: Flavor, gpus: int, replicas: int) -> int:
    return 0 if flavor.kind == Flavor.Kind.CPU else gpus * replicas


# Submitting ------------------------------------------------------------------------------------


def _replay(actor: Actor, key: str) -> WorkloadRequest | None:
    if not key or actor.user is None:
        return None
    found = (
        WorkloadRequest.objects.select_related("project__tenant", "template", "flavor")
        .filter(requested_by=actor.user, idempotency_key=key)
        .first()
    )
    if found is not None:
        found.replayed = True  # type: ignore[attr-defined]
    return found


def _submission_fingerprint(
    *, project: Project, template: ServiceTemplate, image: str, flavor: Flavor | None, gpus: int | None,
    replicas: int | None, cpu: Decimal | int | float | None, memory_gib: int | None,
    parameters: dict[str, Any] | None, duration_hours: int | None, priority: str, name: str,
    share: dict[str, Any] | None = None, topology: Any = "",
) -> str:
    """sha256 of the submission as sent (canonical JSON; an omitted value is null, not its default). A HAMi share
    size and a placement (``topology``) count only when one was sent (fingerprints of submissions without one are
    as before)."""
    body = {
        "project": project.pk, "template": template.slug, "flavor": flavor.name if flavor is not None else None,
        "image": (image or "").strip(), "gpus": gpus, "replicas": replicas,
        "cpu": None if cpu is None else format(Decimal(str(cpu)).normalize(), "f"), "memory_gib": memory_gib,
        "parameters": parameters, "duration_hours": duration_hours, "priority": priority or "",
        "name": (name or "").strip(),
    }
    if share and any(value is not None for value in share.values()):
        body |= {key: None if value is None else str(value) for key, value in share.items()}
    if topology:
        body["topology"] = str(topology)
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_replay_matches(found: WorkloadRequest, *, project: Project, template: ServiceTemplate, fingerprint: str) -> None:
    # A key names one request. Reusing it for a different one is a client bug, not a retry. Rows from
    # before fingerprints were recorded can only be compared by project and template.
    if found.idempotency_fingerprint:
        differs = found.idempotency_fingerprint != fingerprint
    else:
        differs = found.project_id != project.pk or found.template.slug != template.slug
    if differs:
        raise IdempotencyKeyReused(
            "This Idempotency-Key was already used with a different request body "
            f"({found.project.slug}/{found.name}); send the same body to retry, or use a new key."
        )


def _request_snapshot(req: WorkloadRequest) -> dict[str, Any]:
    out = snapshot(req, REQUEST_FIELDS) or {}
    return out | {"cpu": str(req.cpu)}


# Submitting again: clones and presets --------------------------------------------------------------------


def request_clone(*, actor: Actor, request: WorkloadRequest, name: str = "", idempotency_key: str = "") -> WorkloadRequest:
    """Submit ``request`` again: the same project, template (its live version), flavor, image, size, parameters,
    duration and priority (``selectors.request_values``), under ``name`` (empty: a new name). Everything is
    checked again as for any submission; an ended template is refused with its field."""
    template = selectors.live_template(request.template.slug)
    if template is None:
        raise Invalid(f"Template {request.template.slug} is no longer offered: pick another one.", field="template")
    values = selectors.request_values(request)
    flavor = request.flavor
    if not template.allowed_flavors.filter(pk=flavor.pk).exists():
        flavor = template.allowed_flavors.filter(name=flavor.name, active=True).first() or flavor
    return request_submit(
        actor=actor, project=request.project, template=template, image=values["image"], flavor=flavor,
        gpus=values["gpus"], replicas=values.get("replicas"), cpu=request.cpu, memory_gib=values["memory_gib"],
        parameters=values["parameters"], duration_hours=values["duration_hours"], priority=values["priority"],
        name=name, idempotency_key=idempotency_key, topology=values.get("topology", ""),
    )


PRESET_NAME_MAX = 60


def _preset_values(values: dict[str, Any]) -> dict[str, Any]:
    """Only the keys a preset keeps, as JSON (decimals as text); empty values left out (the defaults apply)."""
    unknown = sorted(set(values) - set(selectors.PRESET_KEYS))
    if unknown:
        raise Invalid(f"A preset keeps {', '.join(selectors.PRESET_KEYS)}; not {', '.join(unknown)}.", field=unknown[0])
    out: dict[str, Any] = {}
    for key in selectors.PRESET_KEYS:
        value = values.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, Decimal):
            value = f"{value.normalize():f}"
        if key == "parameters" and not isinstance(value, dict):
            raise Invalid("Parameters are a JSON object.", field="parameters")
        out[key] = value
    return out


def preset_save(*, actor: Actor, project: Project, template_slug: str, name: str, values: dict[str, Any]) -> tuple[RequestPreset, bool]:
    """Save the form's values under ``name`` for the actor, in ``project``, for a live template; a preset of the
    same name (same user and project) is replaced. Returns (preset, created). Nothing is checked against the
    template's limits here: the submission made from it is."""
    if actor.user is None:
        raise NotAllowed("Presets belong to users.")
    require(policy.may_submit_request(actor, project), "You may not submit requests in this project.")
    name = " ".join((name or "").split())
    if not name:
        raise Invalid("Name the preset.", field="name")
    if len(name) > PRESET_NAME_MAX:
        raise Invalid(f"A preset's name has at most {PRESET_NAME_MAX} characters.", field="name")
    if selectors.live_template(template_slug) is None:
        raise Invalid(f"No such template: {template_slug}.", field="template")
    kept = _preset_values(values)
    with transaction.atomic():
        preset, created = RequestPreset.objects.select_for_update().get_or_create(
            owner=actor.user, project=project, name=name, defaults={"template_slug": template_slug, "values": kept},
        )
        before = None if created else snapshot(preset, ["template_slug", "values"])
        if not created:
            preset.template_slug, preset.values = template_slug, kept
            preset.save(update_fields=["template_slug", "values", "updated_at"])
        audit_record(actor=actor, action="preset.save", target=preset, tenant=project.tenant, project=project,
                     before=before, after=snapshot(preset, ["name", "template_slug", "values"]))
    return preset, created


def preset_delete(*, actor: Actor, preset: RequestPreset) -> None:
    """Delete one of the actor's presets (``selectors.presets_for`` found it: nobody else's is ever in reach)."""
    if actor.user is None or preset.owner_id != actor.user.pk:
        raise NotAllowed("Only its owner deletes a preset.")
    with transaction.atomic():
        audit_record(actor=actor, action="preset.delete", target=preset, tenant=preset.project.tenant,
                     project=preset.project, before=snapshot(preset, ["name", "template_slug", "values"]))
        preset.delete()


def request_submit(
    *,
    actor: Actor,
    project: Project,
    template: ServiceTemplate,
    image: str = "",
    flavor: Flavor | None = None,
    gpus: int | None = None,
    replicas: int | None = None,
    cpu: Decimal | int | float | None = None,
    memory_gib: int | None = None,
    parameters: dict[str, Any] | None = None,
    duration_hours: int | None = None,
    priority: str = "",
    name: str = "",
    idempotency_key: str = "",
    project_is_fresh: bool = False,
    needs: routing.Needs | None = None,
    share_memory_gib: Any = None,
    share_cores_percent: Any = None,
    share_preset: bool | None = None,
    topology: str = "",
) -> WorkloadRequest:
    """Validate and record a request, then approve it by rule or leave it pending approval.

    ``topology`` (multi-pod training on a flavor of a cluster with a topology only): "rack" or "block" (all pods within
    one), "prefer-rack", or "" (anywhere); see :func:`_check_topology`.

    A HAMi flavor's vGPUs get the flavor's preset share, or a size of the requester's own: ``share_memory_gib``
    GiB of GPU memory and ``share_cores_percent`` % of the card's cores (either one alone: the preset's other half).
    ``share_preset`` True asks for the preset explicitly (a size given as well is refused), False for an own size.

    Refused at once (nothing created) when it is invalid or can never run. With an
    ``idempotency_key``, a retry by the same user returns the request the first call made and
    creates nothing; the returned request's ``replayed`` attribute says which happened. ``project_is_fresh``: the
    caller read ``project`` (with its tenant) in this request, so it is not read again.
    (What each step costs: docs/performance.md, "Submissions".)
    """
    if actor.user is None:
        raise NotAllowed("Requests are made by users (or their tokens).")
    if not project_is_fresh:
        project = Project.objects.select_related("tenant").get(pk=project.pk)  # fresh: suspended? archived? own images?
    require(policy.may_submit_request(actor, project), "You may not submit requests in this project.")
    idempotency_key = (idempotency_key or "").strip()
    if len(idempotency_key) > 200:
        raise Invalid("An Idempotency-Key has at most 200 characters.", field="idempotency_key")

    fingerprint = _submission_fingerprint(
        project=project, template=template, image=image, flavor=flavor, gpus=gpus, replicas=replicas, cpu=cpu,
        memory_gib=memory_gib, parameters=parameters, duration_hours=duration_hours, priority=priority, name=name,
        share={"share_memory_gib": share_memory_gib, "share_cores_percent": share_cores_percent,
               "share_preset": share_preset}, topology=topology,
    ) if idempotency_key else ""
    given_name = (name or "").strip()
    # With a key the submission goes ahead without first looking for the call it may repeat (a round trip and a
    # plan on every submission, for the rare retry): the unique constraint on the requester's keys refuses the
    # second row, and a refusal of any other kind looks for the earlier call before it is given (``_replayed``).
    # The name is then left to its partial unique constraint too, and looked up only when the submission fails.
    optimistic = bool(idempotency_key)
    name_taken = False if optimistic and given_name else None

    # The catalogue's images and rule, read before the transaction (from the process's copy: ``selectors.CATALOGUE``).
    images = selectors.curated_images()
    rule = approval_rule_for(project=project, template=template)
    # What the project's queues offer, from the process's copy (``quotas.selectors.OFFERS``; None inside a caller's
    # transaction: read in the check). Three queries less per submission than reading it in the transaction.
    offered = selectors.queue_offered_flavors_kept(project=project, kind=template.kind)
    ceilings = selectors.quota_ceilings_kept(project=project)  # likewise: the quota read of "can it ever run"
    try:
        with transaction.atomic():
            req = _submit(
                actor=actor, project=project, template=template, image=image, flavor=flavor, gpus=gpus,
                replicas=replicas, cpu=cpu, memory_gib=memory_gib, parameters=parameters,
                duration_hours=duration_hours, priority=priority, name=name, idempotency_key=idempotency_key,
                idempotency_fingerprint=fingerprint, name_taken=name_taken, images=images, rule=rule,
                share=(share_memory_gib, share_cores_percent, share_preset), needs=needs or routing.Needs(),
                topology=topology, offered=offered, ceilings=ceilings,
            )
    except IntegrityError:
        # A retry with the same key (an earlier or a concurrent call won the insert: the unique constraint decides).
        found = _replay(actor, idempotency_key)
        if found is not None:
            _check_replay_matches(found, project=project, template=template, fingerprint=fingerprint)
            return found
        # Or another submission took the name (the partial unique constraint on live names decides).
        if given_name and _name_taken(project, given_name):
            raise ValidationError({"name": [_name_taken_message(project, given_name)]}) from None
        raise
    except (ValidationError, PortalError) as refusal:
        if not optimistic:
            raise
        found = _replayed(actor, idempotency_key, project, given_name, refusal)
        _check_replay_matches(found, project=project, template=template, fingerprint=fingerprint)
        return found
    req.replayed = False  # type: ignore[attr-defined]
    return req


def _replayed(actor: Actor, key: str, project: Project, name: str, refusal: Exception) -> WorkloadRequest:
    """The request an earlier call with ``key`` made, when a submission with that key was refused: a retry gets what
    the first call made whatever would refuse it now (the quota it uses itself, a budget since spent). Else the
    refusal, with the name's error among the fields when a live request of the project holds ``name`` (the error a
    look-up before the checks would have given with the others)."""
    found, taken = _replay_and_name(actor, key, project, name)
    if found is not None:
        return found
    if taken:
        message = _name_taken_message(project, name)
        fields = refusal.message_dict if isinstance(refusal, ValidationError) and hasattr(refusal, "error_dict") else {}
        raise ValidationError({"name": [message]} | {k: v for k, v in fields.items() if k != "name"}) from refusal
    raise refusal


def _replay_query(user_id: int, key: str, project_id: int | None = None, name: str = "") -> Any:
    match = Q(requested_by_id=user_id, idempotency_key=key)
    if project_id is not None:
        match |= Q(project_id=project_id, name=name, state__in=LIVE_STATES)
    # Only what the check reads, no joins: planning the row with its project, tenant, template and flavor took a
    # millisecond on every submission, for the rare retry (which reads it in full, ``_replay``).
    return WorkloadRequest.objects.filter(match).only(*_REPLAY_COLUMNS).order_by()[:2]


_REPLAY_COLUMNS = ("id", "requested_by_id", "idempotency_key", "project_id", "name", "state")


# Compiled once per process (portal.compiled): the select_related's columns took longer to compile than to read.
# Not prepared: its indexes are partial (a key that is not empty, a name among live requests), so only a plan made
# with the values can use them; PostgreSQL's generic plan for a prepared statement scanned every request.
_REPLAY = Compiled(lambda user_id, key: _replay_query(user_id, key), prepare=False)  # noqa: PLW0108 no name: 2 values
_REPLAY_OR_NAME = Compiled(_replay_query, prepare=False)


def _replay_and_name(actor: Actor, key: str, project: Project, name: str) -> tuple[WorkloadRequest | None, bool | None]:
    """The request an earlier call with ``key`` made (a retry), and whether ``name`` is taken by a live request of
    the project (None: not asked), in one query. Without a key the name is checked with the other fields."""
    if not key or actor.user is None:
        return None, None
    if name:
        rows = _REPLAY_OR_NAME.rows(actor.user.pk, key, project.pk, name)
    else:
        rows = _REPLAY.rows(actor.user.pk, key)
    found = next((r for r in rows if r.requested_by_id == actor.user.pk and r.idempotency_key == key), None)
    if found is not None:
        found = _replay(actor, key)  # a retry: the earlier request in full
    taken = any(r.project_id == project.pk and r.name == name and r.state in LIVE_STATES for r in rows) if name else None
    return found, taken


_NO_NEEDS = routing.Needs()  # the default: frozen, so one shared instance is safe
_INSERT_REQUEST = KeptInsert(WorkloadRequest)  # the request's INSERT written once, prepared (portal.compiled)


def _record(*, actor: Actor, project: Project, template: ServiceTemplate, flavor: Flavor, image: str, name: str,
            parameters: dict[str, Any], size: _Size, decision: Decision, idempotency_key: str,
            idempotency_fingerprint: str, share: tuple[int, int] = (0, 0), needs: routing.Needs = _NO_NEEDS,
            where: routing.Route | None = None, topology: str = "") -> WorkloadRequest:
    """Write the request in the state the decision gives it, a notebook's home volume, then its two timeline entries
    (submitted, then approved or pending approval) and the two audit entries, with the audit chain's lock and head, in
    one statement (``tenants.audit.audit_append``)."""
    req = WorkloadRequest(
        tenant=project.tenant, project=project, cluster=flavor.cluster, template=template, name=name,
        image=image, flavor=flavor, gpus=size.gpus, replicas=size.replicas, cpu=size.cpu, memory_gib=size.memory_gib,
        share_memory_mib=share[0], share_cores_percent=share[1],
        parameters=parameters, duration_hours=size.duration_hours, priority=size.priority, state=S.SUBMITTED,
        requested_by=actor.user, token=actor.token, idempotency_key=idempotency_key,
        idempotency_fingerprint=idempotency_fingerprint, accepted_models=list(needs.accepted_models),
        min_gpu_memory_gib=needs.min_gpu_memory_gib, min_compute_capability=needs.min_compute_capability,
        spill_consent=needs.spill_consent, spilled=bool(where and where.spilled),
        spilled_from_model=where.from_model if where else "", route_reason=(where.reason if where else "")[:500],
        spill_source_pending=where.source_pending if where else None,
        spill_source_wait_seconds=where.source_wait_seconds if where else None,
        kueue_flavors=where.kueue_flavors if where else [],
        topology=topology,
    )
    to = S.APPROVED if decision.auto else S.PENDING_APPROVAL
    first_state(req, to=to, reason=decision.reason, fields=None if decision.auto else {"pending_reason": decision.reason})
    _INSERT_REQUEST.insert(req)
    submitted_event = RequestEvent(
        request=req, from_state="", to_state=S.SUBMITTED, actor_label=actor.label[:200],
        message=(f"Submitted: {template.name} v{template.version}, {size.gpus} x {flavor} x {size.replicas}"
                 f"{f' (each {req.share})' if req.share else ''}, {size.duration_hours} h.")[:1000],
    )
    decided_event, decided_entry = move_records(req, from_state=S.SUBMITTED, to=to, actor_label=RULE_LABEL,
                                                reason=decision.reason)
    if where is not None and where.reason:
        submitted_event.message = f"{submitted_event.message} {where.reason}"[:1000]  # where it runs, and why
    # Kept on the row for the API's answer (no read-back of what was just written); written with the audit entries.
    req.written_timeline = [submitted_event, decided_event]  # type: ignore[attr-defined]
    if kinds.get(template.kind).interactive:
        # The home volume (the StatefulSet's claim) is the requester's own: only their requests may mount it.
        Volume.objects.create(project=project, name=manifests.notebook_home_claim(req.k8s_name), owner=actor.user,
                              request=req, description=f"Home of notebook {name}.")
    snap = _request_snapshot(req) | {"state": S.SUBMITTED, "template": f"{template.slug} v{template.version}"}
    submitted_entry = audit_entry(actor=actor, action="request.submit", target=req, tenant=project.tenant,
                                  project=project, after=snap)
    # The chain lock is held to the commit: audit last, the timeline's two entries in the same statement.
    audit_append([submitted_entry, decided_entry], along=req.written_timeline)  # type: ignore[attr-defined]
    return req


def _submit(
    *,
    actor: Actor,
    project: Project,
    template: ServiceTemplate,
    image: str,
    flavor: Flavor | None,
    gpus: int | None,
    replicas: int | None,
    cpu: Decimal | int | float | None,
    memory_gib: int | None,
    parameters: dict[str, Any] | None,
    duration_hours: int | None,
    priority: str,
    name: str,
    idempotency_key: str,
    idempotency_fingerprint: str,
    name_taken: bool | None = None,
    images: list[Image] | None = None,
    rule: Any = _ASK,
    share: tuple[Any, Any, bool | None] = (None, None, None),
    needs: routing.Needs = _NO_NEEDS,
    topology: str = "",
    offered: set[int] | None = None,
    ceilings: selectors.Ceilings | None = None,
) -> WorkloadRequest:
    _require_usable(project, "submitting a request")
    _require_live(template)
    refused = submission_guard.call(project)  # billing's budget refusal, through portal.extensions
    if refused:
        raise Invalid(refused, field="project")
    errors = _Errors()
    flavor = _check_flavor(template, flavor, errors)
    hami_share = _check_share(flavor, *share, errors)
    image = _check_submitted_image(project, template, image, errors, images)
    parameters = _check_parameters(actor, project, template, parameters, errors)
    size = _check_size(template, flavor, parameters, gpus=gpus, replicas=replicas, cpu=cpu, memory_gib=memory_gib,
                       duration_hours=duration_hours, priority=priority, errors=errors)
    name = _check_name(project, template, name, name_taken, errors)
    topology = _check_topology(template, flavor, size.replicas, topology, errors)
    errors.raise_any()
    assert flavor is not None

    # The request could never be admitted: refuse now rather than queue it forever.
    demand = request_demand(flavor=flavor, gpus=size.gpus, replicas=size.replicas, cpu=size.cpu)
    _check_can_ever_run(project=project, flavor=flavor, demand=demand, field="replicas" if size.replicas > 1 else "gpus",
                        ceilings=ceilings)
    if flavor.kind == Flavor.Kind.HAMI:
        _check_share_fits_quota(project=project, flavor=flavor, vgpus=size.gpus * size.replicas, share=hami_share,
                                ceilings=ceilings)
    _check_queue_admits(project=project, template=template, flavor=flavor, offered=offered)
    # Federation: the model check, then which cluster and flavor (workloads/routing.py; docs/federation.md).
    where = routing.route(project=project, flavor=flavor, needs=needs, demand=demand, candidates=_allowed_flavors(template),
                          usable=lambda f: _routable_here(project, template, f, demand, offered, ceilings))
    flavor = where.flavor
    if topology and not quota_manifests.placed_by_topology(flavor.cluster, flavor):
        raise Invalid(f"It would run on {flavor}, whose cluster places nothing by rack or block: submit it without "
                      f"a placement, or without spill-over.", field="topology")

    decision = approval_decide(
        actor=actor, project=project, template=template, hours=size.duration_hours, priority=size.priority,
        gpus_total=_gpus_total(flavor=flavor, gpus=size.gpus, replicas=size.replicas), rule=rule,
    )
    if where.spilled and where.needs_approval and decision.auto:
        decision = Decision(False, f"Waits for an approver: project {project.slug} approves spill-over by hand, and "
                                   f"this request spilled from {where.from_model} to {flavor.gpu_model}.")
    req = _record(actor=actor, project=project, template=template, flavor=flavor, image=image, name=name,
                  parameters=parameters, size=size, decision=decision, idempotency_key=idempotency_key,
                  idempotency_fingerprint=idempotency_fingerprint, share=hami_share, needs=needs, where=where,
                  topology=topology)
    if decision.auto:
        _on_commit_approved(req, notify_requester=False)
    else:
        after_commit(notify.request_waiting_notify, req.pk)
    return req


# Deciding --------------------------------------------------------------------------------------


REJECT_REASON_MISSING = "Say why it is rejected: the requester sees the reason."


def _decide(*, actor: Actor, req: WorkloadRequest, to: str, comment: str) -> WorkloadRequest:
    req = _fresh(req)
    require(policy.may_decide(actor, req.project), "Only project admins, tenant admins and ops decide on requests.")
    if to == S.APPROVED:
        _require_usable(req.project, "approving a request")
    elif not comment:
        raise Invalid(REJECT_REASON_MISSING, field="comment")
    if len(comment) > 1000:
        raise Invalid("At most 1000 characters.", field="comment")
    verb = "Approved" if to == S.APPROVED else "Rejected"
    reason = f"{verb} by {actor.label}" + (f": {comment}" if comment else ".")
    fields: dict[str, Any] = {"approved_by": actor.user} if to == S.APPROVED and actor.user is not None else {}
    fields["decision_comment"] = comment
    routed = _route_at_approval(req) if to == S.APPROVED and req.state in (S.SUBMITTED, S.PENDING_APPROVAL) else None
    won = move(
        req, to=to, actor_label=actor.label, actor=actor, reason=reason,
        only_from=[S.SUBMITTED, S.PENDING_APPROVAL], fields=fields | (routed.fields if routed else {}),
    )
    if not won:
        current = WorkloadRequest.objects.filter(pk=req.pk).values_list("state", flat=True).first()
        raise ConflictError(f"The request is {current} now: someone already decided on it, or it was cancelled.")
    if routed is not None:
        _event(req, actor_label=actor.label, message=routed.message)
        req.approval_note = routed.message  # type: ignore[attr-defined]  # the page's message says it too
        if routed.fields:
            after = _where(req) | {"spilled": req.spilled, "why": routed.message[:300]}
            audit_append([audit_entry(actor=actor, action="request.reroute", target=req, tenant=req.tenant,
                                      project=req.project, before=routed.before, after=after)])
    if to == S.APPROVED:
        _on_commit_approved(req, notify_requester=True)
    else:
        after_commit(notify.request_decided_notify, req.pk)
    return req


# Routing again at approval (docs/federation.md, "Routing again at approval") -----------------------

APPROVAL_ROUTING_LOCK = 26_001  # PostgreSQL advisory lock class: one tenant's approvals re-route one at a time


@dataclass(frozen=True)
class _Rerouted:
    fields: dict[str, Any]  # empty: it stays where it is
    message: str  # the timeline entry: where it moved and why, or why it stays
    before: dict[str, Any]  # where it was (the audit's "before" of a move)


def _where(req: WorkloadRequest) -> dict[str, str]:
    return {"cluster": req.cluster.name, "zone": req.cluster.zone_name, "flavor": req.flavor.name}


def _approval_routing_lock(tenant_id: int) -> None:
    """Held to the commit: a concurrent approval in the tenant routes after this one is written, and counts it."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [APPROVAL_ROUTING_LOCK, tenant_id])


def _in_flight(req: WorkloadRequest, flavors: list[Flavor]) -> dict[int, tuple[Decimal, Decimal]]:
    """Per flavor id, what approved requests (not in the cluster's queues yet) will take: (all, ``req``'s project).
    The cluster's ClusterQueues do not show them yet; routing counts them as reserved. One query."""
    out: dict[int, tuple[Decimal, Decimal]] = {}
    rows = (WorkloadRequest.objects.filter(state=S.APPROVED, flavor__in=[f.pk for f in flavors]).exclude(pk=req.pk)
            .values_list("flavor_id", "project_id", "flavor__kind", "gpus", "replicas", "cpu"))
    for flavor_id, project_id, kind, gpus, replicas, cpu in rows:
        demand = (Decimal(cpu) if kind == Flavor.Kind.CPU else Decimal(gpus)) * replicas
        zone, project = out.get(flavor_id, (Decimal(0), Decimal(0)))
        out[flavor_id] = (zone + demand, project + (demand if project_id == req.project_id else Decimal(0)))
    return out


def _route_at_approval(req: WorkloadRequest) -> _Rerouted | None:
    """Route a request that waited for an approver again, by the submission's rule (``routing.route``: its consent,
    its project's spill-over policy, the compatibility check, never a drained or unhealthy cluster), reading the
    clusters' load now plus what was approved and is not in their queues yet. None: it stays, nothing to say."""
    flavor = req.flavor
    if flavor.kind in (Flavor.Kind.CPU, Flavor.Kind.HAMI):
        return None  # not routed at submission either
    needs = routing.Needs(tuple(req.accepted_models or ()), req.min_gpu_memory_gib, req.min_compute_capability,
                          req.spill_consent)
    candidates = _allowed_flavors(req.template)
    demand = request_demand(flavor=flavor, gpus=req.gpus, replicas=req.replicas, cpu=req.cpu)

    def usable(f: Flavor) -> bool:
        return _routable_here(req.project, req.template, f, demand)

    home: Flavor | None = flavor
    if req.spilled and req.spilled_from_model:  # routing starts again from its first model
        home = next((f for f in candidates if f.kind == flavor.kind and (f.gpu_model or f.name) == req.spilled_from_model
                     and f.cluster.role != "worker" and f.cluster.routable and usable(f)), None)
        if home is None:
            return None  # its first model is offered nowhere now: it stays where it spilled to

    def in_flight() -> dict[int, tuple[Decimal, Decimal]]:  # only when clusters are read: lock, then count
        _approval_routing_lock(req.tenant_id)
        return _in_flight(req, candidates)

    try:
        found = routing.route(project=req.project, flavor=home, needs=needs, demand=demand, candidates=candidates,
                              usable=usable, in_flight=in_flight)
    except ValidationError as exc:
        here = f"zone {req.cluster.zone_name} ({req.cluster.name}, {flavor})"
        return _Rerouted({}, f"Approved where it is, in {here}: routing at approval found no model that runs it "
                             f"({' '.join(exc.messages)}); it waits there."[:1000], {})
    new = found.flavor
    if new.pk == flavor.pk and not found.nowhere:
        return None
    here = f"zone {req.cluster.zone_name} ({req.cluster.name}, {flavor})"
    if found.nowhere:
        return _Rerouted({}, f"Approved where it is, in {here}: no zone can take it now ({found.reason}) It waits "
                             f"there."[:1000], {})
    if req.topology and not quota_manifests.placed_by_topology(new.cluster, new):
        return _Rerouted({}, f"Not re-routed at approval: {new} would be freer, but its cluster places nothing by "
                             f"rack or block; it stays in {here}."[:1000], {})
    back = " (its first model has room again)" if req.spilled and not found.spilled else ""
    message = (f"Re-routed at approval from {here} to zone {new.cluster.zone_name} ({new.cluster.name}, {new}){back}: "
               f"{found.reason}")
    fields = found.fields() | {"route_reason": message[:500]}
    return _Rerouted(fields, message[:1000], _where(req))


@transaction.atomic
def request_approve(*, actor: Actor, request: WorkloadRequest, comment: str = "") -> WorkloadRequest:
    """An approver lets the request go ahead. Two approvers at once: one wins, the other gets 409. Routed again first
    (``_route_at_approval``): it may move to a zone that is free now, or is approved where it is."""
    return _decide(actor=actor, req=request, to=S.APPROVED, comment=comment.strip())


@transaction.atomic
def request_reject(*, actor: Actor, request: WorkloadRequest, comment: str = "") -> WorkloadRequest:
    """An approver turns the request down. ``comment`` (the reason) is required: the requester sees it on the
    request, in the API (``decision_comment``) and in the email."""
    return _decide(actor=actor, req=request, to=S.REJECTED, comment=(comment or "").strip())


# The requester's (and approvers') actions -------------------------------------------------------


def _refused(req: WorkloadRequest, doing: str, hint: str = "") -> ConflictError:
    current = WorkloadRequest.objects.filter(pk=req.pk).values_list("state", flat=True).first()
    return ConflictError(f"A {current} request cannot be {doing}." + (f" {hint}" if hint else ""))


@transaction.atomic
def request_cancel(*, actor: Actor, request: WorkloadRequest, reason: str = "") -> WorkloadRequest:
    """Withdraw a request before it ever ran (a running one is stopped instead)."""
    req = _fresh(request)
    _require_owner_or_approver(actor, req, "cancel")
    was_waiting = req.state == S.PENDING_APPROVAL
    text = f"Cancelled by {actor.label}" + (f": {reason}" if reason else ".")
    if not move(req, to=S.CANCELLED, actor_label=actor.label, actor=actor, reason=text, only_from=CANCELLABLE):
        raise _refused(req, "cancelled", "Stop it instead." if req.state not in FINAL else "")
    if was_waiting:  # the approvers who were asked are told it no longer waits (it has left their inbox)
        after_commit(notify.request_withdrawn_notify, req.pk, actor_user_id=actor.user.pk if actor.user else None)
    _on_commit_changed(req, "cancel")
    return req


@transaction.atomic
def request_stop(*, actor: Actor, request: WorkloadRequest, reason: str = "") -> WorkloadRequest:
    """Stop an active request; its cluster objects are removed (a notebook keeps its home volume)."""
    req = _fresh(request)
    _require_owner_or_approver(actor, req, "stop")
    text = f"Stopped by {actor.label}" + (f": {reason}" if reason else ".")
    if not move(req, to=S.STOPPED, actor_label=actor.label, actor=actor, reason=text, only_from=ACTIVE):
        raise _refused(req, "stopped", "Cancel it instead." if req.state in CANCELLABLE else "")
    _on_commit_changed(req, "stop")
    return req


@transaction.atomic
def request_restart(*, actor: Actor, request: WorkloadRequest) -> WorkloadRequest:
    """Run a stopped or failed request again, under its original approval."""
    req = _fresh(request)
    _require_owner_or_approver(actor, req, "restart")
    _require_usable(req.project, "restarting a request")
    # The same request under its original approval: it keeps its version, even one a newer version retired.
    if selectors.live_template(req.template.slug) is None:
        raise Invalid(f"Template {req.template.slug} v{req.template.version} is no longer offered; submit a new request.")
    # Quotas may have shrunk since it was submitted.
    demand = request_demand(flavor=req.flavor, gpus=req.gpus, replicas=req.replicas, cpu=req.cpu)
    _check_can_ever_run(project=req.project, flavor=req.flavor, demand=demand)
    if req.flavor.kind == Flavor.Kind.HAMI:
        _check_share_fits_quota(project=req.project, flavor=req.flavor, vgpus=req.gpus * req.replicas, share=req.hami_share)
    # A new run: what the cluster said about the last one, and what was applied then, no longer hold.
    fields: dict[str, Any] = {
        "pending_reason": "", "started_at": None, "queued_at": None, "expires_at": None, "attempts": 0,
        "cluster_status": {}, "applied_hash": "",
    }
    # Its name may have gone to another request meanwhile; the database constraint decides under concurrency.
    taken = ConflictError(f"{_name_taken_message(req.project, req.name)} Submit it again under another name.", field="name")
    if _name_taken(req.project, req.name, other_than=req.pk):
        raise taken
    try:
        restarted = move(req, to=S.APPROVED, actor_label=actor.label, actor=actor, reason=f"Restarted by {actor.label}.",
                         only_from=[S.STOPPED, S.FAILED], fields=fields)
    except IntegrityError:
        raise taken from None
    if not restarted:
        raise _refused(req, "restarted", "Only stopped or failed requests restart.")
    _on_commit_approved(req, notify_requester=False)
    return req


@transaction.atomic
def request_delete(*, actor: Actor, request: WorkloadRequest) -> WorkloadRequest:
    """Remove the request's cluster objects, volumes included; it ends (cancelled or stopped).

    The row stays, with its timeline: it is the record of what ran and what it cost.
    """
    req = _fresh(request)
    _require_owner_or_approver(actor, req, "delete")
    text = f"Deleted by {actor.label}."
    if req.state in CANCELLABLE:
        move(req, to=S.CANCELLED, actor_label=actor.label, actor=actor, reason=text, only_from=CANCELLABLE)
    elif req.state in ACTIVE:
        move(req, to=S.STOPPED, actor_label=actor.label, actor=actor, reason=text, only_from=ACTIVE)
    _event(req, actor_label=actor.label, message="Deleted: its cluster objects and volumes are removed.")
    Volume.objects.filter(request=req).delete()  # its home volume goes with it: nothing left to mount
    audit_record(actor=actor, action="request.delete", target=req, tenant=req.tenant, project=req.project)
    _on_commit_changed(req, "delete")
    return req


@transaction.atomic
def request_extend(*, actor: Actor, request: WorkloadRequest, hours: int) -> WorkloadRequest:
    """Give a request more time, within its template's maximum.

    Pending approval: the approver decides on the new duration. Otherwise it applies at once when
    the approval rule would approve the new total (or the actor is an approver), and is refused with
    a plain message when it needs a project admin: the requester then asks for an extension
    (``workloads.extensions.extension_request_create``), which the approvers decide.
    """
    req = _fresh(request)
    _require_owner_or_approver(actor, req, "extend")
    _require_usable(req.project, "extending a request")
    if hours < 1:
        raise Invalid("Extend by at least 1 hour.", field="hours")
    if req.state in FINAL:
        raise _refused(req, "extended")
    total = req.duration_hours + hours
    limit = req.template.max_duration_hours
    if total > limit:
        raise Invalid(
            f"{total} hours is more than {req.template.name}'s maximum of {limit} hours "
            f"(it has {req.duration_hours}; at most {max(0, limit - req.duration_hours)} more).",
            field="hours",
        )
    if req.state not in (S.SUBMITTED, S.PENDING_APPROVAL):
        decision = approval_decide(
            actor=actor, project=req.project, template=req.template,
            gpus_total=_gpus_total(flavor=req.flavor, gpus=req.gpus, replicas=req.replicas), hours=total,
            priority=req.priority, approver_decides=True,
        )
        if not decision.auto:
            raise NotAllowed(
                f"Extending to {total} hours needs a project admin: {decision.reason} "
                "Ask for an extension with a reason instead; the project's approvers decide."
            )
    return extend_apply(actor=actor, request=req, hours=hours,
                        message=f"Extended by {hours} h to {req.duration_hours + hours} h by {actor.label}.")


def extend_apply(*, actor: Actor, request: WorkloadRequest, hours: int, message: str) -> WorkloadRequest:
    """Add ``hours`` to a request that has not ended (deadline included), with its timeline and audit entries,
    inside the caller's transaction. No rule is checked here: ``request_extend`` and an approved extension
    request (``workloads.extensions``) check theirs first."""
    req = request
    before = {"duration_hours": req.duration_hours, "expires_at": req.expires_at.isoformat() if req.expires_at else None}
    updated = (
        WorkloadRequest.objects.filter(pk=req.pk, duration_hours=req.duration_hours)
        .exclude(state__in=FINAL)
        .update(duration_hours=F("duration_hours") + hours, expires_at=F("expires_at") + timedelta(hours=hours))
    )
    if updated != 1:
        raise ConflictError("The request changed meanwhile; reload and try again.")
    req.refresh_from_db(fields=["duration_hours", "expires_at", "updated_at"])
    _event(req, actor_label=actor.label, message=message)
    audit_record(
        actor=actor, action="request.extend", target=req, tenant=req.tenant, project=req.project, before=before,
        after={"duration_hours": req.duration_hours, "expires_at": req.expires_at.isoformat() if req.expires_at else None},
    )
    _on_commit_changed(req, "extend")
    return req


@transaction.atomic
def request_scale(*, actor: Actor, request: WorkloadRequest, replicas: int) -> WorkloadRequest:
    """Change an inference service's replicas: down always, up within quota and the approval rule."""
    req = _fresh(request)
    _require_owner_or_approver(actor, req, "scale")
    if not kinds.allows(req.template.kind, "scale"):
        raise Invalid("Only inference services scale.", field="replicas")
    if not 1 <= replicas <= MAX_REPLICAS:
        raise Invalid(f"Between 1 and {MAX_REPLICAS} replicas.", field="replicas")
    size_check = kinds.get(req.template.kind).size_check  # inference: not below its minimum, nor above the template's
    for _field, message in size_check(req.template.parameters_schema or {}, req.parameters or {}, replicas) if size_check else []:
        raise Invalid(message, field="replicas")
    if req.state in FINAL:
        raise _refused(req, "scaled")
    if replicas > req.replicas:
        _require_usable(req.project, "scaling up")
        demand = request_demand(flavor=req.flavor, gpus=req.gpus, replicas=replicas, cpu=req.cpu)
        _check_can_ever_run(project=req.project, flavor=req.flavor, demand=demand, field="replicas")
        if req.flavor.kind == Flavor.Kind.HAMI:
            _check_share_fits_quota(project=req.project, flavor=req.flavor, vgpus=req.gpus * replicas, share=req.hami_share,
                                    field="replicas")
        if req.state not in (S.SUBMITTED, S.PENDING_APPROVAL):
            decision = approval_decide(
                actor=actor, project=req.project, template=req.template,
                gpus_total=_gpus_total(flavor=req.flavor, gpus=req.gpus, replicas=replicas), hours=req.duration_hours,
                priority=req.priority, approver_decides=True,
            )
            if not decision.auto:
                raise NotAllowed(f"Scaling up to {replicas} replicas needs a project admin: {decision.reason}")
    before = req.replicas
    if before == replicas:
        return req
    updated = (
        WorkloadRequest.objects.filter(pk=req.pk, replicas=before).exclude(state__in=FINAL).update(replicas=replicas)
    )
    if updated != 1:
        raise ConflictError("The request changed meanwhile; reload and try again.")
    req.replicas = replicas
    _event(req, actor_label=actor.label, message=f"Scaled from {before} to {replicas} replicas by {actor.label}.")
    audit_record(
        actor=actor, action="request.scale", target=req, tenant=req.tenant, project=req.project,
        before={"replicas": before}, after={"replicas": replicas},
    )
    _on_commit_changed(req, "scale")
    return req


# The catalogue (ops) and approval rules (project admins, ops) -----------------------------------


def _require_live(template: ServiceTemplate) -> None:
    """New requests use the live version of a template: older versions are retired, and say which one replaced them.
    A template read with ``is_live`` (``selectors.template_to_submit``, in this request) is not looked up again."""
    if getattr(template, "is_live", None) is True:
        return
    live = selectors.live_template(template.slug)
    if live is not None and live.pk == template.pk:
        return
    if live is not None and live.version > template.version:
        raise Invalid(
            f"Version {template.version} of {template.slug} is retired; use version {live.version} (id {live.pk}).",
            field="template",
        )
    raise Invalid(f"Template {template.slug} v{template.version} is no longer offered.", field="template")


# Volumes ---------------------------------------------------------------------------------------

VOLUME_FIELDS = ["project", "name", "owner", "description"]


# Notebook activity ------------------------------------------------------------------------------------------------

# Activity is written at most this often per notebook (a notebook page makes many requests a second).
NOTEBOOK_ACTIVITY_WRITE_SECONDS = 60


def notebook_activity_record(*, request_id: int, now: Any = None) -> bool:
    """A request reached the notebook through the portal (its proxy, or the ingress asking ``/notebooks/auth/``):
    remember when, for idle culling (``materialize.notebooks_cull_idle``). Throttled: at most one write per
    ``NOTEBOOK_ACTIVITY_WRITE_SECONDS`` (a cache key spares the database the rest). True when it wrote."""
    from django.core.cache import cache
    from django.utils import timezone

    now = now or timezone.now()
    every = NOTEBOOK_ACTIVITY_WRITE_SECONDS
    if not cache.add(f"workloads:notebook-activity:{request_id}", 1, timeout=every):
        return False
    stale = Q(last_active_at__isnull=True) | Q(last_active_at__lt=now - timedelta(seconds=every))
    return WorkloadRequest.objects.filter(pk=request_id).filter(stale).update(last_active_at=now) > 0

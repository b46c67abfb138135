"""Federation: which cluster and flavor a request runs on, the model compatibility check, and moving pending work
off a drained or unhealthy cluster (docs/federation.md).

The rule, at submission (``services._submit`` calls ``route`` after its own checks, before the approval decision):

1. **Compatibility first.** What the image needs (``min_gpu_memory_gib``, ``min_compute_capability``) is compared
   with each accepted model's card (``Flavor.gpu_memory_mib``, ``compute_capability``, from GPU Feature Discovery).
   A model that cannot run the image is refused with a field error (400) before anything is written or dispatched;
   a refusal is shown, never retried.
2. **Preference order.** The accepted models (``accepted_models``, preferred first; default: the flavor's model).
   The first is the request's own model. Among the clusters that offer it to the project (same kind, enforced, with
   quota, routable: neither unhealthy nor drained) the least loaded one that fits now is taken.
3. **Load from the clusters.** Free capacity and queue depth are read from each candidate cluster through
   ``portal/kube.py`` (one ClusterQueue list per cluster: what Kueue reserves per flavor, the project's queue's
   nominal and borrowing limit, its pending workloads), not from the portal's own bookkeeping. A cluster that does
   not answer is not a candidate.
4. **Spill-over only with consent.** When no cluster of the first model fits now, a later accepted model is tried
   only if the job consented (``spill_consent``) and the project's policy (``quotas.SpillPolicy``) allows that
   model; the request then records ``spilled``, ``spilled_from_model`` and ``route_reason``, and waits for an
   approver when the policy says so. Otherwise it waits in its own model's queue.

5. **Inside the chosen cluster Kueue chooses.** For a consenting job, later accepted models its policy allows (without
   an approver) that the cluster's ClusterQueue lists after the chosen flavor become ``kueue_flavors``: its pods allow
   each of them and Kueue's flavor fungibility picks at admission (``kueue_choice``); the status follower writes the
   flavor Kueue admitted back into the request.

Only when there is a choice (another cluster of its model, or a spill target) are clusters read: a request with one
possible place goes there as before, at no extra cost. A request that waited for an approver is routed again by the
same rule when it is approved (``services._route_at_approval``, with ``in_flight``; docs/federation.md).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.events import after_commit
from portal.kube import ClusterError, kube_for
from portal.labels import PROJECT_LABEL
from portal.quantities import fmt, in_portal_units
from quotas.capacity import capacity_by_flavor
from quotas.manifests import KUEUE, topology_flavor, volcano_owned
from quotas.models import Cluster, Flavor, SpillPolicy
from quotas.zones import COMPUTE_CAPABILITY, capability_tuple, gpu_models, spill_policy_of
from tenants.audit import audit_append, audit_entry
from tenants.models import Project

from . import hooks, materialize
from .models import RequestEvent, RequestState, WorkloadRequest
from .states import LabelledActor, move

logger = logging.getLogger(__name__)
S = RequestState
ROUTER = "router"


# ----------------------------------------------------------------------------------------- what the job declares
@dataclass(frozen=True)
class Needs:
    accepted_models: tuple[str, ...] = ()
    min_gpu_memory_gib: int | None = None
    min_compute_capability: str = ""
    spill_consent: bool = False

    @property
    def declared(self) -> bool:
        return bool(self.accepted_models or self.min_gpu_memory_gib or self.min_compute_capability or self.spill_consent)


def needs_parse(*, accepted_models: Any = None, min_gpu_memory_gib: Any = None, min_compute_capability: Any = "",
                spill_consent: Any = False) -> Needs:
    """The declared needs, checked: known models, a compute capability such as ``8.0``. Raises ValidationError."""
    errors: dict[str, list[str]] = {}
    models: list[str] = []
    if accepted_models:
        if isinstance(accepted_models, str):
            accepted_models = [m for m in accepted_models.split(",")]
        if not isinstance(accepted_models, (list, tuple)) or not all(isinstance(m, str) for m in accepted_models):
            errors["accepted_models"] = ["A list of GPU model names, preferred first."]
        else:
            models = list(dict.fromkeys(m.strip().lower() for m in accepted_models if m.strip()))
            known = set(gpu_models())
            unknown = [m for m in models if m not in known]
            if unknown:
                errors["accepted_models"] = [f"No cluster offers {', '.join(unknown)}; known models: {', '.join(sorted(known)) or 'none'}."]
            elif len(models) > 8:
                errors["accepted_models"] = ["At most 8 models."]
    memory = None
    if min_gpu_memory_gib not in (None, ""):
        try:
            memory = int(min_gpu_memory_gib)
            if not 1 <= memory <= 4096:
                raise ValueError
        except (TypeError, ValueError):
            errors["min_gpu_memory_gib"] = ["A whole number of GiB between 1 and 4096."]
    capability = str(min_compute_capability or "").strip()
    if capability and not COMPUTE_CAPABILITY.match(capability):
        errors["min_compute_capability"] = ["A CUDA compute capability such as 8.0 or 9.0."]
    if errors:
        raise ValidationError(errors)
    return Needs(tuple(models), memory, capability, bool(spill_consent))


def incompatibility(flavor: Flavor, needs: Needs) -> str:
    """Why ``flavor``'s card cannot run the image (empty: it can). Unknown facts are not held against a flavor only
    when nothing is declared; a declared need against an unknown card is a refusal (never schedule into doubt)."""
    if flavor.kind == Flavor.Kind.CPU:
        return ""
    model = flavor.gpu_model or flavor.name
    if needs.min_gpu_memory_gib:
        have = Decimal(flavor.gpu_memory_mib) / 1024
        if not flavor.gpu_memory_mib:
            return f"{model}: its card memory is not known; the image needs {needs.min_gpu_memory_gib} GiB."
        if have < needs.min_gpu_memory_gib:
            return f"{model} has {fmt(have.quantize(Decimal('0.1')))} GiB per GPU; the image needs {needs.min_gpu_memory_gib} GiB."
    if needs.min_compute_capability:
        if not flavor.compute_capability:
            return f"{model}: its compute capability is not known; the image needs {needs.min_compute_capability}."
        if capability_tuple(flavor.compute_capability) < capability_tuple(needs.min_compute_capability):
            return (f"{model} has compute capability {flavor.compute_capability}; the image needs "
                    f"{needs.min_compute_capability} or newer.")
    return ""


def models_satisfying(flavors: Iterable[Flavor], needs: Needs) -> list[str]:
    """The GPU models among ``flavors`` whose card runs an image with ``needs`` (the form offers only these)."""
    return sorted({f.gpu_model for f in flavors if f.gpu_model and f.kind != Flavor.Kind.CPU and not incompatibility(f, needs)})


# ----------------------------------------------------------------------------------------- load, read from clusters
@dataclass
class Load:
    """One flavor of one cluster as the cluster says now: capacity (its nodes), what Kueue reserves of it in every
    ClusterQueue, the project's queue's ceiling (nominal + borrowing limit, None: no limit) and use, and pending
    workloads in the project's queue and in the whole zone."""

    capacity: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)
    project_ceiling: Decimal | None = Decimal(0)
    project_reserved: Decimal = Decimal(0)
    project_pending: int = 0
    zone_pending: int = 0

    @property
    def free(self) -> Decimal:
        free = self.capacity - self.reserved
        if self.project_ceiling is not None:
            free = min(free, self.project_ceiling - self.project_reserved)
        return max(Decimal(0), free)

    def fits(self, demand: Decimal) -> bool:
        return self.project_pending == 0 and demand <= self.free

    def words(self) -> str:
        return f"{fmt(self.free)} free, {self.zone_pending} waiting"


def _resource_amount(entries: list[dict[str, Any]], flavor: str, resource: str, key: str) -> Decimal | None:
    for entry in entries or []:
        if entry.get("name") != flavor:
            continue
        for res in entry.get("resources") or []:
            if res.get("name") == resource and res.get(key) is not None:
                return in_portal_units(resource, res.get(key))
    return None


def zone_load(cluster: Cluster, project: Project, flavors: list[Flavor]) -> dict[int, Load] | None:
    """Per flavor id of ``cluster``, its load now, read from the cluster (one ClusterQueue list); None when the
    cluster does not answer (it is then no candidate)."""
    try:
        queues, _ = kube_for(cluster).list(KUEUE, "ClusterQueue")
    except ClusterError as exc:
        logger.info("routing: %s does not answer: %s", cluster, exc)
        return None
    except Exception as exc:  # a missing or broken kubeconfig: not a candidate either
        logger.info("routing: %s cannot be read: %s", cluster, exc)
        return None
    capacity = capacity_by_flavor(cluster, flavors=flavors)
    out: dict[int, Load] = {}
    for flavor in flavors:
        resource = flavor.primary_resource
        load = Load(capacity=capacity.get((flavor.pk, resource), Decimal(0)), project_ceiling=Decimal(0))
        for cq in queues:
            status, spec = cq.get("status") or {}, cq.get("spec") or {}
            reserved = _resource_amount(status.get("flavorsReservation") or status.get("flavorsUsage") or [],
                                        flavor.name, resource, "total") or Decimal(0)
            load.reserved += reserved
            groups = [f for g in spec.get("resourceGroups") or [] for f in g.get("flavors") or []]
            if not any(f.get("name") == flavor.name for f in groups):
                continue
            pending = int(status.get("pendingWorkloads") or 0)
            load.zone_pending += pending
            if ((cq.get("metadata") or {}).get("labels") or {}).get(PROJECT_LABEL) == project.slug:
                nominal = _resource_amount(groups, flavor.name, resource, "nominalQuota") or Decimal(0)
                borrowing = _resource_amount(groups, flavor.name, resource, "borrowingLimit")
                has_cohort = bool(spec.get("cohort") or spec.get("cohortName"))
                if load.project_ceiling is not None:
                    load.project_ceiling = (None if borrowing is None and has_cohort
                                            else load.project_ceiling + nominal + (borrowing or Decimal(0)))
                load.project_reserved += reserved
                load.project_pending += pending
        out[flavor.pk] = load
    return out


# ----------------------------------------------------------------------------------------- the route
@dataclass
class Route:
    flavor: Flavor
    spilled: bool = False
    from_model: str = ""
    reason: str = ""
    needs_approval: bool = False
    source_pending: int | None = None  # a spill: workloads waiting in its first model's zones then
    source_wait_seconds: int | None = None  # a spill: the estimated wait there then (``source_wait_estimate``)
    nowhere: bool = False  # no zone takes new work or answers: it stays where asked (re-routing at approval keeps it)
    kueue_flavors: list[dict[str, Any]] = field(default_factory=list)  # Kueue chooses among these (``kueue_choice``)

    def fields(self) -> dict[str, Any]:
        return {"flavor": self.flavor, "cluster": self.flavor.cluster, "spilled": self.spilled,
                "spilled_from_model": self.from_model, "route_reason": self.reason[:500],
                "spill_source_pending": self.source_pending, "spill_source_wait_seconds": self.source_wait_seconds,
                "kueue_flavors": self.kueue_flavors}


def _model(flavor: Flavor) -> str:
    return flavor.gpu_model or flavor.name


def kueue_choice(found: Route, *, project: Project, needs: Needs, candidates: list[Flavor],
                 usable: Callable[[Flavor], bool]) -> list[dict[str, Any]]:
    """The flavors of the chosen cluster Kueue may choose between for a consenting request (its own first, then
    flavors of later accepted models its project's policy allows, in the ClusterQueue's order), or [] (pinned).

    Kueue tries a group's flavors in the queue's order (``quotas.manifests.kueue_flavors``: ``order``, then name), so
    a later model is offered to Kueue only where the queue lists it after the chosen flavor and in the job's order of
    preference. Whole GPUs only, never on Volcano's pool, with the same pool and topology as the chosen flavor (one
    ClusterQueue, one kind of placement), usable by the submission's own rules and compatible with the image. A
    policy that wants an approver for a spill keeps the request pinned: Kueue would spill it without one."""
    chosen = found.flavor
    order = list(needs.accepted_models)
    model = _model(chosen)
    if (not needs.spill_consent or len(order) < 2 or model not in order or chosen.kind != Flavor.Kind.WHOLE
            or volcano_owned(chosen.cluster, chosen)):
        return []
    policy = spill_policy_of(project)
    later = [m for m in order[order.index(model) + 1:] if policy.admits(m)]
    if not later or policy.needs_approval:
        return []
    queue = sorted((f for f in candidates if f.cluster_id == chosen.cluster_id and f.active and f.kind == chosen.kind),
                   key=lambda f: (f.order, f.name))
    at = next((i for i, f in enumerate(queue) if f.pk == chosen.pk), None)
    if at is None:
        return []
    rank = {m: i for i, m in enumerate(order)}
    placed = topology_flavor(chosen.cluster, chosen)
    kept = [chosen]
    for f in queue[at + 1:]:
        if (_model(f) in later and rank[_model(f)] >= rank[_model(kept[-1])] and f.pool_label == chosen.pool_label
                and topology_flavor(f.cluster, f) == placed and not volcano_owned(f.cluster, f)
                and not incompatibility(f, needs) and usable(f)):
            kept.append(f)
    if len(kept) < 2:
        return []
    return [{"name": f.name, "model": _model(f), "node_labels": {str(k): str(v) for k, v in (f.node_labels or {}).items()},
             "tolerations": [dict(t) for t in (f.tolerations or [])]} for f in kept]


def _kueue_chooses(fn: Callable[..., Route]) -> Callable[..., Route]:
    """``route`` and then, inside the cluster it chose, the later models Kueue may choose (``kueue_choice``)."""
    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Route:
        found = fn(**kwargs)
        choice = kueue_choice(found, project=kwargs["project"], needs=kwargs["needs"], candidates=kwargs["candidates"],
                              usable=kwargs["usable"])
        if choice:
            found.kueue_flavors = choice
            found.reason = (f"{found.reason} In zone {found.flavor.cluster.zone_name} Kueue may also run it on "
                            f"{', '.join(f['model'] for f in choice[1:])} when {_model(found.flavor)} is full there "
                            f"(the queue's flavor order decides).")[:500]
        return found
    return wrapper


@_kueue_chooses
def route(*, project: Project, flavor: Flavor, needs: Needs, demand: Decimal, candidates: list[Flavor],
          usable: Callable[[Flavor], bool], exclude_cluster: Cluster | None = None,
          in_flight: Callable[[], dict[int, tuple[Decimal, Decimal]]] | None = None) -> Route:
    """Where a request of ``project`` asking ``demand`` of ``flavor`` runs (see the module's rule).

    ``candidates``: the flavors the template allows (active, with their clusters); ``usable(flavor)``: the
    submission's own rules (enforced, quota enough, the queues admit it), asked of each candidate considered.
    ``in_flight()``: per flavor id, demand approved but not in the clusters' queues yet (zone, project), counted as
    reserved; called once, only when clusters are read, before they are (re-routing at approval takes its lock there).
    Raises ValidationError (``flavor`` / ``accepted_models``) when the declared needs rule a model out."""
    home_model = _model(flavor)
    order = list(needs.accepted_models) or [home_model]
    if needs.accepted_models and home_model != order[0]:
        raise ValidationError({"flavor": [f"Flavor {flavor.name} is a {home_model}, but the first accepted model is "
                                          f"{order[0]}. Choose a flavor of {order[0]}, or list {home_model} first."]})
    same_kind = [f for f in candidates if f.kind == flavor.kind and f.active]
    # 1. Compatibility, before anything is read from a cluster or written.
    refused = incompatibility(flavor, needs)
    if refused and not needs.accepted_models:
        raise ValidationError({"flavor": [f"Incompatible: {refused} Choose another model."]})
    refusals = []
    for model in order:
        offered = [f for f in same_kind if _model(f) == model]
        if offered and all(incompatibility(f, needs) for f in offered):
            refusals.append(incompatibility(offered[0], needs))
    if refusals:
        raise ValidationError({"accepted_models": [f"Incompatible: {r}" for r in refusals]})
    if flavor.kind in (Flavor.Kind.CPU, Flavor.Kind.HAMI):
        return Route(flavor)  # CPU work goes where asked; HAMi shares are sized per flavor (not routed yet)

    # The policy is read only when the job consented to another model (no query on the common path).
    policy = spill_policy_of(project) if needs.spill_consent and len(order) > 1 else SpillPolicy(project=project)
    may_spill = {m for m in order[1:] if needs.spill_consent and policy.admits(m)}
    # Its own model on other clusters only: inside one cluster Kueue's flavor order decides between flavors of a model.
    considered = [f for f in same_kind if (f.pk == flavor.pk or f.cluster_id != flavor.cluster_id or _model(f) != home_model)
                  and _model(f) in ({order[0]} | may_spill) and f.cluster.routable
                  and f.cluster.role != "worker"  # a MultiKueue worker takes work from its manager only
                  and f.cluster != exclude_cluster and not incompatibility(f, needs)]
    if exclude_cluster is None and all(f.pk == flavor.pk for f in considered):
        considered = [flavor] if flavor in considered else []
    else:
        considered = [f for f in considered if f.pk == flavor.pk or usable(f)]
    first = order[0]
    if exclude_cluster is None and all(f.pk == flavor.pk for f in considered):
        # No choice: it goes where asked, as before routing existed, without reading any cluster.
        if flavor.cluster.routable:
            if len(order) > 1 and not may_spill:
                why = "did not consent to spill over" if not needs.spill_consent else "its project does not allow spill-over"
                return Route(flavor, reason=f"Runs on {first} in zone {flavor.cluster.zone_name}: the job {why}, so it "
                                            f"never runs on {', '.join(order[1:])}.")
            return Route(flavor)
        state = "drained" if flavor.cluster.draining else "unhealthy"
        return Route(flavor, nowhere=True,
                     reason=f"Zone {flavor.cluster.zone_name} is {state} and no other zone may take it: it waits there.")

    extra = in_flight() if in_flight is not None else {}
    loads: dict[int, Load] = {}
    by_cluster: dict[int, list[Flavor]] = {}
    for f in considered:
        by_cluster.setdefault(f.cluster_id, []).append(f)
    for fl in by_cluster.values():
        found = zone_load(fl[0].cluster, project, fl)
        if found:
            loads.update(found)
    for pk, (zone_extra, project_extra) in extra.items():
        if pk in loads:  # approved, not in the cluster's queues yet (re-routing at approval)
            loads[pk].reserved += zone_extra
            loads[pk].project_reserved += project_extra
    answered = [f for f in considered if f.pk in loads]
    home = [f for f in answered if _model(f) == first]
    fitting = sorted((f for f in home if loads[f.pk].fits(demand)), key=lambda f: (-loads[f.pk].free, f.order, f.cluster.name))
    if fitting:
        chosen = fitting[0]
        where = "" if len(home) == 1 else f" ({loads[chosen.pk].words()}, least loaded of {len(home)} {first} zones)"
        return Route(chosen, reason=f"Runs on {first} in zone {chosen.cluster.zone_name}{where}.")
    # 2. The first model is full (or gone): spill-over, only with consent and the project's policy.
    why_home = (f"{first} is full in every zone that offers it to the project ("
                + "; ".join(f"{f.cluster.zone_name}: {loads[f.pk].words()}" for f in home) + ")") if home else \
        f"no zone offering {first} answers or takes new work"
    source = {"source_pending": sum(loads[f.pk].zone_pending for f in home) if home else None,
              "source_wait_seconds": source_wait_estimate(home, loads, demand) if home and may_spill else None}
    for model in order[1:]:
        if model not in may_spill:
            continue
        targets = sorted((f for f in answered if _model(f) == model and loads[f.pk].fits(demand)),
                         key=lambda f: (-loads[f.pk].free, f.order, f.cluster.name))
        if targets:
            chosen = targets[0]
            return Route(chosen, spilled=True, from_model=first, needs_approval=policy.needs_approval, **source,
                         reason=(f"Spilled over from {first} to {model} in zone {chosen.cluster.zone_name}: {why_home}; "
                                 f"the job consented and the project allows {model}.")[:500])
    if not home:
        # No zone of its own model takes work (down or drained): with consent it waits in an allowed target instead.
        waiting = [f for f in answered if _model(f) in may_spill]
        if waiting:
            chosen = min(waiting, key=lambda f: (order.index(_model(f)), loads[f.pk].zone_pending, -loads[f.pk].free))
            return Route(chosen, spilled=True, from_model=first, needs_approval=policy.needs_approval, **source,
                         reason=(f"Spilled over from {first} to {_model(chosen)} in zone {chosen.cluster.zone_name}: "
                                 f"{why_home}; the job consented and the project allows {_model(chosen)}. It waits "
                                 f"there ({loads[chosen.pk].words()}).")[:500])
    if not needs.spill_consent and len(order) > 1:
        note = " It did not consent to spill over, so it waits for its own model."
    elif needs.spill_consent and not policy.allowed:
        note = " The project does not allow spill-over, so it waits for its own model."
    else:
        note = ""
    if home:
        chosen = min(home, key=lambda f: (loads[f.pk].zone_pending, -loads[f.pk].free, f.cluster.name))
        return Route(chosen, reason=f"Waits for {first} in zone {chosen.cluster.zone_name}: {why_home}.{note}"[:500])
    if exclude_cluster is not None:
        raise NoRoute(f"{why_home}.{note}")
    return Route(flavor, nowhere=True, reason=f"Waits for {first} in zone {flavor.cluster.zone_name}: {why_home}.{note}"[:500])


class NoRoute(Exception):
    """Re-dispatch found nowhere else to go."""


def source_wait_estimate(home: list[Flavor], loads: dict[int, Load], demand: Decimal, now: Any = None) -> int | None:
    """Seconds a job of ``demand`` would wait for the first free place among ``home`` (its first model's flavors),
    estimated now from what the portal knows runs and waits there: each admitted run frees its GPUs at its time limit
    (``expires_at``, else its admission plus its duration), the work queued ahead (first come, first served) takes
    freed GPUs first and runs its full duration, and the cluster's free capacity now (``loads``) counts at once.
    Time limits are upper bounds (work may end earlier), so this is an estimate, not a promise. None when nothing
    known would ever free enough (an unknown wait). One query."""
    now = now or timezone.now()
    rows = list(WorkloadRequest.objects.filter(flavor__in=[f.pk for f in home], finished_at__isnull=True,
                                               state__in=[S.QUEUED, S.RUNNING, S.APPROVED, S.PREEMPTED])
                .order_by("created_at").values_list("flavor_id", "state", "admitted_at", "expires_at", "duration_hours",
                                                    "gpus", "replicas"))
    best = None
    for flavor in home:
        free = loads[flavor.pk].free
        ends: list[tuple[Any, Decimal]] = []
        ahead: list[tuple[Decimal, int]] = []
        for flavor_id, state, admitted, expires, hours, gpus, replicas in rows:
            if flavor_id != flavor.pk:
                continue
            size = Decimal(gpus) * replicas
            if admitted is not None and state in (S.QUEUED, S.RUNNING):
                ends.append((expires or admitted + timedelta(hours=hours), size))
            else:
                ahead.append((size, hours))
        at = now
        waited = None
        for size, hours in [*ahead, (demand, 0)]:
            while free < size and ends:
                ends.sort(key=lambda e: e[0])
                end, freed = ends.pop(0)
                at, free = max(at, end), free + freed
            if free < size:
                break
            free -= size
            ends.append((at + timedelta(hours=hours), size))
            waited = at
        else:
            seconds = int(max(0.0, (waited - now).total_seconds())) if waited is not None else None
            if seconds is not None and (best is None or seconds < best):
                best = seconds
    return best


# ----------------------------------------------------------------------------------------- drained or unhealthy clusters
def _not_started(cluster: Cluster):
    """Requests on ``cluster`` that have not started there and were never moved before: approved (not applied yet)
    or queued and never admitted."""
    return (WorkloadRequest.objects.filter(cluster=cluster, redispatched_from__isnull=True)
            .filter(state__in=[S.APPROVED, S.QUEUED], admitted_at__isnull=True, first_admitted_at__isnull=True,
                    started_at__isnull=True)
            .select_related("project", "tenant", "flavor", "cluster", "template"))


def requests_redispatch(*, cluster_id: int, usable: Callable[[WorkloadRequest, Flavor], bool]) -> dict[str, int]:
    """Move the pending work of a drained or unhealthy cluster elsewhere, at most once per request (audited
    ``request.redispatch``, a timeline entry). Running work (admitted, started) is never touched: it finishes where
    it is, so nothing is duplicated. The same routing rule holds (another model only with consent and policy).
    The request goes back to ``approved`` on its new cluster and is materialized there; its objects on the old
    cluster are removed at once when it answers, else when it answers again (``leftovers_remove``)."""
    cluster = Cluster.objects.get(pk=cluster_id)
    out = {"moved": 0, "stayed": 0}
    if cluster.routable:
        return out
    why = f"cluster {cluster.name} is drained ({cluster.drain_reason})" if cluster.draining else \
        f"cluster {cluster.name} is unhealthy ({cluster.last_error[:200]})"
    for req in _not_started(cluster):
        needs = Needs(tuple(req.accepted_models or ()), req.min_gpu_memory_gib, req.min_compute_capability, req.spill_consent)
        candidates = list(req.template.allowed_flavors.filter(active=True).select_related("cluster"))
        demand = (Decimal(req.cpu) if req.flavor.kind == Flavor.Kind.CPU else Decimal(req.gpus)) * req.replicas
        try:
            found = route(project=req.project, flavor=req.flavor, needs=needs, demand=demand, candidates=candidates,
                          usable=lambda f, req=req: usable(req, f), exclude_cluster=cluster)
        except (NoRoute, ValidationError) as exc:
            out["stayed"] += 1
            RequestEvent.objects.create(request=req, actor_label=ROUTER,
                                        message=f"Not moved off {cluster.name}: {exc}"[:1000])
            continue
        if found.flavor.cluster_id == cluster.pk:
            out["stayed"] += 1
            continue
        # Leave the old cluster first where it answers (its Workload not admitted: nothing ran there).
        removed = None
        if req.state == S.QUEUED:
            try:
                materialize._delete_objects(kube_for(cluster), req, materialize.request_objects(req))
                removed = timezone.now()
            except Exception as exc:  # unreachable: removed when it answers again
                logger.info("redispatch of %s: old objects stay for now: %s", req.pk, exc)
        else:
            removed = timezone.now()
        spilled = _model(found.flavor) != (req.spilled_from_model or _model(req.flavor)) or req.spilled
        message = (f"Re-dispatched from {cluster.name} to {found.flavor.cluster.name} ({found.flavor}) because {why}. "
                   f"{found.reason}")[:1000]
        with transaction.atomic():
            fields = found.fields() | {"redispatched_from": cluster, "leftovers_removed_at": removed, "claimed_at": None,
                                       "applied_hash": "", "cluster_status": {}}
            fields["spilled"] = spilled
            if spilled and not req.spilled_from_model:
                fields["spilled_from_model"] = _model(req.flavor)
            if req.state == S.APPROVED:
                n = WorkloadRequest.objects.filter(pk=req.pk, state=S.APPROVED, redispatched_from__isnull=True).update(**fields)
                if not n:
                    continue
                RequestEvent.objects.create(request=req, actor_label=ROUTER, message=message)
            elif not move(req, to=S.APPROVED, actor_label=ROUTER, reason=message, fields=fields, only_from=[S.QUEUED]):
                continue
            entry = audit_entry(actor=_router_actor(), action="request.redispatch", target=req, tenant=req.tenant,
                                project=req.project, before={"cluster": cluster.name, "flavor": req.flavor.name},
                                after={"cluster": found.flavor.cluster.name, "flavor": found.flavor.name,
                                       "spilled": spilled, "why": why[:300]})
            audit_append([entry])
            after_commit(hooks.request_approved, req.pk)
        out["moved"] += 1
    return out


def _router_actor() -> LabelledActor:
    return LabelledActor(user=None, name=ROUTER)


def zones_redispatch(*, usable: Callable[[WorkloadRequest, Flavor], bool], now: Any = None) -> dict[str, dict[str, int]]:
    """Housekeeping: re-dispatch the pending work of every drained cluster, and of every cluster unhealthy for longer
    than ``PORTAL_REDISPATCH_AFTER_SECONDS`` (a blip moves nothing); remove what moved requests left on clusters that
    answer again. Per cluster name, what was done."""
    now = now or timezone.now()
    after = timedelta(seconds=getattr(settings, "PORTAL_REDISPATCH_AFTER_SECONDS", 120))
    out: dict[str, dict[str, int]] = {}
    for cluster in Cluster.objects.all():
        down_long = cluster.unhealthy and (cluster.last_seen_at is None or now - cluster.last_seen_at >= after)
        if cluster.draining or down_long:
            out[cluster.name] = requests_redispatch(cluster_id=cluster.pk, usable=usable)
        elif cluster.health == "healthy":
            cleaned = leftovers_remove(cluster)
            if cleaned:
                out[cluster.name] = {"leftovers_removed": cleaned}
    return out


def leftovers_remove(cluster: Cluster) -> int:
    """Remove the objects re-dispatched requests left on ``cluster`` while it did not answer (called once the cluster
    answers again). Returns the number of requests cleaned."""
    rows = list(WorkloadRequest.objects.filter(redispatched_from=cluster, leftovers_removed_at__isnull=True)
                .select_related("project", "tenant", "flavor", "cluster", "template"))
    if not rows:
        return 0
    kube = kube_for(cluster)
    done = []
    for req in rows:
        try:  # the same names and kinds as there (``req-<id>``)
            materialize._delete_objects(kube, req, materialize.request_objects(req))
        except ClusterError:
            continue
        done.append(req.pk)
    WorkloadRequest.objects.filter(pk__in=done).update(leftovers_removed_at=timezone.now())
    return len(done)


# ----------------------------------------------------------------------------------------- reads (the ops zones page)
@dataclass
class SpillRow:
    source: str
    target: str
    requests: int = 0
    gpu_hours: Decimal = Decimal(0)
    measured: int = 0  # admitted, with the source's estimated wait recorded at routing
    wait_saved_hours: Decimal = Decimal(0)


def spill_summary(*, now: Any = None) -> list[SpillRow]:
    """Spill-overs by source and target model: how many requests, the GPU-hours they ran (their runs from the
    first admission to their end, or now) and the queue wait spilling saved them (the wait estimated on the source
    at routing, ``spill_source_wait_seconds``, less the wait they had on the target from approval to first admission,
    at least 0 each; docs/federation.md). Ops only, every tenant. One query."""
    now = now or timezone.now()
    rows: dict[tuple[str, str], SpillRow] = {}
    for source, target, gpus, replicas, admitted, finished, created, approved, estimate in (
            WorkloadRequest.objects.filter(spilled=True).values_list(
                "spilled_from_model", "flavor__gpu_model", "gpus", "replicas", "first_admitted_at", "finished_at",
                "created_at", "approved_at", "spill_source_wait_seconds")):
        row = rows.setdefault((source, target), SpillRow(source, target))
        row.requests += 1
        if admitted:
            seconds = Decimal(max(0.0, ((finished or now) - admitted).total_seconds()))
            row.gpu_hours += (seconds / 3600 * gpus * replicas).quantize(Decimal("0.01"))
            if estimate is not None:
                waited = max(0.0, (admitted - (approved or created)).total_seconds())
                row.measured += 1
                row.wait_saved_hours += (Decimal(max(0.0, estimate - waited)) / 3600).quantize(Decimal("0.01"))
    return sorted(rows.values(), key=lambda r: (r.source, r.target))

"""The checks a submission passes before anything is written (``services._submit`` calls them in order): the
flavor, a HAMi share's size, the image, the parameters, the size, the topology and the name. Each adds its field
errors to one ``_Errors``, so a form shows every problem at once."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Q

from portal.exceptions import Invalid
from portal.quantities import fmt
from quotas import manifests as quota_manifests
from quotas import services as quota_services
from quotas.capacity import flavor_enforcement, is_enforced
from quotas.models import Flavor
from tenants.access import Actor
from tenants.models import DNS1123_LABEL, Project

from . import kinds
from .models import (
    LIVE_STATES,
    Image,
    Priority,
    ServiceTemplate,
    Volume,
    WorkloadRequest,
)
from .schema import parameters_validate

DEFAULT_DURATION_HOURS = 8
MAX_REPLICAS = 64
TOPOLOGY_CHOICES = ("", "rack", "block", "prefer-rack", "nvlink", "prefer-nvlink")


def _name_taken(project: Project, name: str, *, other_than: int | None = None) -> bool:
    live = WorkloadRequest.objects.filter(project=project, name=name, state__in=LIVE_STATES)
    if other_than is not None:
        live = live.exclude(pk=other_than)
    return live.exists()


def _name_taken_message(project: Project, name: str) -> str:
    return f"{name} is already in use by an active request in {project.slug}."


def _check_data_volume(actor: Actor, project: Project, parameters: dict[str, Any]) -> str | None:
    """Why ``parameters.data_volume`` may not be mounted by ``actor``'s request, or None when it may.

    Only the requester's own volumes and the project's shared ones (``Volume`` rows) may be mounted: a
    name in the namespace is not enough (another user's notebook home lives there too).
    """
    claim = str(parameters.get("data_volume") or "").strip()
    if not claim:
        return None
    usable = Volume.objects.filter(project=project).filter(Q(owner__isnull=True) | Q(owner=actor.user))
    if usable.filter(name=claim).exists():
        return None
    names = list(usable.order_by("name").values_list("name", flat=True)[:20])
    allowed = (f"You may mount: {', '.join(names)}." if names else
               "You have none there yet: a notebook's home volume is yours, and a project admin can share one.")
    return (f"Volume {claim} is not one you may mount in {project.slug}: only your own volumes and the project's "
            f"shared volumes may be mounted. {allowed}")


def _default_name(template: ServiceTemplate) -> str:
    return f"{template.slug[:33].rstrip('-')}-{secrets.token_hex(3)}"


class _Errors(dict):
    """Field errors collected across the checks, raised together as one ValidationError."""

    def add(self, field: str, message: str) -> None:
        self.setdefault(field, []).append(message)

    def raise_any(self) -> None:
        if self:
            raise ValidationError(dict(self))


def _allowed_flavors(template: ServiceTemplate) -> list[Flavor]:
    """The template's active flavors with their clusters, in order; from the prefetch when the caller made one
    (``selectors.template_to_submit``)."""
    prefetched = getattr(template, "_prefetched_objects_cache", {}).get("allowed_flavors")
    if prefetched is not None and all(Flavor.cluster.is_cached(f) for f in prefetched):
        return sorted((f for f in prefetched if f.active), key=lambda f: (f.order, f.name))
    return list(template.allowed_flavors.filter(active=True).select_related("cluster").order_by("order", "name"))


def _check_flavor(template: ServiceTemplate, flavor: Flavor | None, errors: _Errors) -> Flavor | None:
    """One the template allows, active and enforced by its cluster; default: the first allowed one."""
    allowed = _allowed_flavors(template)
    if flavor is None:
        flavor = next((f for f in allowed if is_enforced(f)), None)  # never default to one nothing enforces
        if flavor is None:
            errors.add("flavor", f"Template {template.slug} allows no flavor at the moment.")
            return None
    else:
        by_pk = {f.pk: f for f in allowed}
        if flavor.pk not in by_pk:
            names = ", ".join(f.name for f in allowed) or "none"
            errors.add("flavor", f"Flavor {flavor.name} is not allowed for {template.name} (allowed: {names}).")
            return flavor
        flavor = by_pk[flavor.pk]  # the allowed row, with its cluster loaded
        enforcement = flavor_enforcement(flavor.cluster, flavor)
        if not enforcement.enforced:
            # Offered but not enforced by the cluster's architecture: it would be admitted by nothing, ever.
            errors.add("flavor", enforcement.reason)
            return flavor
    if not flavor.hami_sized:
        errors.add("flavor", f"HAMi flavor {flavor.name} has no share size yet (memory and cores per vGPU): platform ops "
                             f"set it on the flavor's page. Choose another flavor meanwhile.")
        return flavor
    if kinds.kueue_cannot_admit(kind=template.kind, flavor=flavor):
        # Architecture E: Volcano alone schedules these GPUs; a Kueue workload on them would queue forever.
        errors.add("flavor", f"Flavor {flavor.name} is the offline pool's whole GPUs, which only Volcano schedules on "
                             f"{flavor.cluster.name}: {template.name} ({template.get_kind_display().lower()}) could "
                             f"never start there. Choose another flavor; training jobs may use this one.")
    return flavor


def _check_share(flavor: Flavor | None, memory_gib: Any, cores_percent: Any, preset: bool | None,
                 errors: _Errors) -> tuple[int, int]:
    """A HAMi flavor's share per vGPU as (GPU memory MiB, % of a card's cores): its preset, or a size of the
    requester's own within what the card allows (``quotas.services.share_size``: more than 0 GiB and at most one
    card's memory, 1 to 100 % of its cores; the same rule as a quota request's shares). (0, 0) for other kinds,
    which take no share size."""
    given = [name for name, value in (("share_memory_gib", memory_gib), ("share_cores_percent", cores_percent))
             if value not in (None, "")]
    if flavor is None:
        return 0, 0
    if flavor.kind != Flavor.Kind.HAMI:
        for name in given:
            errors.add(name, f"Only HAMi flavors take a share size; {flavor} is not one.")
        if preset:
            errors.add("share_preset", f"Only HAMi flavors have a preset share; {flavor} is not one.")
        return 0, 0
    if not flavor.hami_sized:
        return 0, 0  # refused with the reason by _check_flavor
    if preset and given:
        errors.add("share_preset", f"Give the preset share ({flavor.share}) or a size of your own, not both.")
        return 0, 0
    if not given:
        if preset is False:
            errors.add("share_memory_gib", "Give your share's GPU memory (GiB) and % of the cores, or take the preset.")
        return flavor.hami_memory_mib, flavor.hami_cores_percent
    try:
        return quota_services.share_size(flavor, memory_gib=memory_gib, cores_percent=cores_percent)
    except Invalid as exc:
        errors.add(exc.field or "share_memory_gib", exc.message)
        return 0, 0


def _check_submitted_image(project: Project, template: ServiceTemplate, image: str, errors: _Errors,
                           images: list[Image] | None = None) -> str:
    """Curated for this kind of template, unless the project may use its own; default: the first curated one.
    ``images``: the active images, already read."""
    image = (image or "").strip()
    active = Image.objects.filter(active=True) if images is None else images
    curated = [i for i in active if template.kind in (i.kinds or [])]
    kind_name = template.get_kind_display().lower()
    if not image:
        if curated:
            image = curated[0].reference
        else:
            errors.add("image", f"No curated image for {kind_name}s; name one.")
    elif image not in {i.reference for i in curated} and not project.allow_custom_images:
        errors.add("image", f"Image {image} is not in the curated list for {kind_name}s.")
    if len(image) > 300:
        errors.add("image", "At most 300 characters.")
    return image


def _check_parameters(actor: Actor, project: Project, template: ServiceTemplate, parameters: dict[str, Any] | None,
                      errors: _Errors) -> dict[str, Any]:
    """The template's JSON Schema, defaults filled in; a data volume the actor may mount."""
    try:
        parameters = parameters_validate(template.parameters_schema, parameters)
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            for message in messages:
                errors.add(field, message)
        return {}
    refused = _check_data_volume(actor, project, parameters)
    if refused:
        errors.add("parameters.data_volume", refused)
    return parameters


@dataclass
class _Size:
    gpus: int
    replicas: int
    cpu: Decimal
    memory_gib: int
    duration_hours: int
    priority: str


def _check_size(template: ServiceTemplate, flavor: Flavor | None, parameters: dict[str, Any], *, gpus: int | None,
                replicas: int | None, cpu: Decimal | int | float | None, memory_gib: int | None,
                duration_hours: int | None, priority: str, errors: _Errors) -> _Size:
    """Resources (defaults from the template, within its maxima), replicas, duration and priority."""
    is_cpu = flavor is not None and flavor.kind == Flavor.Kind.CPU
    gpus = (0 if is_cpu else template.default_gpus) if gpus is None else gpus
    if gpus < (0 if is_cpu else 1):
        errors.add("gpus", "At least 1 GPU (or slice) for a GPU flavor.")
    elif gpus > template.max_gpus:
        errors.add("gpus", f"At most {template.max_gpus} per replica for {template.name}.")
    cpu = template.default_cpu if cpu is None else Decimal(str(cpu))
    if cpu <= 0 or cpu > template.max_cpu:
        errors.add("cpu", f"Between 0 and {fmt(template.max_cpu)} CPUs for {template.name}.")
    memory_gib = template.default_memory_gib if memory_gib is None else memory_gib
    if memory_gib < 1 or memory_gib > template.max_memory_gib:
        errors.add("memory_gib", f"Between 1 and {template.max_memory_gib} GiB for {template.name}.")
    duration_hours = min(DEFAULT_DURATION_HOURS, template.max_duration_hours) if duration_hours is None else duration_hours
    if duration_hours < 1:
        errors.add("duration_hours", "At least 1 hour.")
    elif duration_hours > template.max_duration_hours:
        errors.add("duration_hours", f"At most {template.max_duration_hours} hours for {template.name}.")

    # Replicas: inference replicas, or distributed training's workers (one source: the parameters).
    kind = kinds.get(template.kind)
    if kind.replicas == "workers":
        derived = int(parameters.get("workers", 1)) if parameters.get("distributed") else 1
        if replicas is not None and replicas != derived:
            errors.add("replicas", f"For {kind.name}, set parameters.workers (with parameters.distributed) instead.")
        replicas = derived
    elif kind.replicas == "one":
        if replicas not in (None, 1):
            errors.add("replicas", f"A {kind.name} has one replica.")
        replicas = 1
    replicas = 1 if replicas is None else replicas
    if not 1 <= replicas <= MAX_REPLICAS:
        errors.add("replicas", f"Between 1 and {MAX_REPLICAS}.")

    if kind.size_check is not None and 1 <= replicas <= MAX_REPLICAS:
        for field, message in kind.size_check(template.parameters_schema or {}, parameters, replicas):
            errors.add(field, message)

    priority = priority or kind.default_priority
    if priority not in Priority.values:
        errors.add("priority", f"One of {', '.join(Priority.values)}.")
    elif kind.priority_fixed and priority != kind.default_priority:
        errors.add("priority", f"{kind.label}s always run at {kind.default_priority} priority (the online class, "
                               f"never preempted by batch work): leave it out or choose {kind.default_priority}.")
    return _Size(gpus, replicas, cpu, memory_gib, duration_hours, priority)


def _check_topology(template: ServiceTemplate, flavor: Flavor | None, replicas: int, topology: Any,
                    errors: _Errors) -> str:
    """Placement by rack or block (Kueue TAS, or Volcano's HyperNodes on architecture E's training pool) is offered only
    where it can work: multi-pod training on a whole-GPU flavor of a cluster with a topology
    (``quotas.manifests.placed_by_topology``). The form offers the same."""
    topology = "" if topology is None else topology
    if not isinstance(topology, str) or topology not in TOPOLOGY_CHOICES:
        errors.add("topology", f"One of {', '.join(repr(c) for c in TOPOLOGY_CHOICES)}.")
        return ""
    if not topology or flavor is None:
        return topology
    if not kinds.get(template.kind).gang or kinds.get(template.kind).replicas != "workers":
        errors.add("topology", f"Only distributed training is placed by rack or block, not a {template.kind}.")
    elif replicas < 2:
        errors.add("topology", "Only a job of 2 or more workers is placed by rack or block.")
    elif not quota_manifests.placed_by_topology(flavor.cluster, flavor):
        errors.add("topology", f"Flavor {flavor} is not placed by topology: its cluster has no racks and blocks "
                               f"configured, or the flavor is not a whole-GPU flavor Kueue or Volcano hands out.")
    elif not quota_manifests.placement_offered(flavor.cluster, topology):
        level = quota_manifests.PLACEMENTS[topology][1]
        names = ", ".join(quota_manifests.level_names(flavor.cluster))
        errors.add("topology", f"Cluster {flavor.cluster.name} has no {quota_manifests.LEVEL_WORDS.get(level, level)} "
                               f"level (its levels: {names}): choose a placement by one of those.")
    return topology


def _check_name(project: Project, template: ServiceTemplate, name: str, taken: bool | None, errors: _Errors) -> str:
    """A DNS label of at most 40 characters not used by a live request of the project; default: made up.
    ``taken``: already looked up (``_replay_and_name``), else None."""
    name = (name or "").strip() or _default_name(template)
    try:
        DNS1123_LABEL(name)
        if len(name) > 40:
            raise ValidationError("At most 40 characters.")
    except ValidationError as exc:
        for message in exc.messages:
            errors.add("name", message)
        return name
    if taken if taken is not None else _name_taken(project, name):
        errors.add("name", _name_taken_message(project, name))
    return name

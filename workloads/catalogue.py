"""The default service catalogue: one template per kind (workloads/kinds/), curated images and the global approval rules.

``seed_catalogue()`` is idempotent: run it on every deploy or demo start. It creates what is
missing and leaves what ops changed alone (it never overwrites an existing template version, image
or rule); templates without flavors get the first cluster's active GPU flavors.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from quotas.models import Cluster, Flavor

from . import kinds
from .models import ApprovalRule, Image, ServiceTemplate

@dataclass(frozen=True)
class TemplateSpec:
    kind: str
    slug: str
    name: str
    description: str
    schema: dict
    default_gpus: int
    max_gpus: int
    max_duration_hours: int
    idle_timeout_minutes: int | None = None
    default_cpu: int = 4
    max_cpu: int = 64
    default_memory_gib: int = 32
    max_memory_gib: int = 512


def template_specs() -> list[TemplateSpec]:
    """One default template per registered kind (workloads/kinds/): its defaults and parameter schema."""
    return [
        TemplateSpec(kind.name, kind.defaults.slug, kind.defaults.name, kind.defaults.description, kind.schema,
                     default_gpus=kind.defaults.default_gpus, max_gpus=kind.defaults.max_gpus,
                     max_duration_hours=kind.defaults.max_duration_hours,
                     idle_timeout_minutes=kind.defaults.idle_timeout_minutes, default_cpu=kind.defaults.default_cpu,
                     max_cpu=kind.defaults.max_cpu, default_memory_gib=kind.defaults.default_memory_gib,
                     max_memory_gib=kind.defaults.max_memory_gib)
        for kind in kinds.KINDS.values()
    ]


def curated_images() -> list[tuple[str, str, str, list[str]]]:
    """(name, reference, description, kinds) of every image a registered kind declares (``Kind.images``); an image
    several kinds declare is one row listing them all."""
    out: dict[str, tuple[str, str, str, list[str]]] = {}
    for kind in kinds.KINDS.values():
        for name, reference, description in kind.images:
            out.setdefault(reference, (name, reference, description, []))[3].append(kind.name)
    return list(out.values())


# Global rule: small, short requests go ahead on their own; inference always needs a project admin.
GLOBAL_RULE = {"auto_approve_max_gpus": 2, "auto_approve_max_hours": 8, "require_admin_for_inference": True}


def _gpu_flavors() -> list[Flavor]:
    cluster = Cluster.objects.order_by("pk").first()
    if cluster is None:
        return []
    return list(cluster.flavors.filter(active=True).exclude(kind=Flavor.Kind.CPU))


@transaction.atomic
def seed_catalogue() -> dict[str, int]:
    """Create the default templates, images and global rules that are missing. Returns counts created."""
    created = {"templates": 0, "images": 0, "rules": 0}
    flavors = _gpu_flavors()
    for spec in template_specs():
        template, made = ServiceTemplate.objects.get_or_create(
            slug=spec.slug,
            version=1,
            defaults={
                "kind": spec.kind, "name": spec.name, "description": spec.description,
                "parameters_schema": spec.schema, "default_gpus": spec.default_gpus, "max_gpus": spec.max_gpus,
                "default_cpu": spec.default_cpu, "max_cpu": spec.max_cpu,
                "default_memory_gib": spec.default_memory_gib, "max_memory_gib": spec.max_memory_gib,
                "max_duration_hours": spec.max_duration_hours, "idle_timeout_minutes": spec.idle_timeout_minutes,
            },
        )
        created["templates"] += made
        if flavors and not template.allowed_flavors.exists():
            template.allowed_flavors.set(flavors)
    for name, reference, description, image_kinds in curated_images():
        _, made = Image.objects.get_or_create(
            reference=reference, defaults={"name": name, "description": description, "kinds": [str(k) for k in image_kinds]}
        )
        created["images"] += made
    _, made = ApprovalRule.objects.get_or_create(project=None, template_slug="", defaults=GLOBAL_RULE)
    created["rules"] += made
    return created

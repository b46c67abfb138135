"""Writes to the catalogue (ops: templates and images, each template version kept while requests use it),
approval rules (project admins, ops) and volumes: check the rules, write, audit. The request lifecycle is in
``workloads.services``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from portal.exceptions import ConflictError, Invalid, NotAllowed, ReadOnlyTenant
from quotas.models import Flavor
from tenants.access import Actor
from tenants.audit import audit_record, snapshot
from tenants.guards import require
from tenants.models import Project

from . import kinds, manifests, policy
from .models import (
    APPROVER_ONLY_PRIORITIES,
    ApprovalRule,
    Image,
    Priority,
    ServiceTemplate,
    Volume,
)
from .schema import schema_errors
from .services import _require_usable

RULE_FIELDS = [
    "project", "template_slug", "auto_approve_max_gpus", "auto_approve_max_hours", "require_admin_for_inference",
    "member_priorities", "admin_priorities",
]

IMAGE_FIELDS = ["name", "reference", "kinds", "active"]

# What may change on a template version that requests already use: nothing that changes meaning.
TEMPLATE_COSMETIC = {"name", "description", "active"}

TEMPLATE_FIELDS = [
    "kind", "slug", "version", "name", "active", "default_gpus", "max_gpus", "max_duration_hours", "idle_timeout_minutes",
    "idle_gpu_percent",
]


def _retire_others(actor: Actor, template: ServiceTemplate) -> None:
    """One live version per slug: activating a version (a new one, or an old one again) retires the others."""
    if not template.active:
        return
    others = ServiceTemplate.objects.select_for_update().filter(slug=template.slug, active=True).exclude(pk=template.pk)
    for other in others:
        before = snapshot(other, TEMPLATE_FIELDS)
        other.active = False
        other.save(update_fields=["active"])
        audit_record(actor=actor, action="template.retire", target=other, before=before,
                     after=snapshot(other, TEMPLATE_FIELDS) | {"replaced_by": f"{template.slug} v{template.version}"})


def _check_template(template: ServiceTemplate) -> None:
    problems = schema_errors(template.parameters_schema)
    if problems:
        raise ValidationError({"parameters_schema": problems})
    if template.default_gpus > template.max_gpus:
        raise ValidationError({"default_gpus": [f"At most max_gpus ({template.max_gpus})."]})
    if template.idle_gpu_percent is not None and not 0 <= template.idle_gpu_percent <= 100:
        raise ValidationError({"idle_gpu_percent": ["A percentage: between 0 and 100, or empty for the default."]})
    template.full_clean(exclude=["allowed_flavors"])


@transaction.atomic
def template_create(*, actor: Actor, allowed_flavors: Iterable[Flavor] = (), **values: Any) -> ServiceTemplate:
    """A new template, or a new version of an existing slug (version = last + 1)."""
    require(policy.may_manage_catalogue(actor), "Only platform ops manage templates.")
    last = ServiceTemplate.objects.select_for_update().filter(slug=values.get("slug", "")).order_by("-version").first()
    values["version"] = (last.version + 1) if last else 1
    template = ServiceTemplate(**values)
    _check_template(template)
    template.save()
    template.allowed_flavors.set(list(allowed_flavors))
    audit_record(actor=actor, action="template.create", target=template, after=snapshot(template, TEMPLATE_FIELDS))
    _retire_others(actor, template)
    return template


@transaction.atomic
def template_update(
    *, actor: Actor, template: ServiceTemplate, allowed_flavors: Iterable[Flavor] | None = None, **changes: Any
) -> ServiceTemplate:
    """Edit a version in place. Once requests use it, only name, description and active may change:
    anything else makes a new version (POST with the same slug), so old requests keep their meaning."""
    require(policy.may_manage_catalogue(actor), "Only platform ops manage templates.")
    template = ServiceTemplate.objects.select_for_update().get(pk=template.pk)
    for fixed in ("kind", "slug", "version"):
        if fixed in changes and changes[fixed] != getattr(template, fixed):
            raise Invalid(f"{fixed} cannot change; create a new template or version.", field=fixed)
    meaningful = {k for k, v in changes.items() if getattr(template, k) != v} - TEMPLATE_COSMETIC
    if allowed_flavors is not None and (
            {f.pk for f in allowed_flavors} != set(template.allowed_flavors.values_list("pk", flat=True))):
        meaningful.add("allowed_flavors")
    if meaningful and template.requests.exists():
        raise ConflictError(
            f"Requests use {template.slug} v{template.version}; changing {', '.join(sorted(meaningful))} needs a new version."
        )
    before = snapshot(template, TEMPLATE_FIELDS)
    for field, value in changes.items():
        setattr(template, field, value)
    _check_template(template)
    template.save()
    if allowed_flavors is not None:
        template.allowed_flavors.set(list(allowed_flavors))
    audit_record(actor=actor, action="template.update", target=template, before=before, after=snapshot(template, TEMPLATE_FIELDS))
    if changes.get("active") and not before["active"]:
        _retire_others(actor, template)
    return template


@transaction.atomic
def image_create(*, actor: Actor, **values: Any) -> Image:
    require(policy.may_manage_catalogue(actor), "Only platform ops manage the image list.")
    image = Image(**values)
    _check_image(image)
    image.save()
    audit_record(actor=actor, action="image.create", target=image, after=snapshot(image, IMAGE_FIELDS))
    return image


@transaction.atomic
def image_update(*, actor: Actor, image: Image, **changes: Any) -> Image:
    require(policy.may_manage_catalogue(actor), "Only platform ops manage the image list.")
    image = Image.objects.select_for_update().get(pk=image.pk)
    before = snapshot(image, IMAGE_FIELDS)
    for field, value in changes.items():
        setattr(image, field, value)
    _check_image(image)
    image.save()
    audit_record(actor=actor, action="image.update", target=image, before=before, after=snapshot(image, IMAGE_FIELDS))
    return image


def _check_image_kinds(image: Image) -> None:
    listed = image.kinds if isinstance(image.kinds, list) else None
    if not listed or any(kind not in kinds.names() for kind in listed):
        raise ValidationError({"kinds": [f"A list of template kinds: {', '.join(kinds.names())}."]})


def _check_image(image: Image) -> None:
    _check_image_kinds(image)
    image.full_clean()


def _require_rule_scope(actor: Actor, project: Project | None) -> None:
    if project is None:
        require(policy.may_manage_catalogue(actor), "Only platform ops set global approval rules.")
    else:
        require(policy.may_decide(actor, project), "Only project admins, tenant admins and ops set the project's approval rules.")
        if not project.tenant.is_active and not actor.is_ops:
            raise ReadOnlyTenant(f"Tenant {project.tenant.slug} is suspended: its data can be read but not changed.")


def _check_rule(rule: ApprovalRule) -> None:
    for field in ("member_priorities", "admin_priorities"):
        value = getattr(rule, field)
        if not isinstance(value, list) or any(p not in Priority.values for p in value):
            raise ValidationError({field: [f"A list of priorities: {', '.join(Priority.values)}."]})
        if any(p in APPROVER_ONLY_PRIORITIES for p in value):
            raise ValidationError({field: ["production always needs an approver's decision; it cannot be approved automatically."]})
        setattr(rule, field, [p for p in Priority.values if p in value])  # stable order, no duplicates
    rule.full_clean(validate_unique=False, validate_constraints=False)


@transaction.atomic
def approval_rule_create(*, actor: Actor, project: Project | None, **values: Any) -> ApprovalRule:
    if actor.token is not None:
        raise NotAllowed("API tokens cannot change approval rules.")
    _require_rule_scope(actor, project)
    if ApprovalRule.objects.filter(project=project, template_slug=values.get("template_slug", "")).exists():
        raise ConflictError("A rule for this project and template exists already; change it instead.", field="template_slug")
    rule = ApprovalRule(project=project, **values)
    _check_rule(rule)
    rule.save()
    audit_record(
        actor=actor, action="approval_rule.create", target=rule, tenant=project.tenant if project else None,
        project=project, after=snapshot(rule, RULE_FIELDS),
    )
    return rule


@transaction.atomic
def approval_rule_update(*, actor: Actor, rule: ApprovalRule, **changes: Any) -> ApprovalRule:
    if actor.token is not None:
        raise NotAllowed("API tokens cannot change approval rules.")
    rule = ApprovalRule.objects.select_for_update(of=("self",)).select_related("project__tenant").get(pk=rule.pk)
    _require_rule_scope(actor, rule.project)
    if "template_slug" in changes and changes["template_slug"] != rule.template_slug:
        raise Invalid("The template of a rule cannot change; create another rule.", field="template_slug")
    before = snapshot(rule, RULE_FIELDS)
    for field, value in changes.items():
        setattr(rule, field, value)
    _check_rule(rule)
    rule.save()
    audit_record(
        actor=actor, action="approval_rule.update", target=rule, tenant=rule.project.tenant if rule.project else None,
        project=rule.project, before=before, after=snapshot(rule, RULE_FIELDS),
    )
    return rule


@transaction.atomic
def approval_rule_delete(*, actor: Actor, rule: ApprovalRule) -> None:
    if actor.token is not None:
        raise NotAllowed("API tokens cannot change approval rules.")
    rule = ApprovalRule.objects.select_for_update(of=("self",)).select_related("project__tenant").get(pk=rule.pk)
    _require_rule_scope(actor, rule.project)
    audit_record(
        actor=actor, action="approval_rule.delete", target=rule, tenant=rule.project.tenant if rule.project else None,
        project=rule.project, before=snapshot(rule, RULE_FIELDS),
    )
    rule.delete()


@transaction.atomic
def volume_register(*, actor: Actor, project: Project, name: str, shared: bool = False, description: str = "") -> Volume:
    """Record an existing PersistentVolumeClaim of the project's namespace as mountable.

    ``shared``: every member's requests may mount it (project admins, tenant admins and ops register those);
    otherwise it is the registering user's own. Notebook home names (``home-req-…``) are the portal's.
    """
    if actor.user is None:
        raise NotAllowed("Volumes are registered by users.")
    project = Project.objects.select_related("tenant").get(pk=project.pk)
    if shared:
        require(policy.may_decide(actor, project), "Only project admins, tenant admins and ops share volumes with a project.")
    else:
        require(policy.may_submit_request(actor, project), "You may not register volumes in this project.")
    _require_usable(project, "registering a volume")
    name = (name or "").strip()
    if not name or len(name) > 253 or not manifests.DNS1123_SUBDOMAIN.match(name):
        raise Invalid("A PersistentVolumeClaim name: lower-case letters, digits, '-' and '.'.", field="name")
    if name.startswith(manifests.NOTEBOOK_HOME_PREFIX):
        raise Invalid("Names starting with home-req- are notebook home volumes; the portal registers those.", field="name")
    if Volume.objects.filter(project=project, name=name).exists():
        raise ConflictError(f"Volume {name} is registered in {project.slug} already.", field="name")
    try:
        with transaction.atomic():
            volume = Volume.objects.create(project=project, name=name, owner=None if shared else actor.user,
                                           description=(description or "")[:200])
    except IntegrityError:
        raise ConflictError(f"Volume {name} is registered in {project.slug} already.", field="name") from None
    audit_record(actor=actor, action="volume.register", target=volume, tenant=project.tenant, project=project,
                 after={"name": name, "shared": shared})
    return volume

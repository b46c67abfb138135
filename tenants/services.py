"""Every write to tenancy: checks the rules, writes, audits, re-syncs permissions. One transaction each."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.exceptions import ConflictError, Invalid, NotAllowed, ReadOnlyTenant

from . import policy
from .access import Actor, has_perm, permissions_sync, permissions_sync_tenant
from .audit import audit_record, snapshot
from .authentication import token_generate
from .guards import require, require_ops
from .models import ApiToken, Membership, Project, Role, Tenant

TENANT_FIELDS = ["name", "slug", "cost_centre", "contact_email", "status"]
PROJECT_FIELDS = ["name", "slug", "description", "status", "notebooks_open_to_approvers"]
MEMBERSHIP_FIELDS = ["user", "tenant", "project", "role"]
TOKEN_FIELDS = ["name", "project", "scope", "expires_at", "revoked_at"]
MAX_TOKEN_DAYS = 366


def _require_writable(actor: Actor, tenant: Tenant) -> None:
    """A suspended tenant is read-only for everyone but ops."""
    if not policy.may_write_in(actor, tenant):
        raise ReadOnlyTenant(f"Tenant {tenant.slug} is suspended: its data can be read but not changed.")


def _tenant_locked(tenant: Tenant) -> Tenant:
    """Re-read the tenant under a row lock: its status decides whether writes are allowed, and the
    lock serialises membership and project changes within one tenant."""
    return Tenant.objects.select_for_update().get(pk=tenant.pk)


# Tenants ---------------------------------------------------------------------------------------


@transaction.atomic
def tenant_create(*, actor: Actor, name: str, slug: str, cost_centre: str = "", contact_email: str = "") -> Tenant:
    require_ops(actor, "Only platform ops create tenants.")
    tenant = Tenant(name=name, slug=slug, cost_centre=cost_centre, contact_email=contact_email)
    tenant.full_clean()
    tenant.save()
    audit_record(actor=actor, action="tenant.create", target=tenant, tenant=tenant, after=snapshot(tenant, TENANT_FIELDS))
    return tenant


@transaction.atomic
def tenant_update(*, actor: Actor, tenant: Tenant, **changes: Any) -> Tenant:
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    require(policy.may_change_tenant(actor, tenant), "Only tenant admins and ops change a tenant.")
    if "status" in changes and changes["status"] != tenant.status:
        require_ops(actor, "Only platform ops suspend or reactivate a tenant.")
    elif not ("status" in changes and changes["status"] == Tenant.Status.ACTIVE):
        _require_writable(actor, tenant)
    if "slug" in changes and changes["slug"] != tenant.slug:
        raise Invalid("The slug cannot change: it names cluster objects.", field="slug")
    before = snapshot(tenant, TENANT_FIELDS)
    for field, value in changes.items():
        setattr(tenant, field, value)
    tenant.full_clean()
    tenant.save()
    action = "tenant.update"
    if before and before["status"] != tenant.status:
        action = "tenant.suspend" if tenant.status == Tenant.Status.SUSPENDED else "tenant.activate"
    audit_record(actor=actor, action=action, target=tenant, tenant=tenant, before=before, after=snapshot(tenant, TENANT_FIELDS))
    return tenant


# Projects --------------------------------------------------------------------------------------


def project_namespace(tenant_slug: str, slug: str) -> str:
    """A new project's namespace, fixed at creation: the slug when it already starts with ``<tenant>-``
    (the convention, e.g. ``acme-vision``), else ``<tenant>-<slug>``. The tenant prefix keeps a project
    away from namespaces other tenants' projects or the platform use (docs/ownership.md)."""
    return slug if slug.startswith(f"{tenant_slug}-") else f"{tenant_slug}-{slug}"


class NamespaceChecks:
    """What only the app that knows the clusters can say about a namespace. tenants sits below quotas
    and does not import it: quotas installs its checks here when it is ready (``QuotasConfig.ready``)."""

    @staticmethod
    def reserved(name: str) -> bool:
        return False

    @staticmethod
    def problem(namespace: str, *, project_slug: str | None = None) -> str | None:
        return None


namespace_checks = NamespaceChecks()


def _check_namespace(tenant: Tenant, slug: str) -> str:
    """The namespace for a new project, or Invalid (field ``slug``): reserved, too long, taken, or it
    exists on a registered cluster without our labels (never adopted silently; ops may adopt it)."""
    if not slug:
        return slug
    if namespace_checks.reserved(slug):
        raise Invalid(f"{slug} is a reserved name (Kubernetes, GPU operator, Kueue, Volcano, HAMi...): choose another slug.",
                      field="slug")
    namespace = project_namespace(tenant.slug, slug)
    if len(namespace) > 63:
        raise Invalid(f"The namespace {namespace} would be longer than 63 characters: choose a shorter slug.", field="slug")
    if Project.objects.filter(cluster_namespace=namespace).exists():
        raise Invalid(f"Namespace {namespace} belongs to another project: choose another slug.", field="slug")
    problem = namespace_checks.problem(namespace, project_slug=slug)
    if problem:
        raise Invalid(problem, field="slug")
    return namespace


@transaction.atomic
def project_create(*, actor: Actor, tenant: Tenant, name: str, slug: str, description: str = "") -> Project:
    tenant = _tenant_locked(tenant)
    require(policy.may_change_tenant(actor, tenant), "Only tenant admins and ops create projects.")
    _require_writable(actor, tenant)
    project = Project(tenant=tenant, name=name, slug=slug, description=description)
    project.full_clean()
    project.cluster_namespace = _check_namespace(tenant, slug)
    project.save()
    # Tenant admins hold permissions on every project of their tenant, this new one included.
    permissions_sync_tenant(tenant=tenant)
    audit_record(
        actor=actor, action="project.create", target=project, tenant=tenant, project=project,
        after=snapshot(project, PROJECT_FIELDS),
    )
    return project


@transaction.atomic
def project_update(*, actor: Actor, project: Project, **changes: Any) -> Project:
    project = Project.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=project.pk)
    require(policy.may_change_project(actor, project), "Only project admins, tenant admins and ops change a project.")
    _require_writable(actor, project.tenant)
    if "slug" in changes and changes["slug"] != project.slug:
        raise Invalid("The slug cannot change: it is the project's namespace.", field="slug")
    if "status" in changes and changes["status"] != project.status:
        require(policy.may_change_tenant(actor, project.tenant), "Only tenant admins and ops archive or restore a project.")
    if changes.get("notebooks_open_to_approvers", project.notebooks_open_to_approvers) != project.notebooks_open_to_approvers:
        # Approvers would grant themselves access to other people's notebooks: the tenant admins decide.
        require(policy.may_change_tenant(actor, project.tenant), "Only tenant admins and ops let approvers open members' notebooks.")
    before = snapshot(project, PROJECT_FIELDS)
    for field, value in changes.items():
        setattr(project, field, value)
    if before and before["status"] != project.status:
        # Archiving keeps the namespace for the retention period (quotas/namespaces.py); restoring cancels it.
        archived = project.status == Project.Status.ARCHIVED
        project.archived_at = timezone.now() if archived else None
        project.namespace_released_at = None
    project.full_clean()
    project.save()
    action = "project.update"
    if before and before["status"] != project.status:
        action = "project.archive" if project.status == Project.Status.ARCHIVED else "project.restore"
    audit_record(
        actor=actor, action=action, target=project, tenant=project.tenant, project=project,
        before=before, after=snapshot(project, PROJECT_FIELDS),
    )
    return project


# Memberships -----------------------------------------------------------------------------------


def _check_membership_shape(*, tenant: Tenant, project: Project | None, role: str) -> None:
    if role not in Role.values:
        raise Invalid(f"Unknown role {role!r}.", field="role")
    if role == Role.TENANT_ADMIN and project is not None:
        raise Invalid("A tenant admin is a member of the tenant, not of one project: leave project empty.", field="project")
    if role != Role.TENANT_ADMIN and project is None:
        raise Invalid("This role is held in a project: choose one.", field="project")
    if project is not None and project.tenant_id != tenant.pk:
        raise Invalid("The project belongs to another tenant.", field="project")


@transaction.atomic
def membership_create(*, actor: Actor, tenant: Tenant, user: Any, role: str, project: Project | None = None) -> Membership:
    tenant = _tenant_locked(tenant)
    require(policy.may_manage_members(actor, tenant), "Only tenant admins and ops manage members.")
    _require_writable(actor, tenant)
    _check_membership_shape(tenant=tenant, project=project, role=role)
    if Membership.objects.filter(user=user, tenant=tenant, project=project).exists():
        where = project.slug if project else tenant.slug
        raise ConflictError(f"{user.get_username()} already has a role in {where}; change that role instead.", field="user")
    try:
        with transaction.atomic():
            membership = Membership.objects.create(user=user, tenant=tenant, project=project, role=role)
    except IntegrityError:
        raise ConflictError("That user already has a role there.", field="user") from None
    permissions_sync(user=user, tenant=tenant)
    audit_record(
        actor=actor, action="membership.create", target=membership, tenant=tenant, project=project,
        after=snapshot(membership, MEMBERSHIP_FIELDS),
    )
    return membership


@transaction.atomic
def membership_update(*, actor: Actor, membership: Membership, role: str) -> Membership:
    membership = Membership.objects.select_for_update(of=("self",)).select_related("tenant", "project", "user").get(pk=membership.pk)
    require(policy.may_manage_members(actor, membership.tenant), "Only tenant admins and ops manage members.")
    _require_writable(actor, membership.tenant)
    _check_membership_shape(tenant=membership.tenant, project=membership.project, role=role)
    _guard_last_admin(membership, new_role=role)
    before = snapshot(membership, MEMBERSHIP_FIELDS)
    membership.role = role
    membership.save(update_fields=["role"])
    permissions_sync(user=membership.user, tenant=membership.tenant)
    audit_record(
        actor=actor, action="membership.update", target=membership, tenant=membership.tenant,
        project=membership.project, before=before, after=snapshot(membership, MEMBERSHIP_FIELDS),
    )
    return membership


@transaction.atomic
def membership_delete(*, actor: Actor, membership: Membership) -> None:
    membership = Membership.objects.select_for_update(of=("self",)).select_related("tenant", "project", "user").get(pk=membership.pk)
    require(policy.may_manage_members(actor, membership.tenant), "Only tenant admins and ops manage members.")
    _require_writable(actor, membership.tenant)
    _guard_last_admin(membership, new_role=None)
    before = snapshot(membership, MEMBERSHIP_FIELDS)
    user, tenant, project = membership.user, membership.tenant, membership.project
    audit_record(actor=actor, action="membership.delete", target=membership, tenant=tenant, project=project, before=before)
    membership.delete()
    permissions_sync(user=user, tenant=tenant)
    # A user's tokens for a project they no longer belong to stop working at once.
    if project is not None and not Membership.objects.filter(user=user, tenant=tenant, role=Role.TENANT_ADMIN).exists():
        ApiToken.objects.filter(user=user, project=project, revoked_at__isnull=True).update(revoked_at=timezone.now())
    elif project is None:
        still = Membership.objects.filter(user=user, tenant=tenant).values("project_id")
        ApiToken.objects.filter(user=user, project__tenant=tenant, revoked_at__isnull=True).exclude(
            project_id__in=still
        ).update(revoked_at=timezone.now())


def _guard_last_admin(membership: Membership, *, new_role: str | None) -> None:
    """Keep at least one tenant admin, so a tenant can't lock itself out."""
    if membership.role != Role.TENANT_ADMIN or new_role == Role.TENANT_ADMIN:
        return
    others = Membership.objects.filter(tenant=membership.tenant, role=Role.TENANT_ADMIN).exclude(pk=membership.pk)
    if not others.exists():
        raise ConflictError("This is the tenant's last tenant admin: add another one first.", field="role")


def user_by_name(username: str) -> Any:
    User = get_user_model()
    try:
        return User.objects.get(username=username, is_active=True)
    except User.DoesNotExist:
        raise Invalid(f"No active user named {username!r}.", field="user") from None


# Tokens ----------------------------------------------------------------------------------------


@transaction.atomic
def token_create(
    *, actor: Actor, project: Project, name: str, scope: str, expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """Create a token; returns it and the raw secret, which is never stored or shown again."""
    if actor.token is not None:
        raise NotAllowed("API tokens cannot create tokens; sign in to create one.")
    require(policy.may_view_project(actor, project), "You are not a member of this project.")
    _require_writable(actor, project.tenant)
    if not project.is_active:
        raise Invalid("The project is archived.", field="project")
    if scope == ApiToken.Scope.SUBMIT:
        require(policy.may_submit(actor, project), "Your role in this project cannot submit, so neither can your token.")
    elif scope != ApiToken.Scope.READ:
        raise Invalid(f"Scope must be one of {', '.join(ApiToken.Scope.values)}.", field="scope")
    now = timezone.now()
    expires_at = expires_at or now + timedelta(days=90)
    if expires_at <= now:
        raise Invalid("The expiry must be in the future.", field="expires_at")
    if expires_at > now + timedelta(days=MAX_TOKEN_DAYS):
        raise Invalid(f"Tokens live at most {MAX_TOKEN_DAYS} days.", field="expires_at")
    raw, prefix, digest = token_generate()
    token = ApiToken(name=name, project=project, user=actor.user, scope=scope, prefix=prefix, secret_hash=digest, expires_at=expires_at)
    token.full_clean()
    token.save()
    audit_record(
        actor=actor, action="token.create", target=token, tenant=project.tenant, project=project,
        after=snapshot(token, TOKEN_FIELDS),
    )
    return token, raw


@transaction.atomic
def token_revoke(*, actor: Actor, token: ApiToken) -> ApiToken:
    token = ApiToken.objects.select_for_update(of=("self",)).select_related("project__tenant", "user").get(pk=token.pk)
    own = actor.user is not None and token.user_id == actor.user.pk and actor.token is None
    if not own and not (actor.token is None and has_perm(actor, "manage_members_tenant", token.project.tenant)):
        raise NotAllowed("Only the token's owner, tenant admins and ops revoke a token.")
    if token.revoked_at is not None:
        return token  # revoking twice is a no-op, not an error
    before = snapshot(token, TOKEN_FIELDS)
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(
        actor=actor, action="token.revoke", target=token, tenant=token.project.tenant, project=token.project,
        before=before, after=snapshot(token, TOKEN_FIELDS),
    )
    return token


# Platform ops ----------------------------------------------------------------------------------


def _ops_snapshot(user: Any) -> dict[str, Any]:
    from .access import OPS_GROUP

    return {"is_staff": user.is_staff, "ops_group": user.groups.filter(name=OPS_GROUP).exists()}


def _forget_perms(user: Any) -> None:
    # is_ops() and Django cache permissions on the user object; this one may be the request's user.
    for attr in ("_portal_is_ops", "_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        user.__dict__.pop(attr, None)


@transaction.atomic
def ops_user_ensure(*, actor: Actor, user: Any) -> bool:
    """Make ``user`` platform ops (staff in the ops group). Audited when it changes something;
    returns whether it did (making ops twice is a no-op, not an error)."""
    from django.contrib.auth.models import Group

    from .access import OPS_GROUP

    require_ops(actor, "Only platform ops make other users ops.")
    locked = get_user_model().objects.select_for_update().get(pk=user.pk)
    before = _ops_snapshot(locked)
    group, _ = Group.objects.get_or_create(name=OPS_GROUP)
    if not locked.is_staff:
        locked.is_staff = True
        locked.save(update_fields=["is_staff"])
    locked.groups.add(group)
    user.is_staff = True
    _forget_perms(user)
    after = _ops_snapshot(locked)
    if after == before:
        return False
    audit_record(actor=actor, action="user.make_ops", target=locked, before=before, after=after)
    return True


@transaction.atomic
def ops_user_remove(*, actor: Actor, user: Any) -> bool:
    """Take platform ops away from ``user`` (out of the ops group, no longer staff). Audited when it
    changes something; returns whether it did. Nobody removes their own ops role, so there is always
    someone left who can give it back."""
    from .access import OPS_GROUP

    require_ops(actor, "Only platform ops remove other users' ops role.")
    if actor.user is not None and actor.user.pk == user.pk:
        raise ConflictError("You cannot remove your own ops role: ask another ops user.", field="user")
    locked = get_user_model().objects.select_for_update().get(pk=user.pk)
    if locked.is_superuser:
        raise ConflictError(f"{locked.get_username()} is a superuser, which counts as ops; that is not changed here.", field="user")
    before = _ops_snapshot(locked)
    locked.groups.remove(*locked.groups.filter(name=OPS_GROUP))
    if locked.is_staff:
        locked.is_staff = False
        locked.save(update_fields=["is_staff"])
    user.is_staff = False
    _forget_perms(user)
    after = _ops_snapshot(locked)
    if after == before:
        return False
    audit_record(actor=actor, action="user.remove_ops", target=locked, before=before, after=after)
    return True

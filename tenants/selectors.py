"""Every read that depends on who asks. The API viewsets and the portal pages both start here."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Prefetch, Q, QuerySet
from guardian.shortcuts import get_objects_for_user

from .access import Actor, is_ops
from .models import ApiToken, AuditEntry, Invitation, Membership, Project, Role, Tenant


def tenants_for(*, actor: Actor) -> QuerySet[Tenant]:
    user = actor.user
    if actor.token is not None:
        return Tenant.objects.filter(pk=actor.token.project.tenant_id)
    if is_ops(user):
        return Tenant.objects.all()
    return get_objects_for_user(user, "tenants.view_tenant", klass=Tenant, accept_global_perms=False)


def projects_for(*, actor: Actor) -> QuerySet[Project]:
    user = actor.user
    if actor.token is not None:
        return Project.objects.filter(pk=actor.token.project_id).select_related("tenant")
    if is_ops(user):
        return Project.objects.select_related("tenant")
    visible = get_objects_for_user(user, "tenants.view_project", klass=Project, accept_global_perms=False)
    return visible.select_related("tenant")


def projects_where(*, actor: Actor, perm: str) -> QuerySet[Project]:
    """Projects on which ``actor`` holds ``perm`` (e.g. ``submit_project``)."""
    if actor.token is not None:
        from .access import TOKEN_PERMS

        if perm not in TOKEN_PERMS[actor.token.scope]:
            return Project.objects.none()
        base = Project.objects.filter(pk=actor.token.project_id)
        return base.filter(pk__in=get_objects_for_user(actor.user, f"tenants.{perm}", klass=Project, accept_global_perms=False))
    if is_ops(actor.user):
        return Project.objects.select_related("tenant")
    return get_objects_for_user(actor.user, f"tenants.{perm}", klass=Project, accept_global_perms=False).select_related("tenant")


def admin_tenants_for(*, actor: Actor) -> QuerySet[Tenant]:
    """Tenants whose members ``actor`` may manage."""
    if actor.token is not None:
        return Tenant.objects.none()
    if is_ops(actor.user):
        return Tenant.objects.all()
    return get_objects_for_user(actor.user, "tenants.manage_members_tenant", klass=Tenant, accept_global_perms=False)


def memberships_for(*, actor: Actor) -> QuerySet[Membership]:
    """Tenant admins see their tenants' memberships; others see the members of the projects they see."""
    base = Membership.objects.select_related("user", "tenant", "project")
    if actor.token is None and is_ops(actor.user):
        return base
    projects = projects_for(actor=actor)
    admin_tenants = admin_tenants_for(actor=actor)
    return base.filter(Q(tenant__in=admin_tenants) | Q(project__in=projects))


def own_memberships_for(*, actor: Actor) -> QuerySet[Membership]:
    """The actor's own roles (``/api/v1/me/``); through a token, only those in the token's tenant."""
    mine = Membership.objects.filter(user=actor.user).select_related("tenant", "project", "user")
    if actor.token is not None:
        mine = mine.filter(tenant=actor.token.project.tenant_id)
    return mine


def users_for(*, actor: Actor) -> QuerySet[Any]:
    """Every user account, for ops (the ops pages); nobody else lists users."""
    users = get_user_model().objects.all()
    return users if actor.token is None and is_ops(actor.user) else users.none()


def user_list_for(*, actor: Actor) -> QuerySet[Any]:
    """``users_for`` by username, with each user's memberships and groups (ops' user list)."""
    memberships = Prefetch("memberships", queryset=Membership.objects.select_related("tenant", "project"))
    return users_for(actor=actor).order_by("username").prefetch_related(memberships, "groups")


def invitations_for(*, actor: Actor) -> QuerySet[Invitation]:
    """Invitations of the tenants ``actor`` administers (ops: all); nobody else sees any."""
    base = Invitation.objects.select_related("tenant", "project", "invited_by", "accepted_by")
    if actor.token is not None:
        return base.none()
    if is_ops(actor.user):
        return base
    return base.filter(tenant__in=admin_tenants_for(actor=actor))


def invitation_by_secret(secret: str) -> Invitation | None:
    """The invitation a link's secret opens (whatever its status), or None. Only the hash is stored."""
    import hashlib

    if not secret or len(secret) > 100:
        return None
    digest = hashlib.sha256(secret.encode()).hexdigest()
    return Invitation.objects.select_related("tenant", "project").filter(secret_hash=digest).first()


def tenant_members(*, tenant: Tenant) -> QuerySet[Any]:
    """The active users who hold any role in ``tenant`` (for picking one, never for searching others)."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(is_active=True, memberships__tenant=tenant).distinct().order_by("username")


def tokens_for(*, actor: Actor) -> QuerySet[ApiToken]:
    """A user's own tokens; tenant admins also see (and may revoke) every token of their tenant."""
    base = ApiToken.objects.select_related("project__tenant", "user")
    if actor.token is not None:
        return base.filter(pk=actor.token.pk)
    if is_ops(actor.user):
        return base
    return base.filter(Q(user=actor.user) | Q(project__tenant__in=admin_tenants_for(actor=actor)))


def audit_entries_for(*, actor: Actor) -> QuerySet[AuditEntry]:
    """Ops see everything; tenant admins their tenants' entries; project admins their projects'."""
    base = AuditEntry.objects.select_related("tenant", "project")
    if actor.token is not None:
        return base.none()
    if is_ops(actor.user):
        return base
    admin_projects = Membership.objects.filter(user=actor.user, role=Role.PROJECT_ADMIN).values("project_id")
    return base.filter(Q(tenant__in=admin_tenants_for(actor=actor)) | Q(project_id__in=admin_projects))


def lookup(queryset: QuerySet[Any], key: str) -> Any:
    """Find by numeric id or by slug within an already-scoped queryset; anything else is a 404."""
    from django.shortcuts import get_object_or_404

    from portal.inputs import NUL, is_id

    if is_id(key):
        return get_object_or_404(queryset, pk=int(key))
    if NUL in key:
        return get_object_or_404(queryset.none())
    return get_object_or_404(queryset, slug=key)

"""Who may do what: roles map to django-guardian object permissions, kept in sync with memberships.

Memberships are the source of truth. ``permissions_sync()`` rewrites a user's guardian rows for one
tenant from them; every service that changes memberships or projects calls it in the same
transaction, so what a user can see changes at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.contrib.contenttypes.models import ContentType
from guardian.models import UserObjectPermission
from django.contrib.auth.models import Permission

from .models import ApiToken, Membership, Project, Role, Tenant

if TYPE_CHECKING:
    from django.http import HttpRequest

OPS_GROUP = "ops"

TENANT_PERMS: dict[str, set[str]] = {
    Role.TENANT_ADMIN: {"view_tenant", "change_tenant", "manage_members_tenant"},
    Role.PROJECT_ADMIN: {"view_tenant"},
    Role.MEMBER: {"view_tenant"},
    Role.VIEWER: {"view_tenant"},
}
PROJECT_PERMS: dict[str, set[str]] = {
    Role.TENANT_ADMIN: {"view_project", "change_project", "submit_project", "approve_project", "manage_members_project"},
    Role.PROJECT_ADMIN: {"view_project", "change_project", "submit_project", "approve_project"},
    Role.MEMBER: {"view_project", "submit_project"},
    Role.VIEWER: {"view_project"},
}
# A token can never do more than its user; this is the most it can do at all.
TOKEN_PERMS: dict[str, set[str]] = {
    ApiToken.Scope.READ: {"view_tenant", "view_project"},
    ApiToken.Scope.SUBMIT: {"view_tenant", "view_project", "submit_project"},
}


@dataclass(frozen=True)
class Actor:
    """Who is acting: a browser user, or a user through one of their API tokens."""

    user: Any
    token: ApiToken | None = None
    ip: str | None = None

    @classmethod
    def from_request(cls, request: HttpRequest) -> Actor:
        token = getattr(request, "auth", None)
        return cls(
            user=request.user,
            token=token if isinstance(token, ApiToken) else None,
            ip=client_address(request),
        )

    @classmethod
    def system(cls) -> Actor:
        """The portal itself (tasks, seeding): audited as "system", allowed everything."""
        return cls(user=None, token=None, ip=None)

    @property
    def label(self) -> str:
        if self.user is None:
            return "system"
        if self.token is not None:
            return f"{self.user.get_username()} (token {self.token.prefix})"
        return self.user.get_username()

    @property
    def is_ops(self) -> bool:
        return self.token is None and is_ops(self.user)


def client_address(request: HttpRequest) -> str | None:
    # Behind a trusted proxy, REMOTE_ADDR is the proxy; deployments set it right (see deploy/).
    return request.META.get("REMOTE_ADDR") or None


def is_ops(user: AbstractBaseUser | AnonymousUser | None) -> bool:
    """Platform ops: active staff users in the ops group (or superusers). Cached on the user object."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    cached = getattr(user, "_portal_is_ops", None)
    if cached is None:
        cached = user.is_superuser or (user.is_staff and user.groups.filter(name=OPS_GROUP).exists())
        user._portal_is_ops = cached
    return cached


def has_perm(actor: Actor, perm: str, obj: Tenant | Project) -> bool:
    """Object permission check for ``perm`` (a codename like ``change_project``) on ``obj``."""
    user = actor.user
    if user is None:
        return True  # the system itself (tasks, seeding)
    if not user.is_authenticated or not user.is_active:
        return False
    if actor.token is not None:
        if perm not in TOKEN_PERMS[actor.token.scope]:
            return False
        project = actor.token.project
        if isinstance(obj, Project) and obj.pk != project.pk:
            return False
        if isinstance(obj, Tenant) and obj.pk != project.tenant_id:
            return False
    if is_ops(user) and actor.token is None:
        return True
    app = "tenants"
    return user.has_perm(f"{app}.{perm}", obj)


def permissions_sync(*, user: Any, tenant: Tenant) -> None:
    """Rewrite ``user``'s guardian permissions on ``tenant`` and its projects from their memberships."""
    tenant_ct = ContentType.objects.get_for_model(Tenant)
    project_ct = ContentType.objects.get_for_model(Project)
    project_ids = [str(pk) for pk in Project.objects.filter(tenant=tenant).values_list("pk", flat=True)]
    UserObjectPermission.objects.filter(user=user, content_type=tenant_ct, object_pk=str(tenant.pk)).delete()
    UserObjectPermission.objects.filter(user=user, content_type=project_ct, object_pk__in=project_ids).delete()

    wanted: set[tuple[int, str, str]] = set()  # (content type id, object pk, codename)
    for membership in Membership.objects.filter(user=user, tenant=tenant):
        for codename in TENANT_PERMS[membership.role]:
            wanted.add((tenant_ct.pk, str(tenant.pk), codename))
        scope = project_ids if membership.project_id is None else [str(membership.project_id)]
        for pk in scope:
            for codename in PROJECT_PERMS[membership.role]:
                wanted.add((project_ct.pk, pk, codename))
    if not wanted:
        return
    perms = {
        (p.content_type_id, p.codename): p
        for p in Permission.objects.filter(content_type__in=[tenant_ct, project_ct])
    }
    UserObjectPermission.objects.bulk_create(
        [
            UserObjectPermission(user=user, content_type_id=ct, object_pk=pk, permission=perms[(ct, codename)])
            for ct, pk, codename in sorted(wanted)
        ]
    )
    # Django caches object permissions per user object; drop that cache.
    for attr in ("_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        if hasattr(user, attr):
            delattr(user, attr)


def permissions_sync_tenant(*, tenant: Tenant) -> None:
    """Re-sync every member of ``tenant`` (after a project is created, say)."""
    User = get_user_model()
    for user in User.objects.filter(memberships__tenant=tenant).distinct():
        permissions_sync(user=user, tenant=tenant)

"""Who may do what: roles map to permissions on tenants and projects.

Memberships are the source of truth. ``scope_of(actor)`` reads the actor's memberships once per request
(at most two queries: the memberships, then the projects of the tenants they administer) into an
``ActorScope``: the project and tenant ids per permission, and the actor's role labels. Selectors filter
by those integer ids and ``has_perm`` answers from them without a query.

``permissions_sync()`` also keeps django-guardian's object permission rows in step (who holds a
permission on a project: ``workloads.selectors.request_approvers``); every service that changes memberships or
projects calls it in the same transaction. A remembered scope is dropped whenever memberships or
projects change (``scope_forget``), so what a user can see changes at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.contrib.contenttypes.models import ContentType
from django.db.models import Exists, OuterRef, Q, Subquery
from django.db.models.expressions import RawSQL
from guardian.models import UserObjectPermission
from django.contrib.auth.models import Group, Permission

from portal.compiled import Compiled

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
    """Platform ops: active staff users in the ops group (or superusers). Cached on the user object (a signed-in
    request's user arrives with the answer: ``user_for_session``)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    cached = getattr(user, "_portal_is_ops", None)
    if cached is None:
        cached = user.is_superuser or (user.is_staff and user.groups.filter(name=OPS_GROUP).exists())
        user._portal_is_ops = cached
    return cached


def _session_user_query(user_id: Any) -> Any:
    in_ops = Exists(Group.objects.filter(user=OuterRef("pk"), name=OPS_GROUP))
    return (get_user_model()._default_manager.filter(pk=user_id)
            .annotate(portal_in_ops_group=in_ops, portal_memberships=user_memberships()).order_by("pk"))


_SESSION_USER = Compiled(lambda user_id: _session_user_query(user_id)[:1])


def user_for_session(user_id: Any) -> Any:
    """The user a session names, read with whether they are in the ops group (an ``EXISTS`` in the same query),
    so that ``is_ops`` asks nothing more in that request; None if there is no such user."""
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        found = _SESSION_USER.rows(user_id)  # compiled once per process (portal.compiled)
        user = found[0] if found else None
    else:
        user = _session_user_query(user_id).first()
    if user is not None:
        user._portal_is_ops = user.is_superuser or (user.is_staff and user.portal_in_ops_group)
        user._portal_memberships_at = _generation  # the scope takes its rows from the user: no query of its own
    return user


def user_memberships() -> RawSQL:
    """For the session's user query (``user_for_session``): all the user's memberships as
    ``"<tenant id>:<project id or empty>:<role>"`` joined by commas, so that their scope (``_membership_scope``)
    needs no query of its own. Written as SQL (PostgreSQL's ``string_agg``, SQLite's ``group_concat``): Django took
    longer to compile the same ``StringAgg(Concat(Cast(...)))`` subquery than the query it saved."""
    from django.db import connection

    q = connection.ops.quote_name
    User = get_user_model()
    member, user, pk = q(Membership._meta.db_table), q(User._meta.db_table), q(User._meta.pk.column)
    if connection.vendor == "postgresql":
        agg = "string_agg(m.tenant_id::text || ':' || COALESCE(m.project_id::text, '') || ':' || m.role, ',')"
    else:
        agg = "group_concat(m.tenant_id || ':' || COALESCE(m.project_id, '') || ':' || m.role, ',')"
    return RawSQL(f"SELECT {agg} FROM {member} m WHERE m.user_id = {user}.{pk}", ())


def _session_rows(user: Any) -> list[tuple[int, int | None, str]] | None:
    """The memberships read with the session's user (``user_for_session``), or None: not read with it, or a
    membership changed since in this process."""
    if getattr(user, "_portal_memberships_at", None) is not _generation:
        return None
    rows = []
    for item in filter(None, (getattr(user, "portal_memberships", None) or "").split(",")):
        tenant, project, role = item.split(":", 2)
        rows.append((int(tenant), int(project) if project else None, role))
    return rows


# What an actor may see and do ------------------------------------------------------------------------------------

_NOTHING: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Grants:
    """What memberships grant: ``projects[perm]`` / ``tenants[perm]``, the ids on which the actor holds ``perm``
    (``view_project``, ``submit_project``, ``change_tenant``...); ``by_project`` / ``by_tenant``, the actor's own
    role labels (tenant-wide roles by tenant); ``memberships``, (tenant id, project id or None, role) rows."""

    projects: dict[str, frozenset[int]] = field(default_factory=dict)
    tenants: dict[str, frozenset[int]] = field(default_factory=dict)
    by_project: dict[int, str] = field(default_factory=dict)
    by_tenant: dict[int, str] = field(default_factory=dict)
    memberships: tuple[tuple[int, int | None, str], ...] = ()


class ActorScope:
    """What one actor may see and do, as integer ids (computed once per request, see ``scope_of``).

    ``everything``: ops without a token and the system actor; no list is filtered for them. Otherwise
    ``visible_projects`` / ``visible_tenants`` are what the lists show (a token: its own project and tenant) and
    ``grants`` what the actor may do where (for a token read on first use: its lists need only its project)."""

    def __init__(self, *, everything: bool = False, visible_projects: frozenset[int] = _NOTHING,
                 visible_tenants: frozenset[int] = _NOTHING, grants: Grants | Callable[[], Grants] | None = None):
        self.everything = everything
        self.visible_projects = visible_projects
        self.visible_tenants = visible_tenants
        self._grants = Grants() if grants is None else grants

    @property
    def grants(self) -> Grants:
        if not isinstance(self._grants, Grants):
            self._grants = self._grants()
        return self._grants

    @property
    def projects(self) -> dict[str, frozenset[int]]:
        return self.grants.projects

    @property
    def tenants(self) -> dict[str, frozenset[int]]:
        return self.grants.tenants

    @property
    def by_project(self) -> dict[int, str]:
        return self.grants.by_project

    @property
    def by_tenant(self) -> dict[int, str]:
        return self.grants.by_tenant

    @property
    def memberships(self) -> tuple[tuple[int, int | None, str], ...]:
        return self.grants.memberships

    def project_ids(self, perm: str = "view_project") -> list[int]:
        """The projects where the actor holds ``perm``, sorted (for ``pk__in=``; meaningless when ``everything``)."""
        return sorted(self.projects.get(perm, _NOTHING))

    def tenant_ids(self, perm: str = "view_tenant") -> list[int]:
        return sorted(self.tenants.get(perm, _NOTHING))

    def in_projects(self, path: str = "project", perm: str | None = None) -> Q:
        """A filter on the project foreign key at ``path`` (``"project"``, ``"request__project"``; ``"pk"`` for
        projects themselves): in the visible projects, or in those where the actor holds ``perm``. Empty (no
        filter) for ``everything``, so only AND it with others."""
        if self.everything:
            return Q()
        ids = sorted(self.visible_projects) if perm is None else self.project_ids(perm)
        return Q(**{("pk__in" if path == "pk" else f"{path}_id__in"): ids})

    def in_tenants(self, path: str = "tenant", perm: str | None = None) -> Q:
        """``in_projects`` for the tenant foreign key at ``path``."""
        if self.everything:
            return Q()
        ids = sorted(self.visible_tenants) if perm is None else self.tenant_ids(perm)
        return Q(**{("pk__in" if path == "pk" else f"{path}_id__in"): ids})

    def allows(self, perm: str, obj: Tenant | Project) -> bool:
        if self.everything:
            return True
        ids = self.projects if isinstance(obj, Project) else self.tenants
        return obj.pk in ids.get(perm, _NOTHING)


EVERYTHING = ActorScope(everything=True)
NOTHING = ActorScope()

# Replaced whenever memberships or projects change in this process: a scope remembered under another one is
# recomputed. An object, compared by identity: a user object from elsewhere (a pickle) never matches.
_generation = object()


def scope_forget() -> None:
    """Forget every remembered scope (memberships or projects changed)."""
    global _generation
    _generation = object()


def scope_forget_on_change(sender: Any, **kwargs: Any) -> None:
    """Signal receiver (``post_save``/``post_delete`` of memberships and projects, see ``TenantsConfig.ready``):
    a membership or project written directly, not through a service, is seen at once too."""
    scope_forget()
    approvals_changed()


# The ``portal.cache`` name under which what waits for each approver's decision is kept
# (``workloads.selectors.approvals_waiting_counts_kept``, the navigation's badges).
APPROVALS = "approvals"


def approvals_changed(**kwargs: Any) -> None:
    """Something an approver's counts read changed: a request into or out of pending approval, an extension or
    quota request created or moved, a membership, a project, the ops group. Every kept count is read again once
    the write commits. (Also a signal receiver, hence ``**kwargs``.)"""
    from portal.cache import changed

    changed(APPROVALS)


def _membership_scope(user: Any) -> ActorScope:
    """``user``'s scope from their memberships: one query (none when they came with the session's user), plus one
    for the projects of tenants they administer."""
    rows = _session_rows(user)
    if rows is None:
        rows = list(Membership.objects.filter(user_id=user.pk).order_by().values_list("tenant_id", "project_id", "role"))
    wide = sorted({tenant_id for tenant_id, project_id, _ in rows if project_id is None})
    tenant_projects: dict[int, list[int]] = {tenant_id: [] for tenant_id in wide}
    if wide:
        for pk, tenant_id in Project.objects.filter(tenant_id__in=wide).order_by().values_list("pk", "tenant_id"):
            tenant_projects[tenant_id].append(pk)
    projects: dict[str, set[int]] = {}
    tenants: dict[str, set[int]] = {}
    by_project: dict[int, str] = {}
    by_tenant: dict[int, str] = {}
    for tenant_id, project_id, role in rows:
        for codename in TENANT_PERMS[role]:
            tenants.setdefault(codename, set()).add(tenant_id)
        scope: Iterable[int] = tenant_projects[tenant_id] if project_id is None else (project_id,)
        for codename in PROJECT_PERMS[role]:
            projects.setdefault(codename, set()).update(scope)
        label = Role(role).label
        if project_id is None:
            by_tenant[tenant_id] = label
        else:
            by_project[project_id] = label
    frozen_projects = {codename: frozenset(ids) for codename, ids in projects.items()}
    frozen_tenants = {codename: frozenset(ids) for codename, ids in tenants.items()}
    return ActorScope(
        visible_projects=frozen_projects.get("view_project", _NOTHING),
        visible_tenants=frozen_tenants.get("view_tenant", _NOTHING),
        grants=Grants(projects=frozen_projects, tenants=frozen_tenants, by_project=by_project, by_tenant=by_tenant,
                      memberships=tuple(rows)),
    )


def _user_scope(user: Any) -> ActorScope:
    """The user's own scope (no token), remembered on the user object: a request's user is loaded once per
    request, so each request computes it once, however many times views, predicates and tags ask."""
    remembered = getattr(user, "_portal_scope", None)  # through request.user's lazy wrapper, on the user itself
    if remembered is not None and remembered[0] is _generation:
        return remembered[1]
    generation = _generation
    scope = EVERYTHING if user.is_superuser else _membership_scope(user)
    user._portal_scope = (generation, scope)
    return scope


def token_memberships() -> Subquery:
    """For a token query (``tenants.authentication.token_resolve``): its user's memberships in its project's tenant,
    as ``"<project id or empty>:<role>"`` joined by commas: all a token's permissions depend on (``_token_scope``),
    so the token brings them along and its scope asks no query."""
    from django.db.models import CharField, StringAgg, Value
    from django.db.models.functions import Cast, Coalesce, Concat

    rows = (
        Membership.objects.filter(user_id=OuterRef("user_id"), tenant_id=OuterRef("project__tenant_id"))
        .order_by().values("user_id")
        .annotate(rows=StringAgg(Concat(Coalesce(Cast("project_id", CharField()), Value("")), Value(":"), "role"),
                                 Value(",")))
        .values("rows")
    )
    return Subquery(rows, output_field=CharField())


def token_memberships_read(token: ApiToken) -> None:
    """(``token_resolve``) note that ``token.memberships_here`` was read now: used while no membership changes."""
    token._portal_memberships_at = _generation  # type: ignore[attr-defined]


def _token_rows(token: ApiToken) -> list[tuple[int, int | None, str]] | None:
    """The token's user's memberships in its tenant as read with the token, or None (not read with it, or a
    membership changed since)."""
    if getattr(token, "_portal_memberships_at", None) is not _generation:
        return None
    text = getattr(token, "memberships_here", None) or ""
    tenant_id = token.project.tenant_id
    rows = []
    for item in filter(None, text.split(",")):
        project, role = item.split(":", 1)
        rows.append((tenant_id, int(project) if project else None, role))
    return rows


def _token_grants(token: ApiToken, rows: list[tuple[int, int | None, str]]) -> Grants:
    """``_token_scope``'s grants from the memberships in the token's tenant: what the user's whole scope gives there."""
    project_id, tenant_id = token.project_id, token.project.tenant_id
    here = [role for _, pid, role in rows if pid is None or pid == project_id]
    projects: dict[str, frozenset[int]] = {}
    tenants: dict[str, frozenset[int]] = {}
    for codename in TOKEN_PERMS[token.scope]:
        if any(codename in PROJECT_PERMS[role] for role in here):
            projects[codename] = frozenset((project_id,))
        if any(codename in TENANT_PERMS[role] for _, _, role in rows):
            tenants[codename] = frozenset((tenant_id,))
    return Grants(projects=projects, tenants=tenants,
                  by_project={pid: Role(role).label for _, pid, role in rows if pid == project_id},
                  memberships=tuple(row for row in rows if row[1] == project_id))


def _token_scope(user: Any, token: ApiToken) -> ActorScope:
    """A token acts as its user, narrowed to its project (and tenant) and to its scope's permissions. It lists its
    project and tenant; it holds a permission there only where its user does (their memberships in the token's
    tenant, read with the token; else their scope, read when first asked)."""
    project_id, tenant_id = token.project_id, token.project.tenant_id

    def grants() -> Grants:
        rows = None if user.is_superuser else _token_rows(token)
        if rows is not None:
            return _token_grants(token, rows)
        user_scope = _user_scope(user)
        projects: dict[str, frozenset[int]] = {}
        tenants: dict[str, frozenset[int]] = {}
        for codename in TOKEN_PERMS[token.scope]:
            if user_scope.everything or project_id in user_scope.projects.get(codename, _NOTHING):
                projects[codename] = frozenset((project_id,))
            if user_scope.everything or tenant_id in user_scope.tenants.get(codename, _NOTHING):
                tenants[codename] = frozenset((tenant_id,))
        return Grants(projects=projects, tenants=tenants,
                      by_project={k: v for k, v in user_scope.by_project.items() if k == project_id},
                      memberships=tuple(m for m in user_scope.memberships if m[1] == project_id))

    return ActorScope(visible_projects=frozenset((project_id,)), visible_tenants=frozenset((tenant_id,)), grants=grants)


def scope_of(actor: Actor) -> ActorScope:
    """What ``actor`` may see and do: everything (ops without a token, the system), nothing (nobody signed
    in), else from their memberships, narrowed by their token. Computed once per request."""
    user = actor.user
    if user is None:
        return EVERYTHING  # the system itself (tasks, seeding)
    if not user.is_authenticated:
        return NOTHING
    token = actor.token
    if token is None:
        return EVERYTHING if is_ops(user) else _user_scope(user)
    remembered = getattr(token, "_portal_scope", None)
    if remembered is not None and remembered[0] is _generation:
        return remembered[1]
    generation = _generation
    scope = _token_scope(user, token)
    token._portal_scope = (generation, scope)
    return scope


def has_perm(actor: Actor, perm: str, obj: Tenant | Project) -> bool:
    """Object permission check for ``perm`` (a codename like ``change_project``) on ``obj``, from the actor's
    scope (no query once the scope is known)."""
    user = actor.user
    if user is None:
        return True  # the system itself (tasks, seeding)
    if not user.is_authenticated or not user.is_active:
        return False
    return scope_of(actor).allows(perm, obj)


def permissions_sync(*, user: Any, tenant: Tenant) -> None:
    """Rewrite ``user``'s guardian permissions on ``tenant`` and its projects from their memberships."""
    scope_forget()
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

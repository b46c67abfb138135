"""Who may do what: roles map to permissions on tenants and projects.

Memberships are the source of truth. ``scope_of(actor)`` reads the actor's memberships once per request
(at most two queries: the memberships, then the projects of the tenants they administer) into an
``ActorScope``: the project and tenant ids per permission, and the actor's role labels. Selectors filter
by those integer ids and ``has_perm`` answers from them without a query.

``holders(perm, obj)`` is the same rule read the other way round: the users who hold ``perm`` on ``obj``, as a
queryset, for everything that tells people (approvers, budget alerts, digests). Every service that changes
memberships or projects calls ``permissions_sync()`` in the same transaction: a remembered scope is dropped
whenever memberships or projects change (``scope_forget``), so what a user can see changes at once.
django-guardian holds only what roles cannot express: one request shared with a named colleague
(``workloads.sharing``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, Subquery
from django.db.models.expressions import RawSQL
from django.contrib.auth.models import Group

from portal.cache import Versioned
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


# Platform ops, defined once ------------------------------------------------------------------------------------
#
# ``ops_role()`` is the ops role as held (a superuser, or staff in the ops group); ``ops_q()`` adds that the account
# is active. Every other form asks these: ``is_ops(user)`` (one user), ``ops_users()`` (who is told),
# ``user_for_session`` (the session's user arrives with the answer), the ops pages' user list (``in_ops_group``).


def ops_role() -> Q:
    """A filter on users: holds the platform ops role (superuser, or staff in the ``ops`` group), active or not."""
    in_group = Exists(Group.objects.filter(user=OuterRef("pk"), name=OPS_GROUP))
    return Q(is_superuser=True) | (Q(is_staff=True) & Q(in_group))


def ops_q() -> Q:
    """A filter on users: platform ops, i.e. ``is_ops`` as a queryset filter (active users holding ``ops_role``)."""
    return Q(is_active=True) & ops_role()


def ops_annotation() -> ExpressionWrapper:
    """``ops_q`` as a boolean column, for a query that reads users (no query of its own per user)."""
    return ExpressionWrapper(ops_q(), output_field=BooleanField())


def ops_users() -> Any:
    """Every platform ops user (``is_ops`` true), as a queryset: who is told what only ops may decide."""
    return get_user_model()._default_manager.filter(ops_q())


def is_ops(user: AbstractBaseUser | AnonymousUser | None) -> bool:
    """Platform ops (``ops_q``: active, and a superuser or staff in the ops group). Cached on the user object (a
    signed-in request's user arrives with the answer: ``user_for_session``)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    cached = getattr(user, "_portal_is_ops", None)
    if cached is None:
        # Neither staff nor superuser: ``ops_q`` cannot hold, so no query is needed to say no.
        cached = (user.is_staff or user.is_superuser) and ops_users().filter(pk=user.pk).exists()
        user._portal_is_ops = cached
    return cached


def _session_user_query(user_id: Any) -> Any:
    return (get_user_model()._default_manager.filter(pk=user_id)
            .annotate(portal_is_ops=ops_annotation(), portal_memberships=user_memberships()).order_by("pk"))


_SESSION_USER = Compiled(lambda user_id: _session_user_query(user_id)[:1])


# The session users' rows (with the ops answer and the memberships), kept per process under the shared version of
# ``SESSION_USERS``: a signed-in request reads its user with the request's versions (one round trip, with the session:
# portal/sessions.py), not with a query. Every write that can change such a row sets a new version once it commits
# (``session_users_changed``: a user saved or deleted, a membership or project written or deleted, a group joined or
# left, a group saved or deleted; see TenantsConfig.ready). Inside a transaction the row is read from the database.
SESSION_USERS = "session-users"
_session_rows_kept = Versioned(SESSION_USERS)


def session_users_changed(**kwargs: Any) -> None:
    """(A signal receiver) a write that can change a session user's row: every process reads them again."""
    _session_rows_kept.changed()


def _session_user_row(user_id: int) -> tuple[tuple[str, ...], tuple[Any, ...]] | None:
    found = _SESSION_USER.rows(user_id)  # compiled once per process (portal.compiled)
    if not found:
        return None
    user = found[0]
    names = tuple(f.attname for f in user._meta.concrete_fields)
    return names, (*(getattr(user, name) for name in names), user.portal_is_ops, user.portal_memberships)


def user_for_session(user_id: Any) -> Any:
    """The user a session names, read with whether they are in the ops group (an ``EXISTS`` in the same query),
    so that ``is_ops`` asks nothing more in that request; None if there is no such user. A new instance per call,
    from the row kept per process and version (``SESSION_USERS``)."""
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        row = _session_rows_kept.get(str(user_id), lambda: _session_user_row(user_id))
        user = None
        if row is not None:
            names, values = row
            user = get_user_model().from_db("default", names, values[:len(names)])
            user.portal_is_ops, user.portal_memberships = values[len(names):]
    else:
        user = _session_user_query(user_id).first()
    if user is not None:
        user._portal_is_ops = bool(user.portal_is_ops)
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
    global _generation  # noqa: PLW0603 a new token makes every remembered scope stale at once
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


# Who holds a permission: the queryset twin of ``has_perm`` ------------------------------------------------------


def holders(perm: str, obj: Tenant | Project) -> Any:
    """The users for whom ``has_perm(Actor(user), perm, obj)`` is true, as a queryset (no duplicates): active users
    whose memberships grant ``perm`` on ``obj`` (``TENANT_PERMS`` / ``PROJECT_PERMS``, a tenant-wide role on every
    project of its tenant), and platform ops (``ops_q``), who hold every permission. What ``scope_of`` computes for
    one user, asked the other way round; ``tests/test_policy_matrix.py`` holds the two equal."""
    if isinstance(obj, Project):
        roles = sorted(role for role, perms in PROJECT_PERMS.items() if perm in perms)
        where = Q(project_id=obj.pk) | Q(project__isnull=True, tenant_id=obj.tenant_id)
    elif isinstance(obj, Tenant):
        roles = sorted(role for role, perms in TENANT_PERMS.items() if perm in perms)
        where = Q(tenant_id=obj.pk)
    else:
        raise TypeError(f"holders() asks about a tenant or a project, not {type(obj).__name__}")
    granted = Exists(Membership.objects.filter(where, user_id=OuterRef("pk"), role__in=roles))
    return get_user_model()._default_manager.filter(Q(is_active=True) & (Q(granted) | ops_role()))


def told(people: Any, *, exclude_user_id: int | None = None) -> list[Any]:
    """Who is told that something waits for a decision among ``people`` (a ``holders`` queryset): everyone there but
    platform ops and ``exclude_user_id`` (the one who asked), by username; ops only where nobody else may decide."""
    if exclude_user_id is not None:
        people = people.exclude(pk=exclude_user_id)
    others = list(people.exclude(ops_role()).order_by("username"))
    return others or list(people.filter(ops_role()).order_by("username"))


def permissions_sync(*, user: Any, tenant: Tenant) -> None:
    """``user``'s memberships in ``tenant`` changed (services call it in the same transaction): every remembered
    scope is stale. Nothing is mirrored: scopes, predicates and ``holders`` all read the memberships themselves."""
    scope_forget()
    # Django caches object permissions per user object; drop that cache.
    for attr in ("_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        if hasattr(user, attr):
            delattr(user, attr)


def permissions_sync_tenant(*, tenant: Tenant) -> None:
    """The tenant's projects changed (a project created, say): every remembered scope is stale."""
    scope_forget()

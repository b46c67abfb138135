"""Who may do what in tenancy: the one place the rules live.

Each ``may_*`` predicate answers for one actor and one object, from the actor's scope that
``tenants.access.scope_of`` reads from their memberships once per request (no query after that; ops
and the system actor may do everything; an API token never more than its scope). Services enforce
these predicates; views, API views and templates only ask them, so a button is shown exactly when the service would accept the action.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from .access import PROJECT_PERMS, TENANT_PERMS, Actor, has_perm, scope_of
from .access import holders as perm_holders
from .models import Project, Tenant


# Who holds a predicate: its queryset twin -------------------------------------------------------------------------
#
# A predicate that decides who is told something (approvers, budget alerts, digests, quota cuts) declares its twin
# with ``@with_holders(fn)``: ``fn(*objects, **options)`` returns the users (a queryset) for whom the predicate is
# true of ``Actor(user)`` (no token). ``holders()`` is the one place anything asks who those people are;
# ``tests/test_policy_matrix.py`` holds every twin equal to its predicate for each user of the cast.

CODENAMES = frozenset().union(*TENANT_PERMS.values(), *PROJECT_PERMS.values())


def with_holders(twin: Callable[..., Any]) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Declare ``twin`` the queryset twin of the decorated predicate (see ``holders``)."""
    def mark(predicate: Callable[..., bool]) -> Callable[..., bool]:
        predicate.holders = twin  # type: ignore[attr-defined]
        return predicate
    return mark


def holders(perm: str | Callable[..., bool], *objects: Any, **options: Any) -> Any:
    """The users for whom ``perm`` holds on ``objects``, as a queryset of active users (platform ops included where
    the predicate lets ops do it). ``perm`` is a permission codename asked of a tenant or project
    (``holders("approve_project", project)``, ``tenants.access.holders``), or a predicate that declares a twin,
    as the function or by its name (``holders("quotas.may_decide", quota_request, tier=...)``)."""
    if isinstance(perm, str) and perm in CODENAMES:
        (obj,) = objects
        return perm_holders(perm, obj)
    may = predicate(perm) if isinstance(perm, str) else perm
    twin = getattr(may, "holders", None)
    if twin is None:
        raise LookupError(f"{getattr(may, '__qualname__', perm)} declares no holders twin (tenants.policy.with_holders)")
    return twin(*objects, **options)


def may_operate(actor: Actor) -> bool:
    """Platform ops work (clusters, flavors, catalogue, tenants' lifecycle); the system actor too."""
    return actor.user is None or actor.is_ops


def may_write_in(actor: Actor, tenant: Tenant) -> bool:
    """A suspended tenant is read-only for everyone but ops."""
    return tenant.is_active or actor.is_ops


@with_holders(lambda tenant: perm_holders("view_tenant", tenant))
def may_view_tenant(actor: Actor, tenant: Tenant) -> bool:
    return has_perm(actor, "view_tenant", tenant)


@with_holders(lambda tenant: perm_holders("change_tenant", tenant))
def may_change_tenant(actor: Actor, tenant: Tenant) -> bool:
    """Edit the tenant's details, create and archive its projects, split its quota: tenant admins and ops."""
    return has_perm(actor, "change_tenant", tenant)


@with_holders(lambda tenant: perm_holders("manage_members_tenant", tenant))
def may_manage_members(actor: Actor, tenant: Tenant) -> bool:
    """Add, change and remove the tenant's members (and see its admin pages): tenant admins and ops."""
    return has_perm(actor, "manage_members_tenant", tenant)


@with_holders(lambda project: perm_holders("view_project", project))
def may_view_project(actor: Actor, project: Project) -> bool:
    return has_perm(actor, "view_project", project)


@with_holders(lambda project: perm_holders("change_project", project))
def may_change_project(actor: Actor, project: Project) -> bool:
    return has_perm(actor, "change_project", project)


@with_holders(lambda project: perm_holders("submit_project", project))
def may_submit(actor: Actor, project: Project) -> bool:
    """Submit requests, register volumes, ask for quota in the project: members and admins."""
    return has_perm(actor, "submit_project", project)


@with_holders(lambda project: perm_holders("approve_project", project))
def may_approve(actor: Actor, project: Project) -> bool:
    """Decide on the project's requests and set its approval rules: project admins, tenant admins, ops."""
    return has_perm(actor, "approve_project", project)


def may_manage_some_tenant(actor: Actor) -> bool:
    """Administer at least one tenant (the navigation's "Tenants you admin"): tenant admins and ops."""
    if actor.user is None:
        return True
    if actor.token is not None:
        return False
    scope = scope_of(actor)
    return scope.everything or bool(scope.tenant_ids("manage_members_tenant"))  # ops: no query (they see every tenant)


def may_manage_identity(actor: Actor) -> bool:
    """Map the identity provider's groups to roles and change how people sign in (/ops/identity/): ops."""
    return actor.user is None or actor.is_ops


def may_use_password(actor: Actor, login_settings: Any) -> bool:
    """Sign in with a password: everyone, unless ops switched it off for all but staff and ops (break-glass)."""
    if actor.user is None or not login_settings.password_login_staff_only:
        return True
    return bool(actor.user.is_staff) or actor.is_ops


# Asking by name, once per request --------------------------------------------------------------------------------
#
# Templates ask predicates by name: ``{% may "tenants.may_write_in" tenant as writable %}``
# (``tenants/templatetags/policy.py``). Each app makes its policy module's own ``may_*`` functions askable
# from its ``AppConfig.ready`` (tenants sits below the apps whose predicates it names, so it cannot import them).

PREDICATES: dict[str, Callable[..., bool]] = {}


def predicates_install(module: ModuleType) -> None:
    """Make the ``may_*`` functions defined in ``module`` askable as ``"<app>.<function>"``."""
    app = module.__name__.split(".")[0]
    for name, value in vars(module).items():
        if name.startswith("may_") and callable(value) and getattr(value, "__module__", None) == module.__name__:
            PREDICATES[f"{app}.{name}"] = value


def predicate(name: str) -> Callable[..., bool]:
    """The predicate templates call ``name``; ``KeyError`` if no app installed it."""
    return PREDICATES[name]


def _key(value: Any) -> Any:
    """What identifies an argument in the per-request memo: a row by model and pk, a plain value by itself."""
    meta = getattr(value, "_meta", None)
    if meta is not None and getattr(value, "pk", None) is not None:
        return (meta.label, value.pk)
    hash(value)  # TypeError for what cannot be remembered
    return value


def asked(request: Any, may: Callable[..., bool], *objects: Any, **options: Any) -> bool:
    """``may(actor, *objects, **options)`` for the actor of ``request``, asked once per request: a page that
    shows the same button on every row asks once (a predicate may read permissions from the database).
    Rows count by model and pk; a request renders after its writes, so the answers hold for the rest of it."""
    actor = Actor.from_request(request)
    try:
        key = (may.__module__, may.__qualname__, tuple(_key(o) for o in objects),
               tuple(sorted((name, _key(value)) for name, value in options.items())))
    except TypeError:
        return bool(may(actor, *objects, **options))
    memo = request.__dict__.setdefault("_portal_may", {})
    if key not in memo:
        memo[key] = bool(may(actor, *objects, **options))
    return memo[key]

"""The page frame of every portal page, and the small tenancy facts pages show (roles, tenant choices).

It sits above ``portal.ui`` (pagination, filters) because the navigation depends on who the actor
administers; the views of every app render through ``page()``.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .access import Actor, scope_of
from .models import Membership, Project, Role, Tenant


def refresh_perms(user: Any) -> None:
    # Permissions are cached on the request's user; a write in this request may have changed them.
    for attr in ("_perm_cache", "_user_perm_cache", "_group_perm_cache", "_portal_is_ops"):
        user.__dict__.pop(attr, None)


def page(request: HttpRequest, template: str, context: dict[str, Any], *, status: int = 200) -> HttpResponse:
    """Render a full page. The navigation asks the predicates itself (``{% may %}`` in ``base.html``)."""
    context.setdefault("actor", Actor.from_request(request))
    return render(request, template, context, status=status)


def role_labels(actor: Actor) -> tuple[dict[int, str], dict[int, str]]:
    """The user's own roles: ({project id: label}, {tenant id: label}) for tenant-wide roles."""
    if actor.user is None or not actor.user.is_authenticated:
        return {}, {}
    if actor.is_ops:  # the scope of ops is "everything"; their own roles still show
        return _labels(Membership.objects.filter(user=actor.user).order_by().values_list("tenant_id", "project_id", "role"))
    scope = scope_of(actor)  # computed once per request, shared with the selectors and predicates
    return dict(scope.by_project), dict(scope.by_tenant)


def _labels(rows: Any) -> tuple[dict[int, str], dict[int, str]]:
    by_project: dict[int, str] = {}
    by_tenant: dict[int, str] = {}
    for tenant_id, project_id, role in rows:
        if project_id is None:
            by_tenant[tenant_id] = Role(role).label
        else:
            by_project[project_id] = Role(role).label
    return by_project, by_tenant


def role_in(project: Project, by_project: dict[int, str], by_tenant: dict[int, str], actor: Actor) -> str:
    if project.pk in by_project:
        return by_project[project.pk]
    if project.tenant_id in by_tenant:
        return by_tenant[project.tenant_id]
    return "Platform ops" if actor.is_ops else "—"


def tenant_choices() -> list[tuple[str, str]]:
    return list(Tenant.objects.order_by("name").values_list("slug", "name"))

"""The page frame of every portal page, and the small tenancy facts pages show (roles, tenant choices).

It sits above ``portal.ui`` (pagination, filters) because the navigation depends on who the actor
administers; the views of every app render through ``page()``.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from . import selectors
from .access import Actor
from .models import Project, Tenant


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
    by_project: dict[int, str] = {}
    by_tenant: dict[int, str] = {}
    mine = selectors.memberships_for(actor=actor).filter(user=actor.user)
    for membership in mine:
        if membership.project_id is None:
            by_tenant[membership.tenant_id] = membership.get_role_display()
        else:
            by_project[membership.project_id] = membership.get_role_display()
    return by_project, by_tenant


def role_in(project: Project, by_project: dict[int, str], by_tenant: dict[int, str], actor: Actor) -> str:
    if project.pk in by_project:
        return by_project[project.pk]
    if project.tenant_id in by_tenant:
        return by_tenant[project.tenant_id]
    return "Platform ops" if actor.is_ops else "—"


def tenant_choices() -> list[tuple[str, str]]:
    return list(Tenant.objects.order_by("name").values_list("slug", "name"))

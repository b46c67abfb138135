"""The guards every app's views, API views and services share: who is acting, and refusals.

Services raise ``NotAllowed`` (a 403 in the API, a message on a page). Ops-only pages answer 404 to
everyone else: they don't exist for them. Tenant admin pages answer 404 for a tenant the actor cannot
see and 403 for one they can see but not administer.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from portal.exceptions import NotAllowed

from . import policy, selectors
from .access import Actor
from .models import Tenant


def actor_of(request: HttpRequest) -> Actor:
    """The actor behind a page or API request (a user, or a user through an API token)."""
    return Actor.from_request(request)


def ops_only(request: HttpRequest) -> Actor:
    """The actor of an ops page; anyone else gets a 404."""
    actor = actor_of(request)
    if not actor.is_ops:
        raise Http404("No such page.")  # ops pages don't exist for anyone else
    return actor


def require_ops(actor: Actor, message: str) -> None:
    """In a service: refuse unless the actor is ops (or the system itself)."""
    if not policy.may_operate(actor):
        raise NotAllowed(message)


def require(allowed: bool, message: str) -> None:
    """In a service: refuse with ``message`` unless a ``may_*`` predicate said yes."""
    if not allowed:
        raise NotAllowed(message)


def _tenant_page(actor: Actor, slug: str, may: Callable[[Actor, Tenant], bool], message: str) -> Tenant:
    tenant = selectors.tenant_seen_by(actor=actor, slug=slug)
    if tenant is None:
        raise Http404("No Tenant matches the given query.")
    if not may(actor, tenant):
        raise PermissionDenied(message)
    return tenant


def tenant_to_manage_members(actor: Actor, slug: str) -> Tenant:
    """The tenant ``slug`` for its admin pages (members, audit, projects): ``may_manage_members``."""
    return _tenant_page(actor, slug, policy.may_manage_members, "Only the tenant's admins and platform ops manage a tenant.")


def tenant_to_change(actor: Actor, slug: str) -> Tenant:
    """The tenant ``slug`` for changing it (splitting its quota): ``may_change_tenant``."""
    return _tenant_page(actor, slug, policy.may_change_tenant, "Only the tenant's admins and platform ops split its quota.")

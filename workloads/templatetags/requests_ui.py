"""Template helpers for the request pages: which request links the navigation shows (usable from
``base.html`` whatever view rendered it) and the badge colour of a request state."""

from __future__ import annotations

from typing import Any

from django import template

from tenants.access import Actor
from tenants.selectors import projects_where

register = template.Library()

# Badge classes of the shared stylesheet: blue while waiting, green when running or done, red when it went wrong.
BADGES = {
    "submitted": "ops", "pending_approval": "ops", "approved": "ops", "queued": "ops", "preempted": "ops",
    "running": "active", "succeeded": "active",
    "failed": "suspended", "rejected": "suspended",
    "stopped": "archived", "cancelled": "archived", "expired": "archived",
}


@register.simple_tag(takes_context=True)
def request_nav(context: dict[str, Any]) -> dict[str, bool]:
    """Whether the signed-in user may submit (``submit``) and approve (``approve``) anywhere: the nav's links.
    Two small queries, cached on the request."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"submit": False, "approve": False}
    cached = getattr(request, "_portal_request_nav", None)
    if cached is None:
        actor = Actor(user=user)
        cached = {perm.split("_")[0]: projects_where(actor=actor, perm=perm).exists()
                  for perm in ("submit_project", "approve_project")}
        request._portal_request_nav = cached
    return cached


@register.filter
def state_badge(state: str) -> str:
    return BADGES.get(state, "archived")

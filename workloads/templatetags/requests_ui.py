"""Template helpers for the request pages: whether to show "Approvals" in the navigation (usable from
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
def can_approve(context: dict[str, Any]) -> bool:
    """Whether the signed-in user approves requests anywhere. One query, cached on the request."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return False
    cached = getattr(request, "_portal_can_approve", None)
    if cached is None:
        cached = projects_where(actor=Actor(user=user), perm="approve_project").exists()
        request._portal_can_approve = cached
    return cached


@register.filter
def state_badge(state: str) -> str:
    return BADGES.get(state, "archived")

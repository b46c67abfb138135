"""Template helpers for quota pages: quantities for people, and the project quota summary card."""

from __future__ import annotations

from typing import Any

from django import template

from quotas import selectors
from quotas.services import fmt

register = template.Library()


@register.filter
def qty(value: Any, none: str = "no limit") -> str:
    """``12`` rather than ``12.000``; ``None`` (no limit) as ``none``."""
    return none if value is None or value == "" else fmt(value)


@register.inclusion_tag("quotas/_project_quota_card.html")
def project_quota(project: Any) -> dict[str, Any]:
    """The project's quota (nominal, in use, borrowed, free) as a card for the project page."""
    return {"project": project, "rows": selectors.project_quota_summary(project=project)}

"""Template helpers for quota pages: quantities for people, and the project quota summary card."""

from __future__ import annotations

from typing import Any

from django import template

from portal.quantities import fmt
from quotas import selectors
from quotas.capacity import flavor_enforcement

register = template.Library()


@register.filter
def qty(value: Any, none: str = "no limit") -> str:
    """``12`` rather than ``12.000``; ``None`` (no limit) as ``none``."""
    return none if value is None or value == "" else fmt(value)


@register.filter
def offered(flavors: Any) -> list[Any]:
    """Only the flavors the cluster's architecture enforces: what may be offered to researchers."""
    return [f for f in flavors if flavor_enforcement(f.cluster, f).enforced]


@register.filter
def enforcement(flavor: Any) -> Any:
    """``capacity.flavor_enforcement`` of a flavor row: ``.enforced``, ``.reason``, ``.remedy``."""
    return flavor_enforcement(flavor.cluster, flavor)


@register.inclusion_tag("quotas/_project_quota_card.html")
def project_quota(project: Any) -> dict[str, Any]:
    """The project's quota (nominal, in use, borrowed, free) as a card for the project page."""
    return {"project": project, "rows": selectors.project_quota_summary(project=project)}

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


@register.filter
def usage_as_of(rows: Any) -> Any:
    """When the in-use figures of ``rows`` were read from the cluster: every reconcile reads the
    ClusterQueues' usage, then stamps ``Cluster.reconciled_at``, so the figures are as of the oldest
    such stamp among the rows' clusters; None when none was read yet. ``rows``: quota rows (with
    ``flavor.cluster``), ``project_quota_summary`` dicts (``usage_read_at``), ``(row, check)`` pairs,
    or ``values("flavor__cluster__reconciled_at")`` dicts."""
    stamps = []
    for item in rows or []:
        if isinstance(item, tuple):
            item = item[0]
        if isinstance(item, dict):
            item = item.get("row", item)
        if isinstance(item, dict):
            stamp = item.get("usage_read_at", item.get("flavor__cluster__reconciled_at"))
        else:
            stamp = item.flavor.cluster.reconciled_at
        if stamp is not None:
            stamps.append(stamp)
    return min(stamps) if stamps else None

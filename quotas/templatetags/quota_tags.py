"""Template helpers for quota pages: quantities for people, and the project quota summary card."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from portal.quantities import fmt, resource_unit
from quotas import selectors
from quotas.capacity import TOTAL_GPUMEM, flavor_enforcement
from quotas.models import gib_words
from tenants.templatetags.page_kit import written

register = template.Library()


@register.filter
def qty(value: Any, none: str = "no limit") -> str:
    """``12`` rather than ``12.000``; ``None`` (no limit) as ``none``."""
    return none if value is None or value == "" else fmt(value)


@register.filter
def resource_label(resource: str, in_gib: Any = False) -> SafeString:
    """A resource's name with the unit its figures are in: ``memory`` (GiB), ``nvidia.com/total-gpumem`` (MiB of
    GPU memory), ``nvidia.com/gpu`` (count), for the Resource column of quota and capacity tables. ``in_gib``: the
    table shows HAMi's GPU memory in GiB (``qty_in``)."""
    key = (resource, bool(in_gib))
    label = _RESOURCE_LABELS.get(key)
    if label is None:  # a handful of resources: each label made once per process (format_html costs ~10 µs a row)
        unit = "GiB of GPU memory" if in_gib and resource == TOTAL_GPUMEM else resource_unit(resource)
        label = format_html('<code>{}</code> <span class="unit muted small">({})</span>', resource, unit)
        if len(_RESOURCE_LABELS) < 1024:
            _RESOURCE_LABELS[key] = label
    return label


_RESOURCE_LABELS: dict[tuple[Any, bool], SafeString] = {}


@register.filter
def qty_in(value: Any, resource: str) -> str:
    """``qty`` for the quota tables people read: HAMi's GPU memory (``nvidia.com/total-gpumem``, counted in MiB) in
    GiB, ``92136`` -> ``90 GiB``; the rest as ``qty``."""
    if value is None or value == "":
        return "no limit"
    return f"{gib_words(value)} GiB" if resource == TOTAL_GPUMEM else fmt(value)


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
    for given in rows or []:
        item = given[0] if isinstance(given, tuple) else given
        if isinstance(item, dict):
            item = item.get("row", item)
        if isinstance(item, dict):
            stamp = item.get("usage_read_at", item.get("flavor__cluster__reconciled_at"))
        else:
            stamp = item.flavor.cluster.reconciled_at
        if stamp is not None:
            stamps.append(stamp)
    return min(stamps) if stamps else None


_v = written  # ``{{ value }}`` of a snippet written in Python


@register.simple_tag
def quota_asked(r: Any) -> SafeString:
    """What a quota request asks, for the request lists, cards and pages: ``+6 <code>nvidia.com/gpu</code> of
    h100-80gb``; a HAMi request in shares as people think of it, ``+4 shares of L40S shared (HAMi) · 11 GiB, 25 % of
    the cores`` with what they add up to."""
    if not r.is_share:
        return mark_safe(f"+{_v(qty(r.amount))} <code>{_v(r.resource)}</code> of {_v(r.flavor.name)}")
    return mark_safe(f'{_v(r.what)} <span class="muted small share-total">({_v(r.share_totals)} in all)</span>')


SHARE_ROW_WORDS = {"nvidia.com/gpu": "vGPU slots +{}", "nvidia.com/total-gpucores": "GPU cores +{} % of a card",
                   "nvidia.com/total-gpumem": "GPU memory +{} GiB"}


@register.simple_tag
def quota_share_facts(r: Any) -> SafeString:
    """A HAMi request's card: the three quota rows approval raises together (nothing for other requests)."""
    if not r.is_share:
        return mark_safe("")
    parts = [SHARE_ROW_WORDS[resource].format(gib_words(amount) if resource == TOTAL_GPUMEM else fmt(amount))
             for resource, amount in r.share_rows()]
    return mark_safe(f'<div class="share-rows"><dt>Approval raises together</dt><dd>{_v(", ".join(parts))}</dd></div>')


@register.simple_tag
def scheduler_status() -> dict[str, Any]:
    """The scheduler's (Celery beat's) last heartbeat as ``/healthz/ready`` reports it: ``.ok``, ``.text``."""
    from portal.health import scheduler_status as status

    return status()

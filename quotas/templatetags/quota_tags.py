"""Template helpers for quota pages: quantities for people, and the project quota summary card."""

from __future__ import annotations

from typing import Any

from django import template
from django.template.base import render_value_in_context
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import template_localtime

from portal.quantities import fmt
from quotas import selectors
from quotas.capacity import flavor_enforcement
from tenants.templatetags.page_kit import day, stamp, url_kept

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


class _Values:
    """What ``render_value_in_context`` reads of a template context: the settings' defaults, autoescape on."""

    use_tz = None
    use_l10n = None
    autoescape = True


def _v(value: Any) -> str:
    """``{{ value }}`` as the template engine writes it (local time, localisation, escaping). A plain string is only
    escaped and a safe one kept, as the engine ends up doing with them, without asking for local time and formats."""
    if type(value) is str:
        return escape(value)
    if type(value) is SafeString:
        return value
    return render_value_in_context(value, _Values)


@register.simple_tag
def node_row(node: Any, flags: list[tuple[str, str]], allocatable: list[tuple[str, Any]]) -> SafeString:
    """The capacity page's row of a node, written out in Python: the HTML its template wrote (the state flags, the
    allocatable resources), without the template engine's work per value (a tenth of the page;
    ``tests/quotas/test_node_row_fast.py`` compares both)."""
    pool = node.pool
    seen = stamp(template_localtime(node.last_seen_at)) if node.last_seen_at is not None else ""
    state = "".join(f'<span class="flag flag-{_v(css)}">{_v(text)}</span> ' for css, text in flags) if flags else \
        '<span class="badge badge-active">Counting</span>'
    kv = "".join(f'<span class="kv"><code>{_v(key)}</code> {_v(value)}</span> ' for key, value in allocatable)
    flagged = ' class="row-flagged"' if flags else ""
    return mark_safe(
        f"<tr{flagged}>\n"
        f'                <td data-label="Node"><code>{_v(node.name)}</code></td>\n'
        f'                <td data-label="Pool">{_v((pool.name if pool is not None else "") or "—")}</td>\n'
        f'                <td data-label="State">{state}</td>\n'
        f'                <td data-label="Allocatable" class="small">{kv}</td>\n'
        f'                <td data-label="Last seen">{_v(seen or "—")}</td>\n'
        f"              </tr>"
    )


@register.simple_tag
def quota_request_row(r: Any) -> SafeString:
    """``{% include "quotas/_request_row.html" %}`` of the quota request table, written out in Python: the same HTML
    (``tests/quotas/test_request_row_fast.py`` compares both for every kind of row), without the template engine's
    work per value and the status badge's include per row."""
    pk = _v(r.pk)
    until = f'<br><span class="muted small">until {_v(stamp(template_localtime(r.until)))}</span>' if r.until else ""
    project = r.project
    decided_by = r.decided_by
    decision = _v(decided_by.get_username()) if decided_by else ""
    if r.comment:
        decision += f'<blockquote class="comment small">{_v(r.comment)}</blockquote>'
    elif not decided_by:
        decision += '<span class="muted">—</span>'
    return mark_safe(
        f'<tr id="quota-request-row-{pk}">\n'
        f'              <td data-label="Request"><a href="{_v(url_kept("quota-request", r.pk))}">#{pk}</a> '
        f'+{_v(qty(r.amount))} <code>{_v(r.resource)}</code> of {_v(r.flavor.name)}{until}</td>\n'
        f'              <td data-label="Project"><a href="{_v(url_kept("project-quota", project.slug))}">{_v(project.name)}</a>'
        f'<br><span class="muted small">{_v(project.tenant.name)}</span></td>\n'
        f'              <td data-label="Asked by">{_v(r.requested_by.get_username())}<br>'
        f'<span class="muted small">{_v(stamp(template_localtime(r.created_at)))}</span></td>\n'
        f'              <td data-label="Status"><span class="badge badge-request-{_v(r.status)}">{_v(r.get_status_display())}'
        f'</span>\n<br><span class="muted small">{_v(r.get_approver_display())}</span></td>\n'
        f'              <td data-label="Decision">{decision}</td>\n'
        f"            </tr>"
    )


@register.simple_tag
def quota_request_line(r: Any) -> SafeString:
    """``{% include "quotas/_request_line.html" %}`` of the project quota page's request list, written out in Python
    as ``quota_request_row`` (``tests/quotas/test_request_row_fast.py`` compares both)."""
    pk = _v(r.pk)
    decided_by = r.decided_by
    decided = (f" · {_v(str(r.get_status_display()).lower())} by {_v(decided_by.get_username())}" if decided_by else "")
    comment = f'<blockquote class="comment small">{_v(r.comment)}</blockquote>' if r.comment else ""
    return mark_safe(
        f'<li class="request-line">\n'
        f'            <a href="{_v(url_kept("quota-request", r.pk))}">#{pk}</a>\n'
        f"            +{_v(qty(r.amount))} <code>{_v(r.resource)}</code> of {_v(r.flavor.name)}\n"
        f'            <span class="badge badge-request-{_v(r.status)}">{_v(r.get_status_display())}</span>\n\n'
        f'            <span class="muted small">by {_v(r.requested_by.get_username())}, '
        f"{_v(day(template_localtime(r.created_at)))}{decided}</span>\n"
        f"            {comment}\n"
        f"          </li>"
    )


@register.simple_tag
def confirmed_cell(c: Any) -> SafeString:
    """``{% include "quotas/_confirmed.html" %}`` (what the cluster confirmed of a quota row: a row of
    ``selectors.quota_confirmations``), written out in Python: the same HTML (``tests/quotas/test_request_row_fast.py``
    compares both for every kind of row), without an include per row of the quota tables."""
    if not c.get("enforced"):
        reason = getattr(c.get("enforcement"), "reason", "")
        return mark_safe(f'\n<span class="flag flag-notready" title="{_v(reason)}">not enforced</span>\n\n')
    at = c.get("confirmed_at")
    shown = (f'<span class="small">{_v(stamp(template_localtime(at)))} UTC</span>' if at
             else '<span class="muted small">not yet on the cluster</span>')
    drift = (f'<br><strong class="over small drift">drift: the cluster says {_v(qty(c.get("cluster_nominal"), "none"))}'
             f"</strong>" if c.get("drift") else "")
    return mark_safe(f"\n{shown}\n{drift}\n")

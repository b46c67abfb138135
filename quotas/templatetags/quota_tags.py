"""Template helpers for quota pages: quantities for people, and the project quota summary card."""

from __future__ import annotations

from typing import Any

from django import template
from django.template.defaultfilters import linebreaksbr
from django.template.defaulttags import CsrfTokenNode
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import template_localtime

from portal.quantities import fmt, resource_unit
from quotas import selectors
from quotas.capacity import TOTAL_GPUMEM, flavor_enforcement
from quotas.models import gib_words
from tenants.templatetags.page_kit import day, stamp, url_kept, written
from tenants.templatetags.policy import may as policy_may

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
    unit = "GiB of GPU memory" if in_gib and resource == TOTAL_GPUMEM else resource_unit(resource)
    return format_html('<code>{}</code> <span class="unit muted small">({})</span>', resource, unit)


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


_v = written  # ``{{ value }}`` of a row written in Python


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
        f'{quota_asked(r)}{until}</td>\n'
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
        f"            {quota_asked(r)}\n"
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


def _decide_form(r: Any, pk: str, csrf: str, back: str, comment: str) -> str:
    """The card's approve/reject form (``quotas/_request_card.html``)."""
    url = _v(url_kept("quota-request-decide", r.pk))
    return (
        f'\n    <form method="post" action="{url}" class="decide-form"\n'
        f'          hx-post="{url}" hx-target="closest li" hx-swap="outerHTML">\n'
        f"      {csrf}\n"
        f'      <input type="hidden" name="next" value="{back}">\n'
        f'      <div class="field">\n'
        f'        <label for="comment-{pk}">Comment on #{pk}</label>\n'
        f'        <textarea name="comment" id="comment-{pk}" rows="2" maxlength="2000" aria-describedby="comment-{pk}-help">'
        f"{comment}</textarea>\n"
        f'        <p class="help" id="comment-{pk}-help">Required to reject: say why, so '
        f"{_v(r.requested_by.get_username())} knows what to do.</p>\n"
        f"      </div>\n"
        f'      <div class="form-actions">\n'
        f'        <button type="submit" name="decision" value="approve" class="btn btn-primary">Approve'
        f'<span class="visually-hidden"> #{pk}</span></button>\n'
        f'        <button type="submit" name="decision" value="reject" class="btn btn-danger">Reject'
        f'<span class="visually-hidden"> #{pk}</span></button>\n'
        f"      </div>\n"
        f"    </form>\n  "
    )


def _withdraw_form(r: Any, pk: str, csrf: str, back: str) -> str:
    """The card's withdraw form (``quotas/_request_card.html``)."""
    url = _v(url_kept("quota-request-cancel", r.pk))
    return (
        f'\n    <form method="post" action="{url}" data-confirm="Withdraw request #{pk}?"\n'
        f'          hx-post="{url}" hx-target="closest li" hx-swap="outerHTML">\n'
        f"      {csrf}\n"
        f'      <input type="hidden" name="next" value="{back}">\n'
        f'      <button type="submit" class="btn btn-secondary btn-small">Withdraw'
        f'<span class="visually-hidden"> #{pk}</span></button>\n'
        f"    </form>\n  "
    )


@register.simple_tag(takes_context=True)
def quota_request_card(context: template.Context, r: Any, current: Any = None, *, inbox: bool = False,
                       selectable: bool = False) -> SafeString:
    """``{% include "quotas/_request_card.html" %}`` (one quota request as a card, with its decision or withdraw
    form), written out in Python: the same HTML (``tests/quotas/test_request_card_fast.py`` compares both for every
    kind of card), without the template engine's work per value (the inbox shows a page of these). Reads ``note``,
    ``error``, ``form``, ``next_url``, ``request`` and the CSRF token from the context, as the include does."""
    pk = _v(r.pk)
    status = r.status
    note, error = context.get("note"), context.get("error")
    may_decide = may_withdraw = False
    if status == "pending" and not inbox:
        may_decide = policy_may(context, "quotas.may_decide", r, tier=r.approver)
        may_withdraw = policy_may(context, "quotas.may_withdraw", r)
    project = r.project
    asker = _v(r.requested_by.get_username())
    select = ""
    if selectable and status == "pending" and not note:
        select = (f'<label class="select-item"><input type="checkbox" name="quota_requests" value="{pk}" '
                  f'form="quota-bulk-form"> Select<span class="visually-hidden"> #{pk}</span></label>')
    until = f"{_v(stamp(template_localtime(r.until)))} UTC" if r.until else "permanent"
    if current:
        now = f"{_v(qty(current.nominal))} promised, {_v(qty(current.used))} in use"
        if current.borrowed:
            now += f", {_v(qty(current.borrowed))} borrowed"
    else:
        now = "none yet"
    decided_by, comment = r.decided_by, r.comment
    decision = ""
    if decided_by or comment:
        decision = "<div><dt>Decision</dt><dd>"
        if decided_by:
            decision += f"{_v(r.get_status_display())} by {_v(decided_by.get_username())}"
            if r.decided_at:
                decision += f", {_v(stamp(template_localtime(r.decided_at)))} UTC"
        if comment:
            decision += f'<blockquote class="comment">{_v(comment)}</blockquote>'
        decision += "</dd></div>"
    noted = f'<p class="note" role="status">{_v(note)}</p>' if note else ""
    failed = f'<p class="error" role="alert">{_v(error)}</p>' if error else ""
    action = ""
    if inbox or may_decide or may_withdraw:
        csrf = CsrfTokenNode().render(context)
        back = context.get("next_url")
        if not back:
            request = context.get("request")
            back = request.get_full_path() if request is not None else ""
        back = _v(back)
        if inbox or may_decide:
            form = context.get("form")
            value = form["comment"].value() if form is not None else None
            action = _decide_form(r, pk, csrf, back, _v(value or ""))
        else:
            action = _withdraw_form(r, pk, csrf, back)
    return mark_safe(
        "\n"
        f'\n<li class="card request-card" id="request-{pk}" aria-labelledby="request-{pk}-h">\n'
        f'  <div class="card-head">\n'
        f'    <h3 class="card-title" id="request-{pk}-h"><a href="{_v(url_kept("quota-request", r.pk))}">#{pk}</a> '
        f"{quota_asked(r)} for {_v(project.name)}</h3>\n"
        f"    <span>\n"
        f"      {select}\n"
        f'      <span class="badge badge-request-{_v(status)}">{_v(r.get_status_display())}</span>\n\n'
        f"    </span>\n"
        f"  </div>\n"
        f'  <dl class="facts facts-wide">\n'
        f'    <div><dt>Project</dt><dd><a href="{_v(url_kept("project-quota", project.slug))}">{_v(project.name)}</a>'
        f" · {_v(project.tenant.name)}</dd></div>\n"
        f"    <div><dt>Asked by</dt><dd>{asker}, {_v(stamp(template_localtime(r.created_at)))} UTC</dd></div>\n"
        f"    <div><dt>Until</dt><dd>{until}</dd></div>\n"
        f"    <div><dt>Why</dt><dd>{linebreaksbr(r.reason, autoescape=True)}</dd></div>\n"
        f"    <div><dt>Decided by</dt><dd>{_v(r.get_approver_display())} "
        f'<span class="muted small">(who owns the headroom)</span></dd></div>\n'
        f"    <div><dt>Quota now</dt><dd>{now}</dd></div>{quota_share_facts(r)}\n"
        f"    {decision}\n"
        f"  </dl>\n"
        f"  {noted}\n"
        f"  {failed}\n"
        f"  {action}\n"
        f"</li>\n"
    )


@register.simple_tag
def scheduler_status() -> dict[str, Any]:
    """The scheduler's (Celery beat's) last heartbeat as ``/healthz/ready`` reports it: ``.ok``, ``.text``."""
    from portal.health import scheduler_status as status

    return status()

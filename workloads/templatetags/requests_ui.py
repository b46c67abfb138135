"""Template helpers for the request pages: the badge colour of a request state, parameters as people write them.
(Which request links the navigation shows, ``base.html`` asks the predicates: ``{% may %}``.)"""

from __future__ import annotations

import shlex
from typing import Any

from django import template
from django.forms import BoundField
from django.forms.renderers import get_default_renderer
from django.template.defaultfilters import floatformat, pluralize
from django.template.defaulttags import CsrfTokenNode
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import template_localtime

from portal.extensions import cost_estimator
from portal.quantities import format_money
from tenants.access import Actor
from tenants.templatetags.page_kit import stamp, written
from workloads.forms import DecisionForm

register = template.Library()

# Rows of a list link and post to the same view with their own id: the URL is reversed once per name (and URLconf
# and script prefix) with this id in it, and each row's id is put in its place (docs/performance.md).
_PK_MARK = 918273645
_PK_URLS: dict[tuple[str, Any, str], tuple[str, str]] = {}
# The decision forms' comment field rendered once per form class with this prefix, and each row's put in its place.
_PREFIX_MARK = "row0prefix0mark"
_WIDGETS: dict[tuple[type, str, Any], str] = {}

# Badge classes of the shared stylesheet: blue while waiting, green when running or done, red when it went wrong.
BADGES = {
    "submitted": "ops", "pending_approval": "ops", "approved": "ops", "queued": "ops", "preempted": "ops",
    "running": "active", "succeeded": "active",
    "failed": "suspended", "rejected": "suspended",
    "stopped": "archived", "cancelled": "archived", "expired": "archived",
}


@register.filter
def money(amount: Any) -> str:
    """A cost estimate's amount ("12.50") with the currency of the registered estimator: "12.50 EUR"."""
    return "" if amount is None or amount == "" else format_money(amount, cost_estimator.currency)


@register.simple_tag(takes_context=True)
def approvals_waiting(context: dict[str, Any]) -> dict[str, int]:
    """What waits for the signed-in user's decision: ``requests`` (workload and extension requests, the
    Approvals inbox) and ``quota`` (the quota requests inbox). Approvers and ops only (nobody else may decide
    anything): one cache read (``selectors.approvals_waiting_counts_kept``), remembered on the request; nothing for
    everyone else."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"requests": 0, "quota": 0}
    cached = getattr(request, "_portal_approvals_waiting", None)
    if cached is None:
        from workloads.selectors import approvals_waiting_counts_kept

        from tenants.policy import asked
        from workloads.policy import may_decide_somewhere

        actor = Actor(user=user)
        if actor.is_ops or asked(request, may_decide_somewhere):
            cached = approvals_waiting_counts_kept(actor=actor)
        else:
            cached = {"requests": 0, "quota": 0}
        request._portal_approvals_waiting = cached
    return cached


@register.filter
def state_badge(state: str) -> str:
    return BADGES.get(state, "archived")


@register.filter
def parameter_text(value: Any, key: str = "") -> str:
    """A request parameter as a person writes it: a list as a shell command line (``--epochs 3``), env as
    ``KEY=value`` lines, booleans as yes/no; "" for an empty value (the page shows "—")."""
    if value is None or value == "" or value == [] or value == {}:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return "\n".join(f"{k}={'' if v is None else v}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        if key == "env" or (value and all(isinstance(i, dict) and "name" in i for i in value)):
            return "\n".join(f"{i.get('name')}={i.get('value', '')}" for i in value if isinstance(i, dict))
        return shlex.join(str(part) for part in value)
    return str(value)


@register.simple_tag
def pk_url(name: str, pk: int) -> str:
    """``{% url name pk %}`` for a view taking one integer id, without reversing it again for every row."""
    key = (name, get_urlconf(), get_script_prefix())
    parts = _PK_URLS.get(key)
    if parts is None:
        head, found, tail = reverse(name, args=[_PK_MARK]).partition(str(_PK_MARK))
        if not found:  # not a plain id in the path: reverse it every time
            return reverse(name, args=[pk])
        parts = _PK_URLS[key] = (head, tail)
    return f"{parts[0]}{int(pk)}{parts[1]}"


@register.filter
def row_widget(field: BoundField) -> SafeString:
    """``{{ field }}`` of a row's decision form (a form class without arguments, one per row, told apart by its
    prefix). While the form is unbound, without initial values, its widget's HTML differs between rows only by the
    prefix: rendered once, the row's prefix is put in. A bound form (a value, errors) renders as usual."""
    form = field.form
    if form.is_bound or form.initial or not form.prefix or form.auto_id != "id_%s" or form.data:
        return SafeString(str(field))
    key = (type(form), field.name, form.renderer)
    html = _WIDGETS.get(key)
    if html is None:
        html = _WIDGETS[key] = str(type(form)(prefix=_PREFIX_MARK)[field.name])
    return mark_safe(html.replace(_PREFIX_MARK, form.prefix))


_v = written  # ``{{ value }}`` of a row written in Python


# The decision form's comment field of a row (label's target, widget, help text), written once per form class and
# renderer with a marker for the prefix; each row's prefix is put in its place (``approval_row``).
_FIELD_PARTS: dict[tuple[type, Any], tuple[str, str, str]] = {}


def _comment_parts(form_class: type, prefix: str) -> tuple[str, str, str]:
    """(``field.id_for_label``, ``{{ field|row_widget }}``, the help text's paragraph or "") of an unbound form's
    ``comment`` field with ``prefix``, without building the form (``tests/workloads/test_approval_row_fast.py``)."""
    key = (form_class, get_default_renderer())
    parts = _FIELD_PARTS.get(key)
    if parts is None:
        field = form_class(prefix=_PREFIX_MARK)["comment"]
        help_text = (f'<p class="help" id="{_v(field.auto_id)}_helptext">{_v(field.help_text)}</p>'
                     if field.help_text else "")
        parts = _FIELD_PARTS[key] = (_v(field.id_for_label), str(field), help_text)
    return tuple(part.replace(_PREFIX_MARK, prefix) for part in parts)  # type: ignore[return-value]


@register.simple_tag(takes_context=True)
def approval_row(context: Any, row: dict[str, Any]) -> SafeString:
    """``{% include "workloads/_approval_row.html" with req=row.req info=row.info form=row.form %}`` of the
    inbox's list: the row written out in Python, the same HTML (``tests/workloads/test_approval_row_fast.py``
    compares both for every kind of row), without the template engine's work per value, which was most of the
    inbox's time. A row without a form (``None``: the page's rows) has a fresh, unbound ``DecisionForm`` of the
    row's prefix, written without building it (``_comment_parts``). A row with a bound form, a result (``done``) or
    an ``error`` renders through the template."""
    req, info, form = row["req"], row["info"], row.get("form")
    if form is None and (context.get("done") or context.get("error")):
        form = DecisionForm(prefix=f"decide-{req.pk}")
    if form is not None and (context.get("done") or context.get("error") or form.is_bound or form.initial
                             or not form.prefix or form.auto_id != "id_%s" or form.renderer is not get_default_renderer()):
        template = context.template.engine.get_template("workloads/_approval_row.html")
        with context.push(req=req, info=info, form=form, selectable=True):
            return template.render(context)
    pk = _v(req.pk)
    name = _v(req.name)
    state = req.state
    out = [
        f'\n<li class="card inbox-item" id="approval-{pk}" aria-labelledby="approval-{pk}-h">\n'
        f'  <div class="card-head">\n'
        f'    <h2 class="card-title" id="approval-{pk}-h"><a href="{_v(pk_url("request-detail", req.pk))}">{name}</a></h2>\n'
        f'    <span>\n      '
    ]
    if state == "pending_approval":
        checked = " checked" if str(req.pk) in (context.get("selected_requests") or ()) else ""
        out.append(f'<label class="select-item"><input type="checkbox" name="requests" value="{pk}" form="bulk-form"'
                   f'{checked}> Select<span class="visually-hidden"> {name}</span></label>')
    flavor = _v(req.flavor)
    created = _v(stamp(template_localtime(req.created_at)))
    out.append(
        f'\n      <span class="badge badge-{_v(state_badge(state))}">{_v(req.get_state_display())}</span>\n\n'
        f'    </span>\n'
        f'  </div>\n'
        f'  <p class="muted small">{_v(req.template.name)} in <strong>{_v(req.project.name)}</strong> '
        f'({_v(req.tenant.name)}) · by {_v(req.requested_by.get_username())} · {created}</p>\n'
        f'  <dl class="facts facts-wide">\n'
        f'    <div><dt>Asks for</dt><dd>{_v(req.gpus)} × {flavor}'
        + (f" × {_v(req.replicas)}" if req.replicas > 1 else "")
        + f' for {_v(req.duration_hours)} h</dd></div>\n    '
    )
    if req.pending_reason and state == "pending_approval":
        out.append(f"<div><dt>Why you</dt><dd>{_v(req.pending_reason)}</dd></div>")
    out.append("\n    <div><dt>Project quota</dt><dd>\n      ")
    quota = info["quota"]
    for i, q in enumerate(quota):
        out.append(f'{_v(floatformat(q["nominal"], "-2"))} nominal')
        if q["borrowing_limit"] is not None:
            out.append(f' + {_v(floatformat(q["borrowing_limit"], "-2"))} borrowable')
        else:
            out.append(", may borrow from the tenant")
        if q["used"] is not None:
            out.append(f', {_v(floatformat(q["used"], "-2"))} in use')
        out.append(f' <span class="muted small">({_v(q["resource"])})</span>')
        if i < len(quota) - 1:
            out.append("<br>")
        out.append("\n      ")
    if not quota:
        out.append('<span class="muted">no quota in this flavor</span>')
    ahead = info["waiting_ahead"]
    queue = (f"{_v(ahead)} approved request{_v(pluralize(ahead))} waiting for capacity" if ahead
             else "nothing waiting")
    cost = info["cost_estimate"]
    cost = _v(money(cost)) if cost is not None else '<span class="muted">Billing not configured.</span>'
    out.append(
        f"\n    </dd></div>\n"
        f"    <div><dt>Running now</dt><dd>{_v(info['in_use'] or 0)} in {flavor}</dd></div>\n"
        f"    <div><dt>Queue</dt><dd>{queue}</dd></div>\n"
        f"    <div><dt>Cost estimate</dt><dd>{cost}</dd></div>\n"
        f"  </dl>\n  "
    )
    if state in ("pending_approval", "submitted"):
        if form is None:
            label_for, widget, help_text = _comment_parts(DecisionForm, f"decide-{req.pk}")
        else:
            label_for, widget, help_text = _comment_parts(type(form), form.prefix)
        decide_url = _v(pk_url("request-decide", req.pk))
        out.append(
            f'\n    <form method="post" action="{decide_url}"\n'
            f'          hx-post="{decide_url}" hx-target="closest li" hx-swap="outerHTML">\n'
            f"      {CsrfTokenNode().render(context)}\n"
            f'      <input type="hidden" name="next" value="inbox">\n'
            f"      \n"
            f'        <div class="field">\n'
            f'          <label for="{label_for}">Comment on {name}</label>\n'
            f"          {widget}\n"
            f"          \n"
            f"          {help_text}\n"
            f"        </div>\n"
            f"      \n"
            f'      <div class="form-actions">\n'
            f'        <button type="submit" name="decision" value="approve" class="btn btn-primary">Approve'
            f'<span class="visually-hidden"> {name}</span></button>\n'
            f'        <button type="submit" name="decision" value="reject" class="btn btn-danger">Reject'
            f'<span class="visually-hidden"> {name}</span></button>\n'
            f"      </div>\n"
            f"    </form>\n  "
        )
    out.append("\n  \n</li>\n")
    return mark_safe("".join(out))

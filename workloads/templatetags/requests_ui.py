"""Template helpers for the request pages: the badge colour of a request state, parameters as people write them.
(Which request links the navigation shows, ``base.html`` asks the predicates: ``{% may %}``.)"""

from __future__ import annotations

import shlex
from typing import Any

from django import template
from django.forms import BoundField
from django.utils.safestring import SafeString, mark_safe

from portal.extensions import cost_estimator
from portal.quantities import format_money
from tenants.access import Actor

register = template.Library()

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
    if value is None or value in ("", [], {}):
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

"""``{% may %}``: templates ask the apps' ``may_*`` predicates instead of flags the views compute.

    {% load policy %}
    {% may "tenants.may_write_in" tenant as writable %}
    {% may "quotas.may_decide" r tier=r.approver as may_decide %}
    {% may "workloads.may_submit_somewhere" as can_submit %}

The name is ``"<app>.<predicate>"`` (``tenants.policy.PREDICATES``); the actor is the request's. The tag
adds no rule of its own: it calls the predicate, once per request for the same arguments
(``tenants.policy.asked``), so a button on every row costs one question.
"""

from __future__ import annotations

from typing import Any

from django import template

from tenants import policy

register = template.Library()


@register.simple_tag(takes_context=True)
def may(context: template.Context, name: str, *objects: Any, **options: Any) -> bool:
    try:
        predicate = policy.predicate(name)
    except KeyError:
        raise template.TemplateSyntaxError(f"{{% may %}}: no predicate {name!r} (tenants.policy.PREDICATES)") from None
    request = context.get("request")
    if request is None:
        return False  # nobody to ask for (a template rendered outside a request)
    return policy.asked(request, predicate, *objects, **options)

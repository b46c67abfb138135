"""What was shared with whom: the one read of ``RequestShare`` that the predicates (``policy``) and the selectors
share (writes: ``workloads.sharing``; docs/security.md, "Sharing one request")."""

from __future__ import annotations

from tenants.access import Actor, scope_of

from .models import RequestShare

VIEW = "view_workloadrequest"
OPERATE = "operate_workloadrequest"


def shares_held(actor: Actor) -> dict[int, frozenset[str]]:
    """The requests shared with ``actor``'s user, as {request id: codenames}, counting only requests of tenants
    the user still belongs to. Empty for the system, ops (they see everything anyway) and API tokens (a token acts
    for its own project). Read once per request (one indexed query) and remembered on the user object until
    memberships or shares change (``tenants.access.scope_forget``)."""
    user = actor.user
    if user is None or actor.token is not None or not user.is_authenticated:
        return {}
    scope = scope_of(actor)
    if scope.everything or not scope.visible_tenants:
        return {}
    remembered = getattr(user, "_portal_shares", None)
    if remembered is not None and remembered[0] is scope:
        return remembered[1]
    held: dict[int, set[str]] = {}
    rows = (RequestShare.objects.filter(user_id=user.pk, content_object__tenant_id__in=sorted(scope.visible_tenants))
            .order_by().values_list("content_object_id", "permission__codename"))
    for request_id, codename in rows:
        held.setdefault(request_id, set()).add(codename)
    answer = {pk: frozenset(codenames) for pk, codenames in held.items()}
    user._portal_shares = (scope, answer)  # the scope object is new whenever memberships or shares change
    return answer

"""What was shared with whom: the one read of ``RequestShare`` that the predicates (``policy``) and the selectors
share (writes: ``workloads.sharing``; docs/security.md, "Sharing one request")."""

from __future__ import annotations

from portal.cache import Versioned
from tenants.access import Actor, scope_of

from .models import RequestShare

VIEW = "view_workloadrequest"
OPERATE = "operate_workloadrequest"


def shares_held(actor: Actor) -> dict[int, frozenset[str]]:
    """The requests shared with ``actor``'s user, as {request id: codenames}, counting only requests of tenants
    the user still belongs to. Empty for the system, ops (they see everything anyway) and API tokens (a token acts
    for its own project). Read once per request and remembered on the user object until memberships or shares
    change (``tenants.access.scope_forget``); kept per process between requests (``SHARES`` below)."""
    user = actor.user
    if user is None or actor.token is not None or not user.is_authenticated:
        return {}
    scope = scope_of(actor)
    if scope.everything or not scope.visible_tenants:
        return {}
    remembered = getattr(user, "_portal_shares", None)
    if remembered is not None and remembered[0] is scope:
        return remembered[1]
    tenants = tuple(sorted(scope.visible_tenants))
    answer = _kept.get(f"{user.pk}:{','.join(map(str, tenants))}", lambda: _read(user.pk, tenants))
    user._portal_shares = (scope, answer)  # the scope object is new whenever memberships or shares change
    return answer


# The answers kept per process under the shared version of ``SHARES`` (``portal.cache.Versioned``), per user and set
# of visible tenants: a request list or API list read them with the request's versions, not with a query. Every write
# of a share sets a new version once it commits (``shares_changed``: ``workloads.sharing``'s services, and a
# ``RequestShare`` saved or deleted, ``WorkloadsConfig.ready``); a membership changed is a new set of tenants, so a
# new key. Inside a transaction the shares are read from the database.
SHARES = "request-shares"
_kept = Versioned(SHARES)


def shares_changed(**kwargs: object) -> None:
    """(A signal receiver, or a service after its write) a share written: every process reads them again."""
    _kept.changed()


def _read(user_id: int, tenants: tuple[int, ...]) -> dict[int, frozenset[str]]:
    held: dict[int, set[str]] = {}
    rows = (RequestShare.objects.filter(user_id=user_id, content_object__tenant_id__in=tenants)
            .order_by().values_list("content_object_id", "permission__codename"))
    for request_id, codename in rows:
        held.setdefault(request_id, set()).add(codename)
    return {pk: frozenset(codenames) for pk, codenames in held.items()}

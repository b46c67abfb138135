"""Sharing one request with a named colleague: what roles cannot express (docs/security.md, "Sharing one request").

The requester (or an approver of the project) shares one request, and so its notebook, with a colleague of the same
tenant: ``view`` (see it in their lists and its page) or ``operate`` (also read its logs and open its notebook). A
share is a django-guardian per-object permission (``models.RequestShare``: ``view_workloadrequest``, plus
``operate_workloadrequest`` for ``operate``), written here only, audited (``request.share`` / ``request.unshare``)
and read by the same predicates (``policy.may_view_request``, ``may_read_logs``, ``may_open_notebook``) and
selectors (``selectors.request_scope_for``) as roles. A share counts only while its colleague still belongs to the
request's tenant. Nobody shares further what was shared with them.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import transaction
from django.db.models import Q

from portal.exceptions import Invalid
from tenants.access import Actor, scope_forget
from tenants.audit import audit_record
from tenants.guards import require
from tenants.models import Membership

from . import policy
from .models import RequestShare, WorkloadRequest
from .shared import OPERATE, VIEW, shares_changed

LEVELS: dict[str, tuple[str, ...]] = {"view": (VIEW,), "operate": (VIEW, OPERATE)}
LEVEL_LABELS = {"view": "View", "operate": "View and operate (logs, notebook)"}
NOT_A_COLLEAGUE = "No colleague of this tenant has that username or email address."


def shares_of(req: WorkloadRequest) -> list[dict[str, Any]]:
    """Who ``req`` is shared with, by username: ``{"user": user, "level": "view" | "operate", "shared_by": ...,
    "created_at": ...}`` (for the request's page and the API)."""
    rows: dict[int, dict[str, Any]] = {}
    for share in (RequestShare.objects.filter(content_object=req).select_related("user", "permission", "shared_by")
                  .order_by("user__username", "pk")):
        row = rows.setdefault(share.user_id, {"user": share.user, "level": "view", "shared_by": share.shared_by,
                                              "created_at": share.created_at})
        if share.permission.codename == OPERATE:
            row["level"] = "operate"
    return list(rows.values())


# Writes -------------------------------------------------------------------------------------------------------------


def _colleague(req: WorkloadRequest, who: str) -> Any:
    """The active user of ``req``'s tenant named ``who`` (username, or email address). The same error whether
    nobody has that name or someone of another tenant has it: nobody learns who exists elsewhere."""
    who = (who or "").strip()
    if not who or len(who) > 254:
        raise Invalid("Name a colleague by username or email address.", field="user")
    in_tenant = Membership.objects.filter(tenant_id=req.tenant_id).values("user_id")
    found = list(get_user_model().objects.filter(Q(username=who) | Q(email__iexact=who), is_active=True,
                                                 pk__in=in_tenant)[:2])
    if len(found) != 1:
        raise Invalid(NOT_A_COLLEAGUE, field="user")
    return found[0]


def _locked(req: WorkloadRequest) -> WorkloadRequest:
    return WorkloadRequest.objects.select_for_update(of=("self",)).select_related("project", "tenant").get(pk=req.pk)


@transaction.atomic
def request_share(*, actor: Actor, request: WorkloadRequest, user: str, level: str) -> dict[str, Any]:
    """Share ``request`` with the colleague named ``user`` at ``level`` (``view`` or ``operate``; sharing again
    changes the level). Only the requester (while they may submit in the project) and the project's approvers
    share; never through an API token's scope alone, never with oneself or the requester."""
    req = _locked(request)
    require(policy.may_share_request(actor, req), "Only the requester and the project's admins share this request.")
    if level not in LEVELS:
        raise Invalid("Choose view or operate.", field="level")
    colleague = _colleague(req, user)
    if colleague.pk == req.requested_by_id:
        raise Invalid("The requester sees the request already.", field="user")
    if actor.user is not None and colleague.pk == actor.user.pk:
        raise Invalid("You cannot share a request with yourself.", field="user")
    perms = {p.codename: p for p in Permission.objects.filter(content_type__app_label="workloads",
                                                              codename__in=(VIEW, OPERATE))}
    current = set(RequestShare.objects.filter(user=colleague, content_object=req)
                  .values_list("permission__codename", flat=True))
    wanted = set(LEVELS[level])
    before = {"user": colleague.get_username(), "level": "operate" if OPERATE in current else "view"} if current else None
    RequestShare.objects.filter(user=colleague, content_object=req).exclude(permission__codename__in=wanted).delete()
    RequestShare.objects.bulk_create([RequestShare(user=colleague, content_object=req, permission=perms[codename],
                                                   shared_by=actor.user)
                                      for codename in sorted(wanted - current)])
    after = {"user": colleague.get_username(), "level": level}
    if before != after:
        audit_record(actor=actor, action="request.share", target=req, tenant=req.tenant, project=req.project,
                     before=before, after=after)
    scope_forget()
    shares_changed()  # bulk_create sends no signal
    return {"user": colleague, "level": level}


@transaction.atomic
def request_unshare(*, actor: Actor, request: WorkloadRequest, user: str) -> bool:
    """Stop sharing ``request`` with the user named ``user`` (their username); returns whether it was shared with
    them (False: nothing to stop). The same people as ``request_share`` may do it."""
    req = _locked(request)
    require(policy.may_share_request(actor, req), "Only the requester and the project's admins share this request.")
    rows = RequestShare.objects.filter(user__username=user, content_object=req)
    codenames = set(rows.values_list("permission__codename", flat=True))
    if not codenames:
        return False
    rows.delete()
    audit_record(actor=actor, action="request.unshare", target=req, tenant=req.tenant, project=req.project,
                 before={"user": user, "level": "operate" if OPERATE in codenames else "view"})
    scope_forget()
    shares_changed()  # bulk_create sends no signal
    return True

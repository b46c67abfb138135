"""Who may do what with capacity and quota. Built on ``tenants.policy``; services enforce these
predicates, views and templates ask them (see ``tenants/policy.py``)."""

from __future__ import annotations

from typing import Any

from tenants.access import Actor
from tenants.models import Project, Tenant
from tenants.access import ops_users
from tenants.policy import holders, may_approve, may_change_tenant, may_operate, may_submit, with_holders

from .models import QuotaRequest

Approver = QuotaRequest.Approver


def may_manage_capacity(actor: Actor) -> bool:
    """Register and change clusters, sync inventory, define flavors: platform ops."""
    return may_operate(actor)


def may_set_quota(actor: Actor, *, tenant: Tenant | None = None, project: Project | None = None) -> bool:
    """A tenant's quota: ops. A project's share of its tenant's quota: tenant admins and ops."""
    if project is not None:
        return may_change_tenant(actor, project.tenant)
    return may_operate(actor)


def may_split_quota(actor: Actor, tenant: Tenant) -> bool:
    """Split the tenant's quota across its projects (the tenant's quota page)."""
    return may_change_tenant(actor, tenant)


def may_request_quota(actor: Actor, project: Project) -> bool:
    """Ask for more quota in the project: people who may submit there (never the system actor)."""
    return actor.user is not None and may_submit(actor, project)


def _decide_holders(request: QuotaRequest, *, tier: str) -> Any:
    """``may_decide``'s twin: the users who may decide ``request`` at ``tier`` (ops always; never the requester
    through the project tier alone)."""
    if tier == Approver.OPS:
        return ops_users()
    tenant_admins = holders("change_tenant", request.project.tenant)
    if tier == Approver.TENANT_ADMIN:
        return tenant_admins
    approvers = holders("approve_project", request.project).exclude(pk=request.requested_by_id)
    return tenant_admins | approvers


@with_holders(_decide_holders)
def may_decide(actor: Actor, request: QuotaRequest, *, tier: str) -> bool:
    """Project tier: the project's approvers (not the requester, unless a tenant admin); tenant tier:
    tenant admins; ops tier: ops. A higher tier may always decide a lower one."""
    if actor.user is None:
        return True
    if actor.is_ops:
        return True
    if tier == Approver.OPS:
        return False
    tenant_admin = may_change_tenant(actor, request.project.tenant)
    if tier == Approver.TENANT_ADMIN:
        return tenant_admin
    if tenant_admin:
        return True
    return may_approve(actor, request.project) and actor.user.pk != request.requested_by_id


def may_withdraw(actor: Actor, request: QuotaRequest) -> bool:
    """Cancel a quota request: its requester only (approvers reject it instead)."""
    return actor.user is not None and actor.user.pk == request.requested_by_id

"""Who may see the platform's metrics (see ``tenants/policy.py``): ops see every tenant and compare them; a tenant's
admins see their own tenant's slice; nobody else (members, viewers, API tokens) sees metrics."""

from __future__ import annotations

from tenants.access import Actor
from tenants.models import Tenant
from tenants.policy import holders, may_manage_members, may_manage_some_tenant, may_operate, with_holders


@with_holders(lambda tenant: holders("manage_members_tenant", tenant))
def may_view_metrics(actor: Actor, tenant: Tenant) -> bool:
    """A tenant's metric pages, report and API slice: its tenant admins (not through a token) and ops."""
    return may_operate(actor) or (actor.token is None and may_manage_members(actor, tenant))


def may_view_all_metrics(actor: Actor) -> bool:
    """Every tenant's metrics side by side (``/ops/metrics/``, the API without a tenant filter): ops."""
    return may_operate(actor)


def may_view_some_metrics(actor: Actor) -> bool:
    """Some metrics at all (the definitions list, the navigation's link): ops and whoever administers a tenant."""
    return may_manage_some_tenant(actor)

"""Who may do what with prices, discounts and billing periods (see ``tenants/policy.py``)."""

from __future__ import annotations

from tenants.access import Actor
from tenants.models import Tenant
from tenants.policy import may_manage_members, may_operate


def may_manage_prices(actor: Actor) -> bool:
    """Prices, tenant discounts and the month close: platform ops."""
    return may_operate(actor)


def may_view_statements(actor: Actor, tenant: Tenant) -> bool:
    """Read and draft a tenant's statements: its tenant admins and ops (no one through an API token's project)."""
    return actor.token is None and may_manage_members(actor, tenant)

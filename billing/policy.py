"""Who may do what with prices, discounts and billing periods (see ``tenants/policy.py``)."""

from __future__ import annotations

from tenants.access import Actor
from tenants.models import Project, Tenant
from tenants.policy import may_manage_members, may_manage_some_tenant, may_operate, may_view_project


def may_manage_prices(actor: Actor) -> bool:
    """Prices, tenant discounts and the month close: platform ops."""
    return may_operate(actor)


def may_view_statements(actor: Actor, tenant: Tenant) -> bool:
    """Read and draft a tenant's statements: its tenant admins and ops (no one through an API token's project)."""
    return actor.token is None and may_manage_members(actor, tenant)


def may_view_some_statements(actor: Actor) -> bool:
    """The navigation's "Statements": whoever administers a tenant (tenant admins and ops; never a token)."""
    return actor.token is None and may_manage_some_tenant(actor)


def may_view_project_costs(actor: Actor, project: Project) -> bool:
    """A project's cost page (``/costs/projects/<slug>/``): whoever sees the project."""
    return may_view_project(actor, project)


def may_view_tenant_costs(actor: Actor, tenant: Tenant) -> bool:
    """A tenant's cost page (``/costs/tenants/<slug>/``): its tenant admins and ops (no API token)."""
    return actor.token is None and may_manage_members(actor, tenant)

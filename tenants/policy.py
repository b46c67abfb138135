"""Who may do what in tenancy: the one place the rules live.

Each ``may_*`` predicate answers for one actor and one object, from the guardian permissions that
``tenants.access`` keeps in sync with memberships (ops and the system actor may do everything; an
API token never more than its scope). Services enforce these predicates; views, API views and
templates only ask them, so a button is shown exactly when the service would accept the action.
"""

from __future__ import annotations

from .access import Actor, has_perm
from .models import Project, Tenant


def may_operate(actor: Actor) -> bool:
    """Platform ops work (clusters, flavors, catalogue, tenants' lifecycle); the system actor too."""
    return actor.user is None or actor.is_ops


def may_write_in(actor: Actor, tenant: Tenant) -> bool:
    """A suspended tenant is read-only for everyone but ops."""
    return tenant.is_active or actor.is_ops


def may_view_tenant(actor: Actor, tenant: Tenant) -> bool:
    return has_perm(actor, "view_tenant", tenant)


def may_change_tenant(actor: Actor, tenant: Tenant) -> bool:
    """Edit the tenant's details, create and archive its projects, split its quota: tenant admins and ops."""
    return has_perm(actor, "change_tenant", tenant)


def may_manage_members(actor: Actor, tenant: Tenant) -> bool:
    """Add, change and remove the tenant's members (and see its admin pages): tenant admins and ops."""
    return has_perm(actor, "manage_members_tenant", tenant)


def may_view_project(actor: Actor, project: Project) -> bool:
    return has_perm(actor, "view_project", project)


def may_change_project(actor: Actor, project: Project) -> bool:
    return has_perm(actor, "change_project", project)


def may_submit(actor: Actor, project: Project) -> bool:
    """Submit requests, register volumes, ask for quota in the project: members and admins."""
    return has_perm(actor, "submit_project", project)


def may_approve(actor: Actor, project: Project) -> bool:
    """Decide on the project's requests and set its approval rules: project admins, tenant admins, ops."""
    return has_perm(actor, "approve_project", project)

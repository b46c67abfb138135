"""Who may do what with MIG changes (docs/mig-changes.md, "Who may do what"); built on ``tenants/policy.py``.

* Ops propose for any pool, see every change, approve or reject (never their own proposal unless the
  single-ops setting ``PORTAL_MIG_SINGLE_OPS`` is on), and cancel any change before it runs.
* A tenant admin proposes for a pool their tenant uses (checked by the service: the tenant holds quota on a
  flavor the pool's nodes serve), sees their tenant's proposals, and withdraws them before they run.
* Nobody else sees MIG changes (members: 403); API tokens never (they act for a project).
"""

from __future__ import annotations

from django.conf import settings

from typing import Any

from tenants.access import Actor, ops_users
from tenants.models import Tenant
from tenants.policy import may_manage_members, may_manage_some_tenant, may_operate, with_holders

from .models import MigChange


def may_view_mig_changes(actor: Actor) -> bool:
    """The list of MIG changes: ops and tenant admins (no API token)."""
    return actor.token is None and may_manage_some_tenant(actor)


def may_view_mig_change(actor: Actor, change: MigChange) -> bool:
    """One change: ops, and the tenant admins of the tenant that proposed it."""
    if actor.token is not None:
        return False
    if may_operate(actor):
        return True
    return change.tenant is not None and may_manage_members(actor, change.tenant)


def may_propose_mig_change(actor: Actor, tenant: Tenant | None = None) -> bool:
    """Ops for any pool; a tenant admin on behalf of their tenant (``tenant``)."""
    if actor.token is not None:
        return False
    if may_operate(actor):
        return True
    return tenant is not None and may_manage_members(actor, tenant)


def _decide_holders(change: MigChange) -> Any:
    """``may_decide_mig_change``'s twin: ops, less the proposer unless the installation has one ops person."""
    people = ops_users()
    if getattr(settings, "PORTAL_MIG_SINGLE_OPS", False):
        return people
    return people.exclude(pk=change.proposed_by_id)


@with_holders(_decide_holders)
def may_decide_mig_change(actor: Actor, change: MigChange) -> bool:
    """Approve or reject: ops, but not the person who proposed it (a second pair of eyes), unless the
    installation has one ops person (``PORTAL_MIG_SINGLE_OPS``)."""
    if not may_operate(actor) or actor.token is not None:
        return False
    if actor.user is not None and change.proposed_by_id == actor.user.pk:
        return bool(getattr(settings, "PORTAL_MIG_SINGLE_OPS", False))
    return True


def may_cancel_mig_change(actor: Actor, change: MigChange) -> bool:
    """Withdraw before it runs: ops, or the proposer while they still administer the tenant."""
    if actor.token is not None:
        return False
    if may_operate(actor):
        return True
    return (actor.user is not None and change.proposed_by_id == actor.user.pk and change.tenant is not None
            and may_manage_members(actor, change.tenant))

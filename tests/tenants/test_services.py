"""Tenancy services: the role x action matrix, audit in the same transaction, permissions in sync."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from portal.exceptions import NotAllowed, PortalError, ReadOnlyTenant
from tenants import selectors, services
from tenants.access import Actor, has_perm
from tenants.models import AuditEntry, Membership, Project, Role, Tenant

pytestmark = pytest.mark.django_db

# Who may do what. True: allowed. The matrix the README documents.
ACTIONS = ["view_tenant", "change_tenant", "manage_members", "view_project", "change_project", "submit", "approve"]
MATRIX = {
    #          view_t change_t members view_p change_p submit approve   (tenant acme, project acme-vision)
    "ops":    (True,  True,    True,   True,  True,    True,  True),
    "alice":  (True,  True,    True,   True,  True,    True,  True),
    "bob":    (True,  False,   False,  True,  True,    True,  True),
    "carol":  (True,  False,   False,  True,  False,   True,  False),
    "dave":   (True,  False,   False,  True,  False,   False, False),
    "erin":   (False, False,   False,  False, False,   False, False),
    "nobody": (False, False,   False,  False, False,   False, False),
}
PERM = {
    "view_tenant": ("view_tenant", "acme"), "change_tenant": ("change_tenant", "acme"),
    "manage_members": ("manage_members_tenant", "acme"), "view_project": ("view_project", "vision"),
    "change_project": ("change_project", "vision"), "submit": ("submit_project", "vision"),
    "approve": ("approve_project", "vision"),
}


@pytest.mark.parametrize("who", list(MATRIX))
@pytest.mark.parametrize("action", ACTIONS)
def test_permission_matrix(cast, who, action) -> None:
    perm, target = PERM[action]
    expected = MATRIX[who][ACTIONS.index(action)]
    assert has_perm(cast.actor(who), perm, getattr(cast, target)) is expected


@pytest.mark.parametrize("who", list(MATRIX))
def test_selectors_agree_with_matrix(cast, who) -> None:
    actor = cast.actor(who)
    sees_vision = selectors.projects_for(actor=actor).filter(pk=cast.vision.pk).exists()
    assert sees_vision is MATRIX[who][ACTIONS.index("view_project")]
    submits = selectors.projects_where(actor=actor, perm="submit_project").filter(pk=cast.vision.pk).exists()
    assert submits is MATRIX[who][ACTIONS.index("submit")]


def test_tenant_admin_gets_new_projects_at_once(cast) -> None:
    project = services.project_create(actor=cast.actor("alice"), tenant=cast.acme, name="Fresh", slug="acme-fresh")
    assert has_perm(cast.actor("alice"), "change_project", project)
    assert not has_perm(cast.actor("carol"), "view_project", project)


def test_suspended_tenant_blocks_writes_not_reads(cast) -> None:
    services.tenant_update(actor=cast.actor("ops"), tenant=cast.acme, status=Tenant.Status.SUSPENDED)
    alice = cast.actor("alice")
    with pytest.raises(ReadOnlyTenant):
        services.project_update(actor=alice, project=cast.vision, description="x")
    with pytest.raises(ReadOnlyTenant):
        services.membership_create(actor=alice, tenant=cast.acme, user=cast.nobody, role=Role.VIEWER, project=cast.nlp)
    assert selectors.projects_for(actor=alice).count() == 2
    # Ops can still act, and reactivate.
    services.tenant_update(actor=cast.actor("ops"), tenant=cast.acme, status=Tenant.Status.ACTIVE)
    services.project_update(actor=alice, project=cast.vision, description="x")


def test_audit_is_written_in_the_same_transaction(cast) -> None:
    """A change that fails leaves no audit entry; one that commits always has one."""
    before = AuditEntry.objects.count()
    with pytest.raises(PortalError), transaction.atomic():
        services.project_update(actor=cast.actor("alice"), project=cast.vision, description="kept?")
        raise NotAllowed("something later in the same transaction fails")
    assert AuditEntry.objects.count() == before
    assert Project.objects.get(pk=cast.vision.pk).description == ""


def test_database_refuses_to_change_audit_rows(cast) -> None:
    """Raw SQL can't forge entries; on PostgreSQL (production, CI) it can't delete them either."""
    entry = AuditEntry.objects.first()
    table = AuditEntry._meta.db_table
    statements = [f"UPDATE {table} SET action = 'forged' WHERE id = %s"]
    if connection.vendor == "postgresql":
        statements.append(f"DELETE FROM {table} WHERE id = %s")
    for sql in statements:
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [entry.pk])
    assert AuditEntry.objects.get(pk=entry.pk).action == entry.action


def test_membership_removal_drops_permissions(cast) -> None:
    membership = Membership.objects.get(user=cast.dave)
    services.membership_delete(actor=cast.actor("alice"), membership=membership)
    assert not has_perm(cast.actor("dave"), "view_project", cast.vision)
    assert not selectors.tenants_for(actor=cast.actor("dave")).exists()


def test_role_change_takes_effect_at_once(cast) -> None:
    membership = Membership.objects.get(user=cast.dave)
    dave = cast.actor("dave")
    assert not has_perm(dave, "submit_project", cast.vision)
    services.membership_update(actor=cast.actor("alice"), membership=membership, role=Role.MEMBER)
    assert has_perm(cast.actor("dave"), "submit_project", cast.vision)


def test_making_ops_is_audited_once_and_removing_it_too(cast) -> None:
    ops = cast.actor("ops")
    assert services.ops_user_ensure(actor=ops, user=cast.carol) is True
    assert has_perm(Actor(user=cast.carol), "change_tenant", cast.globex)
    assert services.ops_user_ensure(actor=ops, user=cast.carol) is False  # already ops: no change, no entry
    made = AuditEntry.objects.filter(action="user.make_ops", target_id=str(cast.carol.pk))
    assert made.count() == 1 and made.get().actor == cast.ops and made.get().target_repr == "carol"
    assert (made.get().before, made.get().after) == ({"is_staff": False, "ops_group": False}, {"is_staff": True, "ops_group": True})

    assert services.ops_user_remove(actor=ops, user=cast.carol) is True
    assert not has_perm(Actor(user=cast.carol), "change_tenant", cast.globex)
    assert services.ops_user_remove(actor=ops, user=cast.carol) is False
    assert AuditEntry.objects.filter(action="user.remove_ops", target_id=str(cast.carol.pk)).count() == 1


def test_only_ops_change_ops_and_never_their_own(cast) -> None:
    before = AuditEntry.objects.count()
    with pytest.raises(NotAllowed):
        services.ops_user_ensure(actor=cast.actor("alice"), user=cast.alice)
    with pytest.raises(NotAllowed):
        services.ops_user_remove(actor=cast.actor("alice"), user=cast.ops)
    with pytest.raises(PortalError, match="your own ops role"):
        services.ops_user_remove(actor=cast.actor("ops"), user=cast.ops)
    assert AuditEntry.objects.count() == before
    assert Actor(user=cast.ops).is_ops and not Actor(user=cast.alice).is_ops

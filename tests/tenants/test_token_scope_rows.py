"""A token's permissions come from its user's memberships in its tenant, read with the token itself
(``tenants.authentication.token_resolve`` -> ``access.token_memberships``): the same grants as the user's whole scope
narrowed to the token, for every role, tenant-wide or per project, and a membership elsewhere in the tenant; and no
query once the token is read. A membership changed after the token was read is seen (the scope is read again)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tenants.access import Actor, scope_forget, scope_of
from tenants.authentication import token_generate, token_resolve
from tenants.models import ApiToken, Membership, Role
from tenants.services import membership_delete, token_create
from tests.factories import UserFactory, make_member

pytestmark = pytest.mark.django_db

PERMS = ["view_project", "submit_project", "change_project", "approve_project", "view_tenant", "change_tenant",
         "manage_members_tenant"]


def grants(scope) -> tuple:
    return (scope.visible_projects, scope.visible_tenants, scope.projects, scope.tenants, scope.by_project,
            scope.memberships)


def test_the_token_read_with_memberships_grants_what_the_users_scope_grants(cast) -> None:
    grace = UserFactory(username="grace")
    make_member(grace, cast.acme, Role.MEMBER, cast.nlp)  # a member elsewhere in the tenant: sees the tenant only
    make_member(cast.erin, cast.acme, Role.VIEWER, cast.vision)  # two tenants
    people = ["alice", "bob", "carol", "dave", "erin", "ops", "grace", "nobody"]
    compared = 0
    for who in people:
        user = grace if who == "grace" else getattr(cast, who)
        for project in (cast.vision, cast.nlp):
            for token_scope in (ApiToken.Scope.READ, ApiToken.Scope.SUBMIT):
                # Written directly: a token outlives its user's membership (erin has none in acme-nlp).
                raw, prefix, hashed = token_generate()
                ApiToken.objects.create(name=f"{who}-{token_scope}", project=project, user=user, scope=token_scope,
                                        prefix=prefix, secret_hash=hashed,
                                        expires_at=timezone.now() + timedelta(days=1))
                read = token_resolve(raw)
                with CaptureQueriesContext(connection) as ctx:
                    fast = grants(scope_of(Actor(user=read.user, token=read)))
                assert ctx.captured_queries == [], (who, project, token_scope)
                plain = ApiToken.objects.select_related("user", "project__tenant").get(pk=read.pk)  # no memberships
                assert grants(scope_of(Actor(user=plain.user, token=plain))) == fast, (who, project.slug, token_scope)
                compared += 1
    assert compared == len(people) * 4


def test_a_membership_changed_after_the_token_was_read_is_seen(cast) -> None:
    _, raw = token_create(actor=cast.actor("carol"), project=cast.vision, name="ci", scope=ApiToken.Scope.SUBMIT)
    read = token_resolve(raw)
    membership_delete(actor=Actor.system(), membership=Membership.objects.get(user=cast.carol, project=cast.vision))
    scope_forget()
    assert scope_of(Actor(user=read.user, token=read)).project_ids("submit_project") == []

"""A signed-in user's memberships come with the user itself (``tenants.access.user_for_session`` ->
``access.user_memberships``): the same scope as read by its own query, for every role, tenant-wide or per project,
in one tenant or two; no query of its own once the user is read (tenant admins: their tenants' projects, one). A
membership changed after the user was read is seen. The API's request detail with a session: the user and the row."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tenants.access import Actor, scope_forget, scope_of, user_for_session
from tenants.models import Membership, Role
from tenants.services import membership_delete
from tests.factories import UserFactory, make_member
from .factories import make_request

pytestmark = pytest.mark.django_db


def grants(scope) -> tuple:
    return (scope.everything, scope.visible_projects, scope.visible_tenants, scope.projects, scope.tenants,
            scope.by_project, scope.by_tenant, sorted(scope.memberships, key=repr))


def test_the_user_read_with_memberships_has_the_scope_of_its_own_query(cast) -> None:
    grace = UserFactory(username="grace")
    make_member(grace, cast.acme, Role.MEMBER, cast.nlp)
    make_member(grace, cast.acme, Role.PROJECT_ADMIN, cast.vision)
    make_member(cast.erin, cast.acme, Role.VIEWER, cast.vision)  # tenant admin of globex, viewer in acme
    scope_forget()
    for who in ["alice", "bob", "carol", "dave", "erin", "frank", "ops", "grace", "nobody"]:
        user = grace if who == "grace" else getattr(cast, who)
        read = user_for_session(user.pk)
        wide = Membership.objects.filter(user=user, project=None).exists()
        with CaptureQueriesContext(connection) as ctx:
            fast = grants(scope_of(Actor(user=read)))
        assert len(ctx.captured_queries) == (1 if wide else 0), (who, ctx.captured_queries)  # the tenants' projects
        plain = get_user_model().objects.get(pk=user.pk)  # no memberships with it: the scope reads them
        assert grants(scope_of(Actor(user=plain))) == fast, who


def test_a_membership_changed_after_the_user_was_read_is_seen(cast) -> None:
    read = user_for_session(cast.carol.pk)
    membership_delete(actor=Actor.system(), membership=Membership.objects.get(user=cast.carol, project=cast.vision))
    assert scope_of(Actor(user=read)).project_ids("view_project") == []
    make_member(cast.carol, cast.globex, Role.MEMBER, cast.llm)
    scope_forget()
    assert scope_of(Actor(user=user_for_session(cast.carol.pk))).project_ids("view_project") == [cast.llm.pk]


def test_the_api_detail_with_a_session_reads_the_user_and_the_row(api, cast, cat) -> None:
    client = api("carol")
    req = make_request(cat, cast.vision, cast.carol)
    assert client.get(f"/api/v1/requests/{req.pk}/").status_code == 200  # warm-up
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(f"/api/v1/requests/{req.pk}/").json()["id"] == req.pk
    sql = [q["sql"] for q in ctx.captured_queries if "django_session" not in q["sql"]]  # the session: Redis or the db
    # The user (with the ops check and the memberships), the row (SQLite: its timeline apart).
    assert len(sql) == (2 if connection.vendor == "postgresql" else 3), sql
    assert not [s for s in sql if s.lstrip().startswith('SELECT "tenants_membership"')], sql
    other = make_request(cat, cast.llm, cast.frank)
    assert client.get(f"/api/v1/requests/{other.pk}/").status_code == 404  # another tenant's: not found

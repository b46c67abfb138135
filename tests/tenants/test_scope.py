"""What an actor may see and do is read from their memberships once per request (``tenants.access.scope_of``).

Pages and API lists ask the scope many times (selectors, ``{% may %}`` in the navigation, role labels); the
memberships are read once per request whatever their number, no guardian table is read, and a membership granted
or removed is seen at the next request (and by the same user object at once).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tenants.access import Actor
from tenants.models import Membership, Role
from tenants.selectors import projects_for, projects_where
from tenants.services import membership_create, membership_delete

from ..factories import make_member, make_project, make_tenant

pytestmark = pytest.mark.django_db

PAGES = [
    ("carol", "/requests/"),
    ("carol", "/projects/acme-vision/"),
    ("bob", "/approvals/"),
    ("carol", "/api/v1/requests/"),
]


def _roles_grow(cast, who: str, n: int) -> None:
    """``n`` more project roles for ``who`` in acme, and one more tenant (with ``n`` projects) they administer."""
    user = getattr(cast, who)
    role = Role.PROJECT_ADMIN if who == "bob" else Role.MEMBER
    for _ in range(n):
        make_member(user, cast.acme, role, make_project(cast.acme))
    tenant = make_tenant()
    for _ in range(n):
        make_project(tenant)
    make_member(user, tenant, Role.TENANT_ADMIN)


def _get(client, path: str) -> list[str]:
    assert client.get(path).status_code == 200  # warm-up: sessions, content types
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(path).status_code == 200
    return [q["sql"] for q in ctx.captured_queries]


def _scope_reads(sql: list[str], user) -> int:
    """The queries that read ``user``'s own memberships (the scope): their own, or the session's user query that
    brings them along (``access.user_memberships``)."""
    return sum('FROM "tenants_membership"' in q and (f'"tenants_membership"."user_id" = {user.pk}' in q
                                                     or 'AS "portal_memberships"' in q) for q in sql)


@pytest.mark.parametrize(("who", "path"), PAGES)
def test_scope_is_read_once_per_request_however_many_memberships(cast, as_user, who: str, path: str) -> None:
    user = getattr(cast, who)
    _roles_grow(cast, who, 3)
    client = as_user(who)
    before = _get(client, path)
    _roles_grow(cast, who, 3)  # twice as many project roles, two administered tenants
    after = _get(client, path)
    assert Membership.objects.filter(user=user).count() == 9
    for sql in (before, after):
        assert _scope_reads(sql, user) == 1, "\n".join(sql)
        assert not [q for q in sql if "guardian_" in q], "scoping reads guardian's text-keyed tables"
    assert len(after) == len(before), "\n".join(after)


def test_membership_granted_and_removed_is_seen_at_the_next_request(cast, as_user, api) -> None:
    client = as_user("carol")
    assert client.get("/projects/acme-nlp/").status_code == 404
    membership = membership_create(actor=cast.actor("alice"), tenant=cast.acme, user=cast.carol, role=Role.VIEWER,
                                   project=cast.nlp)
    assert client.get("/projects/acme-nlp/").status_code == 200
    assert "acme-nlp" in [p["slug"] for p in api("carol").get("/api/v1/projects/").json()["results"]]

    membership_delete(actor=cast.actor("alice"), membership=membership)
    assert client.get("/projects/acme-nlp/").status_code == 404
    assert "acme-nlp" not in [p["slug"] for p in api("carol").get("/api/v1/projects/").json()["results"]]


def test_a_remembered_scope_follows_membership_changes(cast) -> None:
    # The same user object (as a request's user is) sees a change made meanwhile, through a service or not.
    carol = Actor(user=cast.carol)
    assert set(projects_for(actor=carol).values_list("slug", flat=True)) == {"acme-vision"}
    membership = membership_create(actor=Actor.system(), tenant=cast.acme, user=cast.carol, role=Role.MEMBER,
                                   project=cast.nlp)
    assert set(projects_where(actor=carol, perm="submit_project").values_list("slug", flat=True)) == {"acme-vision", "acme-nlp"}
    Membership.objects.get(pk=membership.pk).delete()  # not through a service: still seen at once
    assert set(projects_for(actor=carol).values_list("slug", flat=True)) == {"acme-vision"}

    # A tenant admin sees a project created after their scope was read.
    alice = Actor(user=cast.alice)
    assert "acme-new" not in set(projects_for(actor=alice).values_list("slug", flat=True))
    make_project(cast.acme, "acme-new")
    assert "acme-new" in set(projects_where(actor=alice, perm="approve_project").values_list("slug", flat=True))


def test_a_token_list_reads_no_memberships(cast, token_client) -> None:
    # A token lists its own project; its user's memberships in its tenant come with the token (a subquery of the
    # token's own query, for the permissions): no query of their own.
    client, _ = token_client("carol", cast.vision)
    assert client.get("/api/v1/requests/").status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        assert client.get("/api/v1/requests/").status_code == 200
    assert not [q["sql"] for q in ctx.captured_queries if q["sql"].startswith('SELECT "tenants_membership"')]
    assert len(ctx.captured_queries) == 2  # the token, the page
    assert [p["slug"] for p in client.get("/api/v1/projects/").json()["results"]] == ["acme-vision"]

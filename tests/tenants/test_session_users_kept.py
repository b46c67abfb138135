"""A signed-in request's user (with their ops answer and memberships) is kept per process under a shared version
(``tenants.access.user_for_session``, ``SESSION_USERS``): a second page asks no user query, and every write that can
change what the user may do is seen by the next page: deactivation, a new password, a membership removed, joining
the ops group, and a version set by another process.

Committed transactions (``transaction=True``): inside a transaction the row is always read from the database.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tenants.access import Actor
from tenants.models import Membership
from tenants.services import membership_delete, ops_user_ensure

pytestmark = pytest.mark.django_db(transaction=True)

USER_SQL = 'FROM "auth_user"'


def page(client, path: str = "/projects/acme-vision/") -> tuple[int, int]:
    """The page's status and how many of its queries read users."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    return response.status_code, sum(USER_SQL in q["sql"] and "portal_memberships" in q["sql"] for q in ctx.captured_queries)


def test_the_second_page_reads_no_user_and_a_new_password_signs_out(as_user, cast) -> None:
    carol = as_user("carol")
    assert page(carol) == (200, 1)
    assert page(carol) == (200, 0)  # kept: no user query

    user = get_user_model().objects.get(pk=cast.carol.pk)
    user.set_password("another-password-entirely")
    user.save()
    status, _ = page(carol)
    assert status == 302  # the session's hash no longer matches: signed out


def test_deactivation_and_a_removed_membership_are_seen_at_once(as_user, cast) -> None:
    carol = as_user("carol")
    assert page(carol)[0] == 200 and page(carol) == (200, 0)

    membership = Membership.objects.get(user=cast.carol, project=cast.vision)
    membership_delete(actor=cast.actor("alice"), membership=membership)
    assert page(carol)[0] == 404  # no longer a member of acme-vision

    dave = as_user("dave")
    assert page(dave)[0] == 200 and page(dave) == (200, 0)
    user = get_user_model().objects.get(pk=cast.dave.pk)
    user.is_active = False
    user.save()
    assert page(dave)[0] == 302


def test_joining_the_ops_group_is_seen_at_once(as_user, cast) -> None:
    frank = as_user("frank")
    assert page(frank, "/ops/capacity/")[0] == 404  # not ops: no such page for them
    assert page(frank, "/ops/capacity/")[0] == 404
    ops_user_ensure(actor=Actor.system(), user=get_user_model().objects.get(pk=cast.frank.pk))
    assert page(frank, "/ops/capacity/")[0] == 200


def test_a_version_set_by_another_process_reads_the_user_again(as_user, cast) -> None:
    """Another process's write is seen through the shared version (here: a row changed without a signal, then the
    version set as that process would once its write committed)."""
    dave = as_user("dave")
    assert page(dave)[0] == 200 and page(dave) == (200, 0)
    get_user_model().objects.filter(pk=cast.dave.pk).update(is_active=False)  # no signal: this process cannot know
    assert page(dave) == (200, 0)
    cache.set("versioned:session-users", "set-by-another-process", None)
    assert page(dave)[0] == 302

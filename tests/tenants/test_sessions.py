"""Sessions stay on the server; with Redis, read from the cache (``cached_db``), written to the database too.

Signing in, every page after it, signing out and a stolen cookie after the sign-out, through the real pages;
and what a signed-in page costs before it reads anything: the user (with whether they are ops), no session query.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.factories import PASSWORD

CACHED = settings.SESSION_ENGINE == "portal.sessions"  # Django's cached_db, with the versions in its read


def _sign_in(username: str) -> Client:
    client = Client()
    response = client.post(reverse("login"), {"username": username, "password": PASSWORD})
    assert response.status_code == 302
    return client


def test_engine_is_server_side() -> None:
    assert settings.SESSION_ENGINE in ("django.contrib.sessions.backends.db", "portal.sessions")
    assert bool(settings.REDIS_URL) == CACHED


def test_sign_in_pages_sign_out_and_the_old_cookie_is_dead(cast) -> None:
    client = _sign_in("carol")
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert Session.objects.filter(session_key=key).exists()  # written to the database, cache or not
    assert client.get(reverse("home")).status_code == 200

    response = client.post(reverse("logout"))
    assert response.status_code == 302 and response["Location"] == reverse("login")
    assert not Session.objects.filter(session_key=key).exists()

    thief = Client()
    thief.cookies[settings.SESSION_COOKIE_NAME] = key
    response = thief.get(reverse("home"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("username", ["carol", "ops"])
def test_a_signed_in_page_reads_the_user_once_and_the_session_from_the_cache(cast, username: str) -> None:
    client = _sign_in(username)
    client.get(reverse("request-list"))  # warm-up
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(reverse("request-list")).status_code == 200
    sql = [q["sql"] for q in ctx.captured_queries]
    assert sum(s.startswith('SELECT "auth_user"."id"') for s in sql) == 1, sql  # the user, once
    assert not [s for s in sql if 'FROM "auth_group"' in s and "EXISTS" not in s], sql  # ops: in the user's query
    if CACHED:
        assert not [s for s in sql if "django_session" in s], sql

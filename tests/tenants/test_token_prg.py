"""Post/redirect/get and one-time form tokens on token creation: a reload or a replayed form never
makes a second token; the secret is shown once, on the page the redirect leads to."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tenants.authentication import token_hash
from tenants.models import ApiToken

pytestmark = pytest.mark.django_db

URL = reverse("token-create", args=["acme-vision"])


def text(response) -> str:
    return response.content.decode()


def form_token(client) -> str:
    return re.search(r'name="token-form_token" value="([^"]+)"', text(client.get("/projects/acme-vision/"))).group(1)


def secret_on(response) -> str | None:
    found = re.search(r'id="token-secret"[^>]*value="([^"]+)"', text(response))
    return found.group(1) if found else None


def test_created_token_redirects_and_shows_the_secret_once(as_user) -> None:
    client = as_user("carol")
    data = {"token-name": "nightly", "token-scope": "read", "token-expires_days": "30", "token-form_token": form_token(client)}
    response = client.post(URL, data)
    assert response.status_code == 302 and response["Location"] == "/projects/acme-vision/#tokens"
    shown = client.get(response["Location"])
    secret = secret_on(shown)
    assert secret and ApiToken.objects.get().secret_hash == token_hash(secret)
    assert "no-store" in shown["Cache-Control"]
    # A reload of that page (a GET) shows it no more and creates nothing.
    again = client.get(response["Location"])
    assert secret_on(again) is None and secret not in text(again)
    assert ApiToken.objects.count() == 1


def test_the_same_form_sent_again_creates_nothing_and_leads_to_the_first_result(as_user) -> None:
    client = as_user("carol")
    data = {"token-name": "nightly", "token-scope": "read", "token-expires_days": "30", "token-form_token": form_token(client)}
    first = client.post(URL, data, follow=True)
    assert secret_on(first)
    replay = client.post(URL, data, follow=True)  # Back, then send again; or a double click
    assert replay.redirect_chain[-1][0] == "/projects/acme-vision/#tokens"
    assert "This form was already sent: token “nightly” was created then" in text(replay)
    assert secret_on(replay) is None
    assert ApiToken.objects.count() == 1


def test_the_same_token_with_other_values_is_shown_again_not_lost(as_user) -> None:
    client = as_user("carol")
    token = form_token(client)
    base = {"token-scope": "read", "token-expires_days": "30", "token-form_token": token}
    client.post(URL, base | {"token-name": "nightly"})
    response = client.post(URL, base | {"token-name": "weekly"})
    assert response.status_code == 200
    body = text(response)
    assert "already sent with other values" in body and 'value="weekly"' in body  # nothing typed is lost
    fresh = re.search(r'name="token-form_token" value="([^"]+)"', body).group(1)
    assert fresh != token
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["nightly"]
    # Sending the shown form (its fresh token) creates the second one: the person asked for it.
    assert client.post(URL, base | {"token-name": "weekly", "token-form_token": fresh}).status_code == 302
    assert sorted(ApiToken.objects.values_list("name", flat=True)) == ["nightly", "weekly"]


def test_a_form_with_errors_keeps_its_token_usable(as_user) -> None:
    client = as_user("carol")
    token = form_token(client)
    bad = client.post(URL, {"token-name": "", "token-scope": "read", "token-expires_days": "30", "token-form_token": token})
    assert 'id="id_token-name_error"' in text(bad) and f'value="{token}"' in text(bad)
    good = client.post(URL, {"token-name": "fixed", "token-scope": "read", "token-expires_days": "30", "token-form_token": token})
    assert good.status_code == 302 and ApiToken.objects.get().name == "fixed"


def test_form_tokens_are_per_user(as_user, cast) -> None:
    """bob sending carol's token is his own first submission (the claim is keyed by user)."""
    client = as_user("carol")
    token = form_token(client)
    data = {"token-name": "ci", "token-scope": "read", "token-expires_days": "30", "token-form_token": token}
    client.post(URL, data)
    assert as_user("bob").post(URL, data).status_code == 302
    assert sorted(ApiToken.objects.values_list("user__username", flat=True)) == ["bob", "carol"]

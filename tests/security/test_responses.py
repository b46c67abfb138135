"""Responses that carry secrets are never cached; unexpected API errors keep the API's error shape."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

API = "/api/v1"


def test_token_create_response_is_not_stored(api, cast) -> None:
    response = api("carol").post(f"{API}/tokens/", {"name": "ci", "project": "acme-vision", "scope": "read"}, format="json")
    assert response.status_code == 201 and response.json()["secret"].startswith("gpp_")
    assert "no-store" in response["Cache-Control"]
    # Reading tokens shows no secret: ordinary caching rules.
    assert "secret" not in api("carol").get(f"{API}/tokens/").json()["results"][0]
    # (The project page that shows a new secret: tests/tenants/test_views.py::test_token_create_shows_secret_once.)


@pytest.mark.urls("tests.security.urls_boom")
def test_api_500_is_json_in_the_error_shape(settings) -> None:
    settings.DEBUG = False
    client = Client(raise_request_exception=False)
    response = client.get(f"{API}/boom/")
    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"] == "server_error" and body["detail"]
    assert "boom" not in response.content.decode()  # nothing of the exception leaks


@pytest.mark.urls("tests.security.urls_boom")
def test_page_500_stays_html(settings) -> None:
    settings.DEBUG = False
    response = Client(raise_request_exception=False).get("/boom/")
    assert response.status_code == 500
    assert response["Content-Type"].startswith("text/html")

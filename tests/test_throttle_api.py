"""API rate limits: per token (or per signed-in user), a stricter one for submissions, 429 with
Retry-After in the one error shape. Low rates are set per test; the cache is each test's own
(conftest's ``private_cache``), so counts never leak between tests."""

from __future__ import annotations

import pytest

from workloads.models import WorkloadRequest

from .workloads.factories import make_catalogue

pytestmark = [pytest.mark.django_db]

API = "/api/v1"
TRAIN = {"template": "training", "flavor": "h100", "parameters": {"command": "python train.py"}}


def assert_throttled(response) -> None:
    assert response.status_code == 429, response.content
    body = response.json()
    assert body["error"] == "throttled" and body["detail"]
    assert isinstance(body["retry_after"], int) and 1 <= body["retry_after"] <= 60
    assert response["Retry-After"] == str(body["retry_after"])


def test_user_rate_is_per_user(api, cast, settings) -> None:
    settings.API_RATE_USER = "3/min"
    carol = api("carol")
    for _ in range(3):
        assert carol.get(f"{API}/me/").status_code == 200
    assert_throttled(carol.get(f"{API}/me/"))
    assert_throttled(carol.get(f"{API}/projects/"))  # every endpoint counts against the one budget
    # Another user has a budget of their own.
    assert api("bob").get(f"{API}/me/").status_code == 200


def test_each_token_has_its_own_budget(token_client, api, cast, settings) -> None:
    settings.API_RATE_USER = "2/min"
    first, _ = token_client("carol", cast.vision, "read")
    second, _ = token_client("carol", cast.vision, "read")
    for _ in range(2):
        assert first.get(f"{API}/requests/").status_code == 200
    assert_throttled(first.get(f"{API}/requests/"))
    assert second.get(f"{API}/requests/").status_code == 200  # a pipeline's token does not starve another's
    assert api("carol").get(f"{API}/me/").status_code == 200  # nor carol in her browser


def test_submissions_have_a_stricter_rate(token_client, cast, settings) -> None:
    make_catalogue(cast)
    settings.API_RATE_SUBMIT = "2/min"
    client, _ = token_client("carol", cast.vision, "read+submit")
    for i in range(2):
        response = client.post(f"{API}/requests/", TRAIN | {"name": f"job-{i}"}, format="json")
        assert response.status_code == 201, response.content
    assert_throttled(client.post(f"{API}/requests/", TRAIN | {"name": "job-2"}, format="json"))
    assert WorkloadRequest.objects.count() == 2  # nothing made by the throttled call
    assert client.get(f"{API}/requests/").status_code == 200  # reads still go through


def test_an_empty_rate_means_no_limit(api, cast, settings) -> None:
    settings.API_RATE_USER = ""
    carol = api("carol")
    assert all(carol.get(f"{API}/me/").status_code == 200 for _ in range(30))


def test_defaults_come_from_the_environment() -> None:
    from django.conf import settings

    # Not the test run's overrides: the documented defaults (the run sets neither variable).
    assert settings.API_RATE_USER == "1200/min" and settings.API_RATE_SUBMIT == "120/min"

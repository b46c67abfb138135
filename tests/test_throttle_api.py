"""API rate limits: per token (or per signed-in user), a stricter one for submissions, 429 with
Retry-After in the one error shape. Low rates are set per test; the cache is each test's own
(conftest's ``private_cache``), so counts never leak between tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.models import WorkloadRequest

from .workloads.factories import make_catalogue

pytestmark = [pytest.mark.django_db]

ROOT = Path(__file__).resolve().parent.parent
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


def _rates(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"API_RATE_USER", "API_RATE_SUBMIT"}} | env
    code = ("import django; django.setup(); from django.conf import settings; "
            "print(repr(settings.API_RATE_USER), repr(settings.API_RATE_SUBMIT))")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean | {"DJANGO_SETTINGS_MODULE": "portal.settings"},
                          capture_output=True, text=True, timeout=60)


def test_rates_come_from_the_environment() -> None:
    assert _rates().stdout.split() == ["'1200/min'", "'120/min'"]
    assert _rates(API_RATE_USER="50/s", API_RATE_SUBMIT="").stdout.split() == ["'50/s'", "''"]
    bad = _rates(API_RATE_SUBMIT="fast")
    assert bad.returncode != 0 and "API_RATE_SUBMIT='fast'" in bad.stderr

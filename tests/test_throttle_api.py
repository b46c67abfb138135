"""API rate limits: per token (or per signed-in user), a stricter one for submissions, 429 with
Retry-After in the one error shape. Low rates are set per test; the cache is each test's own
(conftest's ``private_cache``), so counts never leak between tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
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
                          capture_output=True, text=True, timeout=60, check=False)


def test_rates_come_from_the_environment() -> None:
    assert _rates().stdout.split() == ["'1200/min'", "'120/min'"]
    assert _rates(API_RATE_USER="50/s", API_RATE_SUBMIT="").stdout.split() == ["'50/s'", "''"]
    bad = _rates(API_RATE_SUBMIT="fast")
    assert bad.returncode != 0 and "API_RATE_SUBMIT='fast'" in bad.stderr


# With Redis as the cache the window is one script call (portal/throttles.py): the same decisions, the same waits.


@pytest.fixture
def redis_cache(settings):
    """The default cache on Redis (a key prefix of the test's own, its keys deleted afterwards)."""
    import uuid

    import redis

    url = settings.REDIS_URL or "redis://127.0.0.1:6379/15"
    prefix = f"throttle-test-{uuid.uuid4().hex[:8]}"
    settings.CACHES = {"default": {"BACKEND": "portal.redis_cache.RedisCache", "LOCATION": url,
                                   "KEY_PREFIX": prefix}}
    yield
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


def _decisions(cast, times: list[float], rate: str) -> list[tuple[bool, float | None]]:
    from types import SimpleNamespace

    from portal.throttles import UserRateThrottle

    request = SimpleNamespace(user=cast.carol, auth=None)
    out = []
    for now in times:
        throttle = UserRateThrottle()
        throttle.timer = lambda now=now: now
        allowed = throttle.allow_request(request, None)
        out.append((allowed, None if allowed else round(throttle.wait(), 9)))
    return out


def test_the_redis_window_decides_and_waits_like_drfs(cast, settings, redis_cache) -> None:
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    settings.API_RATE_USER = "3/min"
    base = 1_800_000_000.123456
    times = [base + t for t in (0, 0.5, 1, 1.5, 30, 59.999, 60, 60.5, 61, 61.2, 95, 121, 121.5, 200)]
    assert isinstance(caches["default"], RedisCache)
    on_redis = _decisions(cast, times, "3/min")
    window = caches["default"].make_and_validate_key(f"throttle_user_user-{cast.carol.pk}") + ":window"
    assert caches["default"]._cache.get_client().zcard(window) >= 1  # the script's sorted set, not DRF's list
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "drf"}}
    on_drf = _decisions(cast, times, "3/min")
    assert on_redis == on_drf
    assert [allowed for allowed, _ in on_redis].count(False) >= 4  # the limit was reached, more than once


def test_the_api_rate_limit_on_redis(api, cast, settings, redis_cache) -> None:
    settings.API_RATE_USER = "2/min"
    carol = api("carol")
    for _ in range(2):
        assert carol.get(f"{API}/me/").status_code == 200
    assert_throttled(carol.get(f"{API}/me/"))
    assert api("bob").get(f"{API}/me/").status_code == 200


def _evalshas(call) -> tuple[object, int]:
    import redis

    sent: list[bytes] = []
    original = redis.connection.Connection.send_packed_command
    caller = threading.get_ident()  # not the audit anchor's thread, which runs its own script on its own time

    def counting(self, command, *args, **kwargs):
        if threading.get_ident() == caller:
            packed = b"".join(command) if isinstance(command, list) else bytes(command)
            sent.append(packed.split(b"\r\n")[2])
        return original(self, command, *args, **kwargs)

    redis.connection.Connection.send_packed_command = counting
    try:
        response = call()
    finally:
        redis.connection.Connection.send_packed_command = original
    return response, sent.count(b"EVALSHA") + sent.count(b"EVAL")


def test_a_submissions_two_rates_on_redis_in_one_round_trip(token_client, cast, settings, redis_cache) -> None:
    make_catalogue(cast)
    settings.API_RATE_USER, settings.API_RATE_SUBMIT = "4/min", "3/min"
    client, _ = token_client("carol", cast.vision, "read+submit")
    assert client.post(f"{API}/requests/", TRAIN | {"name": "warm"}, format="json").status_code == 201  # script loaded
    for i in range(2):
        response, scripts = _evalshas(lambda i=i: client.post(f"{API}/requests/", TRAIN | {"name": f"job-{i}"}, format="json"))
        assert response.status_code == 201, response.content
        assert scripts == 1  # both windows in one script call
    refused, _ = _evalshas(lambda: client.post(f"{API}/requests/", TRAIN | {"name": "job-2"}, format="json"))
    assert_throttled(refused)  # the submit rate (3/min) refuses the fourth
    assert WorkloadRequest.objects.count() == 3
    assert client.get(f"{API}/requests/").status_code == 429  # the user rate (4/min) counted the refused call too:
    # as DRF does, every throttle records each call it allows, even one another throttle refuses


def test_the_windows_of_both_rates_decide_like_drfs(cast, settings, redis_cache) -> None:
    from types import SimpleNamespace

    from django.core.cache import caches

    from portal.throttles import SubmitRateThrottle, UserRateThrottle, allow_each

    settings.API_RATE_USER, settings.API_RATE_SUBMIT = "4/min", "2/min"
    request = SimpleNamespace(user=cast.carol, auth=None)
    base = 1_800_000_000.5
    times = [base + t for t in (0, 1, 2, 3, 4, 61, 62, 62.5, 130)]

    def run() -> list[tuple]:
        out = []
        for now in times:
            throttles = [UserRateThrottle(), SubmitRateThrottle()]
            for t in throttles:
                t.timer = lambda now=now: now
            verdicts = allow_each(throttles, request, None)
            if verdicts is None:  # another cache: one by one, as DRF asks them
                verdicts = [t.allow_request(request, None) for t in throttles]
            out.append(tuple((v, None if v else round(t.wait(), 9)) for t, v in zip(throttles, verdicts, strict=True)))
        return out

    on_redis = run()
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "both"}}
    caches["default"].clear()
    assert run() == on_redis
    assert [v for (v, _), _ in on_redis][:5] == [True, True, True, True, False]

"""Redis round trips per call, with Redis as the cache (as in production): the session's GET, the rate limit's one
script call (``portal.throttles``), and every version key of the request in one MGET (``portal.cache.version_key``;
the approvals badge's kept counts come in the same MGET, ``portal.cache.shared``). Counted at the Redis client's
socket (redis-py's ``send_packed_command``), one entry per command sent.

Committed transactions (``transaction=True``): the kept counts are only used outside one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.connection
from rest_framework.test import APIClient

from tenants.services import token_create
from workloads import services

from .workloads.factories import make_catalogue, make_request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def redis_cache(settings) -> Iterator[str]:
    url = settings.REDIS_URL or "redis://127.0.0.1:6379/15"
    prefix = f"trips-{uuid.uuid4().hex[:8]}"
    settings.CACHES = {"default": {"BACKEND": "portal.redis_cache.RedisCache", "LOCATION": url,
                                   "KEY_PREFIX": prefix}}
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
    settings.API_RATE_USER = "1000/min"
    yield prefix
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


def commands(call) -> list[bytes]:
    """The Redis commands sent while ``call()`` runs (their names)."""
    sent: list[bytes] = []
    original = redis.connection.Connection.send_packed_command

    def counting(self, command, *args, **kwargs):
        packed = b"".join(command) if isinstance(command, list) else bytes(command)
        sent.append(packed.split(b"\r\n")[2])
        return original(self, command, *args, **kwargs)

    redis.connection.Connection.send_packed_command = counting
    try:
        response = call()
    finally:
        redis.connection.Connection.send_packed_command = original
    assert response.status_code == 200, response.content[:300]
    return sent


def test_api_calls_and_pages_make_few_round_trips(cast, redis_cache) -> None:
    cat = make_catalogue(cast)
    req = make_request(cat, cast.vision, cast.carol)
    _, raw = token_create(actor=cast.actor("carol"), project=cast.vision, name="ci", scope="read")
    token = APIClient()
    token.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    session = APIClient()
    session.force_login(cast.carol)
    detail = f"/api/v1/requests/{req.pk}/"
    for client in (token, session):
        client.get(detail)  # warm: the versions exist, the session is in the cache

    # The rate limit in one script call, the versions in one MGET; a session adds its GET.
    assert commands(lambda: token.get(detail)) == [b"EVALSHA", b"MGET"]
    assert commands(lambda: session.get(detail)) == [b"GET", b"EVALSHA", b"MGET"]
    assert commands(lambda: session.get("/api/v1/requests/")) == [b"GET", b"EVALSHA", b"MGET"]

    # An approver's page: the session, then the badge's kept counts with the versions (after one page that
    # counted); no count query.
    services.request_submit(actor=cast.actor("carol"), project=cast.vision, template=cat.training, flavor=cat.h100,
                            gpus=4, parameters={"command": "python train.py"})
    bob = APIClient()
    bob.force_login(cast.bob)
    bob.get("/requests/")
    assert commands(lambda: bob.get("/requests/")) == [b"GET", b"MGET"]

"""Redis round trips per call, with Redis as the cache (as in production): the session's GET, the rate limit's one
script call (``portal.throttles``), and every version key of the request in one MGET (``portal.cache.version_key``;
the approvals badge's kept counts come in the same MGET, ``portal.cache.shared``). Counted at the Redis client's
socket (redis-py's ``send_packed_command``), one entry per command sent.

Committed transactions (``transaction=True``): the kept counts are only used outside one.
"""

from __future__ import annotations

import threading
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
    settings.SESSION_ENGINE = "portal.sessions"
    settings.API_RATE_USER = "1000/min"
    yield prefix
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


def commands(call) -> list[bytes]:
    """The Redis commands ``call()`` sends (their names), from its own thread: the audit anchor's thread sends the
    newest audit head on its own time (``tenants.anchor``), which may fall inside the call; it is not the call's."""
    sent: list[bytes] = []
    original = redis.connection.Connection.send_packed_command
    caller = threading.get_ident()

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
    session.get("/api/v1/requests/")  # warm: the kept shares' version (workloads.shared.SHARES) exists too

    # A token: the rate limit's script reads the versions too (one round trip). A session: the session and the
    # versions in one MGET, then the rate limit.
    assert commands(lambda: token.get(detail)) == [b"EVALSHA"]
    assert commands(lambda: session.get(detail)) == [b"MGET", b"EVALSHA"]
    assert commands(lambda: session.get("/api/v1/requests/")) == [b"MGET", b"EVALSHA"]

    # An approver's page: the session with the versions, and the badge's counts from this process's copy at that
    # version (after one page that counted); no count query.
    services.request_submit(actor=cast.actor("carol"), project=cast.vision, template=cat.training, flavor=cat.h100,
                            gpus=4, parameters={"command": "python train.py"})
    bob = APIClient()
    bob.force_login(cast.bob)
    bob.get("/requests/")
    assert commands(lambda: bob.get("/requests/")) == [b"MGET"]
    # The inbox reads kept tables before the navigation asks for the badge: still the one MGET.
    bob.get("/approvals/")
    assert commands(lambda: bob.get("/approvals/")) == [b"MGET"]


def test_the_badge_follows_a_new_version_from_another_process(cast, redis_cache) -> None:
    """The process's copy of the counts is used only at the version it was read at: a version set elsewhere (another
    process's write) has the page read the counts again, and they are right."""
    from django.core.cache import cache

    cat = make_catalogue(cast)
    bob = APIClient()
    bob.force_login(cast.bob)
    assert "nav-badge" not in bob.get("/requests/").content.decode()
    services.request_submit(actor=cast.actor("carol"), project=cast.vision, template=cat.training, flavor=cat.h100,
                            gpus=4, parameters={"command": "python train.py"})
    assert '<span class="nav-badge" aria-hidden="true">1</span>' in bob.get("/requests/").content.decode()
    assert commands(lambda: bob.get("/requests/")) == [b"MGET"]  # kept

    cache.set("versioned:approvals", "set-by-another-process", None)
    sent = commands(lambda: bob.get("/requests/"))
    assert sent[0] == b"MGET" and b"GET" in sent[1:] and b"SET" in sent[1:], sent  # read again, kept again
    assert '<span class="nav-badge" aria-hidden="true">1</span>' in bob.get("/requests/").content.decode()
    assert commands(lambda: bob.get("/requests/")) == [b"MGET"]


def test_a_tokens_rate_limit_still_limits_when_its_script_reads_the_versions(cast, redis_cache, settings) -> None:
    settings.API_RATE_USER = "2/min"
    _, raw = token_create(actor=cast.actor("carol"), project=cast.vision, name="ci", scope="read")
    token = APIClient()
    token.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert token.get("/api/v1/me/").status_code == 200  # the first: the script and the versions are made
    assert commands(lambda: token.get("/api/v1/me/")) == [b"EVALSHA"]
    refused = token.get("/api/v1/me/")
    assert refused.status_code == 429 and refused.json()["error"] == "throttled"


def test_the_quota_and_capacity_pages_read_their_plain_values_with_the_versions(cast, redis_cache) -> None:
    """The maintenance notices' list (quota pages) and the beat's heartbeat (capacity) come in the request's one MGET
    (``portal.cache.read_with_versions``); the list forgotten is read again at the next page."""
    from maintenance.notices import cutting_changes_forget

    make_catalogue(cast)
    alice, ops = APIClient(), APIClient()
    alice.force_login(cast.alice)
    ops.force_login(cast.ops)
    for _ in range(2):  # the first page asks for the keys; the second fetches them with the versions
        alice.get("/tenants/acme/quotas/")
        ops.get("/ops/capacity/")
    assert commands(lambda: alice.get("/tenants/acme/quotas/")) == [b"MGET"]
    assert commands(lambda: alice.get("/projects/acme-vision/quota/")) == [b"MGET"]
    assert commands(lambda: ops.get("/ops/capacity/")) == [b"MGET"]

    cutting_changes_forget()  # as a change's move does: the next page reads the changes and keeps them again
    sent = commands(lambda: alice.get("/tenants/acme/quotas/"))
    assert sent[0] == b"MGET" and b"SET" in sent[1:], sent
    assert commands(lambda: alice.get("/tenants/acme/quotas/")) == [b"MGET"]


def test_a_token_submission_reads_its_versions_and_the_budget_list_in_its_rate_limit_script(cast, redis_cache,
                                                                                             settings) -> None:
    """A submission's two rate limits, the request's versions and the list of tenants whose budgets refuse come in one
    script call (``portal.throttles._windows``, ``portal.cache.read_with_versions``): no MGET, no GET. A refusing
    budget set in the meantime still refuses the next submission."""
    from datetime import UTC, datetime, timedelta
    from decimal import Decimal

    from django.utils import timezone

    from billing import budgets, costs, services as billing_services
    from billing.models import UsageInterval

    cat = make_catalogue(cast)
    settings.API_RATE_SUBMIT = "1000/min"
    _, raw = token_create(actor=cast.actor("carol"), project=cast.vision, name="ci", scope="read+submit")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

    def post(name: str):
        return client.post("/api/v1/requests/", {"template": "training", "flavor": "h100", "name": name,
                                                 "parameters": {"command": "python train.py"}}, format="json")

    for name in ("warm-1", "warm-2"):  # the first asks for the budget list's key; from the second it comes along
        assert post(name).status_code == 201
    sent: list[bytes] = []
    original = redis.connection.Connection.send_packed_command

    def counting(self, command, *args, **kwargs):
        packed = b"".join(command) if isinstance(command, list) else bytes(command)
        sent.append(packed.split(b"\r\n")[2])
        return original(self, command, *args, **kwargs)

    redis.connection.Connection.send_packed_command = counting
    try:
        answer = post("counted")
    finally:
        redis.connection.Connection.send_packed_command = original
    assert answer.status_code == 201, answer.content
    assert sent[0] == b"EVALSHA" and sent.count(b"EVALSHA") <= 2, sent  # (the second: the audit anchor's thread)
    assert b"MGET" not in sent and b"GET" not in sent, sent

    # Ops make the project's budget refuse once spent; it is spent: the next submission is refused.
    billing_services.price_create(actor=cast.actor("ops"), unit="gpu", key="h100-80gb", amount=Decimal(60),
                                  effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    req = make_request(cat, cast.vision, cast.carol, state="succeeded")
    end = timezone.now() - timedelta(minutes=1)
    UsageInterval.objects.create(request=req, tenant=req.tenant, project=req.project, cluster=cat.cluster,
                                 run_key=f"wl/{req.pk}", source="workload", object_uid=f"u{req.pk}", object_name="w",
                                 unit="gpu", key="h100-80gb", quantity=Decimal(1),
                                 started_at=max(end - timedelta(minutes=30), costs.month_start()), ended_at=end)
    budgets.budget_create(actor=cast.actor("ops"), tenant=cast.acme, project=cast.vision, amount=Decimal("0.01"),
                          refuse_when_spent=True)
    refused = post("refused")
    assert refused.status_code == 400 and "budget" in refused.json()["fields"]["project"][0], refused.json()

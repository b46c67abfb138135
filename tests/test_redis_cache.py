"""The Redis cache backend: Django's, with one client per pool kept for the process."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache

from portal.redis_cache import RedisCache


@pytest.fixture
def backend(settings):
    url = settings.REDIS_URL or "redis://127.0.0.1:6379/15"
    cache = RedisCache(url, {"KEY_PREFIX": f"reused-{uuid.uuid4().hex[:8]}"})
    yield cache
    client = cache._cache.get_client(write=True)
    for key in client.scan_iter(f"{cache.key_prefix}:*"):
        client.delete(key)


def test_it_is_djangos_cache_and_keeps_its_behaviour(backend) -> None:
    assert isinstance(backend, DjangoRedisCache)  # throttles and sessions recognise it
    assert backend.get("missing", "default") == "default"
    backend.set("k", {"a": [1, 2]}, 30)
    assert backend.get("k") == {"a": [1, 2]}
    assert backend.add("k", "other") is False
    assert backend.get_many(["k", "nope"]) == {"k": {"a": [1, 2]}}
    assert backend.incr("n", 1) == 1 if backend.add("n", 0) else True
    backend.delete("k")
    assert backend.get("k") is None


def test_one_client_per_pool_shared_by_threads(backend) -> None:
    first = backend._cache.get_client(write=True)
    assert backend._cache.get_client(write=False) is first  # one server: one pool, one client
    seen: list[object] = []
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            seen.append(backend._cache.get_client())
            for n in range(50):
                backend.set(f"t{i}-{n}", n)
                assert backend.get(f"t{i}-{n}") == n
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(client is first for client in seen)


def test_clear_deletes_only_this_caches_keys(backend, settings) -> None:
    """The cache shares its Redis database with the broker's queues, the leases and other caches (another test
    process's prefix): ``clear()`` deletes this cache's keys, of every version, and leaves the rest."""
    client = backend._cache.get_client(write=True)
    other = RedisCache(settings.REDIS_URL or "redis://127.0.0.1:6379/15", {"KEY_PREFIX": f"{backend.key_prefix}x"})
    queue = f"queue-{uuid.uuid4().hex[:8]}"
    try:
        backend.set("a", 1)
        backend.set("a", 2, version=7)
        backend.set_many({f"m{n}": n for n in range(1200)})  # more than one batch of deletes
        other.set("a", "kept")
        client.lpush(queue, b"a queued task")
        backend.clear()
        assert backend.get("a") is None and backend.get("a", version=7) is None and backend.get("m1199") is None
        assert list(client.scan_iter(f"{backend.key_prefix}:*")) == []
        assert other.get("a") == "kept"  # a prefix that only starts like this one's
        assert client.lrange(queue, 0, -1) == [b"a queued task"]
    finally:
        client.delete(queue)
        other.delete("a")


def test_clear_treats_a_prefix_with_glob_characters_literally(settings) -> None:
    url = settings.REDIS_URL or "redis://127.0.0.1:6379/15"
    tag = uuid.uuid4().hex[:8]
    starry, plain = RedisCache(url, {"KEY_PREFIX": f"g*{tag}"}), RedisCache(url, {"KEY_PREFIX": f"gX{tag}"})
    try:
        starry.set("k", 1)
        plain.set("k", 2)
        starry.clear()
        assert starry.get("k") is None and plain.get("k") == 2
    finally:
        plain.delete("k")

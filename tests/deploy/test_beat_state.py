"""The scheduler (portal/beat.py) keeps its state in the shared cache, not in a file; a beat that takes over sends
what is overdue one entry at a time, not in a burst; its heartbeat shows on /healthz/ready and on the ops capacity
page, flagged once it is older than PORTAL_BEAT_STALE_SECONDS. In-process schedulers against the configured
broker (a queue of the test's own)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from django.conf import settings as django_settings

from portal.beat import CATCH_UP_GAP, SingletonScheduler

ENTRIES = 6


@pytest.fixture
def beat_app(settings) -> Iterator[tuple[Celery, str]]:
    if not django_settings.CELERY_BROKER_URL.startswith("redis"):
        pytest.fail("this test counts the messages in the Redis broker: run it with REDIS_URL")
    settings.PORTAL_INSTALLATION_ID = f"beat-state-{uuid.uuid4().hex[:8]}"
    settings.PORTAL_BEAT_LEASE_SECONDS = 1
    queue = f"beat-state-{uuid.uuid4().hex[:8]}"
    app = Celery("beat-state", broker=django_settings.CELERY_BROKER_URL, set_as_current=False)
    app.conf.broker_transport_options = dict(getattr(django_settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {})
    app.conf.task_default_queue = queue
    app.conf.beat_schedule = {f"entry-{i}": {"task": "portal.ping", "schedule": 2.0} for i in range(ENTRIES)}
    yield app, queue
    r = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    for key in r.scan_iter(f"*{queue}*"):
        r.delete(key)


def queued(app: Celery, queue: str) -> int:
    """Messages waiting in ``queue`` (the broker's list, under the run's key prefix)."""
    prefix = (app.conf.broker_transport_options or {}).get("global_keyprefix", "")
    return int(redis.Redis.from_url(django_settings.CELERY_BROKER_URL).llen(prefix + queue))


def run(scheduler: SingletonScheduler, seconds: float) -> list[float]:
    """Drive ``scheduler`` as Celery's beat loop does (tick, sleep what it asks) for ``seconds``; the delays asked."""
    asked = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        delay = scheduler.tick()
        asked.append(delay)
        time.sleep(max(0.0, min(delay, end - time.monotonic())))
    return asked


def test_the_schedule_is_shared_through_the_cache_and_a_takeover_sends_no_burst(beat_app, tmp_path, monkeypatch) -> None:
    app, queue = beat_app
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    first = SingletonScheduler(app=app, schedule_filename=str(tmp_path / "celerybeat-schedule"))
    second = SingletonScheduler(app=app, schedule_filename=str(tmp_path / "celerybeat-schedule"))
    run(first, ENTRIES * CATCH_UP_GAP + 4.5)  # active: each entry sent at start (one a second), then every 2 s
    assert first.active and second.tick() == second.max_interval and not second.active  # the other stands by
    sent_by_first = queued(app, queue)
    assert ENTRIES <= sent_by_first <= 5 * ENTRIES
    assert not list(tmp_path.glob("celerybeat-schedule*")), "no schedule file: its state is in the cache"

    # The holder dies (stops ticking, never releases); its lease lapses and the other one takes over. By then every
    # entry is overdue: they go out one per CATCH_UP_GAP, not all at once.
    time.sleep(2.5)
    before = queued(app, queue)
    asked = []
    counts = []
    end = time.monotonic() + ENTRIES * CATCH_UP_GAP + 0.5
    while time.monotonic() < end:
        asked.append(second.tick())
        counts.append(queued(app, queue) - before)
        time.sleep(max(0.0, min(asked[-1], 2.0)))
    assert second.active
    steps = [b - a for a, b in zip([0, *counts], counts, strict=False)]  # neighbours: one list is longer
    assert max(steps) == 1, (steps, asked)  # one send per tick...
    catch_up = [d for d, s in zip(asked, steps, strict=True) if s == 1][: ENTRIES - 1]
    assert all(d >= CATCH_UP_GAP for d in catch_up), asked  # ...and a pause after each overdue one
    assert counts[-1] >= ENTRIES  # none of them lost


def test_readiness_and_the_ops_page_say_when_the_scheduler_was_last_seen(beat_app, client, as_user, settings,
                                                                        tmp_path, monkeypatch) -> None:
    app, _ = beat_app
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    settings.PORTAL_BEAT_STALE_SECONDS = 5
    body = client.get("/healthz/ready").json()
    assert body["status"] == "ok" and body["degraded"] == ["scheduler"] and body["scheduler"].startswith("never seen")

    beat = SingletonScheduler(app=app)
    beat.tick()
    answer = client.get("/healthz/ready")
    body = answer.json()
    assert answer.status_code == 200 and "degraded" not in body, body
    assert re.fullmatch(r"last seen [0-2] s ago", body["scheduler"]) and "scheduler" not in body["checks"], body
    page = as_user("ops").get("/ops/capacity/").content.decode()
    assert 'id="scheduler-down"' not in page

    time.sleep(6.2)  # it stops ticking (killed): past the bound the scheduler is flagged
    answer = client.get("/healthz/ready")
    body = answer.json()
    assert answer.status_code == 200 and body["degraded"] == ["scheduler"]
    seen = re.match(r"last seen (\d+) s ago \(more than 5 s\)", body["scheduler"])
    assert seen and int(seen[1]) >= 6, body
    assert body["checks"]["scheduler"] == body["scheduler"]
    page = as_user("ops").get("/ops/capacity/").content.decode()
    assert 'id="scheduler-down"' in page and "the scheduler (Celery beat) is down" in page


def test_a_fresh_start_sends_what_was_never_sent_at_once(beat_app, tmp_path, monkeypatch) -> None:
    """Nothing recorded (a fresh start): an hourly entry (the ended month's statement, the rollups) goes out at start,
    not an hour later; what was sent is recorded, so the next beat does not send it again."""
    app, queue = beat_app
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    app.conf.beat_schedule = {"hourly": {"task": "portal.ping", "schedule": 3600.0}}
    first = SingletonScheduler(app=app)
    run(first, 1.5)
    assert first.active and queued(app, queue) == 1
    first.close()  # a clean stop: the next beat takes over at once, from the record
    second = SingletonScheduler(app=app)
    run(second, 1.5)
    assert second.active and queued(app, queue) == 1

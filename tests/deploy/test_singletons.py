"""Scaling out: two beats (``entrypoint.py beat``, started by mistake) send each periodic task once per period,
and the standby takes over when the holder dies; worker and beat liveness comes from their heartbeat files
(``entrypoint.py healthcheck worker|beat``). Real processes against the test Redis."""

from __future__ import annotations

import json
import pickle
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "entrypoint.py"
LEASE_TTL = 3

def _env(tmp: Path, prefix: str, **extra: str) -> dict[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)  # the settings module gives the broker prefix itself
    env.update({"DJANGO_SETTINGS_MODULE": "tests.deploy.beat_settings", "BEAT_TEST_PREFIX": prefix, "TMPDIR": str(tmp),
                "PORTAL_INSTALLATION_ID": prefix.rstrip(":"), "PORTAL_BEAT_LEASE_SECONDS": str(LEASE_TTL),
                "PORTAL_VAR_DIR": str(tmp / "var"), "LOG_LEVEL": "INFO", "PYTHONPATH": str(ROOT)})
    env.update(extra)
    return env


def _start(role: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ENTRYPOINT), role], env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _healthcheck(role: str, env: dict[str, str]) -> int:
    return subprocess.run([sys.executable, str(ENTRYPOINT), "healthcheck", role], env=env, capture_output=True,
                          timeout=30).returncode


def _sent(r: redis.Redis, prefix: str, queue: str = "celery") -> int:
    """How many messages wait in ``queue`` (the 1 s entry goes to "celery", the 3 s one to "slow"; no worker runs)."""
    return sum(json.loads(m)["headers"]["task"] == "portal.ping" for m in r.lrange(f"{prefix}{queue}", 0, -1))


def _lease_holder_pid(r: redis.Redis, prefix: str) -> int:
    """The pid in the beat lease's value (``host:pid:random``, pickled by Django's Redis cache)."""
    keys = list(r.scan_iter(f"*portal:lease:beat:{prefix.rstrip(':')}"))
    assert len(keys) == 1, keys
    return int(pickle.loads(r.get(keys[0])).split(":")[1])


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_two_beats_send_each_schedule_once_and_the_standby_takes_over(tmp_path):
    prefix = f"beat-test-{uuid.uuid4().hex[:8]}:"
    r = redis.Redis.from_url(settings.REDIS_URL)
    logs = [tmp_path / "beat-a.log", tmp_path / "beat-b.log"]
    beats = [_start("beat", _env(tmp_path / name, prefix), log) for name, log in zip(("a", "b"), logs)]
    try:
        # Both up: one says it is active, the other stands by.
        _wait_for(lambda: all("standing by" in log.read_text() or "active" in log.read_text() for log in logs), 90,
                  "the beats did not start")
        _wait_for(lambda: _sent(r, prefix) >= 2, 30, "nothing was sent")
        start, start_slow = _sent(r, prefix), _sent(r, prefix, "slow")
        t0 = time.monotonic()
        time.sleep(9)
        window = time.monotonic() - t0
        fast, slow = _sent(r, prefix) - start, _sent(r, prefix, "slow") - start_slow
        # Once per period: ~9 and ~3; two active beats would send twice that.
        assert window * 0.5 <= fast <= window + 2, (fast, window)
        assert 1 <= slow <= window / 3 + 2, (slow, window)
        texts = [log.read_text() for log in logs]
        active = [i for i, text in enumerate(texts) if "active, sending the schedule" in text]
        assert len(active) == 1, texts
        holder, standby = active[0], 1 - active[0]
        assert _lease_holder_pid(r, prefix) == beats[holder].pid
        for name in ("a", "b"):
            assert _healthcheck("beat", _env(tmp_path / name, prefix)) == 0

        # The holder dies without a word; the standby takes over within the lease's TTL (and a tick).
        _stop(beats[holder], signal.SIGKILL)
        died = time.monotonic()
        _wait_for(lambda: "active, sending the schedule" in logs[standby].read_text(), LEASE_TTL + 10, "no takeover")
        took_over = time.monotonic() - died
        assert took_over <= LEASE_TTL + 3, took_over
        before = _sent(r, prefix)
        time.sleep(6)
        assert 2 <= _sent(r, prefix) - before <= 6 + 3  # the survivor keeps the period (plus what was overdue)
        assert _lease_holder_pid(r, prefix) == beats[standby].pid
        # The dead beat's heartbeat goes stale; the survivor's stays fresh.
        assert _healthcheck("beat", _env(tmp_path / ("a", "b")[holder], prefix, PORTAL_HEARTBEAT_MAX_AGE="4")) == 1
        assert _healthcheck("beat", _env(tmp_path / ("a", "b")[standby], prefix, PORTAL_HEARTBEAT_MAX_AGE="4")) == 0
    finally:
        for proc in beats:
            _stop(proc)
        for key in r.scan_iter(f"{prefix}*"):
            r.delete(key)


def test_worker_heartbeat_is_its_liveness(tmp_path):
    prefix = f"hb-test-{uuid.uuid4().hex[:8]}:"
    env = _env(tmp_path / "w", prefix, PORTAL_HEARTBEAT_SECONDS="1", CELERY_CONCURRENCY="1", CELERY_QUEUES=prefix.rstrip(":"))
    assert _healthcheck("worker", env) == 1  # no heartbeat yet
    worker = _start("worker", env, tmp_path / "worker.log")
    try:
        beat_file = tmp_path / "w" / "portal-worker.alive"
        _wait_for(beat_file.exists, 120, "the worker never touched its heartbeat file")
        first = beat_file.stat().st_mtime
        _wait_for(lambda: beat_file.stat().st_mtime > first, 10, "the heartbeat is not renewed")
        assert _healthcheck("worker", {**env, "PORTAL_HEARTBEAT_MAX_AGE": "5"}) == 0
        os.killpg(worker.pid, signal.SIGSTOP)  # hung: alive but not running its loop
        time.sleep(4)
        assert _healthcheck("worker", {**env, "PORTAL_HEARTBEAT_MAX_AGE": "3"}) == 1
        os.killpg(worker.pid, signal.SIGCONT)
    finally:
        _stop(worker, signal.SIGKILL)
        r = redis.Redis.from_url(settings.REDIS_URL)
        for key in r.scan_iter(f"{prefix}*"):
            r.delete(key)

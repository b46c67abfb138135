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
                          timeout=30, check=False).returncode


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


def _age(path: Path) -> float:
    """Seconds since a heartbeat file was last touched."""
    return time.time() - path.stat().st_mtime


def _counted_window(r: redis.Redis, prefix: str, *, slow_sends: int, timeout: float) -> tuple[int, int, float]:
    """Wait (for events, not by the clock) for a send of the 3 s entry, then for ``slow_sends`` more; return how
    many 1 s and 3 s messages were sent after that first one, and how long they took. A load that slows the beat
    down only makes the window longer, so the bounds below hold whatever the load; nothing passes unless the
    messages really came."""
    slow0 = _sent(r, prefix, "slow")
    _wait_for(lambda: _sent(r, prefix, "slow") > slow0, timeout, "the 3 s entry was not sent")
    fast0, first = _sent(r, prefix), _sent(r, prefix, "slow")
    t0 = time.monotonic()
    _wait_for(lambda: _sent(r, prefix, "slow") >= first + slow_sends, timeout,
              f"the 3 s entry was not sent {slow_sends} more times in {timeout} s")
    window = time.monotonic() - t0
    return _sent(r, prefix) - fast0, _sent(r, prefix, "slow") - first, window


def test_two_beats_send_each_schedule_once_and_the_standby_takes_over(tmp_path):
    prefix = f"beat-test-{uuid.uuid4().hex[:8]}:"
    r = redis.Redis.from_url(settings.REDIS_URL)
    logs = [tmp_path / "beat-a.log", tmp_path / "beat-b.log"]
    alive = [tmp_path / name / "portal-beat.alive" for name in ("a", "b")]
    beats = [_start("beat", _env(tmp_path / name, prefix), log) for name, log in zip(("a", "b"), logs, strict=True)]
    try:
        # Both up: one says it is active, the other stands by.
        _wait_for(lambda: all("standing by" in log.read_text() or "active" in log.read_text() for log in logs), 90,
                  "the beats did not start")
        _wait_for(lambda: _sent(r, prefix) >= 2, 30, "nothing was sent")
        # Once per period: each of 3 further sends of the 3 s entry comes a period after the one before (9 s in all,
        # give or take the polling), and the 1 s entry goes out at most once a second meanwhile. A second active
        # beat would send the 3 s entry twice a period: 3 sends within some 4.5 s.
        fast, slow, window = _counted_window(r, prefix, slow_sends=3, timeout=60)
        assert window >= 3 * slow - 1.5, (slow, window)
        assert 1 <= fast <= window + 1.5, (fast, window)
        texts = [log.read_text() for log in logs]
        active = [i for i, text in enumerate(texts) if "active, sending the schedule" in text]
        assert len(active) == 1, texts
        holder, standby = active[0], 1 - active[0]
        assert _lease_holder_pid(r, prefix) == beats[holder].pid
        for name in ("a", "b"):
            assert _healthcheck("beat", _env(tmp_path / name, prefix)) == 0

        # The holder dies without a word; once its lease expires the standby takes it and says so.
        _stop(beats[holder], signal.SIGKILL)
        _wait_for(lambda: "active, sending the schedule" in logs[standby].read_text(), LEASE_TTL + 60, "no takeover")
        _wait_for(lambda: _lease_holder_pid(r, prefix) == beats[standby].pid, 30, "the lease is not the survivor's")
        # The survivor keeps the period (what was overdue when it took over went out once, before this window).
        fast, slow, window = _counted_window(r, prefix, slow_sends=2, timeout=60)
        assert window >= 3 * slow - 1.5, (slow, window)
        assert 1 <= fast <= window + 1.5, (fast, window)
        assert _lease_holder_pid(r, prefix) == beats[standby].pid
        # The dead beat's heartbeat goes stale (its file only ages); the survivor's stays fresh (just touched).
        _wait_for(lambda: _age(alive[holder]) > 8, 30, "the dead beat's heartbeat file is still being touched")
        touched = alive[standby].stat().st_mtime
        _wait_for(lambda: alive[standby].stat().st_mtime > touched, 30, "the survivor does not touch its heartbeat")
        assert _healthcheck("beat", _env(tmp_path / ("a", "b")[holder], prefix, PORTAL_HEARTBEAT_MAX_AGE="6")) == 1
        assert _healthcheck("beat", _env(tmp_path / ("a", "b")[standby], prefix, PORTAL_HEARTBEAT_MAX_AGE="6")) == 0
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
        stopped = beat_file.stat().st_mtime
        _wait_for(lambda: _age(beat_file) > 4, 30, "the hung worker's heartbeat file does not age")
        assert beat_file.stat().st_mtime == stopped  # nobody touched it while the worker was hung
        assert _healthcheck("worker", {**env, "PORTAL_HEARTBEAT_MAX_AGE": "3"}) == 1
        os.killpg(worker.pid, signal.SIGCONT)
    finally:
        _stop(worker, signal.SIGKILL)
        r = redis.Redis.from_url(settings.REDIS_URL)
        for key in r.scan_iter(f"{prefix}*"):
            r.delete(key)

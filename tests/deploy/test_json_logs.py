"""LOG_FORMAT=json: every line every process writes (stdout and stderr) is one JSON object: gunicorn (its own
error log, its workers, the portal's access lines), a Celery worker and beat (Celery's banner and loggers,
warnings, and the shutdown messages Celery writes straight to the file descriptors), the migrate role and the
entry point's own lines. The real processes run for a few seconds; the worker and beat are stopped the way
Kubernetes stops them (SIGTERM to the entry point's process, which became the role's program) and the way a
person does (Ctrl+C twice)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.deploy.test_image import ENTRYPOINT, free_port, production_env


def not_json(output: str) -> list[str]:
    bad = []
    for line in output.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if not isinstance(record, dict) or not {"time", "level", "logger", "message"} <= set(record):
            bad.append(line)
    return bad


def run_for(argv: list[str], env: dict, seconds: float, ready=None) -> str:
    """Start the role, let it run (and ``ready`` poke it), then SIGTERM it; stdout and stderr together."""
    proc = subprocess.Popen([sys.executable, str(ENTRYPOINT), *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + seconds
        if ready:
            ready(proc)
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out


def run_and_signal(argv: list[str], env: dict, ready: str, signals: list[signal.Signals]) -> tuple[str, str]:
    """Start the role, wait until ``ready`` is in its output, then send ``signals`` to its process (not its
    group, as Kubernetes does), half a second apart, and wait until it and everything it started is done."""
    proc = subprocess.Popen([sys.executable, str(ENTRYPOINT), *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: dict[str, list[str]] = {"out": [], "err": []}

    def drain(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    readers = [threading.Thread(target=drain, args=(proc.stdout, seen["out"]), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, seen["err"]), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any(ready in line for line in seen["out"] + seen["err"]):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(seen["out"] + seen["err"])
            time.sleep(0.2)
        time.sleep(1)
        for sig in signals:
            if proc.poll() is None:
                os.kill(proc.pid, sig)
            time.sleep(0.5)
        proc.wait(timeout=90)
        for reader in readers:  # the pipes end once every process that holds them has exited
            reader.join(timeout=30)
            assert not reader.is_alive(), "output still open after the role exited"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return "".join(seen["out"]), "".join(seen["err"])


def json_env(tmp_path: Path, **extra: str) -> dict:
    env = production_env(tmp_path, **extra)
    # Python's own warnings on, as a careless deployment might set them: they must come out as JSON too.
    env.update({"PYTHONWARNINGS": "default", "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT": "2"})
    env.pop("PYTHONUNBUFFERED", None)
    return env


@pytest.mark.django_db(transaction=True)
def test_web_role_writes_only_json_lines(tmp_path):
    port = free_port()
    env = json_env(tmp_path, HOST="127.0.0.1", PORT=str(port), WEB_WORKERS="2", WEB_THREADS="2")

    def poke(proc):
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/healthz/live", timeout=5).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.3)
        for path, host in (("/nope/", "gpu.example.org"), ("/", "evil.example.com"), ("/healthz/ready", "x")):
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(urllib.request.Request(base + path, headers={
                    "Host": host, "X-Forwarded-Proto": "https"}), timeout=10).read()

    out = run_for(["web"], env, 6, poke)
    assert "portal.access" in out and "gunicorn.error" in out, out
    assert not not_json(out), "\n".join(not_json(out))


@pytest.mark.django_db(transaction=True)
def test_worker_beat_and_migrate_write_only_json_lines(tmp_path):
    env = json_env(tmp_path, CELERY_CONCURRENCY="1")
    # SIGTERM (the entry point remaps it to Celery's cold shutdown), then Ctrl+C during it.
    out, err = run_and_signal(["worker"], env, "ready.", [signal.SIGTERM, signal.SIGINT])
    assert "celery" in out + err and "Cold shutdown" in out + err, out + err
    # Ctrl+C twice: the warm shutdown, then the cold one.
    out2, err2 = run_and_signal(["worker"], env, "ready.", [signal.SIGINT, signal.SIGINT])
    assert "Warm shutdown" in out2 + err2 and "initiate cold shutdown" in out2 + err2, out2 + err2
    for output in (out, err, out2, err2):
        assert not not_json(output), "\n".join(not_json(output))
    beat_out, beat_err = run_and_signal(["beat"], env, "beat: Starting", [signal.SIGTERM])
    assert "celery.beat" in beat_out + beat_err, beat_out + beat_err
    for output in (beat_out, beat_err):
        assert not not_json(output), "\n".join(not_json(output))
    migrate = run_for(["migrate"], env, 120)
    assert "No migrations to apply" in migrate, migrate
    assert not not_json(migrate), "\n".join(not_json(migrate))

"""`make run` (deploy/devstack.py) supervises its children on the embedded defaults.

A killed worker, or a killed beat (a child of its own), is started again (with a notice) while the web server
keeps answering, and readiness shows the scheduler back; SIGTERM stops
everything within 10 seconds and leaves no process behind. The stack runs as `make run` runs it:
a subprocess on free ports with its own runtime folder, no DATABASE_URL / REDIS_URL.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICE_VARS = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "PYTEST_XDIST_WORKER", "PORTAL_KUBECONFIG",
                "DJANGO_SETTINGS_MODULE", "CELERY_TASK_ALWAYS_EAGER"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_groups() -> dict[int, int]:
    """pid -> process group id of every live process on this machine (zombies are dead: not counted)."""
    groups = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] in {"Z", "X"}:
            continue
        groups[int(entry.name)] = int(fields[2])
    return groups


def group_members(pgid: int, at_least: int, timeout: float = 60) -> list[int]:
    """The live processes of a group, once it has ``at_least`` of them (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while True:
        members = [pid for pid, g in process_groups().items() if g == pgid]
        if len(members) >= at_least or time.monotonic() > deadline:
            return members
        time.sleep(0.5)


class Devstack:
    """deploy/devstack.py in a subprocess; its output is collected line by line."""

    def __init__(self, var_dir: Path, *, under_shell: bool = False, **extra_env: str) -> None:
        """``under_shell``: started by a shell that waits for it, as ``make`` starts it (``proc`` is the shell)."""
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS}
        env.update(PORTAL_VAR_DIR=str(var_dir), PORTAL_PORT=str(self.port), SANDBOX_PORT=str(free_port()),
                   PYTHONUNBUFFERED="1", **extra_env)
        command = [sys.executable, "deploy/devstack.py"]
        if under_shell:
            command = ["sh", "-c", f'"{sys.executable}" deploy/devstack.py; echo "devstack returned $?"']
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float, after: int = 0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[after:]:
                if match := re.search(pattern, line):
                    return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s; output:\n{self.output[-6000:]}")

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def started(self) -> dict[str, int]:
        """name -> pid of each child's latest start (each child leads its own process group)."""
        pids = {}
        for line in self.lines:
            if match := re.match(r"devstack: started (\w+) \(pid (\d+)\)", line):
                pids[match[1]] = int(match[2])
        return pids

    def wait_ready_scheduler(self, timeout: float) -> str:
        """What /healthz/ready says about the scheduler, once it is not flagged (degraded) any more."""
        deadline = time.monotonic() + timeout
        body: dict = {}
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz/ready", timeout=10) as response:
                    body = json.load(response)
            except (urllib.error.URLError, OSError, ValueError):
                body = {}
            if body.get("scheduler") and "degraded" not in body:
                return body["scheduler"]
            time.sleep(0.5)
        raise AssertionError(f"the scheduler stayed flagged: {body}; output:\n{self.output[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pgid in self.started().values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def devstack(tmp_path):
    stack = Devstack(tmp_path / "var")
    yield stack
    stack.kill()


@pytest.mark.timeout(600)
def test_killed_worker_and_beat_are_restarted_and_sigterm_stops_everything(devstack: Devstack) -> None:
    devstack.wait_for(r"GPU portal:", timeout=400)
    assert devstack.get("/accounts/login/") == 200
    first = devstack.started()
    assert set(first) == {"sandbox", "worker", "beat", "web"}, devstack.output
    scheduler = devstack.wait_ready_scheduler(timeout=60)
    assert scheduler.startswith("last seen"), scheduler

    mark = len(devstack.lines)
    os.kill(first["worker"], signal.SIGKILL)
    devstack.wait_for(r"devstack: worker exited \(killed by SIGKILL\) after \d+s; restarting in \d+s", timeout=10, after=mark)
    assert devstack.get("/accounts/login/") == 200  # the web server did not go down with it
    new_pid = int(devstack.wait_for(r"devstack: started worker \(pid (\d+)\)", timeout=30, after=mark)[1])
    assert new_pid != first["worker"]
    groups = process_groups()
    assert first["worker"] not in groups
    assert groups.get(new_pid) == new_pid
    assert devstack.get("/accounts/login/") == 200
    assert {k: devstack.started()[k] for k in ("web", "sandbox", "beat")} == {k: first[k] for k in ("web", "sandbox", "beat")}

    # Beat is a child of its own: killed, it is noticed and started again, and it sends the schedule again once the
    # dead one's lease lapsed (PORTAL_BEAT_LEASE_SECONDS): readiness stops flagging it.
    mark = len(devstack.lines)
    os.kill(first["beat"], signal.SIGKILL)
    devstack.wait_for(r"devstack: beat exited \(killed by SIGKILL\) after \d+s; restarting in \d+s", timeout=10, after=mark)
    new_beat = int(devstack.wait_for(r"devstack: started beat \(pid (\d+)\)", timeout=30, after=mark)[1])
    assert new_beat != first["beat"]
    killed = time.monotonic()
    devstack.wait_for(r"beat: active, sending the schedule", timeout=60, after=mark)
    assert time.monotonic() - killed < 30
    assert devstack.wait_ready_scheduler(timeout=30).startswith("last seen")

    everything = {devstack.proc.pid, *devstack.started().values()}
    before = [pid for pid, g in process_groups().items() if g in everything]
    assert len(before) >= 5  # devstack, sandbox, worker, beat, web
    started = time.monotonic()
    devstack.proc.send_signal(signal.SIGTERM)
    devstack.proc.wait(timeout=10)
    took = time.monotonic() - started
    assert devstack.proc.returncode == 0, devstack.output[-3000:]
    left = [pid for pid, g in process_groups().items() if g in everything or pid in before]
    assert not left, f"left behind: {left}"
    assert took < 10
    devstack.wait_for(r"devstack: stopped", timeout=1)


@pytest.mark.timeout(300)
def test_the_end_of_the_process_that_started_it_stops_everything(tmp_path) -> None:
    """`make` killed with SIGTERM passes no signal on to the supervisor: devstack notices that its parent is gone and
    stops every child, leaving nothing behind (its children run in process groups of their own and would otherwise
    hold the ports)."""
    # The parent: a shell that runs devstack and waits for it, as make does; it is killed, devstack is not.
    stack = Devstack(tmp_path / "var", under_shell=True)
    shell = stack.proc
    try:
        stack.wait_for(r"devstack: started web \(pid \d+\)", timeout=240)
        supervisor = next(pid for pid, _ in process_groups().items()
                          if pid != shell.pid and _parent_of(pid) == shell.pid)
        everything = {supervisor, *stack.started().values()}
        before = [pid for pid, g in process_groups().items() if g in everything or pid == supervisor]
        assert len(before) >= 5  # devstack, sandbox(es), worker, beat, web
        os.kill(shell.pid, signal.SIGKILL)  # the parent dies without a word to its child
        shell.wait(timeout=5)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(pid in process_groups() for pid in before):
            time.sleep(0.2)
        left = [pid for pid in before if pid in process_groups()]
        assert not left, f"left behind: {left}\n{stack.output[-3000:]}"
        stack.wait_for(r"devstack: the process that started it \(pid \d+\) exited; stopping", timeout=1)
        stack.wait_for(r"devstack: stopped", timeout=1)
    finally:
        stack.kill()


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])

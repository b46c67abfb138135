"""``gpuportal`` with a cluster: the portal materializes the job into the sandbox (a real Celery worker), the
status follower moves it along (one cycle at a time here, as beat would), and the client sees queued →
running → succeeded on its own and prints the pods' logs. Also runs the README's CI example as written.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from workloads.models import RequestState, WorkloadRequest
from workloads.states import FINAL

from ..workloads.test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures

S = RequestState
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


@pytest.fixture
def world(fresh_sandbox, cast, worker) -> World:  # noqa: F811 - the fixture named like the imported helper
    return _world(fresh_sandbox, cast, architecture="B")


def _drive(world: World, processes: list[subprocess.Popen], *, advance: float, stop=None, timeout: float = 120) -> None:
    """Run follower cycles, moving simulated time, until the processes end (or ``stop()`` holds). Time stops
    once every request has ended, so finished pods (and their logs) stay until the test reads them."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in processes) and not (stop and stop()):
        assert time.monotonic() < deadline, [p.args for p in processes if p.poll() is None]
        if WorkloadRequest.objects.exclude(state__in=FINAL).exists():
            world.sync()
            world.sandbox.advance(advance)
        time.sleep(0.2)


def _states(out: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines() if line.startswith("state: ")]


def test_submit_wait_status_and_logs_in_the_sandbox(gp, world) -> None:
    submit = gp("submit", "training", "--flavor", "h100-80gb-offline", "--gpus", "1", "--duration-hours", "1",
                "-p", "command=python train.py", "--wait", "--until", "running", background=True)
    _drive(world, [submit], advance=5)
    out, err = submit.communicate()
    assert submit.returncode == 0, out + err
    assert "running" in _states(out) and "queued" in _states(out)
    req = WorkloadRequest.objects.get()
    assert req.state == S.RUNNING

    logs = gp("logs", str(req.pk), "--tail", "5")
    assert logs.returncode == 0, logs.stderr
    assert "started on node" in logs.stdout and len(logs.stdout.splitlines()) <= 5
    pods = gp("logs", str(req.pk), "-o", "json")
    assert pods.returncode == 0 and '"pods"' in pods.stdout

    follow = gp("logs", str(req.pk), "--follow", "--interval", "0.3", background=True)
    wait = gp("wait", str(req.pk), background=True)
    _drive(world, [follow, wait], advance=600)
    out, err = wait.communicate()
    assert wait.returncode == 0, out + err
    assert _states(out)[-1] == "succeeded"
    followed, err = follow.communicate()
    assert follow.returncode == 0, err
    lines = followed.splitlines()
    assert lines and len(lines) == len(set(lines))  # each line once, though it was read again and again
    assert "started on node" in followed
    assert WorkloadRequest.objects.get().state == S.SUCCEEDED


def _readme_ci_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## CI pipelines"):]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "README.md's CI section has no ```sh block"
    return match.group(1)


def test_the_readme_ci_example_runs_as_written(cli_env, world) -> None:
    block = _readme_ci_block()
    assert "gpuportal submit" in block and "gpuportal wait" in block
    # A clean shell: the pipeline's variables and a system PATH, on which there is no gpuportal; the block finds it.
    clean = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": cli_env["HOME"], "LANG": "C.UTF-8",
             "PORTAL_URL": cli_env["PORTAL_URL"], "PORTAL_TOKEN": cli_env["PORTAL_TOKEN"], "CI_JOB_ID": "88121",
             "GPUPORTAL_POLL_INTERVAL": "0.2", "XDG_CONFIG_HOME": cli_env["XDG_CONFIG_HOME"],
             "PYTHONPATH": cli_env["PYTHONPATH"]}  # this checkout's client, should the venv's editable install be another's
    assert shutil.which("gpuportal", path=clean["PATH"]) is None
    assert (ROOT / ".venv" / "bin" / "gpuportal").exists(), "`make venv` installs the client into .venv"
    process = subprocess.Popen(["bash", "-e", "-c", block], env=clean, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _drive(world, [process], advance=600)
    out, err = process.communicate()
    assert process.returncode == 0, out + err
    req = WorkloadRequest.objects.get()
    assert req.state == S.SUCCEEDED and req.idempotency_key.startswith("ci-ci_job_id-88121-")
    assert req.parameters["args"] == ["--epochs", "3"] and req.parameters["env"] == {"SEED": "1"}
    assert _states(out)[-1] == "succeeded" and "running" in _states(out)
    assert "exiting with code 0" in out  # the logs

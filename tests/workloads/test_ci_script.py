"""deploy/ci_submit.py, the README's CI example, run as a separate process against the live server with a
real project token: submit with an Idempotency-Key, poll (ETag) until done, exit codes a pipeline can use.

No cluster runs here, so the test does what the materializer and the status follower would do
(``states.move``) while the script waits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tenants.models import ApiToken
from tenants.services import token_create
from workloads import services
from workloads.models import RequestState, WorkloadRequest
from workloads.states import move

S = RequestState
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "ci_submit.py"
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def ci(cast, cat, live_server, hooks_called):  # noqa: ANN001, ANN201
    """``ci(*args)`` runs the script with a fresh submit-scoped token of carol's in acme-vision."""
    _, raw = token_create(actor=cast.actor("carol"), project=cast.vision, name="pipeline", scope=ApiToken.Scope.SUBMIT)

    def run(*args: str, background: bool = False) -> subprocess.CompletedProcess | subprocess.Popen:
        env = {"PORTAL_TOKEN": raw, "PATH": "/usr/bin:/bin"}
        command = [sys.executable, str(SCRIPT), "--url", live_server.url, "--interval", "0.2", *args]
        if background:
            return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    return run


def test_submits_with_a_key_and_a_retry_finds_the_same_request(ci, cast) -> None:  # noqa: ANN001
    first = ci("--command", "python train.py", "--arg=--epochs", "--arg=3", "--env", "SEED=1",
               "--key", "pipeline-42", "--until", "approved,queued,running,succeeded")
    assert first.returncode == 0, first.stderr
    req = WorkloadRequest.objects.get()
    assert f"request {req.pk} (acme-vision/{req.name}) submitted; key pipeline-42" in first.stdout
    assert "state: approved" in first.stdout
    assert json.loads(first.stdout.strip().splitlines()[-1]) == {"id": req.pk, "state": "approved", "cost": None}
    assert (req.requested_by, req.token.name, req.idempotency_key) == (cast.carol, "pipeline", "pipeline-42")
    assert req.parameters["args"] == ["--epochs", "3"] and req.parameters["env"] == {"SEED": "1"}

    again = ci("--command", "python train.py", "--key", "pipeline-42", "--until", "approved")
    assert again.returncode == 0, again.stderr
    assert f"request {req.pk} " in again.stdout and "already submitted (same Idempotency-Key)" in again.stdout
    assert WorkloadRequest.objects.count() == 1


def test_waits_through_approval_and_the_cluster_until_it_succeeds(ci, cast) -> None:  # noqa: ANN001
    process = ci("--command", "python train.py", "--gpus", "4", "--key", "big-run", background=True)
    deadline = time.monotonic() + 20
    while not WorkloadRequest.objects.exists():
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.1)
    req = WorkloadRequest.objects.get()
    assert req.state == S.PENDING_APPROVAL  # 4 GPUs: more than the rule approves on its own
    time.sleep(1)  # the script is polling now, mostly answered 304 Not Modified
    services.request_approve(actor=cast.actor("bob"), request=req, comment="go")
    for to, reason in [(S.QUEUED, "Objects created in the cluster."), (S.RUNNING, "Its pods run."), (S.SUCCEEDED, "Job complete.")]:
        time.sleep(0.5)
        assert move(req, to=to, actor_label="cluster", reason=reason)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    states = [line.split()[1] for line in out.splitlines() if line.startswith("state: ")]
    assert states[0] == "pending_approval" and states[-1] == "succeeded"
    assert "approved" in states
    assert "Awaiting approval by a project admin" in out


def test_a_failed_job_fails_the_pipeline(ci, cast) -> None:  # noqa: ANN001
    result: dict[str, subprocess.CompletedProcess] = {}
    thread = threading.Thread(target=lambda: result.setdefault("run", ci("--command", "false", "--key", "doomed")))
    thread.start()
    deadline = time.monotonic() + 20
    while not WorkloadRequest.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    req = WorkloadRequest.objects.get()
    move(req, to=S.FAILED, actor_label="cluster", reason="BackoffLimitExceeded: the job failed 1 time.")
    thread.join(timeout=30)
    run = result["run"]
    assert run.returncode == 1
    assert "ended failed: BackoffLimitExceeded" in run.stderr


def test_refusals_print_the_field_errors(ci) -> None:  # noqa: ANN001
    run = ci("--command", "python train.py", "--param", "retries=99", "--key", "bad-1")
    assert run.returncode == 2
    assert "parameters.retries: 99 is greater than the maximum of 10" in run.stderr
    run = ci("--command", "python train.py", "--gpus", "50", "--key", "bad-2")
    assert run.returncode == 2 and "gpus:" in run.stderr
    assert not WorkloadRequest.objects.exists()


def test_a_bad_token_or_no_portal(ci, live_server) -> None:  # noqa: ANN001
    run = subprocess.run([sys.executable, str(SCRIPT), "--url", live_server.url, "--command", "x"],
                         env={"PORTAL_TOKEN": "gpp_00000000_nope"}, capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "HTTP 401" in run.stderr
    run = subprocess.run([sys.executable, str(SCRIPT), "--command", "x"], env={}, capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "Set PORTAL_TOKEN" in run.stderr


def test_runs_to_success_in_the_sandbox_cluster(ci, cast, fresh_sandbox) -> None:  # noqa: ANN001
    """With a cluster: the portal materializes the job into the sandbox, the status follower moves it along,
    and the script sees queued → running → succeeded on its own."""
    from celery.contrib.testing.worker import start_worker

    from portal.celery import app
    from workloads.status import requests_sync

    from .test_lifecycle import _world

    world = _world(fresh_sandbox, cast, architecture="B")
    # A real worker materializes what the API queues; the follower runs below, as beat would.
    app.control.purge()
    # The default queue by name: an earlier start_worker(queues=[...]) in this process (test_celery,
    # test_lifecycle) leaves the app consuming only that queue.
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", queues=[app.conf.task_default_queue]):
        process = ci("--command", "python train.py", "--flavor", "h100-80gb-offline", "--gpus", "1",
                     "--duration-hours", "1", "--key", "sandbox-run", background=True)
        deadline = time.monotonic() + 60
        while process.poll() is None:
            assert time.monotonic() < deadline, "the script did not finish"
            if WorkloadRequest.objects.exists():
                requests_sync(cluster=world.cluster, watch_seconds=1)
                fresh_sandbox.advance(600)
            time.sleep(0.2)
        out, err = process.communicate()
    assert process.returncode == 0, out + err
    states = [line.split()[1] for line in out.splitlines() if line.startswith("state: ")]
    assert states[-1] == "succeeded" and "running" in states
    req = WorkloadRequest.objects.get()
    assert req.state == S.SUCCEEDED and req.token is not None

"""``gpuportal`` against the live server, no cluster: login, submit (Idempotency-Key), wait and its exit
statuses, status, list, cancel, templates, flavors, ``--output json`` and the error messages.

No cluster runs here, so the test does what the materializer and the status follower would do
(``states.move``) while the client waits.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workloads import services
from workloads.models import RequestState, WorkloadRequest
from workloads.states import move

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
TRAIN = ("training", "-p", "command=python train.py")


def _config(env: dict[str, str]) -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "gpuportal" / "config.json"


def _states(out: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines() if line.startswith("state: ")]


def _finish(process, first: str = "") -> tuple[str, str]:
    """Wait for a background run; its whole stdout (with ``first``, a line already read) and stderr."""
    process.wait(timeout=60)
    return first + process.stdout.read(), process.stderr.read()


def test_login_checks_the_token_and_writes_a_private_config(gp, cli_env, token, live_server, closed_port) -> None:
    no_env = {"PORTAL_URL": None, "PORTAL_TOKEN": None}
    run = gp("list", env=no_env)
    assert run.returncode == 2 and "Not logged in" in run.stderr

    bad = gp("login", "--url", live_server.url, "--token", "gpp_00000000_nope", env=no_env)
    assert bad.returncode == 2 and "HTTP 401" in bad.stderr
    assert not _config(cli_env).exists()

    run = gp("login", "--url", live_server.url, env=no_env, input=f"{token}\n")  # the token from stdin
    assert run.returncode == 0, run.stderr
    assert "as carol (token pipeline: project acme-vision, scope read+submit)" in run.stdout
    path = _config(cli_env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": live_server.url, "token": token}

    assert gp("list", env=no_env).returncode == 0  # the stored login is used
    # $PORTAL_URL overrides the file: a portal that is not there.
    down = gp("list", env={"PORTAL_URL": f"http://127.0.0.1:{closed_port}", "PORTAL_TOKEN": None, "GPUPORTAL_RETRIES": "0"})
    assert down.returncode == 4

    path.chmod(0o644)  # a login over an existing file makes it private again
    assert gp("login", "--url", live_server.url, "--token", token, "-o", "json", env=no_env).returncode == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_submit_with_a_key_and_a_retry_finds_the_same_request(gp, cast, cat) -> None:
    extra = ("-p", 'args=["--epochs", "3"]', "-p", 'env={"SEED": "1"}', "-p", "retries=2")
    first = gp("submit", *TRAIN, *extra, "--idempotency-key", "pipeline-42")
    assert first.returncode == 0, first.stderr
    req = WorkloadRequest.objects.get()
    assert f"request {req.pk} (acme-vision/{req.name}) submitted; key pipeline-42" in first.stdout
    assert (req.requested_by, req.token.name, req.idempotency_key) == (cast.carol, "pipeline", "pipeline-42")
    assert {k: req.parameters[k] for k in ("command", "args", "env", "retries")} == {
        "command": "python train.py", "args": ["--epochs", "3"], "env": {"SEED": "1"}, "retries": 2}

    again = gp("submit", *TRAIN, *extra, "--idempotency-key", "pipeline-42", "--output", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["id"] == req.pk and "already submitted (same Idempotency-Key)" not in again.stdout
    assert gp("submit", *TRAIN, *extra, "--idempotency-key", "pipeline-42", "-q").stdout == f"{req.pk}\n"
    # The key again with another submission: refused (exit 2), not the first request passed off as this one.
    other = gp("submit", *TRAIN, "--idempotency-key", "pipeline-42")
    assert other.returncode == 2 and "idempotency_key_reused" in other.stderr
    assert WorkloadRequest.objects.count() == 1


def test_the_default_key_comes_from_the_ci_job_and_the_submission(gp, cat) -> None:
    ci = {"CI_JOB_ID": "88121"}
    first, retry = gp("submit", *TRAIN, "-q", env=ci), gp("submit", *TRAIN, "-q", env=ci)
    assert first.returncode == retry.returncode == 0, first.stderr + retry.stderr
    assert first.stdout == retry.stdout  # a retried step finds its request
    other = gp("submit", "training", "-p", "command=python eval.py", "-q", env=ci)  # another submission, same job
    assert other.returncode == 0 and other.stdout != first.stdout
    keys = sorted(WorkloadRequest.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == 2 and all(k.startswith("ci-ci_job_id-88121-") for k in keys)
    outside_ci = gp("submit", *TRAIN, "-q"), gp("submit", *TRAIN, "-q")  # no CI job: a new key each time
    assert outside_ci[0].stdout != outside_ci[1].stdout
    assert WorkloadRequest.objects.count() == 4


def test_refusals_exit_2_with_the_field_errors(gp, cat) -> None:
    run = gp("submit", *TRAIN, "-p", "retries=99")
    assert run.returncode == 2
    assert "parameters.retries: 99 is greater than the maximum of 10" in run.stderr
    run = gp("submit", *TRAIN, "--gpus", "50")
    assert run.returncode == 2 and "\n  gpus: " in run.stderr
    run = gp("submit", *TRAIN, "--flavor", "h200")
    assert run.returncode == 2
    assert "flavor: No such flavor h200." in run.stderr
    allowed = ", ".join(f.name for f in cat.training.allowed_flavors.filter(active=True).order_by("order", "name"))
    assert allowed and f"valid flavors for training: {allowed}" in run.stderr
    run = gp("submit", *TRAIN, "--project", "globex-llm")  # another tenant's project: no such project
    assert run.returncode == 2 and "project: No such project." in run.stderr
    run = gp("submit", *TRAIN, "-p", "nonsense")
    assert run.returncode == 2 and "NAME=VALUE" in run.stderr  # a usage error, before any call
    assert not WorkloadRequest.objects.exists()


def test_wait_exit_statuses(gp, cast, cat) -> None:
    big = gp("submit", *TRAIN, "--gpus", "4", "-q")  # more than the rule approves on its own
    req = WorkloadRequest.objects.get(pk=int(big.stdout))
    assert req.state == S.PENDING_APPROVAL

    timeout = gp("wait", str(req.pk), "--timeout", "1")
    assert timeout.returncode == 3
    assert f"timed out waiting for succeeded; request {req.pk} is pending_approval" in timeout.stderr
    assert "Awaiting approval by a project admin" in timeout.stdout

    waiting = gp("wait", str(req.pk), background=True)
    first = waiting.stdout.readline()  # it has seen the request: it polls now, mostly answered 304 Not Modified
    time.sleep(1)
    services.request_approve(actor=cast.actor("bob"), request=req, comment="go")
    for to, reason in [(S.QUEUED, "Objects created in the cluster."), (S.RUNNING, "Its pods run."), (S.SUCCEEDED, "Job complete.")]:
        time.sleep(0.5)
        assert move(req, to=to, actor_label="cluster", reason=reason)
    out, err = _finish(waiting, first)
    assert waiting.returncode == 0, err
    states = _states(out)
    assert states[0] == "pending_approval" and states[-1] == "succeeded" and "approved" in states
    assert out.rstrip().endswith(f"request {req.pk} succeeded")

    running = gp("wait", str(req.pk), "--until", "running", "--output", "json")  # it ran: done
    assert running.returncode == 0 and json.loads(running.stdout)["state"] == "succeeded"

    doomed = gp("submit", *TRAIN, "--name", "doomed", "-q")
    failing = gp("wait", doomed.stdout.strip(), "--output", "json", background=True)
    assert failing.stderr.readline().startswith("state: approved")  # with --output json, progress goes to stderr
    move(WorkloadRequest.objects.get(name="doomed"), to=S.FAILED, actor_label="cluster",
         reason="BackoffLimitExceeded: the job failed 1 time.")
    out, err = _finish(failing)
    assert failing.returncode == 1
    assert "ended failed: BackoffLimitExceeded" in err and json.loads(out)["state"] == "failed"

    assert gp("wait", "999999").returncode == 2  # no such request (or not yours): refused
    assert gp("wait", str(req.pk), "--until", "done").returncode == 2  # a usage error


def test_submit_wait_follows_it_through(gp, cast, cat) -> None:
    process = gp("submit", *TRAIN, "--wait", "--until", "queued", "--timeout", "30", background=True)
    deadline = time.monotonic() + 20
    while not WorkloadRequest.objects.filter(state=S.APPROVED).exists():
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.1)
    move(WorkloadRequest.objects.get(), to=S.QUEUED, actor_label="cluster", reason="Objects created in the cluster.")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert _states(out) == ["approved", "queued"]


def test_list_status_cancel_templates_flavors(gp, cast, cat) -> None:
    ids = [int(gp("submit", *TRAIN, "--name", name, "-q").stdout) for name in ("first", "second")]

    listing = gp("list")
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split() == ["ID", "PROJECT", "NAME", "TEMPLATE", "FLAVOR", "GPUS", "STATE", "CREATED"]
    assert [r.split()[:3] for r in rows] == [[str(ids[1]), "acme-vision", "second"], [str(ids[0]), "acme-vision", "first"]]

    status = gp("status", str(ids[0]))
    assert status.returncode == 0, status.stderr
    assert f"request    {ids[0]}  acme-vision/first" in status.stdout
    assert "state      approved" in status.stdout and "timeline:" in status.stdout
    detail = json.loads(gp("status", str(ids[0]), "--output", "json").stdout)
    assert detail["id"] == ids[0] and detail["timeline"]

    cancel = gp("cancel", str(ids[0]), "--reason", "not needed")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.strip() == f"request {ids[0]} (acme-vision/first) cancelled"
    assert WorkloadRequest.objects.get(pk=ids[0]).state == S.CANCELLED
    again = gp("cancel", str(ids[0]))
    assert again.returncode == 2 and "HTTP 4" in again.stderr
    assert gp("cancel", "999999").returncode == 2
    assert gp("wait", str(ids[0])).returncode == 1  # cancelled: ended otherwise

    live = json.loads(gp("list", "--state", "approved", "--output", "json").stdout)
    assert [r["id"] for r in live] == [ids[1]]
    assert json.loads(gp("list", "--project", "acme-nlp", "-o", "json").stdout) == []

    templates = gp("templates")
    assert templates.returncode == 0 and templates.stdout.split()[:6] == ["SLUG", "VERSION", "KIND", "NAME", "GPUS", "FLAVORS"]
    assert {t["slug"] for t in json.loads(gp("templates", "-o", "json").stdout)} == {"notebook", "training", "inference",
                                                                                     "batch-inference"}
    flavors = gp("flavors")
    assert flavors.returncode == 0 and "h100" in flavors.stdout.split()
    assert {f["name"] for f in json.loads(gp("flavors", "-o", "json").stdout)} == {"h100", "a100-1g.10gb", "cpu"}


def test_stop_and_cancel_force_end_a_running_request(gp, cast, cat) -> None:
    ids = [int(gp("submit", *TRAIN, "--name", name, "-q").stdout) for name in ("one", "two")]
    for pk in ids:
        req = WorkloadRequest.objects.get(pk=pk)
        move(req, to=S.QUEUED, actor_label="cluster", reason="created")
        move(WorkloadRequest.objects.get(pk=pk), to=S.RUNNING, actor_label="cluster", reason="started")

    refused = gp("cancel", str(ids[0]))
    assert refused.returncode == 2 and "HTTP 409" in refused.stderr
    assert f"gpuportal stop {ids[0]}" in refused.stderr and "cancel --force" in refused.stderr
    assert WorkloadRequest.objects.get(pk=ids[0]).state == S.RUNNING

    stop = gp("stop", str(ids[0]), "--reason", "done early")
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout.strip() == f"request {ids[0]} (acme-vision/one) stopped"
    assert "done early" in WorkloadRequest.objects.get(pk=ids[0]).state_reason
    assert gp("stop", str(ids[0])).returncode == 2  # already ended

    forced = gp("cancel", str(ids[1]), "--force", "-o", "json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["state"] == "stopped"
    assert WorkloadRequest.objects.get(pk=ids[1]).state == S.STOPPED
    waiting = int(gp("submit", *TRAIN, "--name", "three", "-q").stdout)  # not running: --force cancels it
    assert gp("cancel", str(waiting), "-f").stdout.strip().endswith("cancelled")


def test_a_portal_url_without_a_scheme_exits_2_at_once(gp, cli_env, live_server) -> None:
    host = live_server.url.removeprefix("http://")
    started = time.monotonic()
    run = gp("list", env={"PORTAL_URL": host})
    assert run.returncode == 2, run.stderr
    assert time.monotonic() - started < 10 and "retrying" not in run.stderr
    assert f"PORTAL_URL '{host}' is not a URL" in run.stderr and f"e.g. https://{host}" in run.stderr
    login = gp("login", "--url", "gpu.example.org", "--token", "gpp_x", env={"PORTAL_URL": None})
    assert login.returncode == 2 and "--url 'gpu.example.org' is not a URL" in login.stderr
    assert not _config(cli_env).exists()


def test_an_unreachable_portal_exits_4(gp, closed_port) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    run = gp("--retries", "1", "status", "1", env={"PORTAL_URL": url})
    assert run.returncode == 4
    assert "retrying in 1s" in run.stderr and f"Could not reach the portal: GET {url}/api/v1/requests/1/" in run.stderr
    for args in (("submit", *TRAIN), ("wait", "1"), ("list",), ("logs", "1"), ("login", "--url", url, "--token", "x")):
        assert gp(*args, env={"PORTAL_URL": url, "GPUPORTAL_RETRIES": "0"}).returncode == 4, args


def test_the_client_is_http_only(cli_env) -> None:
    """No Django (nor anything of the portal) in the client: it installs on any CI runner."""
    code = ("import sys, gpuportal_cli.main; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'django', 'rest_framework', 'portal', 'workloads', "
            "'tenants', 'quotas', 'sandbox', 'kubernetes'}))")
    run = subprocess.run([sys.executable, "-c", code], env=cli_env, capture_output=True, text=True, timeout=60, cwd="/", check=False)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr


def test_help_and_shell_completion(gp) -> None:
    run = gp("--help")
    assert run.returncode == 0
    for command in ("login", "submit", "wait", "status", "logs", "cancel", "stop", "list", "templates", "flavors"):
        assert command in run.stdout
    assert "`stop` ends a running one" in " ".join(run.stdout.split())  # however the terminal wraps it
    cancel = " ".join(gp("cancel", "--help").stdout.split())
    assert "--force" in cancel and "gpuportal stop ID" in cancel
    # Typer detects the calling shell from the parent processes (which differ under pytest-xdist); its own switch
    # turns detection off so that the shell is the argument given, whatever runs the test.
    completion = gp("--show-completion", "bash", env={"SHELL": "/bin/bash", "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert completion.returncode == 0 and "_GPUPORTAL_COMPLETE" in completion.stdout


def test_client_list_follows_the_cursor(live_server, token, cast, cat) -> None:
    """The request list pages by cursor: the client follows ``next`` and gets every request once."""
    from gpuportal_cli.client import Client

    from ..workloads.factories import make_request

    made = [make_request(cat, cast.vision, cast.carol).pk for _ in range(7)]
    client = Client(live_server.url, token, retries=0)
    listed = [row["id"] for row in client.list("/api/v1/requests/", {"page_size": 2}, limit=100)]
    assert listed == sorted(made, reverse=True)  # newest first, none twice
    assert [row["id"] for row in client.list("/api/v1/requests/", {"page_size": 2}, limit=3)] == listed[:3]

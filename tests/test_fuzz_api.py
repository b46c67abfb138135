"""Schemathesis fuzzes every operation of /api/schema/ over real HTTP (live server, PostgreSQL).

Every check schemathesis offers runs (``--checks all``): no 5xx, only documented status codes,
content types and headers, bodies that match the response schemas, invalid input refused and valid
input accepted. Twice: as a CI pipeline (carol's read+submit token on acme-vision) and as platform
ops in a browser session (cookie + CSRF header); the token run with DEBUG on, as ``make run`` serves the
API, the ops run with DEBUG off, as production does. Fixed seed, deterministic generation and a bounded
number of examples per operation keep it reproducible and within a few minutes on two cores.

A failure prints schemathesis' report: each failing operation with a curl line to reproduce it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

from tenants.services import token_create

from .workloads.factories import make_catalogue, make_request

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(1800)]

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
SEED = "20261201"
CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_EXAMPLES = os.environ.get("FUZZ_MAX_EXAMPLES", "5")
# The coverage phase (boundary values of every parameter, ~3,000 cases a run, ~7 minutes) is left to
# FUZZ_PHASES=examples,coverage,fuzzing runs; CI runs examples and fuzzing.
PHASES = os.environ.get("FUZZ_PHASES", "examples,fuzzing")
CSRF = "fuzzcsrftokenfuzzcsrftokenfuzz12"  # 32 characters: Django takes it as an unmasked secret


def _world(cast: Any) -> dict[str, Any]:
    """Objects for the operations to find: the catalogue, requests in several states, a quota request."""
    from quotas.models import QuotaRequest

    cat = make_catalogue(cast)
    for state in ["pending_approval", "running", "queued", "succeeded"]:
        make_request(cat, cast.vision, cast.carol, state=state)
    QuotaRequest.objects.create(
        project=cast.vision, flavor=cat.h100, resource="nvidia.com/gpu", amount=2, reason="more", requested_by=cast.carol, approver="project_admin",
    )
    return {"cat": cat}


def _session_for(user: Any) -> str:
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]  # a backend the portal uses, or nobody is signed in
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


def _schema(live_server: Any, tmp_path: Path, headers: list[str]) -> Path:
    """The schema as the live server serves it, read once here: on a busy machine its generation can take longer
    than schemathesis' 10 s for loading a schema (the run would end before its first case)."""
    request = urllib.request.Request(f"{live_server.url}/api/schema/?format=json")
    for header in headers:
        name, value = header.split(": ", 1)
        request.add_header(name, value)
    with urllib.request.urlopen(request, timeout=120) as response:
        path = tmp_path / "schema.json"
        path.write_bytes(response.read())
    return path


def _fuzz(live_server: Any, tmp_path: Path, headers: list[str]) -> subprocess.CompletedProcess[str]:
    command = [
        str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", str(_schema(live_server, tmp_path, headers)),
        "--url", live_server.url,
        "--checks", "all",
        "--phases", PHASES,
        "--max-examples", MAX_EXAMPLES,
        "--seed", SEED,
        "--generation-deterministic",
        "--generation-with-security-parameters", "false",
        "--workers", "1",
        "--request-timeout", "30",
        "--no-color",
        "--output-truncate", "true",
        "--report-dir", str(tmp_path),
    ]
    for header in headers:
        command += ["--header", header]
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=1500, check=False)


def _assert_clean(run: subprocess.CompletedProcess[str]) -> None:
    # The summary (failures per check code: ST105 content type, ST108 response schema, ST202 valid data refused,
    # ...) first, then the report's tail with a curl line per failing case.
    summary = run.stdout[run.stdout.rfind("Failures:"):run.stdout.rfind("Warnings:")] if "Failures:" in run.stdout else ""
    assert run.returncode == 0, summary + "\n" + run.stdout[-60000:] + run.stderr[-5000:]


@pytest.fixture
def world(cast):
    return _world(cast)


def test_fuzz_with_a_project_token(live_server, cast, world, tmp_path, settings) -> None:
    # As `make run` serves it (DEBUG on: a 404 or an error under /api/ must still be the API's JSON, not a debug page);
    # the ops run below sees the production settings.
    settings.DEBUG = True
    _, raw = token_create(actor=cast.actor("carol"), project=cast.vision, name="fuzz", scope="read+submit")
    _assert_clean(_fuzz(live_server, tmp_path, [f"Authorization: Bearer {raw}"]))


def test_fuzz_as_ops_in_a_session(live_server, cast, world, tmp_path) -> None:
    session = _session_for(cast.ops)
    headers = [f"Cookie: sessionid={session}; csrftoken={CSRF}", f"X-CSRFToken: {CSRF}", f"Referer: {live_server.url}/"]
    _assert_clean(_fuzz(live_server, tmp_path, headers))


def test_schemathesis_is_installed() -> None:
    assert SCHEMATHESIS.exists() or shutil.which("schemathesis")

"""``gpuportal`` and the portal's rate limits, against the live server with a low rate: on a 429 it waits what
Retry-After says (and says so on stderr), then goes on; a wait longer than it accepts ends at once with exit 4.
"""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from workloads.models import RequestState, WorkloadRequest
from workloads.states import move

from ..workloads.factories import make_request

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_429_waits_for_retry_after_then_goes_on(gp, cast, cat, settings) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.QUEUED)
    settings.API_RATE_USER = "1/s"
    started = time.monotonic()
    # `wait` looks again every 0.05-0.3 s: it runs into the limit of one call a second at once.
    waiting = gp("wait", str(req.pk), "--until", "running", "--timeout", "30", background=True,
                 env={"GPUPORTAL_POLL_INTERVAL": "0.05"})
    told = waiting.stderr.readline()  # progress goes to stdout: the first line on stderr is the 429
    assert told == "portal: HTTP 429: too many requests; waiting 1s as its Retry-After asks, then retrying\n"
    assert waiting.poll() is None  # it waits, it has not given up
    move(req, to=S.RUNNING, actor_label="cluster", reason="Its pods run.")
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, told + err
    assert "retrying in" not in err  # no guessed backoff: the portal said how long
    assert out.rstrip().endswith(f"request {req.pk} running")
    assert time.monotonic() - started < 25


def test_a_retry_after_longer_than_the_client_waits_ends_at_once(gp, cast, cat, token, settings) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.QUEUED)
    settings.API_RATE_USER = "1/day"
    pipeline = APIClient()
    pipeline.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert pipeline.get(f"/api/v1/requests/{req.pk}/").status_code == 200  # the day's one request
    throttled = pipeline.get(f"/api/v1/requests/{req.pk}/")
    assert throttled.status_code == 429 and int(throttled["Retry-After"]) > 120

    started = time.monotonic()
    run = gp("status", str(req.pk))
    assert run.returncode == 4, run.stderr
    assert "the portal asks to wait" in run.stderr and "more than the 120s this client waits" in run.stderr
    assert time.monotonic() - started < 15  # it did not sleep through the retries

    longer = gp("status", str(req.pk), env={"GPUPORTAL_MAX_RETRY_AFTER": "5"})
    assert longer.returncode == 4 and "more than the 5s this client waits" in longer.stderr
    assert WorkloadRequest.objects.get(pk=req.pk).state == S.QUEUED

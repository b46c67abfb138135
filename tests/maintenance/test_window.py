"""Running work in the maintenance window, against the sandbox cluster: a job that ends before the deadline lets
the change go on by itself; one still running at the deadline is stopped and its owner told."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from maintenance import services
from maintenance.models import MigChange
from quotas.models import Flavor
from tenants.access import Actor
from workloads import services as requests
from workloads.catalogue import seed_catalogue
from workloads.materialize import request_act, request_materialize
from workloads.models import RequestState, ServiceTemplate, WorkloadRequest
from workloads.status import requests_sync

from .conftest import drive

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(240)]
S = MigChange.Status
R = RequestState


def _running_job(cast: Any, demo: Any) -> WorkloadRequest:
    seed_catalogue()
    flavor = Flavor.objects.get(cluster=demo.cluster, mig_profile="1g.10gb")
    template = ServiceTemplate.objects.get(slug="training")
    template.allowed_flavors.add(flavor)
    req = requests.request_submit(actor=cast.actor("carol"), project=cast.vision, template=template,
                                  image="nvcr.io/nvidia/pytorch:26.10-py3", flavor=flavor,
                                  parameters={"command": "python train.py"}, gpus=1, duration_hours=1)
    if req.state == R.PENDING_APPROVAL:
        req = requests.request_approve(actor=cast.actor("bob"), request=req, comment="ok")
    request_materialize(request_id=req.pk)
    deadline = time.monotonic() + 60
    while True:
        requests_sync(cluster=demo.cluster, watch_seconds=1)
        req.refresh_from_db()
        if req.state == R.RUNNING:
            return req
        assert time.monotonic() < deadline, (req.state, req.state_reason, req.pending_reason)
        demo.sb.advance(5)


def _pods_on_a100(demo: Any) -> list[str]:
    return [p["spec"].get("nodeName") for p in demo.sb.store.list("v1", "Pod", None)["items"]
            if (p["spec"].get("nodeName") or "").startswith("gpu-a100-mig-") and p["status"].get("phase") == "Running"]


def test_running_work_shown_in_the_impact_finishes_inside_the_window(cast, ops2, demo) -> None:
    job = _running_job(cast, demo)
    assert _pods_on_a100(demo)
    now = timezone.now()
    change = services.mig_change_propose(actor=cast.actor("ops"), pool=demo.pool, to_layout="all-3g.40gb",
                                         window_start=now - timedelta(seconds=1), deadline=now + timedelta(hours=2))
    running = change.impact["running"]
    assert [(r["id"], r["owner"], r["state"]) for r in running] == [(job.pk, "carol", "running")]
    services.mig_change_approve(actor=Actor(user=ops2), change=change)

    def follow() -> None:  # the job runs for an hour of the sandbox's time; the status follower sees it end
        demo.sb.advance(600)
        requests_sync(cluster=demo.cluster, watch_seconds=1)

    change = drive(demo.sb, change, lambda c: c.step in ("relabel", "reconfigure") or c.status not in (S.RUNNING, S.APPROVED), between=follow, timeout=90)
    job.refresh_from_db()
    assert job.state == R.SUCCEEDED  # it ran to its end: nobody stopped it
    waited = change.steps.filter(step="drain", outcome="progress").first()
    assert waited is not None and waited.detail["requests"] == [job.pk]
    change = drive(demo.sb, change, lambda c: c.status in ("succeeded", "rolled_back", "failed"))
    assert change.status == S.SUCCEEDED, change.status_reason


def test_work_still_running_at_the_deadline_is_stopped_and_its_owner_told(
        cast, ops2, demo, django_capture_on_commit_callbacks) -> None:
    job = _running_job(cast, demo)
    now = timezone.now()
    change = services.mig_change_propose(actor=cast.actor("ops"), pool=demo.pool, to_layout="all-3g.40gb",
                                         window_start=now - timedelta(minutes=1), deadline=now - timedelta(seconds=1))
    services.mig_change_approve(actor=Actor(user=ops2), change=change)

    def worker() -> None:  # what the workloads worker does for a stopped request: remove its objects
        job.refresh_from_db()
        if job.state == R.STOPPED:
            request_act(request_id=job.pk, action="stop")

    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        change = drive(demo.sb, change, lambda c: c.status in ("succeeded", "rolled_back", "failed"), between=worker,
                       timeout=90)
    assert change.status == S.SUCCEEDED, change.status_reason
    job.refresh_from_db()
    assert job.state == R.STOPPED and f"MIG change #{change.pk}" in job.state_reason
    stopped = change.steps.get(step="drain", outcome="info")
    assert stopped.detail == {"stopped": [job.pk]} and "deadline passed" in stopped.message
    told = [m for m in mail.outbox if "stopped for maintenance" in m.subject]
    assert [m.to for m in told] == [[cast.carol.email]] and change.to_layout in told[0].body

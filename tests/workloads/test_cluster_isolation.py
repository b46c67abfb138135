"""The status follower against several clusters, and what happens to finished Jobs (the sandbox cluster).

One cluster whose kubeconfig is missing, one whose kubeconfig is garbage, and the sandbox: a sync of every
cluster (the beat task) still moves the sandbox's requests along, and the broken ones are shown unhealthy
with their error on the ops pages and in the cluster API. Materialization runs in the test (no worker).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core.cache import cache

from quotas.models import Cluster
from workloads.manifests import REQUEST_LABEL
from workloads.materialize import request_materialize
from workloads.models import RequestState, WorkloadRequest
from workloads.status import requests_sync
from workloads.tasks import requests_sync_task

from .test_lifecycle import World, _world

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]


@pytest.fixture
def world(fresh_sandbox, cast) -> World:
    return _world(fresh_sandbox, cast, architecture="B")


def wait(world: World, req: WorkloadRequest, states: set[str], *, advance: float, sync: Any, timeout: float = 40) -> WorkloadRequest:
    deadline = time.monotonic() + timeout
    while True:
        req.refresh_from_db()
        if req.state in states:
            return req
        assert time.monotonic() < deadline, f"request {req.pk} stuck in {req.state}: {req.state_reason} {req.cluster_status}"
        world.sandbox.advance(advance)
        sync()


def test_one_broken_cluster_does_not_stop_the_others(world: World, tmp_path, api, as_user) -> None:
    # Sorted by name, both broken clusters come before the sandbox's ("sandbox-b").
    missing = Cluster.objects.create(name="broken-path", architecture="B", kubeconfig_path=str(tmp_path / "gone.yaml"))
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("this: is\nnot: a kubeconfig\n")
    invalid = Cluster.objects.create(name="broken-config", architecture="B", kubeconfig_path=str(garbage))

    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    assert request_materialize(request_id=req.pk) == "queued"

    def sync_all() -> None:
        cache.clear()  # the per-cluster locks: each call is a new beat run
        out = requests_sync_task.apply().get()
        assert "sandbox-b" in out and "broken-path" not in out

    req = wait(world, req, {S.RUNNING}, advance=5, sync=sync_all)

    missing.refresh_from_db()
    invalid.refresh_from_db()
    world.cluster.refresh_from_db()
    assert missing.health == "unhealthy" and "FileNotFoundError" in missing.last_error and "gone.yaml" in missing.last_error
    assert missing.last_seen_at is None
    assert invalid.health == "unhealthy" and invalid.last_error
    assert world.cluster.health == "healthy" and world.cluster.last_error == "" and world.cluster.last_seen_at is not None

    # Shown to ops: the capacity page (every cluster's banner), the cluster page, the API.
    page = as_user("ops").get("/ops/capacity/?cluster=sandbox-b").content.decode()
    assert "Cluster broken-path is unhealthy" in page and "FileNotFoundError" in page
    detail = as_user("ops").get("/ops/clusters/broken-path/")
    assert detail.status_code == 200 and "Unhealthy" in detail.content.decode()
    body = api("ops").get(f"/api/v1/clusters/{missing.pk}/").json()
    assert body["health"] == "unhealthy" and "FileNotFoundError" in body["last_error"]
    assert api("ops").get(f"/api/v1/clusters/{world.cluster.pk}/").json()["health"] == "healthy"

    # Repaired: the next cycle marks it healthy again.
    Cluster.objects.filter(pk=missing.pk).update(kubeconfig_path=str(world.sandbox.kubeconfig))
    requests_sync(cluster=Cluster.objects.get(pk=missing.pk))
    missing.refresh_from_db()
    assert missing.health == "healthy" and missing.last_error == ""


def test_a_finished_job_removed_by_its_ttl_keeps_its_success(world: World, settings) -> None:
    settings.WORKLOADS_JOB_TTL_SECONDS = 60
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    assert request_materialize(request_id=req.pk) == "queued"
    job = world.sandbox.store.get("batch/v1", "Job", req.k8s_name, req.project.namespace)
    assert job["spec"]["ttlSecondsAfterFinished"] == 60
    req = wait(world, req, {S.RUNNING}, advance=5, sync=world.sync)
    # The job ends (its simulated hour) and the TTL passes before the follower looks again: the DELETED event
    # carries the finished Job, whose outcome counts.
    world.sandbox.advance(3600)
    world.sandbox.advance(120)
    req = wait(world, req, {S.SUCCEEDED, S.FAILED}, advance=30, sync=world.sync)
    assert req.state == S.SUCCEEDED, req.state_reason
    gone = world.sandbox.store.list("batch/v1", "Job", req.project.namespace, label_selector=f"{REQUEST_LABEL}={req.pk}")
    assert gone["items"] == []  # the sandbox's TTL controller removed it
    # Later cycles, a full re-list included, leave the finished request alone: the portal keeps the record.
    for _ in range(3):
        world.sandbox.advance(30)
        world.sync()
    cache.clear()
    world.sync()
    req.refresh_from_db()
    assert req.state == S.SUCCEEDED and req.finished_at is not None
    assert WorkloadRequest.objects.filter(pk=req.pk).exists()


def test_a_running_job_deleted_outside_the_portal_still_fails(world: World) -> None:
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    assert request_materialize(request_id=req.pk) == "queued"
    req = wait(world, req, {S.RUNNING}, advance=5, sync=world.sync)
    world.kube().delete("batch/v1", "Job", req.k8s_name, req.project.namespace)
    req = wait(world, req, {S.FAILED}, advance=1, sync=world.sync)
    assert "deleted outside the portal" in req.state_reason

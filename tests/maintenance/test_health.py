"""The ops health view (maintenance/health.py) end to end against the sandbox: a training job runs on an H100 whose
profile raises XID 79 after ten minutes; the page reads the XID from the sandbox's Prometheus, flags the GPU and lists
the request with its owner; ops cordon the node with a reason (the sandbox's node becomes unschedulable, one audit
entry), then uncordon it. Everyone else gets a 404. GFD facts are read from the labels inventory sync stored."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core.cache import cache

from maintenance.health import gpu_facts
from quotas.inventory import inventory_sync
from quotas.models import Node
from tenants.models import AuditEntry
from workloads.models import RequestState

from ..insights.test_admitted_at import run, submit
from ..workloads.test_lifecycle import World, _world

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]


@pytest.fixture
def world(fresh_sandbox, cast, settings) -> World:
    fresh_sandbox.clock.speed = 0
    fresh_sandbox.dcgm.by_kind["training"] = "xid"  # the profile's usage.byKind: training pods raise XID 79
    settings.PROMETHEUS_URL = f"{fresh_sandbox.http_url}/prometheus"
    cache.clear()
    return _world(fresh_sandbox, cast, architecture="B")


def text(response: Any) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def test_gfd_labels_give_model_count_mig_layout_driver_and_cuda() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "nvidia.com/gpu.count": "8",
              "nvidia.com/gpu.memory": "81920", "nvidia.com/mig.config": "all-balanced",
              "nvidia.com/mig.config.state": "success", "nvidia.com/cuda.driver.major": "535",
              "nvidia.com/cuda.driver.minor": "161", "nvidia.com/cuda.driver.rev": "08",
              "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "2"}
    facts = gpu_facts(labels, {"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-3g.40gb": "8", "cpu": "96"})
    assert facts == {"product": "NVIDIA-A100-SXM4-80GB", "count": 8, "memory_gib": 80, "mig_config": "all-balanced",
                     "mig_state": "success", "mig_slices": {"1g.10gb": 16, "3g.40gb": 8}, "driver": "535.161.08",
                     "cuda": "12.2"}
    newer = gpu_facts({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/cuda.driver-version.full": "550.127.08",
                       "nvidia.com/cuda.runtime-version.full": "12.4", "nvidia.com/mig.config": "all-disabled"}, {})
    assert (newer["driver"], newer["cuda"], newer["mig_config"], newer["count"]) == ("550.127.08", "12.4", "", None)


def test_xid_flags_the_gpu_lists_the_request_and_ops_cordon_the_node(world: World, as_user) -> None:
    sb, cast = world.sandbox, world.cast
    req = submit(world, "carol", "training", 1, duration_hours=2)
    req = run(world, req, lambda r: r.state == S.RUNNING, advance=5)
    pod = next(p for p in sb.store.list("v1", "Pod")["items"]
               if p["metadata"].get("labels", {}).get("gpuportal.dev/request") == str(req.pk))
    node_name = pod["spec"]["nodeName"]

    ops = as_user("ops")
    before = ops.get("/ops/health/")
    assert before.status_code == 200 and "GPUs with XID errors" not in text(before)
    assert "570.172.08" in text(before) and "12.8" in text(before) and "whole GPUs" in text(before)  # GFD driver label, from the inventory

    sb.advance(660)  # the xid profile raises XID 79 after ten minutes of running
    cache.clear()  # the page remembers a read for a minute
    page = text(ops.get("/ops/health/"))
    assert "GPUs with XID errors: 1" in page and "XID 79" in page and "GPU has fallen off the bus" in page
    flagged = page.split("GPUs with XID errors")[1]
    assert f"{world.cluster.name} / {node_name}" in flagged and f"#{req.pk}" in flagged and "carol" in flagged

    # not ops: no such page
    assert as_user("alice").get("/ops/health/").status_code == 404
    assert as_user("carol").post(f"/ops/health/{world.cluster.name}/{node_name}/", {"action": "cordon", "reason": "x"}
                                 ).status_code == 404
    assert not sb.store.get("v1", "Node", node_name).get("spec", {}).get("unschedulable")

    ops = as_user("ops")  # one test client: log ops back in
    url = f"/ops/health/{world.cluster.name}/{node_name}/"
    detail = text(ops.get(url))
    assert f"#{req.pk}" in detail and "carol" in detail and "XID 79" in detail
    refused = ops.post(url, {"action": "cordon", "reason": "  "})
    assert refused.status_code == 400 and "Say why the node is cordoned" in text(refused)
    assert not sb.store.get("v1", "Node", node_name).get("spec", {}).get("unschedulable")
    assert not AuditEntry.objects.filter(action="node.cordon").exists()

    done = ops.post(url, {"action": "cordon", "reason": "XID 79 on GPU 0: RMA ticket 4711"}, follow=True)
    assert "is cordoned" in text(done) and "RMA ticket 4711" in text(done)
    assert sb.store.get("v1", "Node", node_name)["spec"]["unschedulable"] is True
    entry = AuditEntry.objects.get(action="node.cordon")
    assert entry.actor == cast.ops and entry.after["reason"] == "XID 79 on GPU 0: RMA ticket 4711"
    assert entry.before == {"unschedulable": False, "cordon_reason": ""} and entry.target_repr == node_name
    node = Node.objects.get(cluster=world.cluster, name=node_name)
    assert node.unschedulable and node.cordon_reason.startswith("XID 79")
    inventory_sync(world.cluster)  # the next sync reads the cordon back from the cluster and keeps the reason
    node.refresh_from_db()
    assert node.unschedulable and node.cordon_reason.startswith("XID 79")

    ops.post(url, {"action": "uncordon", "reason": ""})
    assert not sb.store.get("v1", "Node", node_name)["spec"].get("unschedulable")
    assert AuditEntry.objects.filter(action="node.uncordon").count() == 1
    node.refresh_from_db()
    assert not node.unschedulable and node.cordon_reason == ""

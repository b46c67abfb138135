"""Clock, node profile (GFD labels, capacity) and the MIG reconfiguration label flow."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from sandbox.clock import Clock
from sandbox.controllers import resources as R
from sandbox.controllers.sim import GPU_TOLERATION, Sim
from sandbox.profile import ProfileError, build_nodes, load_profile, mig_layout, validate_profile

START = datetime(2026, 1, 1, tzinfo=UTC)


# ------------------------------------------------------------------------------------------------ clock
def test_clock_frozen_and_advance():
    c = Clock(speed=0, start=START)
    assert c.now() == START
    c.advance(90)
    assert c.timestamp() == "2026-01-01T00:01:30Z"
    with pytest.raises(ValueError):
        c.advance(-1)


def test_clock_speed_scales_real_time():
    c = Clock(speed=3600, start=START)
    time.sleep(0.05)
    elapsed = (c.now() - START).total_seconds()
    assert 150 <= elapsed <= 3600  # 0.05 s real x 3600 = 180 s simulated (generous bounds for slow machines)
    c.speed = 0
    frozen = c.now()
    time.sleep(0.01)
    assert c.now() == frozen
    c.advance(10)
    assert (c.now() - frozen).total_seconds() == 10


# ------------------------------------------------------------------------------------------------ profile
@pytest.fixture(scope="module")
def nodes() -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in build_nodes(load_profile(None))}


def test_demo_profile_shape(nodes):
    assert sorted(nodes) == ["cpu-0", "cpu-1", "gpu-a100-mig-0", "gpu-a100-mig-1", "gpu-h100-0", "gpu-h100-1", "gpu-h100-2",
                             "gpu-h100-3", "gpu-l40s-hami-0", "gpu-l40s-hami-1"]
    pools = {n: v["metadata"]["labels"].get("gpuportal.dev/pool") for n, v in nodes.items()}
    assert pools["cpu-0"] is None and "nvidia.com/gpu.present" not in nodes["cpu-0"]["metadata"]["labels"]
    assert pools["gpu-h100-0"] == "online" and pools["gpu-h100-1"] == "offline"
    for n in nodes.values():
        labels = n["metadata"]["labels"]
        assert labels["kubernetes.io/hostname"] == n["metadata"]["name"]
        assert labels["node.kubernetes.io/instance-type"]
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
        assert {"cpu", "memory", "pods"} <= set(n["status"]["allocatable"])


def test_whole_gpu_node(nodes):
    n = nodes["gpu-h100-1"]
    labels = n["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "8" and labels["nvidia.com/gpu.memory"] == "81559"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in n["spec"]["taints"]


def test_mig_mixed_node(nodes):
    n = nodes["gpu-a100-mig-0"]
    labels = n["metadata"]["labels"]
    alloc = n["status"]["allocatable"]
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig.config"] == "all-balanced"
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "16" and labels["nvidia.com/mig-3g.40gb.count"] == "8"
    assert labels["nvidia.com/mig-2g.20gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-2g.20gb"
    assert alloc["nvidia.com/mig-1g.10gb"] == "16" and alloc["nvidia.com/mig-2g.20gb"] == "8"
    assert alloc["nvidia.com/mig-3g.40gb"] == "8"
    assert "nvidia.com/gpu" not in alloc  # every GPU is partitioned
    assert labels["nvidia.com/gpu.deploy.mig-manager"] == "true"


def test_hami_node(nodes):
    n = nodes["gpu-l40s-hami-0"]
    assert n["metadata"]["labels"]["gpu"] == "on"
    assert n["status"]["allocatable"]["nvidia.com/gpu"] == "40"  # 4 cards x split 10
    assert "nvidia.com/gpumem" not in n["status"]["allocatable"]
    assert "hami.io/node-nvidia-register" in n["metadata"]["annotations"]


def test_mig_layouts():
    assert mig_layout("A100-80GB", "all-1g.10gb", 2) == [{"1g.10gb": 7}, {"1g.10gb": 7}]
    assert mig_layout("A100-80GB", "all-disabled", 1) == [None]
    assert mig_layout("A100-80GB", "all-7g.80gb", 1) == [{"7g.80gb": 1}]
    assert mig_layout("A100-80GB", {"3g.40gb": 2, "1g.10gb": 1}, 1) is None  # 7 compute slices max
    assert mig_layout("A100-80GB", "all-9g.99gb", 1) is None
    assert mig_layout("L40S", "all-balanced", 4) is None
    with pytest.raises(ProfileError):
        validate_profile({"nodeGroups": [{"name": "x", "gpu": {"model": "L40S", "sharing": "mig"}}]})
    with pytest.raises(ProfileError):
        validate_profile({"nodeGroups": [{"name": "x", "gpu": {"model": "TPU"}}]})


def test_resource_math():
    spec = {"containers": [Sim.container({"cpu": "500m", "memory": "1Gi"}), Sim.container({"cpu": 1})],
            "initContainers": [Sim.container({"cpu": 4})], "overhead": {"memory": "128Mi"}}
    req = R.pod_requests(spec)
    assert req["cpu"] == 4 and R.fmt("memory", req["memory"]) == "1152Mi"
    limits_only = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    assert R.pod_requests(limits_only) == {"nvidia.com/gpu": 2}
    asks = R.hami_container_requests({"containers": [Sim.container({"nvidia.com/gpumem": 3000})]})
    assert asks == [{"name": "main", "nums": 1, "mem": 3000, "mem_pct": None, "cores": 0}]


# ------------------------------------------------------------------------------------------------ MIG flow
def mig_node(sim: Sim, name: str = "gpu-a100-mig-0") -> dict:
    return sim.get("v1", "Node", name)


def test_mig_reconfiguration_success():
    sim = Sim()
    sim.patch("v1", "Node", "gpu-a100-mig-0", None, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}})
    sim.settle()
    n = mig_node(sim)
    assert n["metadata"]["labels"]["nvidia.com/mig.config.state"] == "pending"
    assert n["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change"
    assert n["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "0"
    sim.advance(44)
    assert mig_node(sim)["metadata"]["labels"]["nvidia.com/mig.config.state"] == "pending"
    sim.advance(1)
    n = mig_node(sim)
    labels = n["metadata"]["labels"]
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "56"
    assert "nvidia.com/mig-3g.40gb.count" not in labels
    alloc = n["status"]["allocatable"]
    assert alloc["nvidia.com/mig-1g.10gb"] == "56"
    assert alloc["nvidia.com/mig-3g.40gb"] == "0" and alloc["nvidia.com/mig-2g.20gb"] == "0"
    assert any(e["reason"] == "MIGConfigApplied" for e in sim.events("default"))
    # the other node is untouched
    assert mig_node(sim, "gpu-a100-mig-1")["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "8"


def test_mig_custom_layout_and_disable():
    sim = Sim()
    sim.patch("v1", "Node", "gpu-a100-mig-1", None, {"metadata": {"labels": {"nvidia.com/mig.config": "half-and-half"}}})
    sim.settle()
    sim.advance(45)
    n = mig_node(sim, "gpu-a100-mig-1")
    assert n["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert n["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "28"
    assert n["metadata"]["labels"]["nvidia.com/gpu.count"] == "4"


def test_mig_reconfiguration_unknown_layout_fails():
    sim = Sim()
    sim.patch("v1", "Node", "gpu-a100-mig-0", None, {"metadata": {"labels": {"nvidia.com/mig.config": "all-wrong"}}})
    sim.settle()
    sim.advance(45)
    n = mig_node(sim)
    assert n["metadata"]["labels"]["nvidia.com/mig.config.state"] == "failed"
    assert n["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "8"  # previous layout restored
    ev = [e for e in sim.events("default") if e["reason"] == "MIGConfigFailed"]
    assert ev and ev[0]["type"] == "Warning"
    # setting the label back to the applied layout clears the failure
    sim.patch("v1", "Node", "gpu-a100-mig-0", None, {"metadata": {"labels": {"nvidia.com/mig.config": "all-balanced"}}})
    sim.settle()
    assert mig_node(sim)["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success"


def test_mig_reconfiguration_fails_while_gpus_are_busy():
    sim = Sim()
    sim.namespace("t")
    sim.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "namespace": "t"},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-a100-mig-0"}, "tolerations": [GPU_TOLERATION],
                         "containers": [Sim.container({"nvidia.com/mig-1g.10gb": 1})]}})
    sim.settle()
    sim.advance(2)
    sim.patch("v1", "Node", "gpu-a100-mig-0", None, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}})
    sim.settle()
    sim.advance(45)
    n = mig_node(sim)
    assert n["metadata"]["labels"]["nvidia.com/mig.config.state"] == "failed"
    assert "drain the node first" in [e for e in sim.events("default") if e["reason"] == "MIGConfigFailed"][0]["message"]


def test_pending_mig_change_blocks_new_slices():
    sim = Sim()
    sim.namespace("t")
    for n in ("gpu-a100-mig-0", "gpu-a100-mig-1"):
        sim.patch("v1", "Node", n, None, {"metadata": {"labels": {"nvidia.com/mig.config": "all-3g.40gb"}}})
    sim.settle()
    sim.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slice", "namespace": "t"},
                "spec": {"tolerations": [GPU_TOLERATION], "containers": [Sim.container({"nvidia.com/mig-3g.40gb": 1})]}})
    sim.settle()
    assert not sim.get("v1", "Pod", "slice", "t")["spec"].get("nodeName")
    sim.advance(45)
    assert sim.get("v1", "Pod", "slice", "t")["spec"].get("nodeName", "").startswith("gpu-a100-mig-")


def test_seed_is_idempotent():
    sim = Sim()
    rv = sim.store.resource_version()
    sim.controllers.seed()
    assert sim.store.resource_version() == rv
    assert len(sim.items("v1", "Node")) == 10

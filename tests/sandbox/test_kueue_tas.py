"""Kueue Topology Aware Scheduling in the sandbox: one rack or wait, with Kueue's own words and assignment.

The demo profile's offline H100 nodes: gpu-h100-1 in rack-a1, gpu-h100-2 and gpu-h100-3 in rack-a2 (block-a), 8 GPUs
each; the online gpu-h100-0 (rack-a1) has another pool label, so the offline flavor does not see it.
"""

from __future__ import annotations

import pytest

from sandbox.controllers.sim import GPU_TOLERATION, Sim

KUEUE = "kueue.x-k8s.io/v1beta2"
RACK = "cloud.provider.com/topology-rack"
BLOCK = "cloud.provider.com/topology-block"
OFFLINE = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpuportal.dev/pool": "offline"}


def cond(obj: dict, ctype: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.namespace("t")
    s.create({"apiVersion": KUEUE, "kind": "Topology", "metadata": {"name": "gpu-portal"},
              "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": "kubernetes.io/hostname"}]}})
    flavor = s.flavor("h100", OFFLINE, tolerations=[GPU_TOLERATION])
    flavor["spec"]["topologyName"] = "gpu-portal"
    s.create(flavor)
    s.create(s.cluster_queue("cq", {"h100": {"nvidia.com/gpu": 64, "cpu": 500, "memory": "4Ti"}}))
    s.create(s.local_queue("lq", "t", "cq"))
    return s


def tas_job(sim: Sim, name: str, pods: int, gpus: int, *, level: str = RACK, required: bool = True) -> dict:
    job = sim.job(name, "t", requests={"nvidia.com/gpu": gpus, "cpu": 1, "memory": "1Gi"}, parallelism=pods,
                  queue="lq", tolerations=[GPU_TOLERATION], indexed=True, duration="3600")
    job["spec"]["template"]["spec"]["nodeSelector"] = dict(OFFLINE)
    key = "kueue.x-k8s.io/podset-required-topology" if required else "kueue.x-k8s.io/podset-preferred-topology"
    job["spec"]["template"]["metadata"]["annotations"] = {key: level}
    return sim.create(job)


def workload(sim: Sim, name: str) -> dict:
    return sim.workload_of(sim.get("batch/v1", "Job", name, "t"))


def test_a_job_that_fits_one_rack_is_admitted_there_and_its_pods_run_on_that_racks_hosts(sim):
    tas_job(sim, "fits", pods=2, gpus=8)  # 16 GPUs: only rack-a2 (two nodes) holds them
    sim.settle()
    wl = workload(sim, "fits")
    assert cond(wl, "Admitted")["status"] == "True"
    ta = wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert ta == {"levels": ["kubernetes.io/hostname"], "slices": [{
        "domainCount": 2, "podCounts": {"universal": 1},
        "valuesPerLevel": [{"individual": {"prefix": "gpu-h100-", "roots": ["2", "3"]}}]}]}
    sim.advance(5)
    pods = sim.pods("t")
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["gpu-h100-2", "gpu-h100-3"]
    assert all(not p["spec"].get("schedulingGates") and "kueue.x-k8s.io/tas" not in p["metadata"].get("labels", {})
               for p in pods)


def test_a_job_that_fits_no_single_rack_waits_with_kueues_message_though_the_total_would_do(sim):
    tas_job(sim, "small", pods=1, gpus=8)  # takes one rack-a2 node (best fit: the fullest rack that fits is rack-a1)
    sim.settle()
    small = workload(sim, "small")["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert small["slices"][0]["valuesPerLevel"] == [{"universal": "gpu-h100-1"}]  # rack-a1: the least room that fits
    tas_job(sim, "big", pods=3, gpus=8)  # 24 GPUs: 16 free in all, and no rack has more than 16
    sim.settle()
    wl = workload(sim, "big")
    reserved = cond(wl, "QuotaReserved")
    assert reserved["status"] == "False" and reserved["reason"] == "Pending"
    assert reserved["message"] == ('couldn\'t assign flavors to pod set main: topology "gpu-portal" allows to fit only '
                                   '2 out of 3 pod(s). Total nodes: 3; excluded: resource "nvidia.com/gpu": 1')
    assert sim.get("batch/v1", "Job", "big", "t")["spec"]["suspend"] is True


def test_preferred_spreads_when_no_rack_has_room(sim):
    tas_job(sim, "spread", pods=3, gpus=8, required=False)  # no rack has 3 free nodes: the block holds them
    sim.settle()
    wl = workload(sim, "spread")
    assert cond(wl, "Admitted")["status"] == "True"
    ta = wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert ta["slices"][0]["domainCount"] == 3 and ta["slices"][0]["podCounts"] == {"universal": 1}


def test_a_required_block_admits_what_no_rack_holds(sim):
    tas_job(sim, "block", pods=3, gpus=8, level=BLOCK)
    sim.settle()
    assert cond(workload(sim, "block"), "Admitted")["status"] == "True"


def _mixed_queue(sim: Sim, name: str, groups: list[tuple[list[str], dict[str, dict]]]) -> None:
    """A ClusterQueue of several resource groups: [(covered resources, {flavor: {resource: nominal}})]."""
    rgs = [{"coveredResources": covered, "flavors": [
        {"name": f, "resources": [{"name": r, "nominalQuota": str(quotas.get(r, 0))} for r in covered]}
        for f, quotas in flavors.items()]} for covered, flavors in groups]
    sim.create({"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name},
                "spec": {"namespaceSelector": {}, "resourceGroups": rgs}})
    sim.create(sim.local_queue(f"lq-{name}", "t", name))


def test_a_placed_pod_set_takes_cpu_and_memory_from_its_tas_flavor_only(sim):
    """Kueue v0.17 (tas_flavorassigner.go, checkPodSetAndFlavorMatchForTAS), as the real control plane showed: a pod
    set asking for a rack cannot take its cpu and memory from a flavor without a topology."""
    sim.create(sim.flavor("cpu"))
    _mixed_queue(sim, "split", [(["nvidia.com/gpu"], {"h100": {"nvidia.com/gpu": 64}}),
                                (["cpu", "memory"], {"cpu": {"cpu": 500, "memory": "4Ti"}})])
    job = sim.job("split", "t", requests={"nvidia.com/gpu": 8, "cpu": 1, "memory": "1Gi"}, parallelism=2,
                  queue="lq-split", tolerations=[GPU_TOLERATION], indexed=True, duration="3600")
    job["spec"]["template"]["spec"]["nodeSelector"] = dict(OFFLINE)
    job["spec"]["template"].setdefault("metadata", {})["annotations"] = {
        "kueue.x-k8s.io/podset-required-topology": RACK}
    sim.create(job)
    sim.settle()
    reserved = cond(workload(sim, "split"), "QuotaReserved")
    assert reserved["status"] == "False"
    assert reserved["message"] == ('couldn\'t assign flavors to pod set main: Flavor "cpu" does not support '
                                   'TopologyAwareScheduling')


def test_a_pod_set_that_asks_for_no_topology_skips_a_tas_flavor_in_a_mixed_queue(sim):
    sim.create(sim.flavor("cpu"))
    covered = ["nvidia.com/gpu", "cpu", "memory"]
    _mixed_queue(sim, "mixed", [(covered, {"h100": {"nvidia.com/gpu": 64, "cpu": 500, "memory": "4Ti"},
                                           "cpu": {"cpu": 500, "memory": "4Ti"}})])
    plain = sim.job("plain", "t", requests={"nvidia.com/gpu": 8, "cpu": 1, "memory": "1Gi"}, queue="lq-mixed",
                    tolerations=[GPU_TOLERATION], duration="3600")
    plain["spec"]["template"]["spec"]["nodeSelector"] = dict(OFFLINE)
    sim.create(plain)
    sim.settle()
    reserved = cond(workload(sim, "plain"), "QuotaReserved")
    assert reserved["status"] == "False"
    assert 'Flavor "h100" supports only TopologyAwareScheduling' in reserved["message"], reserved
    # Asking for TAS without a constraint (what the portal renders for a request on a placed flavor) is admitted.
    asks = sim.job("asks", "t", requests={"nvidia.com/gpu": 8, "cpu": 1, "memory": "1Gi"}, queue="lq-mixed",
                   tolerations=[GPU_TOLERATION], duration="3600")
    asks["spec"]["template"]["spec"]["nodeSelector"] = dict(OFFLINE)
    asks["spec"]["template"].setdefault("metadata", {})["annotations"] = {
        "kueue.x-k8s.io/podset-unconstrained-topology": "true"}
    sim.create(asks)
    sim.settle()
    wl = workload(sim, "asks")
    assert cond(wl, "Admitted")["status"] == "True"
    assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == "h100"


def test_an_unconstrained_pod_set_takes_the_node_with_the_least_room_that_holds_it(sim):
    """Kueue v0.17 places an unconstrained pod set by LeastFreeCapacity at the hostname level (TASProfileMixed, on by
    default): the node with the least room that holds it, whichever rack it is in (not the best-fit rack first)."""
    first = sim.job("first", "t", requests={"nvidia.com/gpu": 2, "cpu": 1, "memory": "1Gi"}, queue="lq",
                    tolerations=[GPU_TOLERATION], indexed=True, duration="3600")
    first["spec"]["template"]["spec"]["nodeSelector"] = {**OFFLINE, "kubernetes.io/hostname": "gpu-h100-2"}
    first["spec"]["template"]["metadata"] = {"annotations": {"kueue.x-k8s.io/podset-required-topology": RACK}}
    sim.create(first)  # on gpu-h100-2 (rack-a2): 6 GPUs left there
    sim.settle()
    assert workload(sim, "first")["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]["slices"][0][
        "valuesPerLevel"] == [{"universal": "gpu-h100-2"}]
    job = sim.job("anywhere", "t", requests={"nvidia.com/gpu": 4, "cpu": 1, "memory": "1Gi"}, queue="lq",
                  tolerations=[GPU_TOLERATION], indexed=True, duration="3600")
    job["spec"]["template"]["spec"]["nodeSelector"] = dict(OFFLINE)
    job["spec"]["template"]["metadata"] = {"annotations": {"kueue.x-k8s.io/podset-unconstrained-topology": "true"}}
    sim.create(job)
    sim.settle()
    ta = workload(sim, "anywhere")["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    # rack-a1's gpu-h100-1 has 8 free, rack-a2's gpu-h100-2 6 and gpu-h100-3 8: the least room that holds 4 GPUs
    assert ta["slices"][0]["valuesPerLevel"] == [{"universal": "gpu-h100-2"}]

"""Pod placement on the demo profile: whole GPUs, MIG slices, HAMi shares, taints, affinity, FailedScheduling."""

from __future__ import annotations

from collections import Counter

import pytest

from sandbox.controllers import resources as R
from sandbox.controllers.scheduler import choose_node, fit_error, hami_fit, node_infos, parse_hami_alloc
from sandbox.controllers.sim import GPU_TOLERATION, Sim
from sandbox.profile import build_nodes, load_profile

TOL = [GPU_TOLERATION]


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.namespace("t")
    return s


def pod(name: str, requests: dict, *, tolerations=TOL, node_selector=None, affinity=None, annotations=None,
        scheduler=None) -> dict:
    spec = {"containers": [Sim.container(requests)]}
    if tolerations:
        spec["tolerations"] = tolerations
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity:
        spec["affinity"] = affinity
    if scheduler:
        spec["schedulerName"] = scheduler
    meta = {"name": name, "namespace": "t"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def node_of(sim: Sim, name: str) -> str | None:
    return sim.get("v1", "Pod", name, "t")["spec"].get("nodeName")


def test_whole_gpu_pod_lands_on_offline_h100(sim):
    sim.create(pod("p", {"nvidia.com/gpu": 8, "cpu": 4}))
    sim.settle()
    p = sim.get("v1", "Pod", "p", "t")
    assert p["spec"]["nodeName"] in {"gpu-h100-1", "gpu-h100-2", "gpu-h100-3"}  # h100-0 carries the online taint
    assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in p["status"]["conditions"])
    ev = sim.events("t", "Scheduled")
    assert ev and ev[0]["message"] == f"Successfully assigned t/p to {p['spec']['nodeName']}"
    assert ev[0]["source"]["component"] == "default-scheduler"


def test_online_pool_needs_its_toleration_and_selector(sim):
    tol = TOL + [{"key": "gpuportal.dev/pool", "operator": "Equal", "value": "online", "effect": "NoSchedule"}]
    sim.create(pod("online", {"nvidia.com/gpu": 1}, tolerations=tol,
                   node_selector={"gpuportal.dev/pool": "online", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
    sim.settle()
    assert node_of(sim, "online") == "gpu-h100-0"


def test_mig_slice_pods(sim):
    for i in range(33):
        sim.create(pod(f"m{i:02d}", {"nvidia.com/mig-1g.10gb": 1}))
    sim.create(pod("big-slice", {"nvidia.com/mig-3g.40gb": 2}))
    sim.settle()
    placed = Counter(node_of(sim, f"m{i:02d}") for i in range(33))
    assert placed[None] == 1  # 2 nodes x 8 GPUs x 2 slices = 32 slices of 1g.10gb
    assert set(placed) - {None} == {"gpu-a100-mig-0", "gpu-a100-mig-1"}
    assert node_of(sim, "big-slice").startswith("gpu-a100-mig-")
    left = sim.get("v1", "Pod", "m32", "t")
    c = next(c for c in left["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (c["status"], c["reason"]) == ("False", "Unschedulable")
    assert c["message"] == ("0/10 nodes are available: 1 node(s) had untolerated taint {gpuportal.dev/pool: online}, "
                            "9 Insufficient nvidia.com/mig-1g.10gb.")
    ev = [e for e in sim.events("t", "FailedScheduling") if e["involvedObject"]["name"] == "m32"]
    assert ev and ev[0]["type"] == "Warning" and ev[0]["message"] == c["message"]


def test_hami_pods_share_cards_by_memory_and_cores(sim):
    # 2 nodes x 4 L40S (46068 MiB, 100 cores)
    for i in range(8):
        sim.create(pod(f"h{i:02d}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}))
    sim.settle()
    nodes = Counter(node_of(sim, f"h{i:02d}") for i in range(8))
    assert None not in nodes and set(nodes) <= {"gpu-l40s-hami-0", "gpu-l40s-hami-1"}
    p = sim.get("v1", "Pod", "h00", "t")
    ann = p["metadata"]["annotations"]
    alloc = parse_hami_alloc(ann["hami.io/vgpu-devices-allocated"])
    assert len(alloc) == 1 and len(alloc[0]) == 1 and alloc[0][0][1:] == (20000, 30)
    assert ann["hami.io/vgpu-node"] == p["spec"]["nodeName"]
    # 8 cards x 2 x 20000 MiB fit; a 9th..16th fits too (second share per card); the 17th does not
    for i in range(8, 17):
        sim.create(pod(f"h{i:02d}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}))
    sim.settle()
    assert node_of(sim, "h15") is not None and node_of(sim, "h16") is None
    msg = next(c for c in sim.get("v1", "Pod", "h16", "t")["status"]["conditions"] if c["type"] == "PodScheduled")["message"]
    assert msg == ("0/10 nodes are available: 1 node(s) had untolerated taint {gpuportal.dev/pool: online}, "
                   "2 CardInsufficientMemory, 3 NodeInsufficientDevice, 4 Insufficient nvidia.com/gpu.")


def test_hami_multi_card_and_exclusive(sim):
    sim.create(pod("two", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 10000, "nvidia.com/gpucores": 50}))
    sim.create(pod("five", {"nvidia.com/gpu": 5, "nvidia.com/gpumem": 1000}))  # only 4 cards per node
    sim.settle()
    alloc = parse_hami_alloc(sim.get("v1", "Pod", "two", "t")["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"])
    assert len({u for u, _, _ in alloc[0]}) == 2  # two different physical cards
    assert node_of(sim, "five") is None
    # a whole-card ask (no memory/cores) on a HAMi node needs an unused card
    infos = node_infos(build_nodes(load_profile(None)), [])
    ni = infos["gpu-l40s-hami-0"]
    whole = pod("w", {"nvidia.com/gpu": 1})
    got, why = hami_fit(whole, ni)
    assert why == "" and got[0][0][1:] == (46068, 100)


def test_hami_gputype_annotation():
    infos = node_infos(build_nodes(load_profile(None)), [])
    ni = infos["gpu-l40s-hami-0"]
    p = pod("x", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, annotations={"nvidia.com/use-gputype": "A100"})
    assert hami_fit(p, ni) == (None, "CardTypeMismatch")
    p = pod("x", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, annotations={"nvidia.com/use-gputype": "l40s"})
    assert hami_fit(p, ni)[1] == ""


def test_failed_scheduling_message_like_kube_scheduler(sim):
    sim.create(pod("huge", {"nvidia.com/gpu": 16}, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
    sim.settle()
    p = sim.get("v1", "Pod", "huge", "t")
    c = next(c for c in p["status"]["conditions"] if c["type"] == "PodScheduled")
    assert c["message"] == ("0/10 nodes are available: 1 node(s) had untolerated taint {gpuportal.dev/pool: online}, "
                            "3 Insufficient nvidia.com/gpu, 6 node(s) didn't match Pod's node affinity/selector.")
    assert p["status"]["phase"] == "Pending"
    # the event is not repeated on every pass, only after 30 simulated seconds
    sim.settle()
    ev = [e for e in sim.events("t", "FailedScheduling") if e["involvedObject"]["name"] == "huge"]
    assert len(ev) == 1 and ev[0]["count"] == 1
    sim.advance(31)
    ev = [e for e in sim.events("t", "FailedScheduling") if e["involvedObject"]["name"] == "huge"]
    assert ev[0]["count"] == 2


def test_untolerated_taint_and_node_affinity_terms(sim):
    sim.create(pod("notol", {"nvidia.com/gpu": 1}, tolerations=None))
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L40S"]}]}]}}}
    sim.create(pod("aff", {"cpu": 1}, affinity=aff))
    sim.settle()
    assert node_of(sim, "notol") is None
    msg = next(c for c in sim.get("v1", "Pod", "notol", "t")["status"]["conditions"] if c["type"] == "PodScheduled")["message"]
    assert msg == ("0/10 nodes are available: 2 Insufficient nvidia.com/gpu, "
                   "8 node(s) had untolerated taint {nvidia.com/gpu: present}.")
    assert node_of(sim, "aff").startswith("gpu-l40s-hami-")


def test_cordoned_and_not_ready_nodes_are_skipped(sim):
    for n in sim.items("v1", "Node"):
        if n["metadata"]["name"] != "gpu-h100-3":
            sim.patch("v1", "Node", n["metadata"]["name"], None, {"spec": {"unschedulable": True}})
    sim.create(pod("a", {"nvidia.com/gpu": 1}))
    sim.settle()
    assert node_of(sim, "a") == "gpu-h100-3"
    node = sim.get("v1", "Node", "gpu-h100-3")
    for c in node["status"]["conditions"]:
        if c["type"] == "Ready":
            c["status"] = "False"
    sim.store.update(node, subresource="status")
    sim.create(pod("b", {"nvidia.com/gpu": 1}))
    sim.settle()
    msg = next(c for c in sim.get("v1", "Pod", "b", "t")["status"]["conditions"] if c["type"] == "PodScheduled")["message"]
    assert "9 node(s) were unschedulable" in msg and "{node.kubernetes.io/not-ready: }" in msg


def test_gated_pods_and_foreign_schedulers_are_left_alone(sim):
    p = pod("gated", {"cpu": 1})
    p["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    sim.create(p)
    sim.create(pod("other", {"cpu": 1}, scheduler="my-scheduler"))
    sim.settle()
    assert node_of(sim, "gated") is None and node_of(sim, "other") is None
    assert not sim.events("t", "FailedScheduling")


def test_pure_fit_error_sorting():
    assert fit_error(8, Counter({"Insufficient nvidia.com/gpu": 4, "node(s) didn't match Pod's node affinity/selector": 4})) == \
        "0/8 nodes are available: 4 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node affinity/selector."


def test_choose_node_accounts_requests():
    nodes = build_nodes(load_profile(None))
    bound = [{"metadata": {"name": f"x{i}"}, "spec": {"nodeName": n, "containers": [Sim.container({"nvidia.com/gpu": 8})]},
              "status": {"phase": "Running"}} for i, n in enumerate(["gpu-h100-1", "gpu-h100-2"])]
    infos = node_infos(nodes, bound)
    node, alloc, msg = choose_node(pod("y", {"nvidia.com/gpu": 8}), infos)
    assert node == "gpu-h100-3" and msg == ""
    assert infos["gpu-h100-1"].free[R.GPU] == 0


def test_demo_profile_has_a_cpu_pool_without_gpu_taint_or_labels(sim):
    cpu = [n for n in sim.items("v1", "Node") if not n["metadata"]["name"].startswith("gpu-")]
    assert len(cpu) >= 2
    for n in cpu:
        labels = n["metadata"]["labels"]
        assert not any(k.startswith("nvidia.com/") for k in labels), labels
        assert not any(k.startswith("nvidia.com/") for k in n["status"]["allocatable"])
        assert not n["spec"].get("taints")


def test_plain_cpu_pod_runs_on_a_cpu_node_and_gpu_pods_stay_on_gpu_nodes(sim):
    sim.create(pod("plain", {"cpu": 1, "memory": "1Gi"}, tolerations=None))
    sim.create(pod("gpu", {"nvidia.com/gpu": 1, "cpu": 1}))
    sim.settle()
    sim.advance(30)
    cpu_nodes = {n["metadata"]["name"] for n in sim.items("v1", "Node") if not n["spec"].get("taints")}
    plain = sim.get("v1", "Pod", "plain", "t")
    assert plain["spec"]["nodeName"] in cpu_nodes
    assert plain["status"]["phase"] == "Running"
    gpu = sim.get("v1", "Pod", "gpu", "t")
    assert gpu["spec"]["nodeName"].startswith("gpu-") and gpu["spec"]["nodeName"] not in cpu_nodes
    assert gpu["status"]["phase"] == "Running"

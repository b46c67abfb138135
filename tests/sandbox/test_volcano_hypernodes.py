"""Volcano network-topology-aware scheduling in the sandbox (sandbox/controllers/hypernodes.py): HyperNodes
(``topology.volcano.sh/v1alpha1``; members by exact name, regex or label selector, HyperNodes of HyperNodes) and a
Volcano Job's ``spec.networkTopology`` (hard: within one HyperNode of at most the tier, else it waits and says so;
soft: there if one fits, else anywhere).

The demo profile's H100 nodes a gang may use (gpu-h100-0 carries the online pool's taint): gpu-h100-1 in rack-a1,
gpu-h100-2 and gpu-h100-3 in rack-a2, all in block-a; 8 GPUs each."""

from __future__ import annotations

import pytest

from sandbox.controllers.sim import Sim
from sandbox.store import ApiError

from .test_controllers_volcano import VCJOB, podgroup, vcjob

TOPO = "topology.volcano.sh/v1alpha1"
RACK = "cloud.provider.com/topology-rack"


def hypernode(name: str, tier: int, members: list[dict]) -> dict:
    return {"apiVersion": TOPO, "kind": "HyperNode", "metadata": {"name": name}, "spec": {"tier": tier, "members": members}}


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.namespace("t")
    # Three ways to name members, as upstream's API has them: a label selector, exact names and a regex.
    s.create(hypernode("rack-a1", 1, [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {RACK: "rack-a1"}}}}]))
    s.create(hypernode("rack-a2", 1, [{"type": "Node", "selector": {"exactMatch": {"name": "gpu-h100-2"}}},
                                      {"type": "Node", "selector": {"regexMatch": {"pattern": "^gpu-h100-3$"}}}]))
    s.create(hypernode("block-a", 2, [{"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-a1"}}},
                                      {"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-a2"}}}]))
    return s


def placed(sim: Sim, job: str) -> list[str]:
    return sorted(p["spec"].get("nodeName") or "" for p in sim.pods("t") if p["metadata"]["name"].startswith(f"{job}-"))


def topology_job(name: str, replicas: int, mode: str | None, tier: int | None) -> dict:
    job = vcjob(name, replicas=replicas, gpus=8)
    nt = {}
    if mode:
        nt["mode"] = mode
    if tier is not None:
        nt["highestTierAllowed"] = tier
    job["spec"]["networkTopology"] = nt
    return job


def test_hypernodes_count_their_nodes_and_refuse_a_bad_selector(sim) -> None:
    sim.settle()
    counts = {h["metadata"]["name"]: h["status"]["nodeCount"] for h in sim.items(TOPO, "HyperNode")}
    assert counts == {"rack-a1": 2, "rack-a2": 2, "block-a": 4}
    with pytest.raises(ApiError) as both:
        sim.create(hypernode("bad", 1, [{"type": "Node", "selector": {"exactMatch": {"name": "gpu-h100-1"},
                                                                     "regexMatch": {"pattern": "gpu"}}}]))
    assert "Only one of ExactMatch, RegexMatch, or LabelMatch can be specified" in str(both.value)
    with pytest.raises(ApiError) as none:
        sim.create(hypernode("empty", 1, [{"type": "Node", "selector": {}}]))
    assert "Either ExactMatch or RegexMatch or LabelMatch must be specified" in str(none.value)
    with pytest.raises(ApiError):
        sim.create({"apiVersion": TOPO, "kind": "HyperNode", "metadata": {"name": "no-tier"},
                    "spec": {"members": [{"type": "Node", "selector": {"exactMatch": {"name": "gpu-h100-1"}}}]}})


def test_a_hard_gang_is_placed_within_one_rack_or_waits_saying_how_much_the_emptiest_has(sim) -> None:
    sim.create(topology_job("fits", 2, "hard", 1))
    sim.settle()
    assert podgroup(sim, "fits")["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    assert placed(sim, "fits") == ["gpu-h100-2", "gpu-h100-3"]  # the one rack with room for both

    # A second such gang: 8 GPUs are free (gpu-h100-1), but no rack holds 16; it waits, nothing bound.
    sim.create(topology_job("waits", 2, None, None))  # mode hard and tier 1 by default
    sim.settle()
    assert placed(sim, "waits") == ["", ""]
    un = next(c for c in podgroup(sim, "waits")["status"]["conditions"] if c["type"] == "Unschedulable")
    assert un["status"] == "True" and un["reason"] == "NetworkTopologyUnsatisfied"
    assert un["message"] == ("network topology unsatisfied: the gang of 2 pod(s) needs 16 nvidia.com/gpu within one "
                             "hypernode of tier <= 1; the emptiest, rack-a1 (tier 1), has 8 free and room for 1 pod(s)")
    pod = sim.get("v1", "Pod", "waits-worker-0", "t")
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert cond["status"] == "False" and cond["message"] == un["message"]


def test_a_higher_tier_lets_a_gang_span_racks_and_soft_mode_falls_back_to_anywhere(sim) -> None:
    sim.create(topology_job("rack-only", 3, "hard", 1))
    sim.settle()
    assert placed(sim, "rack-only") == ["", "", ""]  # no rack holds 3 usable nodes
    sim.delete(VCJOB, "Job", "rack-only", "t")
    sim.settle()

    sim.create(topology_job("block", 3, "hard", 2))
    sim.settle()
    assert placed(sim, "block") == ["gpu-h100-1", "gpu-h100-2", "gpu-h100-3"]  # one block (tier 2)
    sim.delete(VCJOB, "Job", "block", "t")
    sim.settle()

    sim.create(topology_job("soft", 3, "soft", 1))
    sim.settle()
    assert placed(sim, "soft") == ["gpu-h100-1", "gpu-h100-2", "gpu-h100-3"]  # no rack fits: anywhere


def test_without_network_topology_a_gang_ignores_hypernodes(sim) -> None:
    sim.create(vcjob("plain", replicas=3, gpus=8))
    sim.settle()
    assert placed(sim, "plain") == ["gpu-h100-1", "gpu-h100-2", "gpu-h100-3"]

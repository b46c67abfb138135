"""Volcano network-topology-aware scheduling (issue 26; docs/cluster-objects.md, "Volcano HyperNodes"): on an
architecture E cluster with racks and blocks, the reconcile writes a HyperNode per rack (tier 1) and per block
(tier 2) from the nodes' topology labels; a distributed training job on the Volcano pool that asks for one rack
carries ``spec.networkTopology`` (hard, tier 1); the sandbox's Volcano places the gang within one rack, or keeps it
waiting, and "why is it pending?" says so in plain words."""

from __future__ import annotations

import pytest
from django.test import Client as DjangoClient

from quotas import manifests as m
from quotas.inventory import inventory_sync
from quotas.models import Cluster
from quotas.reconcile import reconcile
from sandbox.store import Store
from workloads.kinds import request_manifests
from workloads.models import RequestState, WorkloadRequest

from .test_lifecycle import _world, celery_worker_thread, worker  # noqa: F401 - fixtures
from .test_topology import TRAIN, _api, _carol, demo  # noqa: F401 - fixtures

S = RequestState
GPU = "nvidia.com/gpu"
OFFLINE = m.FlavorRow("h100-offline", "whole", (GPU,), {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, (), (),
                      "offline", 10)
RACKS = (("block-a", "rack-a1"), ("block-a", "rack-a2"), ("block-b", "rack-b1"))


def _render(architecture: str, topology: str) -> list[dict]:
    cluster = m.ClusterRow("c", architecture, topology=topology)
    return m.desired_state(cluster, m.Snapshot(cluster, (OFFLINE,), racks=RACKS))


def test_an_e_cluster_with_racks_gets_a_hypernode_per_rack_and_block() -> None:
    objects = [o for o in _render("E", "block-rack-host") if o["kind"] == "HyperNode"]
    assert {o["metadata"]["name"]: (o["spec"]["tier"], o["spec"]["members"]) for o in objects} == {
        "rack-a1": (1, [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {m.RACK_LABEL: "rack-a1"}}}}]),
        "rack-a2": (1, [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {m.RACK_LABEL: "rack-a2"}}}}]),
        "rack-b1": (1, [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {m.RACK_LABEL: "rack-b1"}}}}]),
        "block-a": (2, [{"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-a1"}}},
                        {"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-a2"}}}]),
        "block-b": (2, [{"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-b1"}}}]),
    }
    store = Store()  # upstream's CRD and its CEL rules accept them
    for obj in objects:
        store.create(obj, dry_run=True, field_manager="gpu-portal")
    # No topology, or no Volcano pool (F: Kueue places by rack through TAS): no HyperNodes.
    assert not [o for o in _render("E", "") if o["kind"] == "HyperNode"]
    assert not [o for o in _render("F", "block-rack-host") if o["kind"] == "HyperNode"]


def test_network_topology_follows_the_placement_choice() -> None:
    cluster = m.ClusterRow("c", "E", topology="block-rack-host")
    assert m.network_topology(cluster, OFFLINE, "rack") == {"mode": "hard", "highestTierAllowed": 1}
    assert m.network_topology(cluster, OFFLINE, "block") == {"mode": "hard", "highestTierAllowed": 2}
    assert m.network_topology(cluster, OFFLINE, "prefer-rack") == {"mode": "soft", "highestTierAllowed": 1}
    assert m.network_topology(cluster, OFFLINE, "") == {}
    assert m.network_topology(m.ClusterRow("c", "E"), OFFLINE, "rack") == {}  # no racks configured
    assert m.placed_by_topology(cluster, OFFLINE) and not m.topology_flavor(cluster, OFFLINE)


@pytest.mark.usefixtures("worker")
def test_a_gang_asking_for_one_rack_runs_within_one_and_the_next_waits_saying_why(fresh_sandbox, cast) -> None:
    world = _world(fresh_sandbox, cast, architecture="E", gpus=32)
    Cluster.objects.filter(pk=world.cluster.pk).update(topology="block-rack-host")
    world.cluster.refresh_from_db()
    assert reconcile(world.cluster, kube=world.kube()).ok
    fresh_sandbox.advance(1)
    hypernodes = {h["metadata"]["name"]: h for h in fresh_sandbox.store.list(m.VOLCANO_TOPOLOGY, "HyperNode")["items"]}
    assert {n: (h["spec"]["tier"], h["status"]["nodeCount"]) for n, h in hypernodes.items()} == {
        "rack-a1": (1, 2), "rack-a2": (1, 2), "rack-b1": (1, 4), "block-a": (2, 4), "block-b": (2, 4)}
    assert reconcile(world.cluster, kube=world.kube()).applied == 0  # nothing drifts

    distributed = {"command": "torchrun train.py", "distributed": True, "workers": 2}
    first = world.submit("bob", "training", "h100-80gb-offline", gpus=8, duration_hours=2, parameters=distributed,
                         topology="rack")
    if first.state == S.PENDING_APPROVAL:
        first = world.approve(first)
    first = world.wait(first, lambda r: r.state == S.RUNNING, advance=5)
    job = fresh_sandbox.store.get("batch.volcano.sh/v1alpha1", "Job", first.k8s_name, first.project.namespace)
    assert job["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    pods = fresh_sandbox.store.list("v1", "Pod", first.project.namespace)["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].startswith(first.k8s_name)) == [
        "gpu-h100-2", "gpu-h100-3"]  # rack-a2, the one rack with two free offline nodes

    second = world.submit("bob", "training", "h100-80gb-offline", gpus=8, duration_hours=2, parameters=distributed,
                          topology="rack")
    if second.state == S.PENDING_APPROVAL:
        second = world.approve(second)
    second = world.wait(second, lambda r: "within one rack" in r.pending_reason, advance=5)
    assert second.state == S.QUEUED
    assert ("waiting for 16 x" in second.pending_reason and "it needs 16 GPUs within one rack (tier 1); the emptiest "
            "has 8 free (room for 1 of 2 workers)" in second.pending_reason), second.pending_reason

    # Rack rack-b1 (block-b) loses its labels: after an inventory sync the reconcile prunes its two HyperNodes.
    for node in fresh_sandbox.store.list("v1", "Node")["items"]:
        if node["metadata"]["labels"].get(m.RACK_LABEL) == "rack-b1":
            fresh_sandbox.store.patch("v1", "Node", node["metadata"]["name"], None, {"metadata": {"labels": {
                m.RACK_LABEL: None, m.BLOCK_LABEL: None}}}, "merge")
    inventory_sync(world.cluster, kube=world.kube())
    result = reconcile(world.cluster, kube=world.kube())
    assert result.ok and result.deleted == 2, result
    assert sorted(h["metadata"]["name"] for h in fresh_sandbox.store.list(m.VOLCANO_TOPOLOGY, "HyperNode")["items"]) == [
        "block-a", "rack-a1", "rack-a2"]


@pytest.mark.django_db
@pytest.mark.usefixtures("demo")
def test_the_api_and_form_offer_one_rack_on_the_volcano_pool_and_the_job_carries_network_topology() -> None:
    Cluster.objects.update(architecture="E", topology="block-rack-host")
    web = DjangoClient()
    web.force_login(_carol())
    form = web.get("/requests/new/", {"template": "training", "project": "acme-vision"}).context["form"]
    assert "topology" in form.fields and "offline" in form.fields["topology"].help_text.lower()
    for placement, wanted in (("rack", {"mode": "hard", "highestTierAllowed": 1}),
                              ("prefer-rack", {"mode": "soft", "highestTierAllowed": 1}), ("", None)):
        response = _api().post("/api/v1/requests/", TRAIN | {"topology": placement, "name": f"p-{placement or 'none'}"},
                               format="json")
        assert response.status_code == 201, response.content
        (job,) = [o for o in request_manifests(WorkloadRequest.objects.get(pk=response.json()["id"]))
                  if o["apiVersion"] == "batch.volcano.sh/v1alpha1"]
        assert job["spec"].get("networkTopology") == wanted
    Cluster.objects.update(topology="")  # no racks configured: refused, nothing created
    refused = _api().post("/api/v1/requests/", TRAIN | {"topology": "rack", "name": "refused"}, format="json")
    assert refused.status_code == 400 and "its cluster has no racks and blocks" in " ".join(
        refused.json()["fields"]["topology"])
    assert not WorkloadRequest.objects.filter(name="refused").exists()

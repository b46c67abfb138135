"""Parity for topology-aware placement (Kueue TAS, issue 26): the same required-rack training job on the sandbox and
on the real control plane (real Kueue v0.17 placing kwok nodes that carry the demo profile's block and rack labels).

The demo profile's offline H100 nodes: gpu-h100-1 in rack-a1, gpu-h100-2 and gpu-h100-3 in rack-a2 (block-a), 8 GPUs
each. Two workers of 8 GPUs fit only rack-a2; a second such job then fits no single rack (rack-a1 has room for one
worker) though 8 GPUs are free in all, and waits with Kueue's own message.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections

from portal.kube import kube_for
from quotas import manifests as m
from quotas.models import Cluster
from quotas.reconcile import reconcile
from workloads.models import RequestState
from workloads.pending import topology_hosts

from ..workloads.test_lifecycle import celery_worker_thread, worker  # noqa: F401 - fixtures
from .test_parity import _api, _custom, _eventually, _kind, _same_on_both, _world_on

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("realcluster"),
              pytest.mark.timeout(400)]
DISTRIBUTED = {"command": "python train.py", "distributed": True, "workers": 2}


def _workload_of(kube: Any, req) -> dict:
    """The request's Workload (Kueue names it after the Job)."""
    return next(w for w in _custom(kube, "workloads", req.project.namespace)
                if w["metadata"]["name"].startswith(f"job-{req.k8s_name}") or
                any(o.get("name") == req.k8s_name for o in w["metadata"].get("ownerReferences") or []))


OFFLINE_H100 = ("gpu-h100-1", "gpu-h100-2", "gpu-h100-3")


def _gpu_pods_on_offline_h100(kube: Any) -> list[dict]:
    return [p for p in kube.list("v1", "Pod")[0]
            if (p.get("spec") or {}).get("nodeName") in OFFLINE_H100
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and any("nvidia.com/gpu" in ((c.get("resources") or {}).get("requests") or {})
                    for c in (p.get("spec") or {}).get("containers") or [])]


def _free_the_offline_h100(kube: Any) -> None:
    """The story counts every offline H100 free: Jobs an earlier test of this session left on them are removed
    (the real control plane lives for the whole session, and its kwok pods run until deleted)."""
    for pod in _gpu_pods_on_offline_h100(kube):
        meta = pod["metadata"]
        for owner in meta.get("ownerReferences") or []:
            if owner.get("kind") == "Job":
                kube.delete("batch/v1", "Job", owner["name"], namespace=meta["namespace"])
        kube.delete("v1", "Pod", meta["name"], namespace=meta["namespace"])
    _eventually(lambda: not _gpu_pods_on_offline_h100(kube), "the offline H100s free", timeout=60)


@pytest.mark.usefixtures("worker")
def test_a_training_job_within_one_rack_is_placed_alike_or_waits_alike(cluster_under_test, cast) -> None:
    world = _world_on(cluster_under_test, cast, "B", gpus=32)
    kube = kube_for(world.cluster)
    _free_the_offline_h100(kube)
    # Ops switch topology on: a Topology, and spec.topologyName added to the whole-GPU flavors (Kueue allows adding).
    Cluster.objects.filter(pk=world.cluster.pk).update(topology="block-rack-host")
    world.cluster.refresh_from_db()
    result = reconcile(world.cluster, kube=kube)
    assert result.ok, result
    topology = kube.get(m.KUEUE, "Topology", m.TOPOLOGY_NAME)
    assert [lv["nodeLabel"] for lv in topology["spec"]["levels"]] == [
        m.BLOCK_LABEL, m.RACK_LABEL, "kubernetes.io/hostname"]
    assert kube.get(m.KUEUE, "ResourceFlavor", "h100-80gb-offline")["spec"]["topologyName"] == m.TOPOLOGY_NAME
    # The nodes carry the profile's topology labels on both clusters.
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kube.list("v1", "Node")[0]}
    assert {n: (nodes[n].get(m.BLOCK_LABEL), nodes[n].get(m.RACK_LABEL)) for n in
            ("gpu-h100-1", "gpu-h100-2", "gpu-h100-3")} == {
        "gpu-h100-1": ("block-a", "rack-a1"), "gpu-h100-2": ("block-a", "rack-a2"), "gpu-h100-3": ("block-a", "rack-a2")}
    second = reconcile(world.cluster, kube=kube)
    assert second.ok and not second.applied, second

    # Fits one rack: admitted there, its pods run on that rack's hosts.
    fits = world.submit("carol", "training", "h100-80gb-offline", gpus=8, duration_hours=2, parameters=DISTRIBUTED,
                        topology="rack")
    fits = world.approve(fits)  # 16 GPUs: over the automatic approval
    fits = world.wait(fits, lambda r: r.state == S.RUNNING, advance=5, timeout=180)
    wl = _workload_of(kube, fits)
    psa = wl["status"]["admission"]["podSetAssignments"][0]
    assignment = psa["topologyAssignment"]
    hosts = topology_hosts(assignment)
    from kubernetes import client

    api_client = _api(cluster_under_test)
    core = client.CoreV1Api(api_client)

    def running_pods() -> list:
        pods = [p for p in core.list_namespaced_pod(fits.project.namespace).items
                if p.metadata.name.startswith(fits.k8s_name) and p.status.phase == "Running"]
        return pods if len(pods) == 2 else []

    pods = _eventually(running_pods, "both workers running", 90, cluster_under_test)
    page = next(v for k, v in fits.cluster_status["objects"].items() if k.startswith("workload/"))
    observed_fit = {
        "flavor": psa["flavors"]["nvidia.com/gpu"], "levels": assignment["levels"], "hosts": hosts,
        "pod nodes": sorted(p.spec.node_name for p in pods),
        "pods tas-labelled": sorted((p.metadata.labels or {}).get("kueue.x-k8s.io/tas", "") for p in pods),
        "gated": sorted(g.name for p in pods for g in (p.spec.scheduling_gates or [])),
        "portal topo": page.get("topo"),
    }
    assert observed_fit["hosts"] == {"gpu-h100-2": 1, "gpu-h100-3": 1}, (_kind(cluster_under_test), observed_fit)
    assert observed_fit["pod nodes"] == ["gpu-h100-2", "gpu-h100-3"], observed_fit
    _same_on_both("topology: fits one rack", cluster_under_test, observed_fit)

    # Fits no single rack: 8 GPUs are free (gpu-h100-1, rack-a1), and the job needs 2 x 8 in one rack.
    waits = world.submit("carol", "training", "h100-80gb-offline", gpus=8, duration_hours=2, parameters=DISTRIBUTED,
                         topology="rack", name="waits")
    waits = world.approve(waits)
    waits = world.wait(waits, lambda r: r.state == S.QUEUED and "rack" in r.pending_reason, advance=5, timeout=180,
                       also=fits)

    # The Workload's Pending event carries Kueue's topology message on both clusters. (Its QuotaReserved condition
    # may say, on real Kueue, why the queue's next flavors do not serve either: flavor fungibility tries them after
    # the placed flavor's not-fit; the portal's sentence reads the event then, workloads/pending.py.)
    condition = next(v for k, v in waits.cluster_status["objects"].items() if k.startswith("workload/"))["c"]
    said = [text for _reason, text in [*(waits.cluster_status.get("warnings") or []), condition["QuotaReserved"][1:]]
            if "topology" in text]
    observed_wait = {"message": said[-1] if said else "", "pending": waits.pending_reason,
                     "suspended": _suspended(api_client, waits)}
    assert observed_wait["message"] == (
        'couldn\'t assign flavors to pod set main: topology "gpu-portal" allows to fit only 1 out of 2 pod(s). '
        'Total nodes: 3; excluded: resource "nvidia.com/gpu": 2'), (_kind(cluster_under_test), observed_wait)
    assert observed_wait["pending"].startswith("waiting for 16 x "), observed_wait
    assert "the emptiest rack has room for 8 now (1 worker)" in observed_wait["pending"], observed_wait
    assert observed_wait["suspended"] is True
    _same_on_both("topology: fits no single rack", cluster_under_test, observed_wait)
    api_client.close()
    connections.close_all()


def _suspended(api_client: Any, req) -> bool:
    from kubernetes import client

    return bool(client.BatchV1Api(api_client).read_namespaced_job(req.k8s_name, req.project.namespace).spec.suspend)


def test_topology_levels_ops_name_are_taken_and_real_kueue_refuses_to_change_them(cluster_under_test) -> None:
    """The Topology the portal renders for levels ops name (zone, rack, an NVLink domain, host) is accepted alike, and
    a change of its levels is refused alike: Kueue v0.17 makes them immutable, which is why the portal refuses to
    change them while flavors carry the Topology and the reconcile replaces, never updates, one that differs."""
    import contextlib

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    levels = (("zone", "topology.kubernetes.io/zone"), ("rack", m.RACK_LABEL), ("nvlink", m.NVLINK_LABEL),
              ("host", m.HOSTNAME_LABEL))
    topology = m.render_topology(m.ClusterRow("c", topology="custom", topology_levels=levels))
    topology["metadata"]["name"] = "nvlink-levels-check"
    api_client = _api(cluster_under_test)
    custom = client.CustomObjectsApi(api_client)
    group, version = m.KUEUE.split("/")
    try:
        created = custom.create_cluster_custom_object(group, version, "topologies", topology)
        observed = {"levels": [lv["nodeLabel"] for lv in created["spec"]["levels"]]}
        try:
            custom.patch_cluster_custom_object(group, version, "topologies", "nvlink-levels-check",
                                               {"spec": {"levels": [{"nodeLabel": m.RACK_LABEL},
                                                                    {"nodeLabel": m.HOSTNAME_LABEL}]}})
            observed["change"] = "accepted"
        except ApiException as exc:
            observed["change"] = f"{exc.status}: {'field is immutable' in (exc.body or '')}"
        assert observed == {"levels": [lv for _n, lv in levels], "change": "422: True"}, (
            _kind(cluster_under_test), observed)
        _same_on_both("topology: levels ops name", cluster_under_test, observed)
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(group, version, "topologies", "nvlink-levels-check")
        api_client.close()

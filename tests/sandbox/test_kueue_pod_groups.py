"""Kueue plain pod groups through the official client: one Workload per group, gated until complete and admitted."""

from __future__ import annotations

import pytest
from kubernetes import client

from sandbox.testing import api_client, control

KUEUE = ("kueue.x-k8s.io", "v1beta2")
GATE = "kueue.x-k8s.io/admission"
NS = "team"


def _settle(sb, seconds: float = 0) -> None:
    status, _, _ = control(sb, "POST", "/sandbox/advance", {"seconds": seconds})
    assert status == 200


def _pod(name: str, group: str, total: int, cpu: str = "1") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/pod-group-name": group},
                         "annotations": {"kueue.x-k8s.io/pod-group-total-count": str(total),
                                         "sandbox.gpuportal.dev/duration": "60s"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "registry.example/worker:1",
                                     "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}


@pytest.fixture
def cluster(fresh_sandbox):
    with api_client(fresh_sandbox) as api:
        core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        co.create_cluster_custom_object(*KUEUE, "resourceflavors", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "cpu"}})
        co.create_cluster_custom_object(*KUEUE, "clusterqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "cq"},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                {"name": "cpu", "resources": [{"name": "cpu", "nominalQuota": "10"},
                                              {"name": "memory", "nominalQuota": "64Gi"}]}]}]}})
        co.create_namespaced_custom_object(*KUEUE, NS, "localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": NS},
            "spec": {"clusterQueue": "cq"}})
        yield fresh_sandbox, core, co


def _workloads(co) -> dict[str, dict]:
    return {w["metadata"]["name"]: w for w in co.list_namespaced_custom_object(*KUEUE, NS, "workloads")["items"]}


def _gated(pod) -> bool:
    return any(g.name == GATE for g in (pod.spec.scheduling_gates or []))


def test_pod_group_is_one_workload_admitted_together(cluster):
    sb, core, co = cluster
    core.create_namespaced_pod(NS, _pod("grp-0", "grp", 3))
    core.create_namespaced_pod(NS, _pod("grp-1", "grp", 3))
    _settle(sb)
    pods = core.list_namespaced_pod(NS).items
    assert len(pods) == 2 and all(_gated(p) and not p.spec.node_name for p in pods)
    assert "grp" not in _workloads(co)  # the group is not complete yet

    core.create_namespaced_pod(NS, _pod("grp-2", "grp", 3))
    _settle(sb)
    wl = _workloads(co)["grp"]  # named after the group
    assert wl["metadata"]["annotations"]["kueue.x-k8s.io/is-group-workload"] == "true"
    assert sorted(r["name"] for r in wl["metadata"]["ownerReferences"]) == ["grp-0", "grp-1", "grp-2"]
    assert all(r["kind"] == "Pod" and not r.get("controller") for r in wl["metadata"]["ownerReferences"])
    assert wl["spec"]["queueName"] == "lq"
    assert len(wl["spec"]["podSets"]) == 1 and wl["spec"]["podSets"][0]["count"] == 3
    assert {c["type"]: c["status"] for c in wl["status"]["conditions"]}["Admitted"] == "True"
    assert wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]["cpu"] == "3"
    _settle(sb, 5)
    pods = core.list_namespaced_pod(NS).items
    assert all(not _gated(p) and p.spec.node_name and p.status.phase == "Running" for p in pods), \
        [(p.metadata.name, p.spec.scheduling_gates, p.spec.node_name, p.status.phase) for p in pods]

    _settle(sb, 120)
    assert {p.status.phase for p in core.list_namespaced_pod(NS).items} == {"Succeeded"}
    wl = _workloads(co)["grp"]
    fin = next(c for c in wl["status"]["conditions"] if c["type"] == "Finished")
    assert (fin["status"], fin["reason"]) == ("True", "Succeeded")
    # the Workload goes with the last of its pods
    for p in ("grp-0", "grp-1", "grp-2"):
        core.delete_namespaced_pod(p, NS, _preload_content=False)
    _settle(sb)
    assert "grp" not in _workloads(co)


def test_pod_group_over_quota_stays_gated_as_a_whole(cluster):
    sb, core, co = cluster
    for i in range(3):
        core.create_namespaced_pod(NS, _pod(f"big-{i}", "big", 3, cpu="4"))  # 12 cpu > quota 10
    _settle(sb, 5)
    wl = _workloads(co)["big"]
    assert {c["type"]: c["status"] for c in wl["status"]["conditions"]}.get("QuotaReserved") == "False"
    pods = core.list_namespaced_pod(NS).items
    assert len(pods) == 3 and all(_gated(p) and not p.spec.node_name for p in pods)

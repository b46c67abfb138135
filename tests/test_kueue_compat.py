"""The v1beta1 <-> v1beta2 conversion the portal applies for an older Kueue (portal/kueue_compat.py); that real Kueue
accepts and converts the result identically is tested against it in tests/realcluster/test_kueue_versions.py."""

from __future__ import annotations

from portal.kueue_compat import choose, down, up

CQ = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "acme-vision"},
      "spec": {"cohortName": "acme", "namespaceSelector": {},
               "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
               "preemption": {"withinClusterQueue": "LowerPriority"},
               "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                   {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}}
WL = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "job-x", "namespace": "ns"},
      "spec": {"priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "batch"},
               "podSets": [{"name": "main", "count": 1}], "queueName": "lq"},
      "status": {"accumulatedPastExecutionTimeSeconds": 12, "admission": {"clusterQueue": "acme-vision"}}}
LQ = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": "ns"},
      "spec": {"clusterQueue": "acme-vision"}, "status": {"flavorsUsage": [{"name": "h100", "resources": []}]}}


def test_the_v1beta1_names_are_kueues_own() -> None:
    cq, wl, lq = down(CQ), down(WL), down(LQ)
    assert cq["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert cq["spec"]["cohort"] == "acme" and "cohortName" not in cq["spec"]
    assert cq["spec"]["flavorFungibility"] == {"whenCanBorrow": "Borrow", "whenCanPreempt": "TryNextFlavor"}
    assert wl["spec"]["priorityClassName"] == "batch"
    assert wl["spec"]["priorityClassSource"] == "kueue.x-k8s.io/workloadpriorityclass"
    assert "priorityClassRef" not in wl["spec"]
    assert wl["status"]["accumulatedPastExexcutionTimeSeconds"] == 12
    assert lq["status"]["flavorUsage"] == LQ["status"]["flavorsUsage"]
    assert CQ["spec"]["cohortName"] == "acme"  # the input is left alone


def test_up_undoes_down() -> None:
    for obj in (CQ, WL, LQ):
        assert up(down(obj)) == obj


def test_a_v1beta1_admission_check_list_becomes_a_strategy() -> None:
    old = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "q"},
           "spec": {"admissionChecks": ["prov"]}}
    assert up(old)["spec"] == {"admissionChecksStrategy": {"admissionChecks": [{"name": "prov"}]}}


def test_a_multikueue_clusters_kubeconfig_source_moves_as_kueue_converts_it() -> None:
    """v1beta2 ``spec.clusterSource.kubeConfig`` is v1beta1's ``spec.kubeConfig`` (the manager's reconcile writes it)."""
    mkc = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster", "metadata": {"name": "worker1"},
           "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": "worker1-kubeconfig"}}}}
    assert down(mkc)["spec"] == {"kubeConfig": {"locationType": "Secret", "location": "worker1-kubeconfig"}}
    assert up(down(mkc)) == mkc


def test_the_version_chosen_is_the_newest_the_portal_speaks() -> None:
    assert choose(["v1beta2", "v1beta1"]) == "v1beta2"
    assert choose(["v1beta1", "v1alpha1"]) == "v1beta1"
    assert choose(["v1alpha1"]) is None and choose([]) is None

"""Parity for Kueue's flavor fungibility (issue 26): the same ClusterQueues and Jobs on the sandbox and on the real
control plane (real Kueue v0.17), compared by the flavor each Workload is admitted on.

Two flavors of ``nvidia.com/gpu`` in one resource group, H100 first then A100, selected by a label no node carries (so
nothing is scheduled: only Kueue's admission is compared, and the session's other tests find their nodes untouched).
Jobs whose pods allow both flavors carry node affinity with one term per flavor, as the portal renders a request
Kueue may choose for (``workloads/manifests.py: placement``); a pinned Job carries a nodeSelector.

* the first flavor is full: the Job that allows both lands on the second; a pinned one waits;
* ``whenCanBorrow: MayStopSearch``: the first flavor fits only by borrowing from the cohort: it borrows there;
* ``whenCanBorrow: TryNextFlavor``: the same Job lands on the second flavor, which fits without borrowing;
* ``whenCanPreempt: MayStopSearch``: the first flavor is full of lower-priority work: Kueue preempts it there;
  ``TryNextFlavor``: it takes the second flavor and preempts nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from portal.kube import Kube
from quotas.manifests import KUEUE

from .test_parity import _clean_real, _eventually, _kind, _same_on_both

pytestmark = [pytest.mark.xdist_group("realcluster"), pytest.mark.timeout(300)]
NS = "fungibility-parity"
KEY = "parity.gpuportal.dev/model"  # on no node: nothing runs, admission alone is compared
FLAVORS = {"fp-h100": "h100", "fp-a100": "a100"}
GPU = "nvidia.com/gpu"


def _flavor(name: str) -> dict:
    return {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": {KEY: FLAVORS[name]}}}


def _queue(name: str, quotas: dict[str, int], *, cohort: str | None = None, when_can_borrow: str = "MayStopSearch",
           selector: dict | None = None, when_can_preempt: str = "TryNextFlavor") -> dict:
    spec: dict[str, Any] = {
        "namespaceSelector": selector if selector is not None else {"matchLabels": {"kubernetes.io/metadata.name": NS}},
        "resourceGroups": [{"coveredResources": [GPU], "flavors": [
            {"name": f, "resources": [{"name": GPU, "nominalQuota": str(quotas.get(f, 0))}]} for f in FLAVORS]}],
        "flavorFungibility": {"whenCanBorrow": when_can_borrow, "whenCanPreempt": when_can_preempt},
        "preemption": {"withinClusterQueue": "LowerPriority"},
    }
    if cohort:
        spec["cohortName"] = cohort
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def _job(name: str, queue: str, gpus: int, *, allows: tuple[str, ...], priority: str = "") -> dict:
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "busybox", "command": ["sleep", "3600"],
        "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}]}
    if len(allows) == 1:
        pod["nodeSelector"] = {KEY: FLAVORS[allows[0]]}
    else:
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": KEY, "operator": "In", "values": [FLAVORS[f]]}]} for f in allows]}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": queue, **(
                {"kueue.x-k8s.io/priority-class": priority} if priority else {})}},
            "spec": {"backoffLimit": 0, "template": {"spec": pod}}}


def _workload(kube: Kube, job: str) -> dict | None:
    items, _ = kube.list(KUEUE, "Workload", NS)
    return next((w for w in items if any(o.get("name") == job for o in w["metadata"].get("ownerReferences") or [])), None)


def _admitted_on(kube: Kube, job: str, cluster: Any) -> str:
    def flavor() -> str:
        wl = _workload(kube, job) or {}
        assignments = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
        return assignments[0]["flavors"][GPU] if assignments else ""
    return _eventually(flavor, f"{job} admitted", 60, cluster)


def _pending(kube: Kube, job: str, cluster: Any) -> str:
    def said() -> str:
        wl = _workload(kube, job) or {}
        cond = next((c for c in (wl.get("status") or {}).get("conditions") or [] if c.get("type") == "QuotaReserved"), {})
        return cond.get("message", "") if cond.get("status") == "False" and cond.get("message") else ""
    return _eventually(said, f"{job} pending with a message", 60, cluster)


def _borrowed(kube: Kube, queue: str, flavor: str) -> str:
    cq = kube.get(KUEUE, "ClusterQueue", queue) or {}
    for entry in (cq.get("status") or {}).get("flavorsReservation") or []:
        if entry.get("name") == flavor:
            return next((str(r.get("borrowed", "0")) for r in entry.get("resources") or [] if r.get("name") == GPU), "0")
    return "0"


QUEUES = ("fp-next", "fp-stop", "fp-stop-lender", "fp-try", "fp-try-lender")
JOBS = ("fill-h100", "either", "pinned", "stop-either", "try-either")
PREEMPT_QUEUES = ("fp-preempt-stop", "fp-preempt-try")
PREEMPT_JOBS = ("low-stop", "high-stop", "low-try", "high-try")


def _remove(kube: Kube, jobs: tuple[str, ...] = JOBS, queues: tuple[str, ...] = QUEUES) -> None:
    for job in jobs:
        with contextlib.suppress(Exception):
            kube.delete("batch/v1", "Job", job, NS)
    for name in queues:
        with contextlib.suppress(Exception):
            kube.delete(KUEUE, "ClusterQueue", name)


def _setup(kube: Kube, cluster: Any) -> None:
    if _kind(cluster) == "real":
        _clean_real(cluster)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for name in FLAVORS:
        kube.apply(_flavor(name))


def _active(kube: Kube, queues: tuple[str, ...], cluster: Any) -> None:
    def active() -> bool:
        return all(any(c.get("type") == "Active" and c.get("status") == "True"
                       for c in ((kube.get(KUEUE, "ClusterQueue", q) or {}).get("status") or {}).get("conditions") or [])
                   for q in queues)
    _eventually(active, "the queues active", 60, cluster)


def _condition(kube: Kube, job: str, kind: str) -> list[str]:
    wl = _workload(kube, job) or {}
    cond = next((c for c in (wl.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})
    return [cond.get("status", ""), cond.get("reason", "")]


def test_kueue_preempts_on_the_first_flavor_or_tries_the_next_alike(cluster_under_test) -> None:
    kube = Kube(kubeconfig_path=str(cluster_under_test.kubeconfig))
    _setup(kube, cluster_under_test)
    for name, value in (("fp-low", 10), ("fp-high", 1000)):
        kube.apply({"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value})
    for name, preempt in (("fp-preempt-stop", "MayStopSearch"), ("fp-preempt-try", "TryNextFlavor")):
        kube.apply(_queue(name, {"fp-h100": 2, "fp-a100": 2}, when_can_preempt=preempt))
        kube.apply({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": name, "namespace": NS},
                    "spec": {"clusterQueue": name}})
    _active(kube, PREEMPT_QUEUES, cluster_under_test)
    try:
        observed: dict[str, Any] = {}
        for suffix, queue in (("stop", "fp-preempt-stop"), ("try", "fp-preempt-try")):
            # Low-priority work fills the first flavor; a high-priority job that allows both comes.
            kube.apply(_job(f"low-{suffix}", queue, 2, allows=("fp-h100",), priority="fp-low"))
            assert _admitted_on(kube, f"low-{suffix}", cluster_under_test) == "fp-h100"
            kube.apply(_job(f"high-{suffix}", queue, 2, allows=("fp-h100", "fp-a100"), priority="fp-high"))
            observed[f"{suffix}: high on"] = _admitted_on(kube, f"high-{suffix}", cluster_under_test)
            observed[f"{suffix}: low evicted"] = _eventually(
                lambda s=suffix: _condition(kube, f"low-{s}", "Evicted") if _condition(kube, f"high-{s}", "Admitted")[0]
                == "True" else None, "the high job admitted", 60, cluster_under_test)
        assert observed["stop: high on"] == "fp-h100" and observed["stop: low evicted"] == ["True", "Preempted"], observed
        assert observed["try: high on"] == "fp-a100" and observed["try: low evicted"][0] != "True", observed
        _same_on_both("flavor fungibility: preemption", cluster_under_test, observed)
    finally:
        _remove(kube, PREEMPT_JOBS, PREEMPT_QUEUES)
        for name in ("fp-low", "fp-high"):
            with contextlib.suppress(Exception):
                kube.delete(KUEUE, "WorkloadPriorityClass", name)
        kube.close()


def test_kueue_tries_the_next_flavor_or_borrows_on_the_first_alike(cluster_under_test) -> None:
    kube = Kube(kubeconfig_path=str(cluster_under_test.kubeconfig))
    _setup(kube, cluster_under_test)
    # No cohort: 2 H100 and 2 A100.
    kube.apply(_queue("fp-next", {"fp-h100": 2, "fp-a100": 2}))
    # In a cohort with a lender of 2 H100: the queue has 1 H100 of its own, 2 A100; once MayStopSearch, once TryNext.
    nobody = {"matchLabels": {"kubernetes.io/metadata.name": "no-such-namespace"}}
    for name, borrow in (("fp-stop", "MayStopSearch"), ("fp-try", "TryNextFlavor")):
        kube.apply(_queue(name, {"fp-h100": 1, "fp-a100": 2}, cohort=name, when_can_borrow=borrow))
        kube.apply(_queue(f"{name}-lender", {"fp-h100": 2}, cohort=name, selector=nobody))
        kube.apply({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": name, "namespace": NS},
                    "spec": {"clusterQueue": name}})
    kube.apply({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "fp-next", "namespace": NS},
                "spec": {"clusterQueue": "fp-next"}})
    _active(kube, QUEUES, cluster_under_test)
    try:
        observed: dict[str, Any] = {}
        # The first flavor is full: the Job that allows both lands on the second; one pinned to the first waits.
        kube.apply(_job("fill-h100", "fp-next", 2, allows=("fp-h100",)))
        observed["fill-h100"] = _admitted_on(kube, "fill-h100", cluster_under_test)
        kube.apply(_job("either", "fp-next", 2, allows=("fp-h100", "fp-a100")))
        observed["either"] = _admitted_on(kube, "either", cluster_under_test)
        kube.apply(_job("pinned", "fp-next", 1, allows=("fp-h100",)))
        observed["pinned waits"] = _pending(kube, "pinned", cluster_under_test)
        # whenCanBorrow MayStopSearch: H100 fits by borrowing 1 from the cohort, and Kueue stops there.
        kube.apply(_job("stop-either", "fp-stop", 2, allows=("fp-h100", "fp-a100")))
        observed["MayStopSearch"] = _admitted_on(kube, "stop-either", cluster_under_test)
        observed["MayStopSearch borrowed"] = _eventually(lambda: _borrowed(kube, "fp-stop", "fp-h100") != "0" and
                                                         _borrowed(kube, "fp-stop", "fp-h100"), "the borrowing shown",
                                                         60, cluster_under_test)
        # whenCanBorrow TryNextFlavor: A100 fits without borrowing, so Kueue takes it.
        kube.apply(_job("try-either", "fp-try", 2, allows=("fp-h100", "fp-a100")))
        observed["TryNextFlavor"] = _admitted_on(kube, "try-either", cluster_under_test)

        assert observed["fill-h100"] == "fp-h100" and observed["either"] == "fp-a100", observed
        assert observed["MayStopSearch"] == "fp-h100" and observed["MayStopSearch borrowed"] == "1", observed
        assert observed["TryNextFlavor"] == "fp-a100", observed
        assert "insufficient unused quota for nvidia.com/gpu in flavor fp-h100" in observed["pinned waits"], observed
        _same_on_both("flavor fungibility", cluster_under_test, observed)
    finally:
        _remove(kube)
        kube.close()

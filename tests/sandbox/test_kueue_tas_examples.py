"""Kueue's own Topology Aware Scheduling samples (site/static/examples/tas, copied unchanged into
``kueue_examples/tas/``) in the sandbox, applied as a user following Kueue's TAS documentation would: kubectl
``apply`` of the queues, ``create`` of the sample Jobs (they use ``generateName``), on nodes labelled as the samples
expect (``cloud.provider.com/node-group: tas-group``, the block, rack and hostname levels).

The expected outcomes are what real Kueue v0.17 did with the same nodes and samples
(``tests/realcluster/test_kueue_tas_examples_parity.py`` runs :func:`scenario` on both and compares).

The cluster: two blocks of two racks of two nodes, 8 CPUs each (rack names repeat across blocks, as in Kueue's own
example table: ``rack-1`` is in both blocks and is two domains), and a third block with one rack of two GPU nodes
(6 CPUs, 4 GPUs, the ``nvidia.com/gpu`` taint) for ``sample-gpu-queues.yaml``, whose flavor tolerates it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sandbox.controllers.tas import decode
from sandbox.testing import _start, kubectl

TAS = Path(__file__).parent / "kueue_examples" / "tas"
GROUP = {"cloud.provider.com/node-group": "tas-group"}


def _group(name: str, block: str, racks: list[str]) -> dict:
    return {"name": name, "count": len(racks), "namePrefix": "tas-node-", "instanceType": "tas-8cpu", "cpu": "8",
            "memory": "32Gi", "pods": 110, "labels": dict(GROUP), "topology": {"block": block, "racks": racks}}


# tas-node-0..3 in block-1 (rack-1: 0, 1; rack-2: 2, 3), tas-node-4..7 in block-2 (rack-1: 4, 5; rack-3: 6, 7);
# tas-gpu-0, 1 in block-3 rack-4: 6 CPUs and 4 GPUs each, tainted nvidia.com/gpu=present:NoSchedule as GPU nodes are
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
PROFILE = {"name": "kueue-tas-samples", "kubeletVersion": "v1.33.4", "region": "r1", "zone": "z1",
           "nodeGroups": [_group("block-1", "block-1", ["rack-1", "rack-1", "rack-2", "rack-2"]),
                          _group("block-2", "block-2", ["rack-1", "rack-1", "rack-3", "rack-3"]),
                          {**_group("gpu", "block-3", ["rack-4", "rack-4"]), "namePrefix": "tas-gpu-",
                           "cpu": "6", "taints": [GPU_TAINT], "gpu": {"model": "H100-80GB", "count": 4}}]}


def wait(fn, what: str, timeout: float = 60, show=None) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out: {what}" + (f"\n{json.dumps(show(), indent=1)}" if show else ""))
        time.sleep(0.2)


def get(cluster: Any, what: str, name: str = "", ns: str = "default") -> Any:
    out = kubectl(cluster, "get", what, *([name] if name else []), "-n", ns, "-o", "json", check=False).stdout
    return json.loads(out) if out.strip() else None


def cond(obj: Any, ctype: str) -> dict:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def workload_of(cluster: Any, job: str) -> dict | None:
    items = (get(cluster, "workloads") or {}).get("items") or []
    return next((w for w in items if any(o.get("name") == job for o in w["metadata"].get("ownerReferences") or [])),
                None)


def create(cluster: Any, sample: str) -> str:
    return kubectl(cluster, "create", "-f", str(TAS / sample), "-o", "name").stdout.strip().split("/")[-1]


def placed(cluster: Any, job: str, pods: int) -> dict:
    """The admitted Job's topology assignment ({host: pods}) and where its pods run ({node: pods})."""
    wl = wait(lambda: (w := workload_of(cluster, job)) and cond(w, "Admitted").get("status") == "True" and w,
              f"{job} admitted", show=lambda: (workload_of(cluster, job) or {}).get("status"))
    psa = wl["status"]["admission"]["podSetAssignments"][0]
    ta = psa["topologyAssignment"]

    def running() -> Counter | None:
        items = [p for p in (get(cluster, "pods") or {}).get("items") or []
                 if (p["metadata"].get("labels") or {}).get("job-name") == job
                 and (p.get("status") or {}).get("phase") == "Running"]
        return Counter(p["spec"]["nodeName"] for p in items) if len(items) == pods else None

    nodes = wait(running, f"{job}'s {pods} pods running")
    return {"flavor": psa["flavors"], "levels": ta["levels"], "hosts": {v[-1]: n for v, n in decode(ta)},
            "pod nodes": dict(sorted(nodes.items())), "count": psa.get("count")}


def scenario(cluster: Any) -> dict:
    """Kueue's TAS samples on ``cluster`` (a sandbox or the real control plane); what a user sees, as a dict."""
    seen: dict = {}
    kubectl(cluster, "apply", "-f", str(TAS / "sample-queues.yaml"))
    wait(lambda: cond(get(cluster, "clusterqueue", "tas-cluster-queue"), "Active").get("status") == "True",
         "the ClusterQueue active")
    # rack-required: 10 pods of 1 CPU; a rack holds 16
    seen["required"] = placed(cluster, create(cluster, "sample-job-required.yaml"), 10)
    # block-preferred: 40 pods; a block holds 32 (26 left in block-1 after the required job), so they spread
    seen["preferred"] = placed(cluster, create(cluster, "sample-job-preferred.yaml"), 40)
    # unconstrained: 6 pods anywhere in the 14 CPUs left
    seen["unconstrained"] = placed(cluster, create(cluster, "sample-job-unconstrained.yaml"), 6)
    # a second rack-required job: 8 CPUs are free in all, no rack has 10: it waits, suspended, with Kueue's message
    job = create(cluster, "sample-job-required.yaml")
    wl = wait(lambda: (w := workload_of(cluster, job)) and cond(w, "QuotaReserved").get("message") and w,
              "the second required job's verdict")
    reserved = cond(wl, "QuotaReserved")
    seen["waits"] = {"status": reserved["status"], "reason": reserved["reason"], "message": reserved["message"],
                     "suspended": get(cluster, "job", job)["spec"]["suspend"]}
    # multi-layer: TASMultiLayerTopology is an alpha feature gate, off by default in v0.17: Kueue's webhook refuses
    proc = kubectl(cluster, "create", "-f", str(TAS / "sample-job-multi-layer.yaml"), check=False)
    seen["multi-layer"] = {"rc": proc.returncode,
                           "error": proc.stderr.strip().replace(str(TAS / "sample-job-multi-layer.yaml"), "<file>")}

    # The GPU sample over the first: its flavor adds tolerations, which Kueue's CRD keeps immutable under a topology
    gpu_queues = str(TAS / "sample-gpu-queues.yaml")
    proc = kubectl(cluster, "apply", "-f", gpu_queues, check=False)
    seen["gpu over cpu"] = {"rc": proc.returncode, "out": proc.stdout.strip().splitlines(),
                            "error": proc.stderr.strip().replace(gpu_queues, "<file>")}
    # so the user removes the first setup (its Jobs first: a ClusterQueue in use waits for its Workloads) and applies
    # the GPU sample afresh
    kubectl(cluster, "delete", "jobs", "--all", "-n", "default")
    wait(lambda: not ((get(cluster, "workloads") or {}).get("items")), "the Workloads gone")
    kubectl(cluster, "delete", "-f", str(TAS / "sample-queues.yaml"), "--wait=true", "--timeout=60s")
    kubectl(cluster, "apply", "-f", gpu_queues)
    wait(lambda: cond(get(cluster, "clusterqueue", "tas-cluster-queue"), "Active").get("status") == "True",
         "the GPU ClusterQueue active")
    # unconstrained: the node with the least room that holds 6 is now a GPU node (6 CPUs), which the flavor tolerates
    job = create(cluster, "sample-job-unconstrained.yaml")
    seen["gpu unconstrained"] = placed(cluster, job, 6)
    pod = next(p for p in (get(cluster, "pods") or {}).get("items") or []
               if (p["metadata"].get("labels") or {}).get("job-name") == job)
    seen["gpu unconstrained"]["tolerations"] = sorted(
        [t.get("key", ""), t.get("operator", ""), t.get("effect", "")] for t in pod["spec"].get("tolerations") or []
        if t.get("key") == "nvidia.com/gpu")
    # and the rack-required sample: 10 pods; no rack holds them but block-1's and block-2's (the GPU rack has 6 left)
    seen["gpu required"] = placed(cluster, create(cluster, "sample-job-required.yaml"), 10)
    return seen


def _placed(hosts: dict[str, int]) -> dict:
    return {"flavor": {"cpu": "tas-flavor", "memory": "tas-flavor"}, "levels": ["kubernetes.io/hostname"],
            "hosts": hosts, "pod nodes": hosts, "count": sum(hosts.values())}


# What real Kueue v0.17 did (tests/realcluster/test_kueue_tas_examples_parity.py), the sandbox's expectations.
EXPECTED = {
    # the fitting rack with the least room (all four hold 16: the first by block and rack name), BestFit within it
    "required": _placed({"tas-node-0": 8, "tas-node-1": 2}),
    # no block holds 40: spread over both blocks; then Kueue sorts all their racks together (most room first) and
    # takes 16 + 16 + 8 without keeping each block's share, then their hosts the same way
    "preferred": _placed({"tas-node-2": 8, "tas-node-3": 8, "tas-node-4": 8, "tas-node-5": 8, "tas-node-6": 8}),
    # unconstrained: LeastFreeCapacity at the hostname level, the node with the least room that holds all 6
    "unconstrained": _placed({"tas-node-1": 6}),
    "waits": {"status": "False", "reason": "Pending", "suspended": True, "message": (
        'couldn\'t assign flavors to pod set main: topology "default" allows to fit only 8 out of 10 pod(s). '
        'Total nodes: 10; excluded: resource "cpu": 7, taint "nvidia.com/gpu=present:NoSchedule": 2')},
    "multi-layer": {"rc": 1, "error": (
        'Error from server (Forbidden): error when creating "<file>": admission webhook "vjob.kb.io" denied the '
        'request: spec.template.metadata.annotations[kueue.x-k8s.io/podset-slice-required-topology-constraints]: '
        'Forbidden: the TASMultiLayerTopology feature gate must be enabled to use this annotation')},
    # the CRD's rule refuses the flavor's new tolerations; the rest of the file is applied
    "gpu over cpu": {"rc": 1, "out": ["topology.kueue.x-k8s.io/default unchanged",
                                      "clusterqueue.kueue.x-k8s.io/tas-cluster-queue configured",
                                      "localqueue.kueue.x-k8s.io/tas-user-queue unchanged"],
                     "error": 'The ResourceFlavor "tas-flavor" is invalid: spec: Invalid value: tolerations are '
                              'immutable when topologyName is set'},
    # the flavor's toleration counts the tainted GPU nodes in, and Kueue adds it to the pods
    "gpu unconstrained": {**_placed({"tas-gpu-0": 6}), "tolerations": [["nvidia.com/gpu", "Exists", "NoSchedule"]]},
    "gpu required": _placed({"tas-node-0": 8, "tas-node-1": 2}),
}


@pytest.fixture
def tas_sandbox(tmp_path):
    sb = _start(tmp_path / "tas", profile=PROFILE)
    try:
        yield sb
    finally:
        sb.stop()


def test_kueues_tas_samples_behave_as_on_real_kueue(tas_sandbox) -> None:
    seen = scenario(tas_sandbox)
    print(json.dumps(seen, indent=1, sort_keys=True))  # shown when the comparison fails
    assert seen == EXPECTED


def test_a_pod_running_agnhost_pause_runs_until_deleted_as_on_a_kubelet() -> None:
    """Kueue's samples run ``agnhost pause``, which never exits: their pods stay Running (the sandbox used to end a
    Job's pod after its default 180 s), while a Job's pod of another command still ends."""
    from sandbox.controllers.sim import Sim

    sim = Sim()
    sim.namespace("t")
    for name, args in (("pause", ["pause"]), ("other", ["entrypoint-tester", "hello"])):
        job = sim.job(name, "t", requests={"cpu": 1, "memory": "200Mi"})
        job["spec"]["template"]["spec"]["containers"][0].update(
            {"image": "registry.k8s.io/e2e-test-images/agnhost:2.53", "args": args})
        sim.create(job)
    sim.settle()
    sim.advance(24 * 3600)
    phases = {p["metadata"]["labels"]["job-name"]: p["status"]["phase"] for p in sim.pods("t")}
    assert phases == {"pause": "Running", "other": "Succeeded"}

"""Kueue MultiKueue in the sandbox: a manager cluster dispatching Kueue's own examples to worker clusters (three
sandboxes, each its own API server), as Kueue v0.17 does it."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
import yaml

from sandbox.testing import _start, kubectl

EXAMPLES = Path(__file__).parent / "kueue_examples"
KUEUE = "kueue.x-k8s.io/v1beta2"
PROFILE = {"name": "mk", "kubeletVersion": "v1.33.4", "region": "r1", "zone": "z1",
           "nodeGroups": [{"name": "cpu", "count": 2, "namePrefix": "cpu-", "instanceType": "y", "cpu": "8",
                           "memory": "32Gi", "pods": 110}]}


def wait(fn, timeout: float = 30, what: str = ""):
    end = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what or fn}")
        time.sleep(0.1)


def get(sb, kind: str, name: str, ns: str | None = None, api: str = KUEUE):
    return sb.store.try_get(api, kind, name, ns)


def condition(obj: dict | None, ctype: str) -> dict:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def worker_setup(cpu: str) -> str:
    """A worker's queues: Kueue's example without the admission check (as its MultiKueue docs set workers up)."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "multikueue-setup.yaml").read_text())
            if d["kind"] in ("ResourceFlavor", "ClusterQueue", "LocalQueue")]
    for d in docs:
        if d["kind"] == "ClusterQueue":
            d["spec"].pop("admissionChecksStrategy")
            d["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = cpu
    return yaml.safe_dump_all(docs)


def kubeconfig_secret(name: str, worker) -> str:
    data = base64.b64encode(Path(worker.kubeconfig).read_bytes()).decode()
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "kueue-system"},
                           "data": {"kubeconfig": data}})


@pytest.fixture
def three(tmp_path):
    sbs = [_start(tmp_path / n, profile=PROFILE) for n in ("manager", "worker1", "worker2")]
    try:
        yield sbs
    finally:
        for sb in sbs:
            sb.stop()


def test_manager_dispatches_kueues_example_job_to_the_worker_that_admits_it(three):
    manager, worker1, worker2 = three
    kubectl(worker1, "apply", "-f", "-", input=worker_setup("1"))  # too small for the sample job's 3 CPUs
    kubectl(worker2, "apply", "-f", "-", input=worker_setup("9"))
    kubectl(manager, "apply", "-f", str(EXAMPLES / "multikueue-setup.yaml"))
    # no Secret yet: the cluster is not active, nor is the check
    mkc = wait(lambda: condition(get(manager, "MultiKueueCluster", "multikueue-test-worker1"), "Active"))
    assert (mkc["status"], mkc["reason"]) == ("False", "BadKubeConfig")
    assert mkc["message"] == 'load client config failed: Secret "worker1-secret" not found'
    ac = wait(lambda: condition(get(manager, "AdmissionCheck", "sample-multikueue"), "Active"))
    assert (ac["status"], ac["reason"], ac["message"]) == ("False", "NoUsableClusters",
                                                           "Inactive clusters: [multikueue-test-worker1]")
    kubectl(manager, "apply", "-f", "-", input=kubeconfig_secret("worker1-secret", worker1))
    wait(lambda: condition(get(manager, "MultiKueueCluster", "multikueue-test-worker1"), "Active").get("reason")
         == "Active", what="worker1 active")
    assert condition(get(manager, "MultiKueueCluster", "multikueue-test-worker1"), "Active")["message"] == "Connected"
    wait(lambda: condition(get(manager, "AdmissionCheck", "sample-multikueue"), "Active").get("status") == "True")
    # a second worker, and a third whose API does not answer
    dead = yaml.safe_load(Path(worker2.kubeconfig).read_text())
    dead["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"
    kubectl(manager, "apply", "-f", "-", input=kubeconfig_secret("worker2-secret", worker2) + "---\n" + yaml.safe_dump({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "dead-secret", "namespace": "kueue-system"},
        "data": {"kubeconfig": base64.b64encode(yaml.safe_dump(dead).encode()).decode()}}))
    for name, secret in (("multikueue-test-worker2", "worker2-secret"), ("multikueue-test-dead", "dead-secret")):
        kubectl(manager, "apply", "-f", "-", input=yaml.safe_dump({
            "apiVersion": KUEUE, "kind": "MultiKueueCluster", "metadata": {"name": name},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": secret}}}}))
    kubectl(manager, "patch", "multikueueconfig", "multikueue-test", "--type=merge", "-p",
            '{"spec":{"clusters":["multikueue-test-worker1","multikueue-test-worker2","multikueue-test-dead"]}}')
    dead_cond = wait(lambda: condition(get(manager, "MultiKueueCluster", "multikueue-test-dead"), "Active"))
    assert (dead_cond["status"], dead_cond["reason"]) == ("False", "ClientConnectionFailed")
    ac = wait(lambda: (c := condition(get(manager, "AdmissionCheck", "sample-multikueue"), "Active")).get("reason")
              == "SomeActiveClusters" and c)
    assert (ac["status"], ac["message"]) == ("True", "Inactive clusters: [multikueue-test-dead]")

    # Kueue's sample job on the manager
    out = kubectl(manager, "create", "-f", str(EXAMPLES / "sample-job.yaml"), "-o", "name").stdout.strip()
    job_name = out.split("/")[-1]
    job = wait(lambda: (j := get(manager, "Job", job_name, "default", "batch/v1")) and
               (j["spec"].get("managedBy") and j))
    assert job["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"  # Kueue's webhook defaults it

    def manager_wl():
        return next(iter(manager.store.list(KUEUE, "Workload", "default")["items"]), None)

    wl = wait(lambda: (w := manager_wl()) and (w.get("status") or {}).get("clusterName") and w, timeout=60,
              what="the manager's Workload dispatched")
    assert wl["status"]["clusterName"] == "multikueue-test-worker2"
    check = wl["status"]["admissionChecks"][0]
    assert (check["name"], check["state"]) == ("sample-multikueue", "Ready")
    assert check["message"] == 'The workload got reservation on "multikueue-test-worker2"'
    assert "nominatedClusterNames" not in wl["status"]
    wait(lambda: condition(manager_wl(), "Admitted").get("status") == "True", what="manager admitted")
    # the copy on worker1 (which could not admit it) is gone; worker2 runs the Job from the prebuilt Workload
    wait(lambda: not worker1.store.list(KUEUE, "Workload", "default")["items"], what="worker1's copy deleted")
    assert not worker1.store.list("batch/v1", "Job", "default")["items"]
    rjob = wait(lambda: get(worker2, "Job", job_name, "default", "batch/v1"))
    assert rjob["metadata"]["labels"]["kueue.x-k8s.io/prebuilt-workload-name"] == wl["metadata"]["name"]
    assert rjob["metadata"]["labels"]["kueue.x-k8s.io/multikueue-origin"] == "multikueue"
    assert "managedBy" not in rjob["spec"]
    rwl = get(worker2, "Workload", wl["metadata"]["name"], "default")
    assert rwl["metadata"]["ownerReferences"][0]["uid"] == rjob["metadata"]["uid"]
    wait(lambda: len([p for p in worker2.store.list("v1", "Pod", "default")["items"]
                      if (p.get("status") or {}).get("phase") == "Running"]) == 3, what="3 pods running on worker2")
    # the manager runs no pod of its own, and mirrors the worker's Job status
    assert not manager.store.list("v1", "Pod", "default")["items"]
    wait(lambda: ((get(manager, "Job", job_name, "default", "batch/v1") or {}).get("status") or {}).get("active") == 3,
         what="status mirrored")
    manager_job = get(manager, "Job", job_name, "default", "batch/v1")
    assert manager_job["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
    # it finishes on the worker: the manager's Job and Workload finish
    worker2.advance(400)
    wait(lambda: condition(manager_wl(), "Finished").get("status") == "True", what="manager finished")
    assert (get(manager, "Job", job_name, "default", "batch/v1")["status"] or {}).get("succeeded") == 3
    wait(lambda: get(worker2, "Job", job_name, "default", "batch/v1") is None, what="worker copy removed on finish")


def test_deleting_the_managers_job_deletes_the_workers_copy(three):
    manager, worker1, _ = three
    kubectl(worker1, "apply", "-f", "-", input=worker_setup("9"))
    kubectl(manager, "apply", "-f", str(EXAMPLES / "multikueue-setup.yaml"))
    kubectl(manager, "apply", "-f", "-", input=kubeconfig_secret("worker1-secret", worker1))
    out = kubectl(manager, "create", "-f", str(EXAMPLES / "sample-job.yaml"), "-o", "name").stdout.strip()
    job_name = out.split("/")[-1]
    wait(lambda: get(worker1, "Job", job_name, "default", "batch/v1"), timeout=60, what="worker copy")
    kubectl(manager, "delete", "job", job_name, "-n", "default")
    wait(lambda: get(worker1, "Job", job_name, "default", "batch/v1") is None
         and not worker1.store.list(KUEUE, "Workload", "default")["items"], timeout=30, what="worker copy deleted")


def test_a_job_not_managed_by_multikueue_is_rejected(three):
    manager, worker1, _ = three
    kubectl(worker1, "apply", "-f", "-", input=worker_setup("9"))
    kubectl(manager, "apply", "-f", str(EXAMPLES / "multikueue-setup.yaml"))
    kubectl(manager, "apply", "-f", "-", input=kubeconfig_secret("worker1-secret", worker1))
    job = yaml.safe_load((EXAMPLES / "sample-job.yaml").read_text().split("\n", 3)[3])
    job["metadata"] = {"name": "own", "namespace": "default", "labels": job["metadata"]["labels"]}
    job["spec"]["managedBy"] = "example.com/other"
    kubectl(manager, "create", "-f", "-", input=yaml.safe_dump(job))
    wl = wait(lambda: (w := next(iter(manager.store.list(KUEUE, "Workload", "default")["items"]), None)) and
              (w.get("status") or {}).get("admissionChecks", [{}])[0].get("state") == "Rejected" and w)
    assert wl["status"]["admissionChecks"][0]["message"] == (
        'The owner is not managed by Kueue: Expecting spec.managedBy to be "kueue.x-k8s.io/multikueue" not '
        '"example.com/other"')
    assert not worker1.store.list(KUEUE, "Workload", "default")["items"]

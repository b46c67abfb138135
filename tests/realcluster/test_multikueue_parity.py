"""Parity for Kueue MultiKueue (issue 26): Kueue's own MultiKueue example (site/static/examples/multikueue/
multikueue-setup.yaml) and sample job, applied as its documentation says, on a manager and a worker cluster: two
sandboxes, or two real control planes (the session's, as manager, and a second one started here as the worker, each
with its own kube-apiserver, etcd, controllers, Kueue v0.17 and kwok nodes). The same things are asserted on both.

A kubeconfig that skips TLS verification is refused alike (``InsecureKubeConfig``). Not compared: the message of a
cluster that does not answer (``ClientConnectionFailed``: Go's dial error text on the
real Kueue), event texts, and timings.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from realcluster.testing import RealCluster, built

from ..sandbox.test_multikueue import EXAMPLES, PROFILE, worker_setup

pytestmark = [pytest.mark.xdist_group("realcluster"), pytest.mark.timeout(400)]


def _kubectl(cluster: Any, *args: str, input: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), *args], input=input,
                          capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
    return proc.stdout


def _get(cluster: Any, what: str, name: str = "", ns: str = "default") -> Any:
    out = _kubectl(cluster, "get", what, *([name] if name else []), "-n", ns, "-o", "json", check=False)
    return json.loads(out) if out.strip() else None


def _cond(obj: Any, ctype: str) -> dict:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _eventually(fn, what: str, timeout: float = 90) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.5)


def _secret(name: str, worker: Any) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "kueue-system"},
                           "data": {"kubeconfig": base64.b64encode(Path(worker.kubeconfig).read_bytes()).decode()}})


@pytest.fixture(params=["sandbox", "real"])
def manager_and_worker(request, tmp_path):
    if request.param == "sandbox":
        from sandbox.testing import _start

        pair = [_start(tmp_path / n, profile=PROFILE) for n in ("manager", "worker")]
        try:
            yield pair
        finally:
            for sb in pair:
                sb.stop()
        return
    if not built():
        pytest.skip("the real control plane is not built (make cluster-build)")
    manager = request.getfixturevalue("real_cluster")
    from realcluster.__main__ import start

    worker = RealCluster(start(tmp_path / "worker", None))
    try:
        yield [manager, worker]
    finally:
        worker.cp.stop()
        for kind in ("jobs", "workloads"):
            _kubectl(manager, "delete", kind, "--all", "-n", "default", "--wait=false", check=False)
        _kubectl(manager, "delete", "-f", str(EXAMPLES / "multikueue-setup.yaml"), "--wait=false", check=False)
        _kubectl(manager, "delete", "secret", "worker1-secret", "dead-secret", "-n", "kueue-system", check=False)
        _kubectl(manager, "delete", "multikueuecluster", "multikueue-test-dead", check=False)


def test_kueues_multikueue_example_behaves_alike(manager_and_worker) -> None:
    manager, worker = manager_and_worker
    _kubectl(worker, "apply", "-f", "-", input=worker_setup("9"))
    _kubectl(manager, "apply", "-f", str(EXAMPLES / "multikueue-setup.yaml"))
    # accepted as written; no Secret yet: the cluster and the check are inactive
    mkc = _eventually(lambda: _cond(_get(manager, "multikueuecluster", "multikueue-test-worker1"), "Active"),
                      "the cluster's Active condition")
    assert (mkc["status"], mkc["reason"], mkc["message"]) == (
        "False", "BadKubeConfig", 'load client config failed: Secret "worker1-secret" not found')
    ac = _eventually(lambda: _cond(_get(manager, "admissioncheck", "sample-multikueue"), "Active"), "the check")
    assert (ac["status"], ac["reason"], ac["message"]) == (
        "False", "NoUsableClusters", "Inactive clusters: [multikueue-test-worker1]")
    # a cluster whose API does not answer
    dead = yaml.safe_load(Path(worker.kubeconfig).read_text())
    dead["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"
    _kubectl(manager, "apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "dead-secret", "namespace": "kueue-system"},
        "data": {"kubeconfig": base64.b64encode(yaml.safe_dump(dead).encode()).decode()}}) + "---\n" + yaml.safe_dump({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster", "metadata": {"name": "multikueue-test-dead"},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": "dead-secret"}}}}))
    dead_cond = _eventually(lambda: _cond(_get(manager, "multikueuecluster", "multikueue-test-dead"), "Active"),
                            "the dead cluster's condition")
    assert (dead_cond["status"], dead_cond["reason"]) == ("False", "ClientConnectionFailed")
    # a kubeconfig that skips TLS verification is refused (Kueue's MultiKueueAllowInsecureKubeconfigs is off)
    insecure = yaml.safe_load(Path(worker.kubeconfig).read_text())
    insecure["clusters"][0]["cluster"].pop("certificate-authority-data")
    insecure["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    _kubectl(manager, "apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "worker1-secret", "namespace": "kueue-system"},
        "data": {"kubeconfig": base64.b64encode(yaml.safe_dump(insecure).encode()).decode()}}))
    mkc = _eventually(lambda: (c := _cond(_get(manager, "multikueuecluster", "multikueue-test-worker1"), "Active"))
                      .get("reason") == "InsecureKubeConfig" and c, "the insecure kubeconfig refused")
    name = insecure["clusters"][0]["name"]
    assert (mkc["status"], mkc["message"]) == (
        "False", f"load client config failed: insecure TLS verification is not allowed for cluster {name}")
    # the worker's kubeconfig in the Secret the example names: Active
    _kubectl(manager, "apply", "-f", "-", input=_secret("worker1-secret", worker))
    _eventually(lambda: _cond(_get(manager, "multikueuecluster", "multikueue-test-worker1"), "Active").get("status")
                == "True", "the worker active")
    mkc = _cond(_get(manager, "multikueuecluster", "multikueue-test-worker1"), "Active")
    assert (mkc["reason"], mkc["message"]) == ("Active", "Connected")
    ac = _eventually(lambda: (c := _cond(_get(manager, "admissioncheck", "sample-multikueue"), "Active"))
                     .get("status") == "True" and c, "the check active")
    assert (ac["reason"], ac["message"]) == ("Active", "The admission check is active")

    # Kueue's sample job, submitted to the manager
    name = _kubectl(manager, "create", "-f", str(EXAMPLES / "sample-job.yaml"), "-o", "name").strip().split("/")[-1]
    assert _get(manager, "job", name)["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"

    def manager_wl() -> dict | None:
        items = (_get(manager, "workloads") or {}).get("items") or []
        return next((w for w in items if any(o["name"] == name for o in w["metadata"].get("ownerReferences") or [])),
                    None)

    wl = _eventually(lambda: (w := manager_wl()) and (w.get("status") or {}).get("clusterName") and w,
                     "dispatched to the worker")
    assert wl["status"]["clusterName"] == "multikueue-test-worker1"
    check = wl["status"]["admissionChecks"][0]
    assert (check["name"], check["state"], check["message"]) == (
        "sample-multikueue", "Ready", 'The workload got reservation on "multikueue-test-worker1"')
    _eventually(lambda: _cond(manager_wl(), "Admitted").get("status") == "True", "admitted on the manager")
    rjob = _eventually(lambda: _get(worker, "job", name), "the worker's Job")
    assert rjob["metadata"]["labels"]["kueue.x-k8s.io/prebuilt-workload-name"] == wl["metadata"]["name"]
    assert rjob["metadata"]["labels"]["kueue.x-k8s.io/multikueue-origin"] == "multikueue"
    assert "managedBy" not in rjob["spec"]
    rwl = _get(worker, "workload", wl["metadata"]["name"])
    assert [o["uid"] for o in rwl["metadata"]["ownerReferences"]] == [rjob["metadata"]["uid"]]
    # the worker's Job status comes back to the manager's Job, which runs no pod of its own
    worker.advance(400)
    _eventually(lambda: ((_get(manager, "job", name) or {}).get("status") or {}).get("succeeded") == 3
                or ((_get(manager, "job", name) or {}).get("status") or {}).get("active") == 3, "status mirrored")
    assert not (_get(manager, "pods") or {}).get("items")
    # deleting the manager's Job removes the worker's copy
    _kubectl(manager, "delete", "job", name, "-n", "default")
    _eventually(lambda: _get(worker, "job", name) is None, "the worker's Job deleted")

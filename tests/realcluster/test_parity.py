"""Parity: the same scenarios on the sandbox and on the real control plane (kube-apiserver, kube-controller-manager,
kube-scheduler and Kueue built from their released Go modules; kwok plays the kubelets).

Each scenario runs once per cluster kind and compares what the portal sees: whether the cluster accepts what the
portal writes, the conditions and their reasons, and the messages the portal parses. Deliberate differences are
listed in sandbox/README.md ("Known differences from a real cluster").
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
from django.db import connections

from portal.kube import kube_cache_clear, kube_for
from quotas.models import Cluster
from quotas.reconcile import reconcile
from workloads.models import RequestState, WorkloadRequest
from workloads.status import RECLAIM_RE

from ..workloads.test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("realcluster"),
              pytest.mark.timeout(400)]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
# (cluster kind, architecture) -> why the scenario differs on purpose; listed in sandbox/README.md.
KNOWN_DIFFERENCES = {("real", "E"): "Volcano is not part of the real control plane (its Go modules are not served)"}


@pytest.fixture(params=["sandbox", "real"])
def cluster_under_test(request) -> Any:
    """A fresh sandbox, or the session's real control plane (its portal-owned objects left by an earlier test
    are removed by the reconcile of the new Cluster row, as they would be after an architecture change)."""
    if request.param == "sandbox":
        return request.getfixturevalue("fresh_sandbox")
    return request.getfixturevalue("real_cluster")


def _kind(cluster: Any) -> str:
    return getattr(cluster, "kind", "sandbox")


def _custom(kube: Any, plural: str, namespace: str | None = None) -> list[dict]:
    from kubernetes import client

    api = client.CustomObjectsApi(kube.api)
    if namespace:
        return api.list_namespaced_custom_object(*KUEUE, namespace, plural)["items"]
    return api.list_cluster_custom_object(*KUEUE, plural)["items"]


def _cond(obj: dict, kind: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _eventually(check, what: str, timeout: float = 60, cluster: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        if cluster is not None:
            cluster.advance(1)
        else:
            time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {last!r}")


def _clean_real(cluster: Any) -> None:
    """The real control plane lives for the whole session: take away the requests' Jobs an earlier test left (our
    outcome finalizer too: that test's follower is gone), and wait until no ClusterQueue is still held by them."""
    from kubernetes import client, config

    from portal.labels import OUTCOME_FINALIZER
    from workloads.manifests import REQUEST_LABEL

    api_client = config.new_client_from_config(str(cluster.kubeconfig))
    batch = client.BatchV1Api(api_client)
    apps = client.AppsV1Api(api_client)
    for sts in apps.list_stateful_set_for_all_namespaces(label_selector=REQUEST_LABEL).items:
        apps.delete_namespaced_stateful_set(sts.metadata.name, sts.metadata.namespace, propagation_policy="Background")
    for job in batch.list_job_for_all_namespaces(label_selector=REQUEST_LABEL).items:
        finalizers = [f for f in (job.metadata.finalizers or []) if f != OUTCOME_FINALIZER]
        batch.patch_namespaced_job(job.metadata.name, job.metadata.namespace, {"metadata": {"finalizers": finalizers}})
        try:
            batch.delete_namespaced_job(job.metadata.name, job.metadata.namespace, propagation_policy="Background")
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    custom = client.CustomObjectsApi(api_client)
    # Their Workloads too, by hand: Kueue keeps a Workload admitted in a Terminating ClusterQueue (and the queue with
    # it) until the Workload itself goes.
    for wl in custom.list_cluster_custom_object(*KUEUE, "workloads")["items"]:
        meta = wl["metadata"]
        try:
            custom.patch_namespaced_custom_object(*KUEUE, meta["namespace"], "workloads", meta["name"],
                                                  {"metadata": {"finalizers": None}})
            custom.delete_namespaced_custom_object(*KUEUE, meta["namespace"], "workloads", meta["name"])
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    deadline = time.monotonic() + 120
    held: list[str] = []
    while time.monotonic() < deadline:
        held = [q["metadata"]["name"] for q in custom.list_cluster_custom_object(*KUEUE, "clusterqueues")["items"]
                if q["metadata"].get("deletionTimestamp")]
        held += [w["metadata"]["name"] for w in custom.list_cluster_custom_object(*KUEUE, "workloads")["items"]]
        if not held:
            break
        time.sleep(1)
    api_client.close()
    assert not held, f"still on the real control plane after an earlier test: {held}"


def _world_on(cluster: Any, cast: Any, architecture: str) -> World:
    if _kind(cluster) == "real":
        _clean_real(cluster)
    for row in Cluster.objects.all():
        row.delete()
    kube_cache_clear()
    return _world(cluster, cast, architecture=architecture)


# ------------------------------------------------------------------------------------------------ scenarios
@pytest.mark.usefixtures("worker")
@pytest.mark.parametrize("architecture", ["A", "B", "C", "D", "E", "F"])
def test_every_reference_architecture_is_accepted_and_its_queues_become_active(
        cluster_under_test, cast, architecture: str) -> None:
    if (_kind(cluster_under_test), architecture) in KNOWN_DIFFERENCES:
        # Deliberate (sandbox/README.md): the real control plane has no Volcano, so its API refuses E's Queues and
        # the portal's reconcile says which API is missing.
        with pytest.raises(Exception, match="scheduling.volcano.sh"):
            _world_on(cluster_under_test, cast, architecture)
        return
    world = _world_on(cluster_under_test, cast, architecture)
    kube = kube_for(world.cluster)
    _eventually(lambda: _custom(kube, "clusterqueues"), "ClusterQueues")
    _eventually(lambda: all((_cond(q, "Active") or {}).get("status") == "True" for q in _custom(kube, "clusterqueues")),
                "every ClusterQueue Active", 60, cluster_under_test)
    for q in _custom(kube, "clusterqueues"):
        active = _cond(q, "Active")
        assert active and active["status"] == "True", (_kind(cluster_under_test), q["metadata"]["name"], active)
        assert active["reason"] == "Ready"
    # A second reconcile of the unchanged cluster writes nothing.
    again = reconcile(world.cluster, kube=kube)
    assert not getattr(again, "errors", None)
    assert not getattr(again, "applied", None), again


@pytest.mark.usefixtures("worker")
def test_a_job_is_admitted_by_kueue_and_runs_on_a_gpu_node(cluster_under_test, cast) -> None:
    world = _world_on(cluster_under_test, cast, "B")
    req: WorkloadRequest = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5, timeout=120)
    workload = next(v for k, v in req.cluster_status["objects"].items() if k.startswith("workload/"))
    assert workload["c"]["Admitted"][0] == "True"
    assert workload["c"]["QuotaReserved"][0] == "True"
    kube = kube_for(world.cluster)
    wls = _custom(kube, "workloads", req.project.namespace)
    assert len(wls) == 1
    admission = wls[0]["status"]["admission"]
    assert admission["clusterQueue"].startswith(req.project.tenant.slug) or admission["clusterQueue"]
    assert admission["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == "h100-80gb-offline"
    connections.close_all()


@pytest.mark.usefixtures("worker")
def test_a_clusterqueue_deleted_while_in_use_stays_terminating(cluster_under_test, cast) -> None:
    from kubernetes import client

    world = _world_on(cluster_under_test, cast, "B")
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5, timeout=120)
    kube = kube_for(world.cluster)
    wl = _custom(kube, "workloads", req.project.namespace)[0]
    cq_name = wl["status"]["admission"]["clusterQueue"]
    api = client.CustomObjectsApi(kube.api)
    api.delete_cluster_custom_object(*KUEUE, "clusterqueues", cq_name)
    time.sleep(2)
    cq = api.get_cluster_custom_object(*KUEUE, "clusterqueues", cq_name)
    assert cq["metadata"].get("deletionTimestamp"), _kind(cluster_under_test)
    assert "kueue.x-k8s.io/resource-in-use" in cq["metadata"].get("finalizers", [])
    wl = api.get_namespaced_custom_object(*KUEUE, req.project.namespace, "workloads", wl["metadata"]["name"])
    assert (_cond(wl, "Admitted") or {}).get("status") == "True"
    # Put it back for the next test: the portal's reconcile recreates it once the old one is gone.
    connections.close_all()


@pytest.mark.usefixtures("worker")
def test_reclaim_within_the_cohort_gives_the_message_the_portal_parses(cluster_under_test, cast) -> None:
    """A borrower admitted on the lender's unused quota is evicted when the lender asks for it back; the portal
    finds the lender's Workload UID in Kueue's own message."""
    from tenants.models import Role

    from ..factories import make_member

    make_member(cast.carol, cast.acme, Role.MEMBER, cast.nlp)
    world = _world_on(cluster_under_test, cast, "B")
    kube = kube_for(world.cluster)
    nlp = cast.nlp
    from decimal import Decimal

    from quotas.models import Quota

    flavor = world.flavors["h100-80gb-offline"]
    # vision lends everything; nlp (no quota of its own) borrows it; the tenant's cohort has nothing of its own.
    Quota.objects.filter(tenant=cast.acme, project=None, flavor=flavor, resource="nvidia.com/gpu").update(
        nominal=Decimal(0))
    Quota.objects.filter(project=cast.vision, flavor=flavor, resource="nvidia.com/gpu").update(
        nominal=Decimal(2), borrowing_limit=None, lending_limit=None)
    Quota.objects.update_or_create(tenant=cast.acme, project=nlp, flavor=flavor, resource="nvidia.com/gpu",
                                   defaults={"nominal": Decimal(0), "borrowing_limit": Decimal(2)})
    for resource in ("cpu", "memory"):
        Quota.objects.update_or_create(tenant=cast.acme, project=nlp, flavor=flavor, resource=resource,
                                       defaults={"nominal": Decimal(400 if resource == "cpu" else 4000)})
    result = reconcile(world.cluster, kube=kube)
    assert not getattr(result, "errors", None), result
    borrower = world.submit("carol", "training", "h100-80gb-offline", project=nlp, gpus=2, duration_hours=1)
    borrower = world.wait(borrower, lambda r: r.state == S.RUNNING, advance=5, timeout=120)
    lender = world.submit("carol", "training", "h100-80gb-offline", gpus=2, duration_hours=1)
    lender = world.wait(lender, lambda r: r.state == S.RUNNING, advance=5, timeout=180, also=borrower)
    evicted = _eventually(lambda: [w for w in _custom(kube, "workloads", nlp.namespace)
                                   if (w.get("status") or {}).get("schedulingStats", {}).get("evictions")
                                   or (_cond(w, "Evicted") or {}).get("status") == "True"],
                          "the borrower's eviction", 60, cluster_under_test)
    message = (_cond(evicted[0], "Evicted") or _cond(evicted[0], "Preempted") or {}).get("message", "")
    lender_wl = _custom(kube, "workloads", cast.vision.namespace)
    lender_uids = {w["metadata"]["uid"] for w in lender_wl}
    match = RECLAIM_RE.search(message)
    assert match, (_kind(cluster_under_test), message)
    assert match.group(1) in lender_uids
    connections.close_all()


def test_kubectl_imperative_commands(cluster_under_test) -> None:
    import shutil

    exe = shutil.which("kubectl")
    assert exe, "kubectl is needed"
    name = f"parity-{int(time.time() * 1000) % 10**9}"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([exe, "--kubeconfig", str(cluster_under_test.kubeconfig), *args],
                              capture_output=True, text=True, timeout=60)

    made = run("create", "namespace", name)
    assert made.returncode == 0, made.stderr
    cm = run("-n", name, "create", "configmap", "settings", "--from-literal=a=b")
    assert cm.returncode == 0, cm.stderr
    got = run("-n", name, "get", "configmap", "settings", "-o", "jsonpath={.data.a}")
    assert got.stdout == "b"
    again = run("create", "namespace", name)
    assert again.returncode != 0 and "AlreadyExists" in again.stderr
    bad = run("create", "namespace", "Not_Valid")
    assert bad.returncode != 0 and "Invalid value" in bad.stderr


@pytest.mark.usefixtures("worker")
def test_a_notebook_with_its_home_volume_runs(cluster_under_test, cast) -> None:
    """A notebook's StatefulSet claims a home volume; on the real control plane a claim must be bound before the
    scheduler places the pod (realcluster/volumes.py plays the provisioner)."""
    world = _world_on(cluster_under_test, cast, "B")
    req = world.submit("carol", "notebook", "h100-80gb-offline", gpus=1, duration_hours=4)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5, timeout=150)
    pods = [k for k, v in req.cluster_status["objects"].items() if k.startswith("pod/") and v.get("phase") == "Running"]
    assert pods, req.cluster_status
    connections.close_all()

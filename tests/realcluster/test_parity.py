"""Parity: the same scenarios on the sandbox and on the real control plane (kube-apiserver, kube-controller-manager,
kube-scheduler and Kueue built from their released Go modules; kwok plays the kubelets).

Each scenario runs once per cluster kind and compares what the portal sees: whether the cluster accepts what the
portal writes, the conditions and their reasons, and the messages the portal parses. Deliberate differences are
listed in sandbox/README.md ("Known differences from a real cluster").
"""

from __future__ import annotations

import contextlib
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


def _world_on(cluster: Any, cast: Any, architecture: str, gpus: int = 8) -> World:
    if _kind(cluster) == "real":
        _clean_real(cluster)
    for row in Cluster.objects.all():
        row.delete()
    kube_cache_clear()
    return _world(cluster, cast, architecture=architecture, gpus=gpus)


# What each scenario saw, per cluster kind: the second kind to run a scenario compares with the first.
SEEN: dict[str, dict[str, Any]] = {}


def _same_on_both(scenario: str, cluster: Any, observed: dict[str, Any]) -> None:
    """Record what the portal saw of ``scenario`` on this cluster; once both kinds ran it, they must agree."""
    seen = SEEN.setdefault(scenario, {})
    seen[_kind(cluster)] = observed
    if len(seen) == 2:
        assert seen["sandbox"] == seen["real"], f"{scenario}: sandbox {seen['sandbox']!r} != real {seen['real']!r}"


def _events_of(kube: Any, obj: dict) -> list[dict]:
    """The core/v1 Events about one object (the Kueue controllers' and the Job controller's)."""
    meta = obj["metadata"]
    items, _ = kube.list("v1", "Event", meta.get("namespace"))
    return [e for e in items if (e.get("involvedObject") or {}).get("uid") == meta["uid"]]


def _api(cluster: Any) -> Any:
    from kubernetes import config

    return config.new_client_from_config(str(cluster.kubeconfig))


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
    assert again.ok, again
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
    assert result.ok, result
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
                              capture_output=True, text=True, timeout=60, check=False)

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


@pytest.mark.usefixtures("worker")
def test_preemption_by_priority_is_told_in_the_words_the_portal_reads(cluster_under_test, cast) -> None:
    """A batch job holds the project's two GPUs; a notebook (interactive priority) preempts it. Both clusters give the
    victim the same conditions, reasons and event, and a message from which the portal reads the preemptor."""
    from workloads.preemption import preemption_of

    world = _world_on(cluster_under_test, cast, "B", gpus=2)
    job = world.submit("bob", "training", "h100-80gb-offline", gpus=2, duration_hours=1)
    if job.state == S.PENDING_APPROVAL:
        job = world.approve(job)
    job = world.wait(job, lambda r: r.state == S.RUNNING, advance=5, timeout=120)
    notebook = world.submit("bob", "notebook", "h100-80gb-offline", gpus=1, duration_hours=2)
    job = world.wait(job, lambda r: r.state in (S.PREEMPTED, S.QUEUED) and any(
        "Preempted" in m for m in r.events.values_list("message", flat=True)), advance=2, timeout=120, also=notebook)
    notebook = world.wait(notebook, lambda r: r.state == S.RUNNING, advance=5, timeout=150, also=job)
    # Who is ahead of the job is read again by the status follower once the notebook is admitted (on its own
    # schedule): compared once it has, not while the notebook may still count as waiting ahead.
    job = world.wait(job, lambda r: r.state == S.QUEUED and r.pending_reason.endswith("nothing is ahead of you"),
                     advance=2, timeout=120, also=notebook)
    kube = kube_for(world.cluster)
    workloads = _custom(kube, "workloads", cast.vision.namespace)
    victim = next(w for w in workloads if (_cond(w, "Preempted") or {}).get("status") == "True")
    evicted, preempted = _cond(victim, "Evicted"), _cond(victim, "Preempted")
    assert evicted["reason"] == "Preempted", (_kind(cluster_under_test), evicted)
    assert preempted["reason"] == "InClusterQueue", (_kind(cluster_under_test), preempted)
    read = preemption_of(preempted["message"])
    assert read is not None and read.why == "queue", (_kind(cluster_under_test), preempted["message"])
    preemptor = next(w for w in workloads if w["metadata"]["uid"] == read.uid)
    assert (_cond(preemptor, "Admitted") or {}).get("status") == "True"
    assert read.preemptor_path.split("/")[-1] == preemptor["status"]["admission"]["clusterQueue"], read
    reasons = {e["reason"] for e in _events_of(kube, victim)}
    assert {"Preempted", "QuotaReserved", "Admitted"} <= reasons, (_kind(cluster_under_test), reasons)
    # The portal's own account: the job is back in the queue, waiting for its two GPUs.
    job.refresh_from_db()
    assert job.state == S.QUEUED
    assert job.pending_reason.startswith("waiting for 2 x"), job.pending_reason
    _same_on_both("preemption", cluster_under_test, {
        "evicted": evicted["reason"], "preempted": preempted["reason"], "why": read.why,
        "events": sorted(reasons & {"Preempted", "QuotaReserved", "Admitted", "Pending", "EvictedDueToPreempted"}),
        "states": list(job.events.values_list("to_state", flat=True)), "pending": job.pending_reason})
    connections.close_all()


@pytest.mark.usefixtures("worker")
def test_a_hami_share_is_counted_through_kueues_resource_transformation(cluster_under_test, cast) -> None:
    """Under D, a pod asking one vGPU with 10,000 MiB and 25 % of the cores is admitted by Kueue on the HAMi flavor,
    its quota counted in HAMi totals (the transformation multiplies by the vGPU count), and it runs."""
    from kubernetes import client

    world = _world_on(cluster_under_test, cast, "D")
    kube = kube_for(world.cluster)
    ns = cast.vision.namespace
    queues = {q["metadata"]["name"]: q for q in _custom(kube, "clusterqueues")}
    lq = next(q for q in _custom(kube, "localqueues", ns) if any(
        f["name"] == "l40s-hami" for g in queues[q["spec"]["clusterQueue"]]["spec"]["resourceGroups"]
        for f in g["flavors"]))
    api_client = _api(cluster_under_test)
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "parity-hami", "namespace": ns,
                        "labels": {"kueue.x-k8s.io/queue-name": lq["metadata"]["name"]}},
           "spec": {"suspend": True, "backoffLimit": 0, "template": {
               "metadata": {"annotations": {"sandbox.gpuportal.dev/duration": "1h"}},
               "spec": {"restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                        "containers": [{"name": "main", "image": "registry.example/cuda:12", "resources": {
                            "requests": {"cpu": "1", "memory": "1Gi"},
                            "limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10000",
                                       "nvidia.com/gpucores": "25"}}}]}}}}
    client.BatchV1Api(api_client).create_namespaced_job(ns, job)
    try:
        def admitted() -> dict | None:
            for w in _custom(kube, "workloads", ns):
                if w["metadata"]["name"].startswith("job-parity-hami") and (
                        _cond(w, "Admitted") or {}).get("status") == "True":
                    return w
            return None

        wl = _eventually(admitted, "the HAMi job's admission", 90, cluster_under_test)
        assignment = wl["status"]["admission"]["podSetAssignments"][0]
        assert assignment["flavors"]["nvidia.com/gpu"] == "l40s-hami"
        usage = {k: str(v) for k, v in assignment["resourceUsage"].items()}
        assert usage.get("nvidia.com/total-gpumem") == "20k" or usage.get("nvidia.com/total-gpumem") == "20000", usage
        assert usage.get("nvidia.com/total-gpucores") == "50", usage
        assert "nvidia.com/gpumem" not in usage and usage.get("nvidia.com/gpu") == "2", usage
        core = client.CoreV1Api(api_client)

        def running() -> list:
            return [p for p in core.list_namespaced_pod(ns, label_selector="job-name=parity-hami").items
                    if p.status.phase == "Running"]

        pods = _eventually(running, "the HAMi pod running", 90, cluster_under_test)
        node = core.read_node(pods[0].spec.node_name)
        assert node.metadata.labels.get("gpu") == "on", node.metadata.labels
    finally:
        client.BatchV1Api(api_client).delete_namespaced_job("parity-hami", ns, propagation_policy="Background")
        api_client.close()
    connections.close_all()


def _pod_group_member(name: str, ns: str, group: str, total: int, cpu: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/pod-group-name": group},
                         "annotations": {"kueue.x-k8s.io/pod-group-total-count": str(total),
                                         "sandbox.gpuportal.dev/duration": "1h"}},
            "spec": {"restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "main", "image": "registry.example/worker:1",
                                     "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}


def test_a_kueue_pod_group_is_admitted_whole_or_waits_whole(cluster_under_test) -> None:
    """Plain pods in a group: gated until the group is complete, then one Workload admits them together; a group
    over quota stays gated as a whole, with the same pending message on both clusters."""
    from kubernetes import client

    api_client = _api(cluster_under_test)
    core, co = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    ns = f"parity-pods-{int(time.time() * 1000) % 10**8}"
    gate = "kueue.x-k8s.io/admission"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    co.create_cluster_custom_object(*KUEUE, "resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": ns}})
    co.create_cluster_custom_object(*KUEUE, "clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": ns},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                     {"name": ns, "resources": [{"name": "cpu", "nominalQuota": "10"},
                                                {"name": "memory", "nominalQuota": "64Gi"}]}]}]}})
    co.create_namespaced_custom_object(*KUEUE, ns, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": ns},
        "spec": {"clusterQueue": ns}})
    _eventually(lambda: (_cond(co.get_cluster_custom_object(*KUEUE, "clusterqueues", ns), "Active") or {}).get(
        "status") == "True", "the ClusterQueue active", 30, cluster_under_test)
    try:
        def pods(group: str) -> list:
            return [p for p in core.list_namespaced_pod(ns).items
                    if (p.metadata.labels or {}).get("kueue.x-k8s.io/pod-group-name") == group]

        def gated(pod) -> bool:
            return any(g.name == gate for g in (pod.spec.scheduling_gates or []))

        core.create_namespaced_pod(ns, _pod_group_member("grp-0", ns, "grp", 3, "1"))
        core.create_namespaced_pod(ns, _pod_group_member("grp-1", ns, "grp", 3, "1"))
        cluster_under_test.advance(2)
        time.sleep(2)
        assert all(gated(p) for p in pods("grp")), "an incomplete group must stay gated"
        assert not [w for w in co.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
                    if (_cond(w, "Admitted") or {}).get("status") == "True"]
        core.create_namespaced_pod(ns, _pod_group_member("grp-2", ns, "grp", 3, "1"))
        _eventually(lambda: len(pods("grp")) == 3 and not any(gated(p) for p in pods("grp")),
                    "the whole group ungated", 60, cluster_under_test)
        workloads = co.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
        assert len(workloads) == 1, [w["metadata"]["name"] for w in workloads]
        assert workloads[0]["spec"]["podSets"][0]["count"] == 3
        _eventually(lambda: all(p.status.phase == "Running" for p in pods("grp")), "the group running", 60,
                    cluster_under_test)
        # A group that can never fit (3 x 4 cpu against 10 - 3 in use) waits whole, every pod gated.
        for i in range(3):
            core.create_namespaced_pod(ns, _pod_group_member(f"big-{i}", ns, "big", 3, "4"))

        def pending() -> dict | None:
            for w in co.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]:
                cond = _cond(w, "QuotaReserved")
                if w["spec"]["podSets"][0]["count"] == 3 and w["metadata"]["uid"] != workloads[0]["metadata"]["uid"] \
                        and cond and cond["status"] == "False" and "insufficient" in cond.get("message", ""):
                    return cond
            return None

        cond = _eventually(pending, "the big group pending", 60, cluster_under_test)
        assert cond["reason"] == "Pending", cond
        assert cond["message"].startswith("couldn't assign flavors to pod set"), cond["message"]
        assert f"insufficient unused quota for cpu in flavor {ns}" in cond["message"] or \
            f"insufficient quota for cpu in flavor {ns}" in cond["message"], cond["message"]
        assert all(gated(p) for p in pods("big"))
        # The portal's "why is it pending?" reads the resource and the flavor out of this message.
        from workloads.pending import _INSUFFICIENT

        found = _INSUFFICIENT.search(cond["message"])
        assert found and (found["resource"], found["flavor"]) == ("cpu", ns), cond["message"]
    finally:
        core.delete_namespace(ns)
        for plural in ("clusterqueues", "resourceflavors"):
            with contextlib.suppress(client.ApiException):
                co.delete_cluster_custom_object(*KUEUE, plural, ns)
        api_client.close()


def test_a_finished_job_is_removed_after_its_ttl(cluster_under_test) -> None:
    """``ttlSecondsAfterFinished``: the Job completes, then the TTL controller deletes it and its pods go with it."""
    from kubernetes import client

    api_client = _api(cluster_under_test)
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    ns = f"parity-ttl-{int(time.time() * 1000) % 10**8}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        batch.create_namespaced_job(ns, {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "short"},
            "spec": {"ttlSecondsAfterFinished": 3, "backoffLimit": 0, "template": {
                "metadata": {"annotations": {"sandbox.gpuportal.dev/duration": "2s"}},
                "spec": {"restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "main", "image": "registry.example/worker:1",
                                         "resources": {"requests": {"cpu": "100m"}}}]}}}})

        def complete() -> bool:
            try:
                job = batch.read_namespaced_job("short", ns)
            except client.ApiException:
                return False
            return any(c.type == "Complete" and c.status == "True" for c in (job.status.conditions or []))

        _eventually(complete, "the Job Complete", 60, cluster_under_test)

        def gone() -> bool:
            try:
                batch.read_namespaced_job("short", ns)
            except client.ApiException as exc:
                return exc.status == 404
            return False

        _eventually(gone, "the Job removed by its TTL", 60, cluster_under_test)
        _eventually(lambda: not core.list_namespaced_pod(ns).items, "its pods removed", 60, cluster_under_test)
    finally:
        core.delete_namespace(ns)
        api_client.close()


def test_a_recreate_deployment_is_available_only_with_all_its_replicas(cluster_under_test) -> None:
    """The beat's Deployment is ``Recreate`` (never two at once). Such a Deployment may be short of no replica: the
    deployment controller says Available only once every replica is, and never while its one pod cannot be placed."""
    from kubernetes import client

    api_client = _api(cluster_under_test)
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    ns = f"parity-recreate-{int(time.time() * 1000) % 10**8}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def deployment(name: str, cpu: str) -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}},
                                      "spec": {"tolerations": [{"operator": "Exists"}],
                                               "containers": [{"name": "main", "image": "registry.example/beat:1",
                                                               "resources": {"requests": {"cpu": cpu}}}]}}}}

    def available(name: str) -> tuple[str, int] | None:
        status = apps.read_namespaced_deployment_status(name, ns).status
        cond = next((c for c in status.conditions or [] if c.type == "Available"), None)
        return (cond.status, status.available_replicas or 0) if cond else None

    try:
        apps.create_namespaced_deployment(ns, deployment("placed", "100m"))
        apps.create_namespaced_deployment(ns, deployment("unplaceable", "100000"))  # no node has 100,000 CPUs
        _eventually(lambda: available("placed") == ("True", 1), "the placeable Deployment Available", 60,
                    cluster_under_test)
        _eventually(lambda: available("unplaceable"), "the unplaceable Deployment's Available condition", 60,
                    cluster_under_test)
        cluster_under_test.advance(5)
        assert available("unplaceable") == ("False", 0)
    finally:
        core.delete_namespace(ns)
        api_client.close()


def test_a_write_into_a_missing_or_terminating_namespace_names_the_namespace(cluster_under_test) -> None:
    """The materializer waits (and has the namespace restored) instead of failing a request when its project's
    namespace is gone: ``ClusterRejected.missing_namespace`` reads the namespace from the cluster's refusal, a 404
    for a namespace that does not exist and a 403 ``NamespaceTerminating`` for one being deleted."""
    from kubernetes import client

    from portal.kube import ClusterRejected, Kube

    api_client = _api(cluster_under_test)
    core = client.CoreV1Api(api_client)
    kube = Kube(kubeconfig_path=str(cluster_under_test.kubeconfig))
    stamp = int(time.time() * 1000) % 10**8
    missing, held = f"parity-missing-{stamp}", f"parity-held-{stamp}"

    def config_map(ns: str, name: str, finalizers: list[str] | None = None) -> dict:
        meta: dict[str, Any] = {"name": name, "namespace": ns, **({"finalizers": finalizers} if finalizers else {})}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"a": "b"}}

    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": held}})
    try:
        with pytest.raises(ClusterRejected) as gone:
            kube.apply(config_map(missing, "one"))
        assert (gone.value.status, gone.value.missing_namespace) == (404, missing), gone.value
        kube.apply(config_map(held, "holder", ["parity.example/hold"]))  # keeps the namespace terminating
        core.delete_namespace(held)

        def refused() -> ClusterRejected | None:
            try:
                kube.apply(config_map(held, f"late-{time.monotonic_ns()}"))
            except ClusterRejected as exc:
                return exc
            return None

        terminating = _eventually(refused, "a write into the terminating namespace refused", 60, cluster_under_test)
        assert (terminating.status, terminating.missing_namespace) == (403, held), terminating
        with pytest.raises(ClusterRejected) as invalid:  # a refusal of another kind names no namespace
            kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Not_A_Name", "namespace": "default"}})
        assert invalid.value.status == 422 and invalid.value.missing_namespace is None, invalid.value
    finally:
        with contextlib.suppress(Exception):
            core.patch_namespaced_config_map("holder", held, {"metadata": {"finalizers": None}})
        with contextlib.suppress(Exception):
            core.delete_namespace(held)
        kube.close()
        api_client.close()


def test_a_mig_layout_change_runs_through_every_step(cluster_under_test, cast, settings) -> None:
    """The portal's MIG change (cordon, drain, relabel, reconfigure, verify, quotas, uncordon) against each cluster's
    MIG manager (the sandbox's own; on the real control plane the same logic as a stand-in, realcluster/migmanager.py):
    the same steps, the same new capacity, the same events; then the layout is put back."""
    from maintenance import services as mig
    from maintenance.models import MigChange
    from quotas.demo import seed_quota_demo
    from quotas.models import Node, NodePool
    from tenants.access import Actor
    from tenants.services import ops_user_ensure

    from ..factories import UserFactory
    from ..maintenance.conftest import drive, window

    if _kind(cluster_under_test) == "real":
        _clean_real(cluster_under_test)
    Cluster.objects.all().delete()
    settings.KUBECONFIG = str(cluster_under_test.kubeconfig)
    kube_cache_clear()
    seed_quota_demo(architecture="C", reconcile_now=True)
    cluster = Cluster.objects.get(name="sandbox")
    ops2 = UserFactory(username="ops2")
    ops_user_ensure(actor=Actor.system(), user=ops2)

    def change_to(layout: str) -> MigChange:
        # The nodes' pool now (a new layout is a new pool: the pool key holds the MIG config).
        current = Node.objects.filter(cluster=cluster, pool__sharing=NodePool.Sharing.MIG, present=True).first().pool
        change = mig.mig_change_propose(actor=cast.actor("ops"), pool=current,
                                        to_layout=layout, reason="parity", **window())
        change = mig.mig_change_approve(actor=Actor(user=ops2), change=change, comment="go")
        return drive(cluster_under_test, change, lambda c: c.status in ("succeeded", "rolled_back", "failed"),
                     timeout=180)

    change = change_to("all-1g.10gb")
    assert change.status == MigChange.Status.SUCCEEDED, (_kind(cluster_under_test), change.status_reason)
    steps = list(change.steps.filter(outcome="done").values_list("step", flat=True))
    assert steps == ["cordon", "drain", "relabel", "reconfigure", "verify", "quotas", "uncordon"]
    kube = kube_for(cluster)
    for node in Node.objects.filter(cluster=cluster, name__in=change.nodes):
        assert node.mig_config_state == "success" and node.allocatable["nvidia.com/mig-1g.10gb"] == "56"
        live = kube.get("v1", "Node", node.name)
        assert not live["spec"].get("unschedulable")
        assert live["status"]["allocatable"].get("nvidia.com/mig-3g.40gb", "0") == "0"
        reasons = [e["reason"] for e in _events_of(kube, live)]
        assert "MIGConfigPending" in reasons and "MIGConfigApplied" in reasons, reasons
    back = change_to("all-balanced")
    assert back.status == MigChange.Status.SUCCEEDED, back.status_reason
    connections.close_all()

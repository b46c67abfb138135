"""An architecture change and the work in the queues (docs/architecture.md, "Architecture changes and running work"),
against the sandbox cluster with the demo as `make run` seeds it: the plan says before apply which Workloads the switch
moves (running work in removed ClusterQueues, pending work that a looser queue may admit at once), apply follows the
policy ops chose (keep, requeue, drain), and the projects' in-use figures stay true while a removed ClusterQueue is
Terminating behind Kueue's resource-in-use finalizer."""

from __future__ import annotations

import io
from decimal import Decimal

import pytest
from django.core.management import call_command

from portal.kube import kube_cache_clear, kube_for
from quotas import manifests as m
from quotas.demo import seed_quota_demo
from quotas.models import Cluster, Quota
from quotas.reconcile import reconcile, workload_usage
from quotas.tasks import architecture_change_apply_task
from workloads.models import RequestState, WorkloadRequest
from tenants.access import Actor
from tenants.demo import seed_demo
from workloads import services
from workloads.tasks import request_changed_task, request_materialize_task, requests_sync_task

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(300)]
API = "/api/v1"


def _without_the_demo_service(made: dict) -> None:
    """The demo's inference service (chat-demo) is not part of this story (it runs on acme-vision's online H100s),
    so it is stopped and its objects removed first."""
    service = next((r for r in made.values() if r.name == "chat-demo"), None)
    if service is None:
        return
    made.pop(service.name, None)
    stopped = services.request_stop(actor=Actor(user=service.requested_by), request=service, reason="not in this test")
    request_changed_task.apply(args=[stopped.pk, "stop"]).get()


def _seed_demo_on_f() -> None:
    """The demo as `make run` seeds it, on architecture F (its H100 zone runs E, where Volcano, not a ClusterQueue,
    holds the training): these stories are about the work in Kueue's queues."""
    seed_demo()
    seed_quota_demo(architecture="F", reconcile_now=False)
    call_command("seed_demo", stdout=io.StringIO())


def _settle(sandbox, rounds: int = 3) -> None:
    for _ in range(rounds):
        sandbox.advance(5)
        requests_sync_task.apply().get()


def _switch(api, cluster: Cluster, architecture: str, policy: str) -> dict:
    url = f"{API}/clusters/{cluster.pk}/architecture/"
    plan = api("ops").get(url, {"architecture": architecture}).json()["plan"]
    started = api("ops").post(url, {"architecture": architecture, "fingerprint": plan["fingerprint"], "policy": policy},
                              format="json")
    assert started.status_code == 202, started.content
    architecture_change_apply_task.apply(args=[started.json()["id"]]).get()
    change = api("ops").get(url).json()["change"]
    assert change["state"] == "applied", change
    return change


def _used(project: str, resource: str = "nvidia.com/gpu") -> Decimal:
    return sum((q.used for q in Quota.objects.filter(project__slug=project, resource=resource,
                                                     flavor__name="h100-80gb-offline")), Decimal(0))


def _h100_held(kube, namespace: str) -> Decimal:
    """What the namespace's admitted Workloads hold of offline H100s, whatever queue admitted them."""
    queues = {q["metadata"]["name"] for q in kube.list(m.KUEUE, "ClusterQueue")[0]}
    usage = workload_usage(kube.list(m.KUEUE, "Workload", namespace=namespace)[0], queues)
    return usage.get((namespace, "h100-80gb-offline", "nvidia.com/gpu"), Decimal(0))


def test_switching_architectures_says_what_moves_and_keeps_usage_true(api, as_user, fresh_sandbox, settings) -> None:
    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    kube_cache_clear()
    _seed_demo_on_f()  # architecture F, the demo requests
    cluster = Cluster.objects.get(name="sandbox")
    kube = kube_for(cluster)
    made = {r.name: r for r in WorkloadRequest.objects.filter(idempotency_key__startswith="demo-")}
    _without_the_demo_service(made)
    for req in sorted((r for r in made.values() if r.state == RequestState.APPROVED), key=lambda r: r.pk):
        request_materialize_task.apply(args=[req.pk]).get()
    _settle(fresh_sandbox)
    finetune = WorkloadRequest.objects.get(pk=made["llm-finetune"].pk)
    assert finetune.state == RequestState.QUEUED  # waits for acme-vision's quota
    namespace = finetune.project.namespace

    # Before apply: the plan for A says the pending fine-tune would be admitted under the shared queue's limits,
    # and which running work sits in queues A removes.
    plan = api("ops").get(f"{API}/clusters/{cluster.pk}/architecture/", {"architecture": "A"}).json()["plan"]
    moves = {w["owner"]: w for w in plan["workloads"]}
    pending = moves[finetune.k8s_name]
    assert pending["state"] == "pending" and pending["looser"] and pending["to_queue"] == m.SHARED_QUEUE
    assert "not its project's quota" in pending["effects"]["keep"]
    running = [w for w in plan["workloads"] if w["state"] == "running" and w["namespace"] == namespace]
    assert running and all(w["from_queue"] != m.SHARED_QUEUE for w in running)
    page = as_user("ops").get(f"/ops/clusters/{cluster.name}/?architecture=A")
    assert page.status_code == 200 and finetune.k8s_name in page.content.decode()
    assert "looser limits" in page.content.decode()

    # keep: the fine-tune is admitted in `shared`; F's project queues that still run work stay Terminating.
    change = _switch(api, cluster, "A", "keep")
    assert change["result"]["policy"] == "keep" and change["result"]["workloads"]
    _settle(fresh_sandbox)
    assert WorkloadRequest.objects.get(pk=finetune.pk).state == RequestState.RUNNING, finetune.pending_reason
    terminating = [q for q in kube.list(m.KUEUE, "ClusterQueue")[0] if q["metadata"].get("deletionTimestamp")]
    assert terminating and all(q["status"]["admittedWorkloads"] > 0 for q in terminating)
    cluster.refresh_from_db()
    reconcile(cluster, kube=kube)
    assert _used("acme-vision") == _h100_held(kube, namespace) >= Decimal(8)

    # Back to F with requeue: the plan names the fine-tune running in `shared`; apply evicts it and queues it in
    # acme-vision's own queue, where the project quota holds it again; `shared` goes once empty.
    plan = api("ops").get(f"{API}/clusters/{cluster.pk}/architecture/", {"architecture": "F"}).json()["plan"]
    back = {w["owner"]: w for w in plan["workloads"]}[finetune.k8s_name]
    assert back["state"] == "running" and back["from_queue"] == m.SHARED_QUEUE
    assert "evicted" in back["effects"]["requeue"] and "Terminating" in back["effects"]["keep"]
    change = _switch(api, cluster, "F", "requeue")
    assert change["result"]["work"]["requeued"] >= 1
    _settle(fresh_sandbox)
    wl = next(w for w in kube.list(m.KUEUE, "Workload", namespace=namespace)[0]
              if w["metadata"]["ownerReferences"][0]["name"] == finetune.k8s_name)
    conditions = {c["type"]: c["status"] for c in wl["status"]["conditions"]}
    assert conditions.get("QuotaReserved") != "True"
    assert kube.get(m.KUEUE, "ClusterQueue", m.SHARED_QUEUE) is None
    cluster.refresh_from_db()
    reconcile(cluster, kube=kube)
    assert _used("acme-vision") == _h100_held(kube, namespace)


def test_drain_holds_removed_queues_until_their_work_is_done(api, fresh_sandbox, settings) -> None:
    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    kube_cache_clear()
    _seed_demo_on_f()
    cluster = Cluster.objects.get(name="sandbox")
    kube = kube_for(cluster)
    made = {r.name: r for r in WorkloadRequest.objects.filter(idempotency_key__startswith="demo-")}
    _without_the_demo_service(made)
    for req in sorted((r for r in made.values() if r.state == RequestState.APPROVED), key=lambda r: r.pk):
        request_materialize_task.apply(args=[req.pk]).get()
    _settle(fresh_sandbox)
    namespace = made["llm-finetune"].project.namespace

    change = _switch(api, cluster, "A", "drain")
    held = change["result"]["work"]["draining"]
    assert held, change["result"]
    for name in held:  # stopped, not deleted: it admits nothing new while its work runs on
        cq = kube.get(m.KUEUE, "ClusterQueue", name)
        assert cq["spec"]["stopPolicy"] == "Hold" and not cq["metadata"].get("deletionTimestamp")
    _settle(fresh_sandbox)
    cluster.refresh_from_db()
    reconcile(cluster, kube=kube)  # the periodic reconcile leaves a draining queue alone...
    assert all(kube.get(m.KUEUE, "ClusterQueue", name) is not None for name in held)
    assert _used("acme-vision") == _h100_held(kube, namespace)
    fresh_sandbox.advance(9 * 3600)  # the training job ends (8 h); the notebook runs until it is deleted...
    for wl in kube.list(m.KUEUE, "Workload", namespace=namespace)[0]:
        owner = wl["metadata"]["ownerReferences"][0]
        if owner["name"] == made["explore-data"].k8s_name:  # ...as its user does, with kubectl
            kube.delete(owner["apiVersion"], owner["kind"], owner["name"], namespace)
    _settle(fresh_sandbox)
    reconcile(cluster, kube=kube)  # ...and removes it once its admitted work is done
    _settle(fresh_sandbox, rounds=1)
    assert [name for name in held if kube.get(m.KUEUE, "ClusterQueue", name) is not None] == []
    assert _used("acme-vision") == _h100_held(kube, namespace)

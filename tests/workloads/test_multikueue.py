"""Kueue MultiKueue end to end (docs/federation.md, "Kueue MultiKueue"): three sandbox clusters, one a MultiKueue
manager and two its workers, each its own API server. Ops set the roles on the cluster pages; the portal routes to the
manager only and materializes there once; Kueue on the manager dispatches the job to the worker whose Kueue admits
it; the request's page and the API say which worker runs it; stopping it removes the worker's copy; the
architecture review's routing answer says "MultiKueue on <manager>". Materialization and the follower run in the
test (no Celery worker)."""

from __future__ import annotations

import base64
import re
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from insights.review import answer_routing
from insights.review_selectors import review_snapshot_for
from portal.kube import kube_cache_clear, kube_for
from quotas.inventory import flavors_discover, inventory_sync, node_taints
from quotas.models import Cluster, Flavor, Quota
from quotas.reconcile import export_yaml, plan_build, reconcile
from workloads.catalogue import seed_catalogue
from workloads.materialize import request_materialize
from workloads.models import RequestState, ServiceTemplate, WorkloadRequest
from workloads.status import requests_sync
from workloads.tasks import request_changed_task

from ..zones import zone_profile
from sandbox.testing import _start

S = RequestState
KUEUE = "kueue.x-k8s.io/v1beta2"
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(300)]
NAMES = ("pool-manager", "mk-worker1", "mk-worker2")


@pytest.fixture
def three(tmp_path: Path, cast):
    kube_cache_clear()
    sandboxes = {n: _start(tmp_path / n, profile=zone_profile("H100-80GB")) for n in NAMES}
    try:
        clusters = {}
        for name, sb in sandboxes.items():
            cluster = Cluster.objects.create(name=name, architecture="B", kubeconfig_path=str(sb.kubeconfig), zone=name)
            kube = kube_for(cluster)
            inventory_sync(cluster, kube=kube)
            for flavor in flavors_discover(cluster, taints_by_node=node_taints(kube)):
                flavor.save()
            for flavor in Flavor.objects.filter(cluster=cluster):
                for resource in flavor.resource_names:
                    # worker1 gives the project no GPU: its Kueue never admits the copy, worker2's does
                    amount = {"cpu": 64, "memory": 512}.get(resource, 0 if name == "mk-worker1" else 2)
                    Quota.objects.create(tenant=cast.acme, flavor=flavor, resource=resource, nominal=Decimal(amount))
                    Quota.objects.create(tenant=cast.acme, project=cast.vision, flavor=flavor, resource=resource,
                                         nominal=Decimal(amount), borrowing_limit=Decimal(0))
            clusters[name] = cluster
        seed_catalogue()
        for template in ServiceTemplate.objects.all():
            template.allowed_flavors.set(Flavor.objects.all())
        yield {"clusters": clusters, "sandboxes": sandboxes}
    finally:
        for sb in sandboxes.values():
            sb.stop()
        kube_cache_clear()


def _settings(client: Any, name: str, **fields: Any):
    data = {"settings-overcommit_percent": 0, "settings-topology": ""} | {f"settings-{k}": v for k, v in fields.items()}
    return client.post(f"/ops/clusters/{name}/settings/", data)


def _until(test, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _active(obj: dict | None) -> bool:
    return any(c["type"] == "Active" and c["status"] == "True" for c in ((obj or {}).get("status") or {}).get("conditions") or [])


def _sync_until(three: dict, pk: int, test, what: str, timeout: float = 60) -> WorkloadRequest:
    deadline = time.monotonic() + timeout
    manager = three["clusters"]["pool-manager"]
    while True:
        req = WorkloadRequest.objects.get(pk=pk)
        if test(req):
            return req
        assert time.monotonic() < deadline, f"{what}: {req.state} {req.state_reason} {req.cluster_status}"
        requests_sync(cluster=Cluster.objects.get(pk=manager.pk), watch_seconds=1)


def test_a_request_routed_to_a_multikueue_manager_runs_on_the_worker_that_admits_it(three, api, as_user, cast) -> None:
    clusters, sandboxes = three["clusters"], three["sandboxes"]
    manager = clusters["pool-manager"]
    ops = as_user("ops")
    # Ops say which mechanism each cluster uses; a worker without its manager is refused, nothing saved.
    refused = _settings(ops, "mk-worker1", role="worker")
    assert refused.status_code == 200 and "A MultiKueue worker needs its manager cluster." in refused.content.decode()
    assert Cluster.objects.get(name="mk-worker1").role == "standalone"
    assert _settings(ops, "pool-manager", role="manager").status_code == 302
    for name in ("mk-worker1", "mk-worker2"):
        assert _settings(ops, name, role="worker", manager_id=manager.pk).status_code == 302
    assert Cluster.objects.get(name="mk-worker2").manager_id == manager.pk
    # The manager's reconcile writes its MultiKueue objects (ops apply none): per worker a kubeconfig Secret in
    # kueue-system and a MultiKueueCluster named as the worker, the config listing them, the AdmissionCheck.
    for cluster in Cluster.objects.all():
        assert reconcile(cluster, kube=kube_for(cluster)).ok
    mk = sandboxes["pool-manager"].store
    secret = mk.try_get("v1", "Secret", "mk-worker2-kubeconfig", "kueue-system")
    assert base64.b64decode(secret["data"]["kubeconfig"]) == Path(sandboxes["mk-worker2"].kubeconfig).read_bytes()
    assert mk.try_get(KUEUE, "MultiKueueConfig", "multikueue")["spec"]["clusters"] == ["mk-worker1", "mk-worker2"]
    check = mk.try_get(KUEUE, "AdmissionCheck", "multikueue")["spec"]
    assert check["controllerName"] == "kueue.x-k8s.io/multikueue" and check["parameters"]["name"] == "multikueue"
    _until(lambda: all(_active(mk.try_get(KUEUE, "MultiKueueCluster", n)) for n in ("mk-worker1", "mk-worker2")),
           "the MultiKueueClusters Active")
    # A reconcile of the unchanged manager writes nothing; its plan and export never show the kubeconfig.
    manager_row = Cluster.objects.get(name="pool-manager")
    assert plan_build(manager_row, kube=kube_for(manager_row)).empty
    token = sandboxes["mk-worker2"].token
    exported = export_yaml(manager_row)
    assert "name: mk-worker2-kubeconfig" in exported and token not in exported
    assert secret["data"]["kubeconfig"] not in exported
    # The manager's ClusterQueues name the MultiKueue check; the workers' do not.
    kube = kube_for(Cluster.objects.get(name="pool-manager"))
    cqs = [q for q in kube.list(KUEUE, "ClusterQueue")[0] if q["metadata"]["name"].startswith("acme")]
    assert cqs and all(q["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": "multikueue"}]} for q in cqs)
    wkube = kube_for(Cluster.objects.get(name="mk-worker2"))
    assert all("admissionChecksStrategy" not in q["spec"] for q in wkube.list(KUEUE, "ClusterQueue")[0])
    # Each worker holds the manager's queue names for the project (Kueue's MultiKueue requires it), worker1 too.
    manager_lqs = {(q["metadata"]["namespace"], q["metadata"]["name"], q["spec"]["clusterQueue"])
                   for q in mk.list(KUEUE, "LocalQueue")["items"]}
    assert (cast.vision.namespace, "acme-vision", "acme-vision") in manager_lqs
    for name in ("mk-worker1", "mk-worker2"):
        lqs = {(q["metadata"]["namespace"], q["metadata"]["name"], q["spec"]["clusterQueue"])
               for q in sandboxes[name].store.list(KUEUE, "LocalQueue")["items"]}
        assert lqs == manager_lqs, name
        assert sandboxes[name].store.try_get(KUEUE, "ClusterQueue", "acme-vision") is not None

    # The new-request form offers the manager's flavors, never a worker's (work reaches a worker through its manager).
    form = as_user("carol").get("/requests/new/?template=training&project=acme-vision").content.decode()
    select = re.search(r'<select name="flavor".*?</select>', form, re.S)
    assert select is not None
    offered = set(re.findall(r'<option value="(\d+)"', select.group(0)))
    assert offered == {str(pk) for pk in Flavor.objects.filter(cluster=manager).values_list("pk", flat=True)}
    training = ServiceTemplate.objects.filter(slug="training").order_by("-version").first()
    listed = api("carol").get(f"/api/v1/templates/{training.pk}/?project=acme-vision").json()["allowed_flavors"]
    assert {str(f["id"]) for f in listed} == offered  # the API offers what the form does

    # Submitted through the API: routed to the manager, never straight to a worker (worker2, as free as the manager
    # and first by name, would win the portal's own routing), materialized there once.
    created = api("carol").post("/api/v1/requests/", {
        "project": "acme-vision", "template": "training", "flavor": "h100-80gb", "gpus": 2, "duration_hours": 1,
        "name": "via-multikueue", "parameters": {"command": "python train.py"}}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["placement"]["cluster"] == "pool-manager"
    pk = created.json()["id"]
    assert request_materialize(request_id=pk) == "queued"
    req = _sync_until(three, pk, lambda r: r.state == S.RUNNING, "running on a worker")
    assert req.cluster_id == manager.pk
    assert req.state_reason == "Admitted; dispatched by MultiKueue to worker mk-worker2; 1 pod running."
    # It runs on worker2 (worker1 gave no GPU): the pods are there, none on the manager nor on worker1.
    ns = cast.vision.namespace
    pods = {n: sandboxes[n].store.list("v1", "Pod", ns)["items"] for n in NAMES}
    assert len(pods["mk-worker2"]) == 1 and not pods["pool-manager"] and not pods["mk-worker1"]
    assert not sandboxes["mk-worker1"].store.list(KUEUE, "Workload", ns)["items"]

    # The request's page says where it runs and who dispatched it; another tenant does not see it.
    page = as_user("carol").get(f"/requests/{pk}/").content.decode()
    assert "Runs on worker mk-worker2, dispatched by MultiKueue on pool-manager." in page
    assert as_user("erin").get(f"/requests/{pk}/").status_code == 404
    detail = api("carol").get(f"/api/v1/requests/{pk}/").json()
    assert (detail["placement"]["cluster"], detail["placement"]["worker"]) == ("pool-manager", "mk-worker2")

    # The architecture review says which mechanism the deployment uses.
    routing = answer_routing(review_snapshot_for(actor=cast.actor("ops")))
    assert routing.answer.startswith("MultiKueue on pool-manager (workers mk-worker1, mk-worker2): ")
    assert "MultiKueue on pool-manager: dispatches to mk-worker1, mk-worker2" in routing.details

    # Stopped: the portal deletes the Job on the manager, and MultiKueue the worker's copy.
    assert api("carol").post(f"/api/v1/requests/{pk}/stop/", {}, format="json").status_code == 200
    request_changed_task.apply(args=[pk, "stop"]).get()
    deadline = time.monotonic() + 30
    while sandboxes["mk-worker2"].store.list("batch/v1", "Job", ns)["items"] or \
            sandboxes["mk-worker2"].store.list(KUEUE, "Workload", ns)["items"]:
        assert time.monotonic() < deadline, "the worker's copy stayed"
        time.sleep(0.2)

    # Ops demote worker1 to standalone: the manager's reconcile prunes its Secret and MultiKueueCluster and takes it
    # out of the config (the plan shows the Secret's deletion without its content); worker2 stays.
    assert _settings(as_user("ops"), "mk-worker1", role="standalone", manager_id="").status_code == 302
    plan = plan_build(manager_row, kube=kube_for(manager_row))
    assert "Secret/kueue-system/mk-worker1-kubeconfig" in plan.text()
    assert sandboxes["mk-worker1"].token not in plan.text()
    assert reconcile(manager_row, kube=kube_for(manager_row)).ok
    assert mk.try_get("v1", "Secret", "mk-worker1-kubeconfig", "kueue-system") is None
    assert mk.try_get(KUEUE, "MultiKueueCluster", "mk-worker1") is None
    assert mk.try_get(KUEUE, "MultiKueueConfig", "multikueue")["spec"]["clusters"] == ["mk-worker2"]
    assert mk.try_get(KUEUE, "MultiKueueCluster", "mk-worker2") is not None
    assert plan_build(manager_row, kube=kube_for(manager_row)).empty


def test_a_worker_whose_queues_differ_from_its_managers_is_refused_and_left_out(three, api, as_user) -> None:
    """A worker with another architecture than its manager's would never admit what MultiKueue dispatches: the
    cluster page and the API refuse it (a field error, nothing saved), a manager's architecture change is refused
    while its workers differ, and a mismatch already in the data is reported by the manager's plan, which leaves the
    worker out of MultiKueue (its Secret and MultiKueueCluster pruned) instead of dispatching to it."""
    clusters, sandboxes = three["clusters"], three["sandboxes"]
    manager = clusters["pool-manager"]
    ops, ops_api = as_user("ops"), api("ops")
    assert _settings(ops, "pool-manager", role="manager").status_code == 302
    assert _settings(ops, "mk-worker1", role="worker", manager_id=manager.pk).status_code == 302
    # worker2 runs F (allowed while standalone): as pool-manager's worker it is refused next to the manager field.
    assert ops_api.patch("/api/v1/clusters/mk-worker2/", {"architecture": "F"}, format="json").status_code == 200
    refused = _settings(ops, "mk-worker2", role="worker", manager_id=manager.pk)
    assert refused.status_code == 200
    (error,) = refused.context["settings_form"].errors["manager_id"]
    assert "mk-worker2 would have architecture F, not B as on its manager pool-manager" in error
    assert "mk-worker2 would have architecture F, not B as on its manager pool-manager" in refused.content.decode()
    assert Cluster.objects.get(name="mk-worker2").role == "standalone"
    # A worker's own architecture, and its manager's through the API or an architecture change: refused.
    refused = ops_api.patch("/api/v1/clusters/mk-worker1/", {"architecture": "F"}, format="json")
    assert refused.status_code == 400 and "mk-worker1 would have architecture F, not B" in refused.json()["fields"]["architecture"][0]
    refused = ops_api.patch("/api/v1/clusters/pool-manager/", {"architecture": "F"}, format="json")
    assert refused.status_code == 400 and "Make mk-worker1 standalone first" in refused.json()["fields"]["architecture"][0]
    refused = ops_api.post("/api/v1/clusters/pool-manager/architecture/",
                           {"architecture": "F", "fingerprint": "0" * 64}, format="json")
    assert refused.status_code == 400 and "Make mk-worker1 standalone first" in refused.json()["fields"]["architecture"][0]
    applied = ops.post("/ops/clusters/pool-manager/apply/", {"architecture": "F", "fingerprint": "0" * 64}, follow=True)
    assert "Nothing was applied: Its MultiKueue workers would no longer have its queues" in applied.content.decode()
    assert Cluster.objects.get(name="pool-manager").architecture == "B"

    # The manager's reconcile writes worker1's MultiKueue objects.
    manager_row = Cluster.objects.get(name="pool-manager")
    assert reconcile(manager_row, kube=kube_for(manager_row)).ok
    mk = sandboxes["pool-manager"].store
    assert mk.try_get(KUEUE, "MultiKueueCluster", "mk-worker1") is not None

    # A mismatch in existing data (written before these checks): the plan reports it and writes nothing broken.
    Cluster.objects.filter(name="mk-worker1").update(architecture="F")
    plan = plan_build(manager_row, kube=kube_for(manager_row))
    assert plan.worker_mismatches == [
        "worker mk-worker1 has architecture F, not B as on its manager pool-manager: left out of MultiKueue (a workload "
        "dispatched there would never be admitted); make it match, or make it standalone"]
    assert "left out of MultiKueue" in plan.summary() and "left out of MultiKueue" in plan.text()
    assert {i.label for i in plan.deletes} >= {"Secret kueue-system/mk-worker1-kubeconfig", "MultiKueueCluster mk-worker1"}
    assert not plan.creates and not [i for i in plan.changes if "mk-worker1" in i.label]
    page = as_user("ops").get("/ops/clusters/pool-manager/").content.decode()
    assert "MultiKueue:</strong> Worker mk-worker1 has architecture F, not B as on its manager pool-manager" in page
    assert reconcile(manager_row, kube=kube_for(manager_row)).ok
    assert mk.try_get(KUEUE, "MultiKueueCluster", "mk-worker1") is None
    assert mk.try_get("v1", "Secret", "mk-worker1-kubeconfig", "kueue-system") is None

"""Kueue flavor fungibility inside one cluster (docs/federation.md, "Inside one cluster: Kueue chooses").

One sandbox cluster with two whole-GPU models, H100 and A100 (2 GPUs each, both ``nvidia.com/gpu``), ops ordering
H100 first. Through the API: a consenting job whose project allows A100 gets pods that allow both models and lets
Kueue choose; the queue lists H100 then A100 with its flavor fungibility written; a second one, submitted while
H100 is still free, is admitted by Kueue on A100 once the first holds H100, and the follower writes that back: the
request page, the API and billing name A100. A job that did not consent, and one whose project's policy refuses A100,
stay pinned to H100 (and wait there while A100 has room), and so does one where the queue lists A100 first. Other tenants see none of it. Materialization and the
follower run in the test (no worker).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from billing.models import UsageInterval
from portal.kube import kube_cache_clear, kube_for
from quotas.inventory import flavors_discover, inventory_sync, node_taints
from quotas.manifests import KUEUE
from quotas.models import Cluster, Flavor, Quota
from quotas.reconcile import reconcile
from quotas.zones import spill_policy_set
from sandbox.testing import _start
from tenants.access import Actor
from workloads.catalogue import seed_catalogue
from workloads.manifests import REQUEST_LABEL
from workloads.materialize import request_materialize
from workloads.models import RequestState, ServiceTemplate, WorkloadRequest
from workloads.status import requests_sync

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(300)]
PRODUCT = "nvidia.com/gpu.product"


def _gpu_group(name: str, model: str) -> dict[str, Any]:
    return {"name": name, "count": 1, "namePrefix": f"gpu-{name}-", "instanceType": "x", "cpu": "96", "memory": "1Ti",
            "pods": 110, "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            "gpu": {"model": model, "count": 2, "sharing": "whole"}}


@pytest.fixture
def mixed(tmp_path: Path, cast) -> Iterator[dict[str, Any]]:
    """One cluster, two models; acme-vision has 2 GPUs of each (no borrowing); ops put H100 first."""
    kube_cache_clear()
    sb = _start(tmp_path / "mixed", profile={
        "name": "zone-mixed", "kubeletVersion": "v1.33.4", "region": "r1", "zone": "mixed",
        "nodeGroups": [_gpu_group("h100", "H100-80GB"), _gpu_group("a100", "A100-80GB"),
                       {"name": "cpu", "count": 1, "namePrefix": "cpu-", "instanceType": "y", "cpu": "32",
                        "memory": "128Gi", "pods": 110}]})
    try:
        cluster = Cluster.objects.create(name="zone-mixed", architecture="B", kubeconfig_path=str(sb.kubeconfig),
                                         zone="mixed-training", failure_domain="site-a")
        kube = kube_for(cluster)
        inventory_sync(cluster, kube=kube)
        for flavor in flavors_discover(cluster, taints_by_node=node_taints(kube)):
            flavor.save()
        Flavor.objects.filter(cluster=cluster, name="h100-80gb").update(order=5)  # Kueue tries H100 first
        for flavor in Flavor.objects.filter(cluster=cluster):
            for resource in flavor.resource_names:
                amount = {"cpu": 64, "memory": 512}.get(resource, 2)
                Quota.objects.create(tenant=cast.acme, flavor=flavor, resource=resource, nominal=Decimal(amount))
                Quota.objects.create(tenant=cast.acme, project=cast.vision, flavor=flavor, resource=resource,
                                     nominal=Decimal(amount), borrowing_limit=Decimal(0))
        seed_catalogue()
        for template in ServiceTemplate.objects.all():
            template.allowed_flavors.set(Flavor.objects.all())
        assert reconcile(cluster, kube=kube).ok
        yield {"cluster": cluster, "sandbox": sb}
    finally:
        sb.stop()
        kube_cache_clear()


def _sync(mixed: dict[str, Any], advance: float = 0) -> None:
    if advance:
        mixed["sandbox"].advance(advance)
    requests_sync(cluster=Cluster.objects.get(pk=mixed["cluster"].pk), watch_seconds=1)


def _wait(mixed: dict[str, Any], pk: int, states: set[str], timeout: float = 60) -> WorkloadRequest:
    deadline = time.monotonic() + timeout
    while True:
        req = WorkloadRequest.objects.select_related("flavor").get(pk=pk)
        if req.state in states:
            return req
        assert time.monotonic() < deadline, f"{pk} stuck in {req.state}: {req.pending_reason} {req.cluster_status}"
        _sync(mixed, advance=2)


def _submit(api, name: str, gpus: int, **body: Any):
    payload = {"project": "acme-vision", "template": "training", "flavor": "h100-80gb", "gpus": gpus,
               "duration_hours": 1, "name": name, "parameters": {"command": "python train.py"}} | body
    response = api("carol").post("/api/v1/requests/", payload, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _job(mixed: dict[str, Any], cast, pk: int) -> dict[str, Any]:
    (job,) = mixed["sandbox"].store.list("batch/v1", "Job", cast.vision.namespace,
                                         label_selector=f"{REQUEST_LABEL}={pk}")["items"]
    return job


def test_kueue_chooses_between_models_the_job_accepts_inside_one_cluster(mixed, api, as_user, cast) -> None:
    both = ["h100-80gb", "a100-80gb"]
    spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=True, target_models=["a100-80gb"])

    # The project's ClusterQueue lists the models in the order ops gave them, with its fungibility written.
    cq = mixed["sandbox"].store.get(KUEUE, "ClusterQueue", "acme-vision")
    (gpus,) = [g for g in cq["spec"]["resourceGroups"] if "nvidia.com/gpu" in g["coveredResources"]]
    assert [f["name"] for f in gpus["flavors"]] == both
    assert cq["spec"]["flavorFungibility"] == {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}

    # Kueue tries the queue's flavors in their order: where ops list A100 before H100, a job that prefers H100 is not
    # left to Kueue (it would try A100 first), it stays pinned.
    a100 = Flavor.objects.get(cluster=mixed["cluster"], name="a100-80gb")
    a100.order = 1
    a100.save()  # as ops do: the submission catalogue is told (a queryset update() is not)
    before = _submit(api, "a100-listed-first", 1, accepted_models=both, spill_consent=True)
    assert before["placement"]["kueue_models"] == [] and before["placement"]["gpu_model"] == "h100-80gb", before
    cancelled = api("carol").post(f"/api/v1/requests/{before['id']}/cancel/", {"reason": "order check"}, format="json")
    assert cancelled.status_code == 200, cancelled.content
    a100.order = 10
    a100.save()

    # Two consenting jobs, both routed to H100 while it is free: Kueue may run either on A100.
    first = _submit(api, "first", 2, accepted_models=both, spill_consent=True)
    second = _submit(api, "second", 1, accepted_models=both, spill_consent=True)
    for made in (first, second):
        assert made["placement"]["gpu_model"] == "h100-80gb" and made["placement"]["kueue_models"] == both, made
        assert "Kueue may also run it on a100-80gb" in made["placement"]["reason"]
    # Pinned: one that did not consent, and (below) one whose project's policy refuses A100.
    pinned = _submit(api, "no-consent", 1, accepted_models=both)
    assert pinned["placement"]["kueue_models"] == [] and "did not consent" in pinned["placement"]["reason"]

    # The first runs on H100. Its pods allow both models' nodes (node affinity), not one pinned product.
    assert request_materialize(request_id=first["id"]) == "queued"
    template = _job(mixed, cast, first["id"])["spec"]["template"]["spec"]
    terms = template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert sorted(t["matchExpressions"][0]["values"][0] for t in terms) == ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]
    running = _wait(mixed, first["id"], {S.RUNNING})
    assert running.flavor.name == "h100-80gb" and not running.spilled

    # The second: H100 is full now, so Kueue admits it on A100, its queue's next flavor; the follower writes it back.
    assert request_materialize(request_id=second["id"]) == "queued"
    ran = _wait(mixed, second["id"], {S.RUNNING})
    assert (ran.flavor.name, ran.spilled, ran.spilled_from_model, ran.cluster_id) == (
        "a100-80gb", True, "h100-80gb", mixed["cluster"].pk)
    assert any("Kueue admitted it on a100-80gb (flavor a100-80gb) in its queue's flavor order: h100-80gb was full"
               in e.message for e in ran.events.all())
    (workload,) = [w for w in mixed["sandbox"].store.list(KUEUE, "Workload", cast.vision.namespace)["items"]
                   if w["metadata"]["ownerReferences"][0]["name"] == ran.k8s_name]
    assert workload["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == "a100-80gb"

    # The non-consenting job stays pinned to H100 and waits, though A100 has a GPU free.
    assert request_materialize(request_id=pinned["id"]) == "queued"
    _sync(mixed, advance=2)
    waiting = WorkloadRequest.objects.select_related("flavor").get(pk=pinned["id"])
    assert waiting.state == S.QUEUED and waiting.flavor.name == "h100-80gb" and waiting.kueue_flavors == []
    pod = _job(mixed, cast, pinned["id"])["spec"]["template"]["spec"]
    assert pod["nodeSelector"][PRODUCT] == "NVIDIA-H100-80GB-HBM3" and "affinity" not in pod

    # A project whose policy refuses A100: a consenting job is pinned too.
    spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=False)
    refused = _submit(api, "policy-refuses", 1, accepted_models=both, spill_consent=True)
    assert refused["placement"]["kueue_models"] == [] and refused["placement"]["gpu_model"] == "h100-80gb"
    assert "does not allow spill-over" in refused["placement"]["reason"], refused["placement"]
    spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=True, target_models=["a100-80gb"])

    # The request page and the API say which model ran; billing charges it as A100.
    page = as_user("carol").get(f"/requests/{ran.pk}/").content.decode()
    assert "Kueue chooses between h100-80gb, a100-80gb in its queue's flavor order; it admitted it on a100-80gb" in page
    assert "spilled over from h100-80gb" in page
    detail = api("carol").get(f"/api/v1/requests/{ran.pk}/").json()
    assert detail["flavor"] == "a100-80gb" and detail["placement"]["gpu_model"] == "a100-80gb"
    assert detail["placement"]["spilled"] is True and detail["placement"]["kueue_models"] == both
    _sync(mixed, advance=30)
    charged = {(i.request_id, i.key) for i in UsageInterval.objects.filter(unit="gpu")}
    assert (ran.pk, "a100-80gb") in charged and (running.pk, "h100-80gb") in charged
    assert not any(key == "h100-80gb" for pk, key in charged if pk == ran.pk)

    # Other tenants see none of it.
    assert api("erin").get(f"/api/v1/requests/{ran.pk}/").status_code == 404
    assert as_user("erin").get(f"/requests/{ran.pk}/").status_code == 404

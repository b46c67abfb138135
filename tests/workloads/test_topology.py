"""Topology-aware placement (issue 26, Kueue TAS): a Topology and flavors that name it on a cluster with racks and
blocks; distributed training may ask for one rack or block, only where that can work; the request's pod template
carries Kueue's annotation; "why is it pending?" says a topology wait in plain words, and the page says where it ran."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client as DjangoClient
from rest_framework.test import APIClient

from quotas import manifests as m
from quotas.demo import seed_quota_demo
from quotas.models import Cluster, Node
from sandbox.store import Store
from tenants.demo import seed_demo
from workloads.catalogue import seed_catalogue
from workloads.kinds import request_manifests
from workloads.models import WorkloadRequest
from workloads.pending import pending_sentence, topology_hosts

pytestmark = pytest.mark.django_db
GPU = "nvidia.com/gpu"
H100 = m.FlavorRow("h100", "whole", (GPU,), {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, (), (), "offline", 10)
HAMI = m.FlavorRow("l40s-hami", "hami", (GPU,), {"gpu": "on"}, (), (), "", 30)
ACME = m.TenantRow("acme", quotas=(m.QuotaRow("h100", GPU, 8),))
VISION = m.ProjectRow("acme-vision", "acme", quotas=(m.QuotaRow("h100", GPU, 8),))
TRAIN = {"template": "training", "project": "acme-vision", "flavor": "h100-80gb-offline", "gpus": 4, "duration_hours": 2,
         "parameters": {"command": "python train.py", "distributed": True, "workers": 2}}
TAS_MESSAGE = ('couldn\'t assign flavors to pod set main: topology "gpu-portal" allows to fit only 2 out of 3 pod(s). '
               'Total nodes: 3; excluded: resource "nvidia.com/gpu": 1')


def _render(topology: str) -> list[dict]:
    cluster = m.ClusterRow("c", "F", use_hami=True, topology=topology)
    return m.desired_state(cluster, m.Snapshot(cluster, (H100, HAMI), (ACME,), (VISION,)))


def test_a_cluster_with_racks_gets_a_topology_and_its_whole_gpu_flavors_name_it() -> None:
    objects = _render("block-rack-host")
    topology = next(o for o in objects if o["kind"] == "Topology")
    assert topology["spec"] == {"levels": [{"nodeLabel": "cloud.provider.com/topology-block"},
                                           {"nodeLabel": "cloud.provider.com/topology-rack"},
                                           {"nodeLabel": "kubernetes.io/hostname"}]}
    flavors = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "ResourceFlavor"}
    assert flavors["h100"]["topologyName"] == "gpu-portal"
    assert "topologyName" not in flavors["l40s-hami"]  # vGPU slots are not placed by rack
    assert [o["kind"] for o in objects][:1] == ["Topology"]  # applied before the flavors that name it
    store = Store()  # the upstream CRDs and their CEL rules accept them
    for obj in objects:
        if obj["kind"] in ("Topology", "ResourceFlavor"):
            store.create(obj, dry_run=True, field_manager="gpu-portal")
    plain = _render("")
    assert not any(o["kind"] == "Topology" for o in plain)
    assert not any("topologyName" in o["spec"] for o in plain if o["kind"] == "ResourceFlavor")


def test_placement_annotations_name_the_levels_label() -> None:
    cluster = m.ClusterRow("c", "F", topology="block-rack-host")
    assert m.placement_annotations(cluster, "rack") == {m.REQUIRED_TOPOLOGY: "cloud.provider.com/topology-rack"}
    assert m.placement_annotations(cluster, "block") == {m.REQUIRED_TOPOLOGY: "cloud.provider.com/topology-block"}
    assert m.placement_annotations(cluster, "prefer-rack") == {m.PREFERRED_TOPOLOGY: "cloud.provider.com/topology-rack"}
    assert m.placement_annotations(cluster, "") == {}
    assert m.placement_annotations(m.ClusterRow("c", "F"), "rack") == {}


@pytest.fixture
def demo(settings, tmp_path) -> None:
    settings.KUBECONFIG = str(tmp_path / "no-cluster")
    seed_demo()
    seed_quota_demo(architecture="F", reconcile_now=False)  # Kueue TAS places the training here (E: Volcano's HyperNodes)
    seed_catalogue()


def _carol():
    return get_user_model().objects.get(username="carol")


def _api() -> APIClient:
    api = APIClient()
    api.force_authenticate(_carol())
    return api


def _racks() -> None:
    Cluster.objects.update(topology="block-rack-host")


def test_a_distributed_job_asks_for_one_rack_and_its_pods_carry_kueues_annotation(demo) -> None:
    _racks()
    response = _api().post("/api/v1/requests/", TRAIN | {"topology": "rack"}, format="json")
    assert response.status_code == 201, response.content
    req = WorkloadRequest.objects.get(pk=response.json()["id"])
    assert req.topology == "rack"
    job = next(o for o in request_manifests(req) if o["kind"] == "Job")
    assert job["spec"]["template"]["metadata"]["annotations"][m.REQUIRED_TOPOLOGY] == "cloud.provider.com/topology-rack"
    plain = _api().post("/api/v1/requests/", TRAIN | {"name": "anywhere"}, format="json")
    assert plain.status_code == 201, plain.content
    job = next(o for o in request_manifests(WorkloadRequest.objects.get(pk=plain.json()["id"])) if o["kind"] == "Job")
    assert m.REQUIRED_TOPOLOGY not in job["spec"]["template"]["metadata"].get("annotations", {})


@pytest.mark.parametrize(("racks", "sent", "words"), [
    (False, {}, "its cluster has no racks and blocks"),
    (True, {"parameters": {"command": "python train.py"}}, "2 or more workers"),
    (True, {"flavor": "l40s-hami", "gpus": 1}, "not a whole-GPU flavor"),
    (True, {"topology": "one-node"}, "not a valid choice"),
])
def test_placement_is_refused_where_it_cannot_work(demo, racks, sent, words) -> None:
    if racks:
        _racks()
    response = _api().post("/api/v1/requests/", TRAIN | {"topology": "rack"} | sent, format="json")
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()["fields"]["topology"]), response.json()
    assert not WorkloadRequest.objects.exists()


def test_the_form_offers_placement_only_for_training_on_a_cluster_with_racks(demo) -> None:
    web = DjangoClient()
    web.force_login(_carol())
    form = web.get("/requests/new/", {"template": "training", "project": "acme-vision"}).context["form"]
    assert "topology" not in form.fields
    _racks()
    form = web.get("/requests/new/", {"template": "training", "project": "acme-vision"}).context["form"]
    assert "topology" in form.fields and "h100" in form.fields["topology"].help_text.lower()
    notebook = web.get("/requests/new/", {"template": "notebook", "project": "acme-vision"})
    assert "topology" not in notebook.context["form"].fields


def test_a_topology_wait_is_said_in_plain_words() -> None:
    status = {"objects": {"workload/w": {"c": {"QuotaReserved": ["False", "Pending", TAS_MESSAGE]}}}}
    sentence = pending_sentence(state="queued", kind="training", gpus_total=24, flavor_name="h100",
                                flavor_label="H100", resource=GPU, cluster_status=status, gpus_per_pod=8,
                                topology="rack")
    assert sentence == ("waiting for 24 x H100 free in one rack (3 workers of 8); the emptiest rack has room for 16 now "
                        "(2 workers); nothing is ahead of you")


def test_the_request_page_says_why_it_waits_and_where_it_was_placed(demo) -> None:
    _racks()
    response = _api().post("/api/v1/requests/", TRAIN | {"topology": "rack"}, format="json")
    req = WorkloadRequest.objects.get(pk=response.json()["id"])
    req.state = "queued"
    req.pending_reason = "waiting for 8 x H100 free in one rack (2 workers of 4); the emptiest rack has room for 4 now"
    req.save()
    web = DjangoClient()
    web.force_login(_carol())
    page = web.get(f"/requests/{req.pk}/").content.decode()
    assert "Placement:</strong> Within one rack" in page
    assert "the emptiest rack has room for 4 now" in page
    cluster = req.cluster
    for name, rack in (("gpu-h100-2", "rack-a2"), ("gpu-h100-3", "rack-a2")):
        Node.objects.create(cluster=cluster, name=name, labels={m.RACK_LABEL: rack, m.BLOCK_LABEL: "block-a"})
    assignment = {"levels": ["kubernetes.io/hostname"], "slices": [{"domainCount": 2, "podCounts": {"universal": 1},
                  "valuesPerLevel": [{"individual": {"prefix": "gpu-h100-", "roots": ["2", "3"]}}]}]}
    assert topology_hosts(assignment) == {"gpu-h100-2": 1, "gpu-h100-3": 1}
    req.state = "running"
    req.pending_reason = ""
    req.cluster_status = {"objects": {"workload/w": {"c": {"Admitted": ["True", "Admitted", ""]},
                                                     "topo": topology_hosts(assignment)}}}
    req.save()
    page = web.get(f"/requests/{req.pk}/").content.decode()
    assert "placed in rack rack-a2 (block block-a): gpu-h100-2, gpu-h100-3" in page


def test_placement_counts_in_the_idempotency_key_and_carries_over_to_a_clone_a_preset_and_the_api(demo) -> None:
    _racks()
    api = _api()
    first = api.post("/api/v1/requests/", TRAIN | {"topology": "rack"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201, first.content
    # The same key with another placement is another request body: refused, nothing made.
    other = api.post("/api/v1/requests/", TRAIN | {"topology": "block"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert other.status_code == 422, other.content
    assert WorkloadRequest.objects.count() == 1
    again = api.post("/api/v1/requests/", TRAIN | {"topology": "rack"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert again.json()["id"] == first.json()["id"]
    # The API says it, in the list and in the detail.
    detail = api.get(f"/api/v1/requests/{first.json()['id']}/").json()
    assert detail["topology"] == "rack"
    rows = api.get("/api/v1/requests/").json()
    rows = rows.get("results", rows)
    assert [r["topology"] for r in rows] == ["rack"]
    # Submitting again keeps the placement.
    from tenants.access import Actor
    from workloads import services

    original = WorkloadRequest.objects.get(pk=first.json()["id"])
    clone = services.request_clone(actor=Actor(user=_carol()), request=original, name="again")
    assert clone.topology == "rack"
    # A preset keeps it too.
    saved = api.post("/api/v1/presets/", {"name": "one rack", "project": "acme-vision", "template": "training",
                                          "flavor": "h100-80gb-offline", "gpus": 4, "topology": "rack",
                                          "parameters": TRAIN["parameters"]}, format="json")
    assert saved.status_code == 201, saved.content
    assert saved.json()["values"]["topology"] == "rack"


def test_a_topology_wait_is_said_when_kueue_has_moved_on_to_the_next_flavors() -> None:
    """Real Kueue (flavor fungibility) tries the queue's next flavors after the placed one's not-fit, and its
    condition then names only those; the topology wait is in the Workload's Pending event (the real control plane)."""
    status = {"objects": {"workload/w": {"c": {"QuotaReserved": [
        "False", "Pending", 'couldn\'t assign flavors to pod set main: Flavor "cpu" does not support '
                            'TopologyAwareScheduling, flavor h100-online doesn\'t match node affinity']}}},
        "warnings": [["Pending", TAS_MESSAGE], ["Pending", "couldn't assign flavors to pod set main: Flavor \"cpu\" "
                                                           "does not support TopologyAwareScheduling"]]}
    sentence = pending_sentence(state="queued", kind="training", gpus_total=24, flavor_name="h100",
                                flavor_label="H100", resource=GPU, cluster_status=status, gpus_per_pod=8,
                                topology="rack")
    assert sentence.startswith("waiting for 24 x H100 free in one rack (3 workers of 8); the emptiest rack has room "
                               "for 16 now (2 workers)"), sentence

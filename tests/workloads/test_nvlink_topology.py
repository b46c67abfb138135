"""Topology levels from the labels ops name, and NVLink domains (issue 26): ops set a cluster's levels (API and
settings page, field errors for bad label keys); the Kueue Topology, the per-rack lookups and the HyperNodes follow
them; distributed training may ask for one NVLink domain where the cluster has that level (Kueue's annotation with the
level's label, or Volcano's networkTopology with its tier), and the sandbox's Volcano places it in one domain or says
why it waits."""

from __future__ import annotations

import html

import pytest
from django.test import Client as DjangoClient

from quotas import manifests as m
from quotas.models import Cluster
from quotas.reconcile import reconcile
from sandbox.store import Store
from workloads.kinds import request_manifests
from workloads.models import RequestState, WorkloadRequest
from workloads.pending import pending_sentence

from .test_lifecycle import _world, celery_worker_thread, worker  # noqa: F401 - fixtures
from .test_topology import TAS_MESSAGE, TRAIN, _api, _carol, demo  # noqa: F401 - fixtures

S = RequestState
GPU = "nvidia.com/gpu"
ZONE = "topology.kubernetes.io/zone"
NVLINK = [{"name": "block", "label": m.BLOCK_LABEL}, {"name": "rack", "label": m.RACK_LABEL},
          {"name": "nvlink", "label": m.NVLINK_LABEL}, {"name": "host", "label": m.HOSTNAME_LABEL}]
OFFLINE = m.FlavorRow("h100-offline", "whole", (GPU,), {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, (), (),
                      "offline", 10)


def _levels(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"name": n, "label": lbl} for n, lbl in pairs]


@pytest.mark.django_db
@pytest.mark.parametrize(("sent", "words"), [
    ({"topology": "custom", "topology_levels": []}, "Name the levels"),
    ({"topology": "custom", "topology_levels": _levels(("rack", "bad label!"))}, "is not a Kubernetes label key"),
    ({"topology": "custom", "topology_levels": _levels(("rack", "a/b/c"))}, "more than one '/'"),
    ({"topology": "custom", "topology_levels": _levels(("rack", "Example.com/rack"))}, "not a DNS subdomain"),
    ({"topology": "custom", "topology_levels": _levels(("rack", "x" * 64))}, "1 to 63"),
    ({"topology": "custom", "topology_levels": _levels(("Rack!", "example.com/rack"))}, "the name 'Rack!'"),
    ({"topology": "custom", "topology_levels": _levels(("host", m.HOSTNAME_LABEL), ("rack", "example.com/rack"))},
     "can only be the lowest level"),
    ({"topology": "custom", "topology_levels": _levels(("rack", "example.com/rack"), ("rack", "example.com/r2"))},
     "used twice"),
    ({"topology": "custom", "topology_levels": _levels(("a", ZONE), ("b", ZONE))}, "used twice"),
    ({"topology": "custom", "topology_levels": _levels(*((f"l{i}", f"example.com/l{i}") for i in range(9)))},
     "At most 8 levels"),
    ({"topology": "custom", "topology_levels": [{"name": "rack", "label": "example.com/rack", "tier": 1}]},
     "a name and a label only"),
    ({"topology": "block-rack-host", "topology_levels": _levels(("rack", "example.com/rack"))},
     'with topology "custom" only'),
])
def test_bad_topology_levels_get_a_field_error_and_change_nothing(api, cast, sent, words) -> None:
    cluster = Cluster.objects.create(name="gpu-a")
    response = api("ops").patch(f"/api/v1/clusters/{cluster.pk}/", sent, format="json")
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()["fields"]["topology_levels"]), response.json()
    cluster.refresh_from_db()
    assert (cluster.topology, cluster.topology_levels) == ("", [])


@pytest.mark.django_db
def test_ops_name_the_levels_through_the_api_and_kueue_gets_them(api, cast) -> None:
    cluster = Cluster.objects.create(name="gpu-a")
    url = f"/api/v1/clusters/{cluster.pk}/"
    levels = _levels(("zone", ZONE), ("rack", "example.com/rack"), ("nvlink", m.NVLINK_LABEL),
                     ("host", m.HOSTNAME_LABEL))
    response = api("ops").patch(url, {"topology": "custom", "topology_levels": levels}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["topology_levels"] == levels
    assert api("ops").get(url).json()["topology_levels"] == levels
    assert api("carol").get(url).json()["topology_levels"] is None  # an ops setting
    cluster.refresh_from_db()
    objects = m.desired_state(cluster, m.Snapshot(m.ClusterRow("gpu-a"), (OFFLINE,)))
    topology = next(o for o in objects if o["kind"] == "Topology")
    assert topology["spec"]["levels"] == [{"nodeLabel": lv["label"]} for lv in levels]
    Store().create(topology, dry_run=True, field_manager="gpu-portal")  # Kueue's CRD and its CEL rules take it
    assert m.placement_annotations(cluster, "nvlink") == {m.REQUIRED_TOPOLOGY: m.NVLINK_LABEL}
    assert m.placement_annotations(cluster, "prefer-nvlink") == {m.PREFERRED_TOPOLOGY: m.NVLINK_LABEL}
    assert m.placement_annotations(cluster, "rack") == {m.REQUIRED_TOPOLOGY: "example.com/rack"}
    assert m.placement_annotations(cluster, "block") == {}  # no block level here
    # Back to the preset: the named levels go, the preset's labels are Kueue's again.
    response = api("ops").patch(url, {"topology": "block-rack-host"}, format="json")
    assert response.status_code == 200 and response.json()["topology_levels"] == [], response.content


@pytest.mark.django_db
def test_ops_name_the_levels_on_the_settings_page(as_user, cast) -> None:
    Cluster.objects.create(name="gpu-a")
    client = as_user("ops")
    page = html.unescape(client.get("/ops/clusters/gpu-a/").content.decode())
    assert 'name="settings-topology_levels"' in page
    keep = {"settings-overcommit_percent": "0", "settings-topology": "custom"}
    bad = client.post("/ops/clusters/gpu-a/settings/", keep | {"settings-topology_levels": "rack\nhost kubernetes.io/hostname"})
    body = html.unescape(bad.content.decode())
    assert bad.status_code == 200 and 'id="id_settings-topology_levels_error"' in body
    assert "Line 1: give a level's name and its node label key" in body
    bad = client.post("/ops/clusters/gpu-a/settings/", keep | {"settings-topology_levels": "rack bad/label/key"})
    body = html.unescape(bad.content.decode())
    assert 'id="id_settings-topology_levels_error"' in body and "is not a Kubernetes label key" in body
    assert Cluster.objects.get(name="gpu-a").topology == ""
    good = client.post("/ops/clusters/gpu-a/settings/", keep | {
        "settings-topology_levels": "zone topology.kubernetes.io/zone\r\nnvlink nvidia.com/gpu.clique\r\n"
                                    "host kubernetes.io/hostname"}, follow=True)
    assert "Settings of gpu-a saved." in html.unescape(good.content.decode())
    cluster = Cluster.objects.get(name="gpu-a")
    assert cluster.topology == "custom" and [lv["name"] for lv in cluster.topology_levels] == ["zone", "nvlink", "host"]
    page = html.unescape(client.get("/ops/clusters/gpu-a/").content.decode())
    assert "nvlink nvidia.com/gpu.clique" in page  # shown again as typed


def _nvlink(cluster_levels: list[dict[str, str]] = NVLINK, architecture: str | None = None) -> None:
    Cluster.objects.update(topology="custom", topology_levels=cluster_levels,
                           **({"architecture": architecture} if architecture else {}))


@pytest.mark.django_db
@pytest.mark.usefixtures("demo")
def test_one_nvlink_domain_is_offered_and_annotated_only_where_the_cluster_has_that_level() -> None:
    web = DjangoClient()
    web.force_login(_carol())
    Cluster.objects.update(topology="block-rack-host")
    form = web.get("/requests/new/", {"template": "training", "project": "acme-vision"}).context["form"]
    assert "rack" in dict(form.fields["topology"].choices) and "nvlink" not in dict(form.fields["topology"].choices)
    refused = _api().post("/api/v1/requests/", TRAIN | {"topology": "nvlink"}, format="json")
    assert refused.status_code == 400, refused.content
    assert "has no NVLink domain level (its levels: block, rack, host)" in " ".join(refused.json()["fields"]["topology"])
    assert not WorkloadRequest.objects.exists()

    _nvlink()
    form = web.get("/requests/new/", {"template": "training", "project": "acme-vision"}).context["form"]
    choices = dict(form.fields["topology"].choices)
    assert choices["nvlink"] == "Within one NVLink domain" and choices["prefer-nvlink"] == "Prefer one NVLink domain"
    for placement, annotation in (("nvlink", m.REQUIRED_TOPOLOGY), ("prefer-nvlink", m.PREFERRED_TOPOLOGY)):
        response = _api().post("/api/v1/requests/", TRAIN | {"topology": placement, "name": placement}, format="json")
        assert response.status_code == 201, response.content
        assert response.json()["topology"] == placement
        job = next(o for o in request_manifests(WorkloadRequest.objects.get(pk=response.json()["id"]))
                   if o["kind"] == "Job")
        annotations = job["spec"]["template"]["metadata"]["annotations"]
        assert annotations[annotation] == m.NVLINK_LABEL and m.UNCONSTRAINED_TOPOLOGY not in annotations


def test_a_kueue_wait_for_one_nvlink_domain_names_the_domain() -> None:
    status = {"objects": {"workload/w": {"c": {"QuotaReserved": ["False", "Pending", TAS_MESSAGE]}}}}
    sentence = pending_sentence(state="queued", kind="training", gpus_total=24, flavor_name="h100",
                                flavor_label="H100", resource=GPU, cluster_status=status, gpus_per_pod=8,
                                topology="nvlink")
    assert sentence.startswith("waiting for 24 x H100 free in one NVLink domain (3 workers of 8); the emptiest NVLink "
                               "domain has room for 16 now"), sentence


def test_under_e_each_nvlink_domain_is_a_tier_1_hypernode_and_racks_and_blocks_stand_above() -> None:
    cluster = m.ClusterRow("c", "E", topology="custom", topology_levels=tuple((lv["name"], lv["label"]) for lv in NVLINK))
    nodes = (("block-a", "rack-a1", "gpu-0"), ("block-a", "rack-a1", "gpu-1"), ("block-b", "rack-b1", "gpu-2"))
    objects = m.desired_state(cluster, m.Snapshot(cluster, (OFFLINE,), racks=nodes))
    hyper = {o["metadata"]["name"]: (o["spec"]["tier"], o["spec"]["tierName"], o["spec"]["members"])
             for o in objects if o["kind"] == "HyperNode"}
    node = {"type": "Node", "selector": {"labelMatch": {"matchLabels": {m.NVLINK_LABEL: "gpu-0"}}}}
    assert hyper["nvlink-gpu-0"] == (1, "nvlink", [node])
    assert hyper["rack-a1"] == (2, "rack", [{"type": "HyperNode", "selector": {"exactMatch": {"name": n}}}
                                            for n in ("nvlink-gpu-0", "nvlink-gpu-1")])
    assert hyper["block-b"] == (3, "block", [{"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-b1"}}}])
    assert set(hyper) == {"nvlink-gpu-0", "nvlink-gpu-1", "nvlink-gpu-2", "rack-a1", "rack-b1", "block-a", "block-b"}
    store = Store()  # Volcano's CRD takes them
    for obj in objects:
        if obj["kind"] == "HyperNode":
            store.create(obj, dry_run=True, field_manager="gpu-portal")
    assert m.network_topology(cluster, OFFLINE, "nvlink") == {"mode": "hard", "highestTierAllowed": 1}
    assert m.network_topology(cluster, OFFLINE, "prefer-nvlink") == {"mode": "soft", "highestTierAllowed": 1}
    assert m.network_topology(cluster, OFFLINE, "rack") == {"mode": "hard", "highestTierAllowed": 2}
    assert m.network_topology(cluster, OFFLINE, "block") == {"mode": "hard", "highestTierAllowed": 3}


@pytest.mark.usefixtures("worker")
def test_a_gang_asking_for_one_nvlink_domain_runs_within_one_and_the_next_waits_saying_why(fresh_sandbox, cast) -> None:
    """The sandbox's demo profile: each GPU node is one NVLink domain (its ``nvidia.com/gpu.clique``), 8 GPUs."""
    world = _world(fresh_sandbox, cast, architecture="E", gpus=32)
    Cluster.objects.filter(pk=world.cluster.pk).update(topology="custom", topology_levels=NVLINK)
    world.cluster.refresh_from_db()
    assert reconcile(world.cluster, kube=world.kube()).ok
    fresh_sandbox.advance(1)
    hypernodes = {h["metadata"]["name"]: h for h in fresh_sandbox.store.list(m.VOLCANO_TOPOLOGY, "HyperNode")["items"]}
    assert hypernodes["nvlink-gpu-h100-2"]["spec"]["tier"] == 1 and hypernodes["rack-a2"]["spec"]["tier"] == 2
    assert hypernodes["block-a"]["spec"]["tier"] == 3 and hypernodes["nvlink-gpu-h100-2"]["status"]["nodeCount"] == 1
    assert reconcile(world.cluster, kube=world.kube()).applied == 0  # nothing drifts

    small = {"command": "torchrun train.py", "distributed": True, "workers": 2}
    first = world.submit("bob", "training", "h100-80gb-offline", gpus=4, duration_hours=2, parameters=small,
                         topology="nvlink")
    if first.state == S.PENDING_APPROVAL:
        first = world.approve(first)
    first = world.wait(first, lambda r: r.state == S.RUNNING, advance=5)
    job = fresh_sandbox.store.get("batch.volcano.sh/v1alpha1", "Job", first.k8s_name, first.project.namespace)
    assert job["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    pods = fresh_sandbox.store.list("v1", "Pod", first.project.namespace)["items"]
    nodes = {p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].startswith(first.k8s_name)}
    assert len(nodes) == 1, nodes  # both workers in one NVLink domain

    second = world.submit("bob", "training", "h100-80gb-offline", gpus=8, duration_hours=2, parameters=small,
                          topology="nvlink")
    if second.state == S.PENDING_APPROVAL:
        second = world.approve(second)
    second = world.wait(second, lambda r: "NVLink domain" in r.pending_reason, advance=5)
    assert second.state == S.QUEUED
    assert ("it needs 16 GPUs within one NVLink domain (tier 1); the emptiest has 8 free (room for 1 of 2 workers)"
            in second.pending_reason), second.pending_reason


@pytest.mark.django_db
@pytest.mark.usefixtures("demo")
def test_the_request_page_says_which_nvlink_domain_kueue_placed_it_in() -> None:
    from quotas.models import Node

    _nvlink()
    response = _api().post("/api/v1/requests/", TRAIN | {"topology": "nvlink"}, format="json")
    req = WorkloadRequest.objects.get(pk=response.json()["id"])
    Node.objects.create(cluster=req.cluster, name="gpu-h100-2", labels={
        m.RACK_LABEL: "rack-a2", m.BLOCK_LABEL: "block-a", m.NVLINK_LABEL: "clique-7"})
    req.state = "running"
    req.cluster_status = {"objects": {"workload/w": {"c": {"Admitted": ["True", "Admitted", ""]},
                                                     "topo": {"gpu-h100-2": 2}}}}
    req.save()
    web = DjangoClient()
    web.force_login(_carol())
    page = html.unescape(web.get(f"/requests/{req.pk}/").content.decode())
    assert "Placement:</strong> Within one NVLink domain" in page
    assert "placed in NVLink domain clique-7, in rack rack-a2 (block block-a): gpu-h100-2 (2 pods)" in page

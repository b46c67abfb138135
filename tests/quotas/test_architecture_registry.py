"""Reference architectures are data (quotas/architectures.py): an architecture registered in a test renders valid
quota and request manifests, and the enforcement rule and its database filter follow it, with no other module
changed."""

from __future__ import annotations

import dataclasses

import jsonschema
import pytest

from quotas import architectures
from quotas import manifests as m
from quotas.capacity import flavor_enforcement
from quotas.models import Architecture, Cluster, Flavor
from quotas.selectors import enforced_flavor_q
from sandbox.store import ApiError, Store
from tests.workloads.test_render import dry_run, make_request, top_level
from workloads.kinds import request_manifests
from workloads.manifests import QUEUE_LABEL

from .test_render import crd_schema, render

KINDS = ("whole", "mig", "hami", "cpu")


@pytest.fixture
def g_like_c():
    """Architecture G: a copy of C under another letter."""
    with architectures.registered(dataclasses.replace(architectures.get("C"), letter="G", label="G · C again")) as arch:
        yield arch


@pytest.fixture
def h_pools_and_volcano():
    """Architecture H: F's online/offline pools, plus E's Volcano-owned offline pool and MIG always on."""
    arch = architectures.Arch("H", "H · pools and Volcano", queues=architectures.POOLS, mig=architectures.ALWAYS,
                              hami=architectures.NEVER, volcano_pool="offline", online_pool="online")
    with architectures.registered(arch) as registered:
        yield registered


def validate(objects: list[dict]) -> None:
    store = Store()
    for obj in objects:
        if "/" in obj["apiVersion"] and not obj["apiVersion"].startswith(("apps/", "batch/")):
            schema = crd_schema(obj["apiVersion"], obj["kind"])
            assert schema is not None, f"no CRD for {obj['apiVersion']} {obj['kind']}"
            jsonschema.validate(obj, schema)
        try:
            store.create(obj, dry_run=obj["kind"] != "Namespace", field_manager="gpu-portal")
        except ApiError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.status()}")


def test_the_registry_restores_itself() -> None:
    with architectures.registered(architectures.Arch("G", "G")):
        assert "G" in architectures.letters()
    assert architectures.letters() == ["A", "B", "C", "D", "E", "F"]
    assert Architecture.values == ["A", "B", "C", "D", "E", "F"]
    with pytest.raises(KeyError, match="known: A, B, C, D, E, F"):
        architectures.get("G")


def test_a_copy_of_c_renders_what_c_renders(g_like_c) -> None:
    objects = render("G", use_mig=False, use_hami=False)
    validate(objects)
    assert objects == render("C", use_mig=False, use_hami=False)
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "ResourceFlavor"} == {
        "h100-80gb", "h100-80gb-online", "a100-80gb-mig-1g.10gb", "cpu"}


def test_a_new_combination_renders_valid_quota_manifests(h_pools_and_volcano) -> None:
    objects = render("H")
    validate(objects)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("ClusterQueue", "acme-vision-online") in kinds  # the pools' online queue
    assert ("Queue", "acme-vision") in kinds  # the Volcano Queue
    flavors = {name for kind, name in kinds if kind == "ResourceFlavor"}
    assert "h100-80gb" not in flavors and "l40s-hami" not in flavors  # Volcano's; HAMi never
    assert "a100-80gb-mig-1g.10gb" in flavors  # MIG always, whatever the switch


@pytest.mark.parametrize(("kind", "replicas"), [("notebook", 1), ("training", 1), ("training", 3), ("inference", 2)])
@pytest.mark.parametrize("flavor_kind", ["whole", "mig"])
def test_a_new_architecture_renders_valid_request_manifests(g_like_c, kind: str, replicas: int,
                                                             flavor_kind: str) -> None:
    request = make_request(kind, architecture="G", flavor_kind=flavor_kind, replicas=replicas)
    objects = request_manifests(request, notebook_token="t0ken")
    dry_run(objects)
    like_c = request_manifests(make_request(kind, architecture="C", flavor_kind=flavor_kind, replicas=replicas),
                               notebook_token="t0ken")
    assert objects == like_c
    assert top_level(objects)["metadata"]["labels"][QUEUE_LABEL] == "acme-vision"


def test_inference_follows_the_online_pool_of_a_new_architecture(h_pools_and_volcano) -> None:
    objects = request_manifests(make_request("inference", architecture="H", replicas=2), notebook_token="")
    dry_run(objects)
    deployment = top_level(objects)
    assert deployment["metadata"]["labels"][QUEUE_LABEL] == "acme-vision-online"
    assert deployment["spec"]["template"]["spec"]["nodeSelector"][m.POOL_LABEL] == "online"


@pytest.mark.django_db
def test_enforcement_rule_and_filter_follow_a_new_architecture(h_pools_and_volcano) -> None:
    cluster = Cluster.objects.create(name="h", architecture="H", use_mig=False, use_hami=True)
    for kind in KINDS:
        Flavor.objects.create(cluster=cluster, name=f"{kind}-x", kind=kind, mig_profile="1g.10gb")
    Flavor.objects.create(cluster=cluster, name="whole-off", kind="whole", pool_label="offline")
    by_rule = {f.name for f in cluster.flavors.all() if flavor_enforcement(cluster, f).enforced}
    by_filter = set(Flavor.objects.filter(enforced_flavor_q(), cluster=cluster).values_list("name", flat=True))
    assert by_rule == by_filter == {"whole-x", "mig-x", "cpu-x", "whole-off"}
    assert flavor_enforcement(cluster, cluster.flavors.get(name="whole-off")).by == "volcano"
    hami = flavor_enforcement(cluster, cluster.flavors.get(name="hami-x"))
    assert "does not enforce" in hami.reason and "architecture D, or E or F" in hami.remedy

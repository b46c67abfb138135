"""Free GPUs per rack for ops (issue 26): on a cluster with a topology, the capacity page shows, for each flavor placed
by topology, the free GPUs in total against the most free within one rack, from the inventory's nodes (labels,
allocatable, cordoned or not) less what admitted work holds on each node (Kueue's topology assignment)."""

from __future__ import annotations

import html

import pytest

from quotas import manifests as m
from quotas.models import Cluster, Node
from tests.workloads.factories import make_catalogue, make_request
from workloads.models import RequestState

pytestmark = pytest.mark.django_db
PRODUCT = "NVIDIA-H100-80GB-HBM3"
EIGHT = {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": "8", "pods": "110"}


def _node(cluster: Cluster, name: str, rack: str | None, **extra) -> Node:
    labels = {"nvidia.com/gpu.product": PRODUCT, "kubernetes.io/hostname": name}
    if rack:
        labels |= {m.RACK_LABEL: rack, m.BLOCK_LABEL: "b1"}
    return Node.objects.create(cluster=cluster, name=name, labels=labels, allocatable=EIGHT, **extra)


def _admitted(cat, cast, hosts: dict[str, int], gpus: int, state: str = RequestState.RUNNING):
    status = {"objects": {"workload/w": {"c": {"Admitted": ["True", "Admitted", ""]}, "topo": hosts}}}
    return make_request(cat, cast.vision, cast.carol, state=state, gpus=gpus, cluster_status=status)


@pytest.fixture
def racks(cast):
    """Rack r1: two 8-GPU nodes; r2: one, and one cordoned; r3: one not ready; one node without a rack label."""
    cat = make_catalogue(cast)
    cluster = cat.cluster
    cat.h100.node_labels = {"nvidia.com/gpu.product": PRODUCT}
    cat.h100.save()
    for name, rack in (("n1", "r1"), ("n2", "r1"), ("n3", "r2")):
        _node(cluster, name, rack)
    _node(cluster, "n4", "r2", unschedulable=True)
    _node(cluster, "n5", "r3", ready=False)
    _node(cluster, "n6", None)
    return cat


def _page(as_user, cluster: Cluster) -> str:
    response = as_user("ops").get("/ops/capacity/", {"cluster": cluster.name})
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def test_capacity_page_says_how_many_gpus_are_free_within_one_rack(as_user, cast, racks) -> None:
    cluster = racks.cluster
    assert 'id="racks-h"' not in _page(as_user, cluster)  # no topology: no per-rack view

    Cluster.objects.filter(pk=cluster.pk).update(topology="block-rack-host")
    cluster.refresh_from_db()
    # Work admitted on r1 (2 pods x 4 GPUs on n1, 1 x 4 on n2) and on r2 (1 x 2 on n3); a finished one holds nothing.
    _admitted(racks, cast, {"n1": 2, "n2": 1}, gpus=4)
    _admitted(racks, cast, {"n3": 1}, gpus=2)
    _admitted(racks, cast, {"n3": 1}, gpus=6, state=RequestState.SUCCEEDED)
    body = _page(as_user, cluster)
    assert "Free GPUs per rack" in body
    # r1: 16 - 12 = 4 free; r2: 8 - 2 = 6 (n4 cordoned offers none); r3 not ready: 0 of 0. 10 free in all, 6 in one.
    assert "r2: 6 of 8 · r1: 4 of 16" in body
    assert "1 node without a rack label" in body
    assert "10 free, at most 6 in one rack: a job of 7 GPUs or more that asks for one rack fits nowhere now" in body


def test_a_rack_that_holds_every_free_gpu_is_not_fragmented(as_user, cast, racks) -> None:
    Cluster.objects.filter(pk=racks.cluster.pk).update(topology="block-rack-host")
    _admitted(racks, cast, {"n3": 1}, gpus=8)  # r2 full: every free GPU is in r1
    body = _page(as_user, racks.cluster)
    assert "r1: 16 of 16 · r2: 0 of 8" in body and "16 free, all in one rack" in body


def test_free_gpus_per_rack_read_the_rack_label_ops_named(as_user, cast, racks) -> None:
    """With levels ops name (topology "custom"), the racks are the values of their rack level's label."""
    cluster = racks.cluster
    for name, rack in (("n1", "x1"), ("n2", "x1"), ("n3", "x2")):
        node = cluster.nodes.get(name=name)
        node.labels = {**node.labels, "example.com/rack": rack}
        node.save()
    Cluster.objects.filter(pk=cluster.pk).update(topology="custom", topology_levels=[
        {"name": "rack", "label": "example.com/rack"}, {"name": "host", "label": "kubernetes.io/hostname"}])
    body = _page(as_user, cluster)
    assert "x1: 16 of 16 · x2: 8 of 8" in body and "1 node without a rack label" in body

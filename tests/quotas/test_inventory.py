"""Inventory sync and capacity against the sandbox cluster (demo profile), through the official client."""

from __future__ import annotations

from decimal import Decimal as D

import pytest

from portal.kube import Kube
from quotas.capacity import capacity_by_flavor, parse_quantity
from quotas.inventory import flavors_discover, inventory_sync, model_key, node_taints
from quotas.models import Cluster, Flavor, Node, NodePool
from sandbox.testing import kubectl

pytestmark = pytest.mark.django_db


@pytest.fixture
def synced(fresh_sandbox):
    cluster = Cluster.objects.create(name="sandbox", architecture="B", kubeconfig_path=str(fresh_sandbox.kubeconfig))
    kube = Kube(kubeconfig_path=str(fresh_sandbox.kubeconfig))
    counts = inventory_sync(cluster, kube=kube)
    Flavor.objects.bulk_create(flavors_discover(cluster, taints_by_node=node_taints(kube)))
    return cluster, kube, counts


def capacity(cluster: Cluster) -> dict[tuple[str, str], D]:
    names = dict(Flavor.objects.filter(cluster=cluster).values_list("pk", "name"))
    return {(names[fid], res): value for (fid, res), value in capacity_by_flavor(cluster).items()}


def test_sync_reads_nodes_into_pools(synced) -> None:
    cluster, _, counts = synced
    assert counts == {"seen": 10, "new": 10, "gone": 0, "not_ready": 0}
    pools = {p.name: (p.sharing, p.pool_label, p.nodes.count()) for p in NodePool.objects.filter(cluster=cluster)}
    assert pools == {
        "h100-80gb-online": ("whole", "online", 1),
        "h100-80gb-offline": ("whole", "offline", 3),
        "a100-80gb-mig-all-balanced-online": ("mig", "online", 2),
        "l40s-hami-offline": ("hami", "offline", 2),
        "cpu": ("none", "", 2),  # the CPU-only pool: no GPU labels, no pool label
    }
    cpu = Node.objects.get(cluster=cluster, name="cpu-0")
    assert cpu.pool.gpu_product == "" and cpu.pool.gpu_memory_mib == 0 and cpu.counts_capacity
    mig = Node.objects.get(cluster=cluster, name="gpu-a100-mig-0")
    assert mig.mig_config_state == "success" and mig.counts_capacity
    assert mig.pool.mig_config == "all-balanced" and mig.pool.gpu_product == "NVIDIA-A100-SXM4-80GB"
    assert cluster.__class__.objects.get(pk=cluster.pk).inventory_synced_at is not None


def test_discovered_flavors_and_their_capacity(synced) -> None:
    cluster, _, _ = synced
    flavors = {f.name: f for f in Flavor.objects.filter(cluster=cluster)}
    assert set(flavors) == {"h100-80gb-online", "h100-80gb-offline", "a100-80gb-mig-1g.10gb", "a100-80gb-mig-2g.20gb",
                            "a100-80gb-mig-3g.40gb", "l40s-hami", "cpu"}
    online = flavors["h100-80gb-online"]
    assert online.node_labels == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpuportal.dev/pool": "online"}
    assert {"key": "gpuportal.dev/pool", "value": "online", "effect": "NoSchedule"} in online.taints
    assert {"key": "gpuportal.dev/pool", "operator": "Exists", "effect": "NoSchedule"} in online.tolerations
    assert flavors["a100-80gb-mig-1g.10gb"].mig_profile == "1g.10gb"
    assert flavors["l40s-hami"].node_labels["gpu"] == "on"
    cap = capacity(cluster)
    assert cap[("h100-80gb-offline", "nvidia.com/gpu")] == 24
    assert cap[("h100-80gb-online", "nvidia.com/gpu")] == 8
    assert cap[("a100-80gb-mig-1g.10gb", "nvidia.com/mig-1g.10gb")] == 32  # 2 nodes x 8 GPUs x 2 slices
    assert cap[("a100-80gb-mig-3g.40gb", "nvidia.com/mig-3g.40gb")] == 16
    assert cap[("l40s-hami", "nvidia.com/gpu")] == 80  # vGPU slots: 8 cards x split 10
    assert cap[("l40s-hami", "nvidia.com/total-gpucores")] == 800
    assert cap[("l40s-hami", "nvidia.com/total-gpumem")] == 8 * 46068
    assert cap[("cpu", "cpu")] == 192 * 4 + 96 * 4 + 32 * 2  # the CPU pool counts for the cpu flavor only
    assert cap[("cpu", "memory")] == 2048 * 4 + 1152 * 2 + 768 * 2 + 128 * 2  # GiB
    assert not any(res.startswith("nvidia.com/") for (fname, res) in cap if fname == "cpu")


def test_vanished_and_not_ready_nodes_are_kept_and_stop_counting(synced, fresh_sandbox) -> None:
    cluster, kube, _ = synced
    store = fresh_sandbox.store
    node = store.get("v1", "Node", "gpu-h100-1")
    for cond in node["status"]["conditions"]:
        if cond["type"] == "Ready":
            cond["status"], cond["reason"] = "False", "KubeletNotReady"
    store.update(node, subresource="status")
    kubectl(fresh_sandbox, "delete", "node", "gpu-h100-3")
    counts = inventory_sync(cluster, kube=kube)
    assert counts["gone"] == 1 and counts["not_ready"] >= 1
    gone = Node.objects.get(cluster=cluster, name="gpu-h100-3")
    assert not gone.present and not gone.counts_capacity
    assert not Node.objects.get(cluster=cluster, name="gpu-h100-1").ready
    assert capacity(cluster)[("h100-80gb-offline", "nvidia.com/gpu")] == 8  # only gpu-h100-2 still counts


def test_mig_layout_change_does_not_count_until_it_succeeds(synced, fresh_sandbox) -> None:
    cluster, kube, _ = synced
    kubectl(fresh_sandbox, "label", "node", "gpu-a100-mig-1", "nvidia.com/mig.config=all-1g.10gb", "--overwrite")
    fresh_sandbox.tick()
    inventory_sync(cluster, kube=kube)
    node = Node.objects.get(cluster=cluster, name="gpu-a100-mig-1")
    assert node.mig_config_state in ("pending", "rebooting")
    assert not node.counts_capacity
    assert capacity(cluster)[("a100-80gb-mig-1g.10gb", "nvidia.com/mig-1g.10gb")] == 16  # only gpu-a100-mig-0
    fresh_sandbox.advance(120)
    inventory_sync(cluster, kube=kube)
    node.refresh_from_db()
    assert node.mig_config_state == "success"
    assert node.pool.name == "a100-80gb-mig-all-1g.10gb-online"
    assert capacity(cluster)[("a100-80gb-mig-1g.10gb", "nvidia.com/mig-1g.10gb")] == 16 + 8 * 7


@pytest.mark.parametrize(("labels", "key"), [
    ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, "a100-80gb"),
    ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}, "a100-40gb"),
    ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "h100-80gb"),
    ({"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771"}, "h200-141gb"),
    ({"nvidia.com/gpu.product": "NVIDIA-B200"}, "b200"),
    ({"nvidia.com/gpu.product": "NVIDIA-L40S"}, "l40s"),
    ({"gpuportal.dev/gpu-model": "H100-80GB", "nvidia.com/gpu.product": "x"}, "h100-80gb"),
    ({}, ""),
])
def test_model_key(labels: dict, key: str) -> None:
    assert model_key(labels) == key


@pytest.mark.parametrize(("text", "value"), [("96", 96), ("500m", D("0.5")), ("2Ti", 2 * 2**40), ("1152Gi", 1152 * 2**30),
                                             ("1k", 1000), ("", 0)])
def test_parse_quantity(text: str, value: D) -> None:
    assert parse_quantity(text) == value

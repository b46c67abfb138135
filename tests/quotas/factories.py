"""A small GPU cluster for quota tests, independent of the sandbox: flavors through the services,
nodes as inventory sync would have written them.

Capacity that counts (quotas/capacity.py): h100-80gb 16 GPUs (two ready nodes; a third is NotReady),
a100-80gb-mig-1g.10gb 56 slices, l40s-hami 40 vGPU slots (4 cards: 400 cores, 184272 MiB), cpu
576 cores and 6016 GiB across the ready nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from quotas import services
from quotas.models import Cluster, Flavor, Node
from tenants.access import Actor

H100_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU = "nvidia.com/gpu"
MIG_1G = "nvidia.com/mig-1g.10gb"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass
class Fleet:
    cluster: Cluster
    h100: Flavor
    mig: Flavor
    hami: Flavor
    cpu: Flavor


def make_cluster(name: str = "gpu-test", *, architecture: str = "E", overcommit_percent: int = 0, **kwargs) -> Cluster:
    use_gpu_sharing = architecture in ("E", "F")
    return services.cluster_create(
        actor=Actor.system(), name=name, architecture=architecture, overcommit_percent=overcommit_percent,
        use_mig=kwargs.pop("use_mig", use_gpu_sharing), use_hami=kwargs.pop("use_hami", use_gpu_sharing), **kwargs,
    )


def make_node(cluster: Cluster, name: str, *, labels: dict, allocatable: dict, ready: bool = True, mig_state: str = "") -> Node:
    return Node.objects.create(
        cluster=cluster, name=name, labels=labels, allocatable=allocatable, ready=ready, mig_config_state=mig_state
    )


def make_fleet(name: str = "gpu-test", *, architecture: str = "E", overcommit_percent: int = 0) -> Fleet:
    system = Actor.system()
    cluster = make_cluster(name, architecture=architecture, overcommit_percent=overcommit_percent)
    h100 = services.flavor_create(
        actor=system, cluster=cluster, name="h100-80gb", kind="whole", gpu_model="h100-80gb", gpu_product=H100_PRODUCT,
        node_labels={"nvidia.com/gpu.product": H100_PRODUCT}, tolerations=[GPU_TOLERATION], order=10,
    )
    flavors = {"h100": h100}
    if cluster.use_mig:
        flavors["mig"] = services.flavor_create(
            actor=system, cluster=cluster, name="a100-80gb-mig-1g.10gb", kind="mig", gpu_model="a100-80gb",
            mig_profile="1g.10gb", node_labels={"nvidia.com/mig.config": "all-1g.10gb"}, tolerations=[GPU_TOLERATION], order=20,
        )
    if cluster.use_hami:
        flavors["hami"] = services.flavor_create(
            actor=system, cluster=cluster, name="l40s-hami", kind="hami", gpu_model="l40s", hami_memory_mib=4096,
            hami_cores_percent=25, node_labels={"gpu": "on"}, tolerations=[GPU_TOLERATION], order=30,
        )
    flavors["cpu"] = services.flavor_create(actor=system, cluster=cluster, name="cpu", kind="cpu", order=90)
    h100_labels = {"nvidia.com/gpu.product": H100_PRODUCT, "nvidia.com/gpu.count": "8"}
    h100_alloc = {"cpu": "192", "memory": "2Ti", GPU: "8", "pods": "110"}
    make_node(cluster, "gpu-h100-0", labels=h100_labels, allocatable=h100_alloc)
    make_node(cluster, "gpu-h100-1", labels=h100_labels, allocatable=h100_alloc)
    make_node(cluster, "gpu-h100-2", labels=h100_labels, allocatable=h100_alloc, ready=False)
    make_node(
        cluster, "gpu-a100-mig-0",
        labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.config": "all-1g.10gb",
                "nvidia.com/mig.config.state": "success", "nvidia.com/gpu.count": "8"},
        allocatable={"cpu": "96", "memory": "1152Gi", MIG_1G: "56"}, mig_state="success",
    )
    make_node(
        cluster, "gpu-l40s-hami-0",
        labels={"gpu": "on", "nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "46068"},
        allocatable={"cpu": "96", "memory": "768Gi", GPU: "40"},
    )
    return Fleet(cluster=cluster, h100=h100, mig=flavors.get("mig"), hami=flavors.get("hami"), cpu=flavors["cpu"])  # type: ignore[arg-type]


def D(value: str | int) -> Decimal:
    return Decimal(str(value))

"""Demo data for capacity and quotas: the sandbox cluster, its flavors, and quotas for acme and globex.

Idempotent and create-only (rows that exist are never changed); called by the seed command after ``tenants.demo.seed_demo()``. Registers the cluster
named ``sandbox`` with the kubeconfig file of ``settings.KUBECONFIG`` (a path: the sandbox rewrites the
file with a fresh token on every start), syncs its inventory, creates the discovered flavors and
gives each tenant and project a quota that fits the demo profile's capacity
(sandbox/profiles/demo.yaml: 24 offline + 8 online H100, 2 A100 MIG nodes, 2 L40S HAMi nodes).
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction

from portal.cache import changed as cache_changed
from tenants.models import Project, Tenant

from . import architectures
from .manifests import VOLCANO_QUEUE
from .models import Architecture, Cluster, Flavor, Quota

log = logging.getLogger(__name__)

DEMO_CLUSTER = "sandbox"
# What discovery proposes for the demo profile; used as is when the sandbox is not running.
FALLBACK_FLAVORS: list[dict[str, Any]] = [
    {"name": "h100-80gb-offline", "kind": "whole", "gpu_model": "h100-80gb", "gpu_product": "NVIDIA-H100-80GB-HBM3",
     "pool_label": "offline", "order": 10,
     "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpuportal.dev/pool": "offline"},
     "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    {"name": "h100-80gb-online", "kind": "whole", "gpu_model": "h100-80gb", "gpu_product": "NVIDIA-H100-80GB-HBM3",
     "pool_label": "online", "order": 10,
     "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpuportal.dev/pool": "online"},
     "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": "gpuportal.dev/pool", "value": "online", "effect": "NoSchedule"}],
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                     {"key": "gpuportal.dev/pool", "operator": "Exists", "effect": "NoSchedule"}]},
    *[
        {"name": f"a100-80gb-mig-{p}", "kind": "mig", "gpu_model": "a100-80gb", "gpu_product": "NVIDIA-A100-SXM4-80GB",
         "mig_profile": p, "order": 20 + i,
         "node_labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.strategy": "mixed"},
         "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
        for i, p in enumerate(["1g.10gb", "2g.20gb", "3g.40gb"])
    ],
    {"name": "l40s-hami", "kind": "hami", "gpu_model": "l40s", "gpu_product": "NVIDIA-L40S", "order": 30,
     "display_name": "L40S shared (HAMi)", "hami_memory_mib": 11264, "hami_cores_percent": 25,
     "node_labels": {"nvidia.com/gpu.product": "NVIDIA-L40S", "gpu": "on"},
     "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    {"name": "cpu", "kind": "cpu", "order": 90},
]

# owner slug -> [(flavor, resource, nominal, borrowing limit, lending limit)]; memory in GiB.
QUOTAS: dict[str, list[tuple[str, str, int, int | None, int | None]]] = {
    "acme": [("h100-80gb-offline", "nvidia.com/gpu", 12, None, None), ("h100-80gb-online", "nvidia.com/gpu", 4, None, None),
             ("a100-80gb-mig-1g.10gb", "nvidia.com/mig-1g.10gb", 16, None, None),
             ("l40s-hami", "nvidia.com/gpu", 40, None, None), ("l40s-hami", "nvidia.com/total-gpucores", 400, None, None),
             ("l40s-hami", "nvidia.com/total-gpumem", 92136, None, None),
             ("cpu", "cpu", 256, None, None), ("cpu", "memory", 2048, None, None)],
    # Borrowing limit 2: at most 8 H100s at once, so the demo's 7-GPU fine-tune next to its 1-GPU training job
    # and 1-GPU notebook really waits for quota (with 4 it was admitted by borrowing: no pending Workload).
    # acme-vision (carol, bob) may use HAMi shares at once: half of acme's L40S shares, acme-nlp has the other half.
    # Its offline H100s are its Volcano Queue under architecture E (capability 6 + 2); Kueue admits its four online
    # H100s: the demo's notebook and inference service (between 1 and 2 replicas) run there.
    "acme-vision": [("h100-80gb-offline", "nvidia.com/gpu", 6, 2, None), ("h100-80gb-online", "nvidia.com/gpu", 4, None, None),
                    ("a100-80gb-mig-1g.10gb", "nvidia.com/mig-1g.10gb", 8, None, None),
                    ("l40s-hami", "nvidia.com/gpu", 20, None, None), ("l40s-hami", "nvidia.com/total-gpucores", 200, None, None),
                    ("l40s-hami", "nvidia.com/total-gpumem", 46068, None, None),
                    ("cpu", "cpu", 96, None, None), ("cpu", "memory", 768, None, None)],
    "acme-nlp": [("h100-80gb-offline", "nvidia.com/gpu", 4, 2, None), ("l40s-hami", "nvidia.com/gpu", 20, None, None),
                 ("l40s-hami", "nvidia.com/total-gpucores", 200, None, None), ("l40s-hami", "nvidia.com/total-gpumem", 46068, None, None),
                 ("cpu", "cpu", 64, None, None), ("cpu", "memory", 512, None, None)],
    "globex": [("h100-80gb-offline", "nvidia.com/gpu", 12, None, None), ("h100-80gb-online", "nvidia.com/gpu", 4, None, None),
               ("a100-80gb-mig-3g.40gb", "nvidia.com/mig-3g.40gb", 8, None, None),
               ("cpu", "cpu", 384, None, None), ("cpu", "memory", 3072, None, None)],
    "globex-llm": [("h100-80gb-offline", "nvidia.com/gpu", 10, None, 4), ("cpu", "cpu", 160, None, None), ("cpu", "memory", 1280, None, None)],
    "globex-serving": [("h100-80gb-online", "nvidia.com/gpu", 4, None, None), ("a100-80gb-mig-3g.40gb", "nvidia.com/mig-3g.40gb", 8, None, None),
                       ("cpu", "cpu", 64, None, None), ("cpu", "memory", 512, None, None)],
}


def _dec(value: int | None) -> Decimal | None:
    return None if value is None else Decimal(value)


# The H100 training zone runs E (docs/federation.md): Volcano gang-schedules training on the offline H100 pool (a
# Volcano Queue per project), Kueue admits everything else (online H100s, MIG, HAMi); with MIG and HAMi switched on
# every kind the demo profile has is enforced, so the demo never offers a flavor that nothing on the cluster enforces.
# The seeded history (insights/demo.py) ran F until an applied change F -> E.
DEMO_ARCHITECTURE = Architecture.E
VOLCANO_LESS_ARCHITECTURE = Architecture.F  # where the cluster serves no Volcano: Kueue admits the offline pool too


def _tenant_totals() -> dict[tuple[str, str], int]:
    """(flavor, resource) -> what the demo promises the tenants of it in all."""
    out: dict[tuple[str, str], int] = {}
    for owner, rows in QUOTAS.items():
        if "-" not in owner:  # a tenant's rows (project slugs are "<tenant>-...")
            for flavor_name, resource, nominal, _b, _l in rows:
                out[(flavor_name, resource)] = out.get((flavor_name, resource), 0) + nominal
    return out


def _fits(tenant: Tenant, project: Project | None, flavor: Flavor, resource: str, nominal: int,
          planned: dict[tuple[str, str], int]) -> bool:
    """May the seed write this missing row without breaking an invariant over what is there? An existing row is
    never written anyway (create-only)."""
    rows = Quota.objects.filter(flavor=flavor, resource=resource)
    if rows.filter(tenant=tenant, project=project).exists():
        return True  # there already: get_or_create leaves it alone
    if project is not None:
        return rows.filter(tenant=tenant, project=None).exists()
    promised = sum(rows.filter(project=None).values_list("nominal", flat=True), Decimal(0))
    if promised + nominal > planned.get((flavor.name, resource), nominal):
        log.warning("demo: no %s quota on %s for %s: the tenants hold %s of it already", resource, flavor.name,
                    tenant.slug, promised)
        return False
    return True


def seed_quota_demo(*, architecture: str = DEMO_ARCHITECTURE, reconcile_now: bool = True) -> dict[str, Any]:
    """Create the demo cluster, flavors and quotas that are missing; existing rows are left as they are. Needs ``tenants.demo.seed_demo()`` first.

    Returns a summary: flavors created, quota rows written, the inventory counts and, when the
    sandbox answered, what the first reconcile applied.
    """
    from portal.kube import ClusterError, kube_for

    from .inventory import flavors_discover, inventory_sync, node_taints

    cluster, created = Cluster.objects.get_or_create(
        name=DEMO_CLUSTER,
        defaults={"architecture": architecture, "use_mig": True, "use_hami": True, "kubeconfig_path": str(settings.KUBECONFIG)},
    )
    kube = None
    try:
        kube = kube_for(cluster)
        if created and architectures.of(cluster).volcano_pool and not kube.serves(VOLCANO_QUEUE, "Queue"):
            # A cluster without Volcano (`make run CLUSTER=real`: the real control plane runs none) could never start
            # E's training: the demo starts it on F instead, its offline pool Kueue's.
            log.warning("demo: cluster %s serves no Volcano Queue; architecture %s instead of %s", cluster.name,
                        VOLCANO_LESS_ARCHITECTURE, cluster.architecture)
            Cluster.objects.filter(pk=cluster.pk).update(architecture=VOLCANO_LESS_ARCHITECTURE)
            cluster.architecture = VOLCANO_LESS_ARCHITECTURE
        summary: dict[str, Any] = {"cluster": cluster.name, "architecture": cluster.architecture}
        summary["inventory"] = inventory_sync(cluster, kube=kube)
        proposals = flavors_discover(cluster, taints_by_node=node_taints(kube))
    except (ClusterError, OSError, ValueError) as exc:
        log.warning("demo: sandbox cluster not reachable (%s); using the demo profile's flavors", exc)
        summary = {"cluster": cluster.name, "architecture": cluster.architecture, "inventory": f"unavailable: {exc}"}
        kube = None
        existing = set(cluster.flavors.values_list("name", flat=True))
        proposals = [Flavor(cluster=cluster, **spec) for spec in FALLBACK_FLAVORS if spec["name"] not in existing]
    with transaction.atomic():
        for flavor in proposals:
            flavor.full_clean()
        Flavor.objects.bulk_create(proposals)
        cache_changed("catalogue")  # no post_save signal from bulk_create
        flavors = {f.name: f for f in cluster.flavors.all()}
        written = 0
        # The seed writes rows directly: these numbers satisfy the quota invariants by construction
        # (projects within tenants, tenants within the profile's capacity). A database seeded by an older demo may
        # hold other numbers: a missing tenant row is written only while the tenants' rows of its flavor stay within
        # the demo's own total for it, and a missing project row only under its tenant's row.
        planned = _tenant_totals()
        for owner, rows in QUOTAS.items():
            project = Project.objects.filter(slug=owner).select_related("tenant").first()
            tenant = project.tenant if project else Tenant.objects.filter(slug=owner).first()
            if tenant is None:
                continue
            for flavor_name, resource, nominal, borrowing, lending in rows:
                flavor = flavors.get(flavor_name)
                if flavor is None or not _fits(tenant, project, flavor, resource, nominal, planned):
                    continue
                # Create only what is missing: a restart of `make run` seeds again, and must never put back the
                # demo's numbers over quotas that ops, a tenant admin or a MIG change set since.
                _, created = Quota.objects.get_or_create(
                    tenant=tenant, project=project, flavor=flavor, resource=resource,
                    defaults={"nominal": Decimal(nominal), "borrowing_limit": _dec(borrowing), "lending_limit": _dec(lending)},
                )
                written += created
    summary.update({"flavors_created": len(proposals), "quota_rows": written})
    if reconcile_now and kube is not None:
        from .reconcile import reconcile

        try:
            result = reconcile(cluster, kube=kube)
            summary["reconcile"] = {"applied": result.applied, "deleted": result.deleted, "failed": result.failed}
        except ClusterError as exc:
            summary["reconcile"] = f"unavailable: {exc}"
    return summary


# ----------------------------------------------------------------------------------------- three zones (federation)
# The demo's zones (docs/federation.md): the H100 training cluster above, and two more sandbox clusters that
# ``make run`` starts with their own endpoint and kubeconfig (sandbox/profiles/zone-*.yaml), their kubeconfig files
# next to ``settings.KUBECONFIG``. Facts as GPU Feature Discovery gives them, used as is when a zone is not running.
ZONE_OF_DEMO_CLUSTER = ("h100-training", "site-a")
DEMO_ZONES: list[dict[str, Any]] = [
    {"name": "a100-inference", "zone": "a100-inference", "failure_domain": "site-b", "kubeconfig": "zone-a100.kubeconfig",
     "profile": "zone-a100.yaml",
     "flavor": {"name": "a100-80gb", "kind": "whole", "gpu_model": "a100-80gb", "gpu_product": "NVIDIA-A100-SXM4-80GB",
                "gpu_memory_mib": 81920, "compute_capability": "8.0", "order": 10,
                "node_labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
     "quotas": {"acme": 8, "acme-vision": 4, "acme-nlp": 4}},
    {"name": "l40s-dev", "zone": "l40s-dev", "failure_domain": "site-c", "kubeconfig": "zone-l40s.kubeconfig",
     "profile": "zone-l40s.yaml",
     "flavor": {"name": "l40s", "kind": "whole", "gpu_model": "l40s", "gpu_product": "NVIDIA-L40S",
                "gpu_memory_mib": 46068, "compute_capability": "8.9", "order": 10,
                "node_labels": {"nvidia.com/gpu.product": "NVIDIA-L40S"}},
     "quotas": {"acme": 4, "acme-vision": 2, "acme-nlp": 2}},
]
GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def zone_kubeconfig(spec: dict[str, Any]) -> str:
    from pathlib import Path

    return str(Path(str(settings.KUBECONFIG)).with_name(spec["kubeconfig"]))


def seed_zone_demo(*, reconcile_now: bool = True) -> dict[str, Any]:
    """The demo's three zones: the demo cluster becomes the H100 training zone (site-a) and the A100 inference
    (site-b) and L40S development (site-c) clusters are registered, their whole-GPU flavor discovered (else the
    facts above), with Acme's quota; acme-vision may spill over to A100. Create-only, like the rest of the seed."""
    from portal.kube import ClusterError, kube_for

    from .inventory import flavors_discover, inventory_sync, node_taints
    from .models import SpillPolicy
    from .zones import flavor_facts_refresh

    summary: dict[str, Any] = {}
    Cluster.objects.filter(name=DEMO_CLUSTER, zone="").update(zone=ZONE_OF_DEMO_CLUSTER[0],
                                                               failure_domain=ZONE_OF_DEMO_CLUSTER[1])
    for spec in DEMO_ZONES:
        cluster, _ = Cluster.objects.get_or_create(name=spec["name"], defaults={
            "architecture": Architecture.B, "kubeconfig_path": zone_kubeconfig(spec), "zone": spec["zone"],
            "failure_domain": spec["failure_domain"]})
        kube = None
        proposals: list[Flavor] = []
        try:
            kube = kube_for(cluster)
            inventory_sync(cluster, kube=kube)
            proposals = [f for f in flavors_discover(cluster, taints_by_node=node_taints(kube)) if f.kind in ("whole", "cpu")]
        except (ClusterError, OSError, ValueError) as exc:
            log.warning("demo: zone %s not reachable (%s); using its known flavor", cluster.name, exc)
            kube = None
            if not cluster.flavors.exists():
                proposals = [Flavor(cluster=cluster, taints=GPU_TAINT, tolerations=GPU_TOLERATION, **spec["flavor"])]
        with transaction.atomic():
            existing = set(cluster.flavors.values_list("name", flat=True))
            fresh = [f for f in proposals if f.name not in existing]
            Flavor.objects.bulk_create(fresh)
            cache_changed("catalogue")
            if kube is not None:
                flavor_facts_refresh(cluster)
            zone_flavors = list(cluster.flavors.filter(kind__in=["whole", "cpu"]))
            for owner, amount in spec["quotas"].items():
                project = Project.objects.filter(slug=owner).select_related("tenant").first()
                tenant = project.tenant if project else Tenant.objects.filter(slug=owner).first()
                for flavor in zone_flavors if tenant is not None else []:
                    for resource in flavor.resource_names:  # GPUs, and 12 CPUs and 96 GiB per GPU
                        nominal = {"cpu": amount * 12, "memory": amount * 96}.get(resource, amount)
                        Quota.objects.get_or_create(tenant=tenant, project=project, flavor=flavor, resource=resource,
                                                    defaults={"nominal": Decimal(nominal)})
        summary[cluster.name] = {"flavors_created": len(fresh), "reachable": kube is not None}
        if reconcile_now and kube is not None:
            from .reconcile import reconcile

            try:
                reconcile(cluster, kube=kube)
            except ClusterError as exc:
                summary[cluster.name]["reconcile"] = f"unavailable: {exc}"
    vision = Project.objects.filter(slug="acme-vision").first()
    if vision is not None:
        SpillPolicy.objects.get_or_create(project=vision, defaults={"allowed": True, "target_models": ["a100-80gb"]})
    return summary


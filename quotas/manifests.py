"""Desired cluster state for quotas: plain rows in, Kubernetes objects (dicts) out. No I/O, no queries.

``reconcile.snapshot_load()`` reads the database once into the frozen rows below; everything here is
a pure function of them, so the rendering is tested as data (tests/quotas/test_render.py) and
exported as YAML for review.

What each reference architecture renders (docs/cluster-objects.md says why; Kueue v1beta2 only). The
letters are data in ``quotas/architectures.py`` (docs/extending.md); the functions below ask that entry, never the letter:

* every architecture: a ResourceFlavor per active flavor of the kinds the architecture offers, the
  WorkloadPriorityClasses, and per active project a Namespace (labels ``gpuportal.dev/tenant`` and
  ``gpuportal.dev/project``), a LocalQueue named after the project, a ResourceQuota that caps GPU
  requests at the most Kueue could ever admit (a guard rail against pods that bypass Kueue) and a
  LimitRange with default requests (so Kueue and the ResourceQuota see requests on every container).
* A: one ClusterQueue ``shared`` for every portal namespace, whole GPUs, no cohort; its quota is the
  sum of the tenants' quotas. Each namespace's LocalQueue points at it.
* B: a Cohort per tenant and a ClusterQueue per project (cohortName = tenant slug, namespaceSelector
  on the project label). C adds MIG flavors, D HAMi flavors.
* E: B (with MIG/HAMi as the cluster's ``use_mig``/``use_hami`` say) plus a Volcano Queue per project.
  The offline (training) pool's whole-GPU flavors belong to Volcano, everything else to Kueue — see
  :func:`volcano_owned`.
* F: online and offline pools: per project a ClusterQueue ``<project>`` (offline: training and
  notebooks, LocalQueue ``<project>``) and ``<project>-online`` (inference only, LocalQueue
  ``<project>-online``), with explicit lending from offline to online — see :func:`_f_queues`.

Units: see ``quotas/capacity.py`` (memory in GiB, cpu in cores, HAMi totals in % and MiB).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from portal.labels import (  # noqa: F401 - re-exported: the rest of quotas and the tests read m.POOL_LABEL
    ARCHIVED_LABEL, DEFAULT_INSTALLATION, INSTALLATION_LABEL, MANAGED_BY, MANAGER, OWNER_ANNOTATION, POD_SECURITY,
    POOL_LABEL, PROJECT_LABEL, TENANT_LABEL, VOLCANO_QUEUE_LABEL,
)
from portal.quantities import kube_quantity, parse_quantity

from . import architectures

if TYPE_CHECKING:  # pragma: no cover
    from .models import Cluster, Flavor

# Labels come from portal/labels.py (re-exported here: the rest of quotas and the tests read them as ``m.*``).
# Ownership (docs/ownership.md): every object we write carries MANAGED_BY=MANAGER and INSTALLATION_LABEL=<id>
# and the OWNER_ANNOTATION naming the installation, tenant and project. Nothing without both labels is ours.
KUEUE = "kueue.x-k8s.io/v1beta2"
VOLCANO_QUEUE = "scheduling.volcano.sh/v1beta1"
VOLCANO_TOPOLOGY = "topology.volcano.sh/v1alpha1"
RBAC = "rbac.authorization.k8s.io/v1"
NAMESPACED_ROLE = "gpu-portal-namespaced"  # deploy/kubernetes/base/rbac.yaml
# Namespaces no project may ever use: the control plane's and the GPU stack's (a trailing * is a prefix).
RESERVED_NAMESPACES: tuple[str, ...] = (
    "kube-*", "default", "openshift-*", "gpu-operator", "nvidia-gpu-operator", "nvidia-network-operator",
    "network-operator", "kueue-system", "volcano-system", "volcano-monitoring", "hami-system", "cert-manager",
    "monitoring", "prometheus", "ingress-nginx", "istio-system", "calico-system", "tigera-operator",
    "local-path-storage", "metallb-system", "argocd", "flux-system", "gpu-portal",
)
SHARED_QUEUE = "shared"  # architecture A's one ClusterQueue
GUARDRAIL_NAME = "gpu-portal"  # the ResourceQuota's and LimitRange's name in each namespace
ONLINE, OFFLINE = "online", "offline"
VOLCANO_POOL = OFFLINE  # architecture E: the training pool that Volcano, not Kueue, hands out

# (name, value, description). Production inference outranks notebooks, notebooks outrank batch
# training; F's borrowing-with-preemption threshold is the batch value (see _f_queues).
PRIORITY_CLASSES: list[tuple[str, int, str]] = [
    ("production", 1000, "Production inference: preempts batch work, never preempted by it."),
    ("interactive", 500, "Notebooks and interactive sessions."),
    ("batch", 100, "Training and batch jobs: the first to be preempted."),
]
BATCH_PRIORITY = 100

# Apply order: what an object refers to exists before it (flavors before queues, cohorts before the
# queues that join them, namespaces before what lives in them). Deletes run in the reverse order.
KIND_ORDER: list[tuple[str, str]] = [
    (KUEUE, "Topology"),
    (KUEUE, "ResourceFlavor"),
    (KUEUE, "WorkloadPriorityClass"),
    ("v1", "Secret"),  # only a MultiKueue manager's, in MULTIKUEUE_NAMESPACE (MULTIKUEUE_KINDS)
    (KUEUE, "MultiKueueCluster"),
    (KUEUE, "MultiKueueConfig"),
    (KUEUE, "AdmissionCheck"),
    (KUEUE, "Cohort"),
    (KUEUE, "ClusterQueue"),
    ("v1", "Namespace"),
    (KUEUE, "LocalQueue"),
    ("v1", "ResourceQuota"),
    ("v1", "LimitRange"),
    (RBAC, "RoleBinding"),
    (VOLCANO_QUEUE, "Queue"),
    (VOLCANO_TOPOLOGY, "HyperNode"),
]
KIND_RANK = {kind: i for i, kind in enumerate(KIND_ORDER)}
# Kueue MultiKueue on a manager cluster (docs/federation.md, "Kueue MultiKueue"): per worker a Secret with its kubeconfig
# and a MultiKueueCluster, one MultiKueueConfig listing them, the AdmissionCheck the ClusterQueues name. Listed only
# where the cluster is a manager or holds some we wrote (a demoted manager's are pruned); Secrets only in Kueue's
# namespace, never cluster-wide (deploy/kubernetes/base/rbac.yaml binds the Secret role there).
MULTIKUEUE_NAMESPACE = "kueue-system"
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
MULTIKUEUE_KINDS = frozenset({("v1", "Secret"), (KUEUE, "MultiKueueCluster"), (KUEUE, "MultiKueueConfig"),
                              (KUEUE, "AdmissionCheck")})
KIND_NAMESPACE = {("v1", "Secret"): MULTIKUEUE_NAMESPACE}  # kinds listed in one namespace only
DEFAULT_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
POD_GPU_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")  # real pod resources (not Kueue's HAMi totals)

# Kueue Topology Aware Scheduling (docs/cluster-objects.md, "Topology-aware placement"). A cluster with
# ``topology`` set gets one Topology whose levels are node labels, highest first: the preset's (the labels of Kueue's
# own TAS examples) or, with ``topology`` "custom", the levels ops name (``Cluster.topology_levels``: a name and a
# node label each, e.g. zone topology.kubernetes.io/zone, rack, nvlink nvidia.com/gpu.clique, host). Its whole-GPU
# flavors name it in ``spec.topologyName``. A multi-pod training request that asks for one rack, block or NVLink
# domain carries the level's label in a pod template annotation.
TOPOLOGY_NAME = "gpu-portal"
BLOCK_LABEL = "cloud.provider.com/topology-block"
RACK_LABEL = "cloud.provider.com/topology-rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
NVLINK_LABEL = "nvidia.com/gpu.clique"  # GPU Feature Discovery's NVLink clique (one NVLink domain)
TOPOLOGY_LEVELS: dict[str, tuple[tuple[str, str], ...]] = {
    "block-rack-host": (("block", BLOCK_LABEL), ("rack", RACK_LABEL), ("host", HOSTNAME_LABEL)),
}
CUSTOM_TOPOLOGY = "custom"  # Cluster.topology: the levels ops name (Cluster.topology_levels)
MAX_TOPOLOGY_LEVELS = 8
# The level names placement understands (others are allowed: Kueue places by them, no request asks for them).
LEVEL_WORDS = {"zone": "zone", "block": "block", "rack": "rack", "nvlink": "NVLink domain", "host": "host"}
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
# A pod set on a placed flavor that asks for no rack or block still asks Kueue for TAS explicitly: in a ClusterQueue
# that also holds flavors without a topology, Kueue refuses a placed flavor to a pod set that does not ask for TAS
# ("Flavor ... supports only TopologyAwareScheduling", its tas_flavorassigner.go).
UNCONSTRAINED_TOPOLOGY = "kueue.x-k8s.io/podset-unconstrained-topology"
# A request's placement choice -> (annotation, level name). "": anywhere (no annotation).
PLACEMENTS: dict[str, tuple[str, str]] = {
    "rack": (REQUIRED_TOPOLOGY, "rack"),
    "block": (REQUIRED_TOPOLOGY, "block"),
    "prefer-rack": (PREFERRED_TOPOLOGY, "rack"),
    "nvlink": (REQUIRED_TOPOLOGY, "nvlink"),
    "prefer-nvlink": (PREFERRED_TOPOLOGY, "nvlink"),
}
# Volcano's network-topology-aware scheduling (docs/cluster-objects.md, "Volcano HyperNodes"): on a cluster with a
# topology whose Volcano hands out the training pool (architecture E), the reconcile writes one HyperNode per value of
# each level above the host, the lowest level tier 1 (its nodes by that level's label), each level above one tier
# higher (its members the HyperNodes below): with the preset, racks (tier 1) and blocks (tier 2); with levels rack,
# nvlink, host: NVLink domains (tier 1) and racks (tier 2). A Volcano training job that asks for one rack, block or
# NVLink domain carries ``spec.networkTopology`` with that level's tier.
HYPERNODE_TIERS = {"rack": 1, "block": 2}  # the preset's
# A request's placement choice -> Volcano's networkTopology (mode, the level whose tier is the highest allowed).
VOLCANO_PLACEMENTS: dict[str, tuple[str, str]] = {
    "rack": ("hard", "rack"), "block": ("hard", "block"), "prefer-rack": ("soft", "rack"),
    "nvlink": ("hard", "nvlink"), "prefer-nvlink": ("soft", "nvlink")}


# ----------------------------------------------------------------------------------------- the snapshot
@dataclass(frozen=True)
class FlavorRow:
    name: str
    kind: str  # whole | mig | hami | cpu (Flavor.Kind values)
    resource_names: tuple[str, ...]
    node_labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    pool_label: str = ""
    order: int = 100
    id: int | None = None


@dataclass(frozen=True)
class QuotaRow:
    flavor: str
    resource: str
    nominal: Decimal
    borrowing_limit: Decimal | None = None
    lending_limit: Decimal | None = None


@dataclass(frozen=True)
class TenantRow:
    slug: str
    active: bool = True
    quotas: tuple[QuotaRow, ...] = ()
    id: int | None = None


@dataclass(frozen=True)
class ProjectRow:
    """A project. ``active=False`` rows are archived projects whose namespace is still retained: they get
    their Namespace (marked archived) and nothing else. ``namespace`` defaults to the slug."""

    slug: str
    tenant: str
    active: bool = True
    quotas: tuple[QuotaRow, ...] = ()
    id: int | None = None
    namespace: str = ""

    @property
    def ns(self) -> str:
        return self.namespace or self.slug


@dataclass(frozen=True)
class ClusterRow:
    name: str
    architecture: str = "B"
    use_mig: bool = False
    use_hami: bool = False
    volcano_capacity_plugin: bool = False
    topology: str = ""  # Cluster.topology: a key of TOPOLOGY_LEVELS, "custom", or "" (no topology-aware placement)
    admission_check: str = ""  # Cluster.multikueue_check: a MultiKueue manager's AdmissionCheck ("" elsewhere)
    # Cluster.topology_levels ((name, node label), highest first): the levels of a "custom" topology.
    topology_levels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class WorkerRow:
    """A MultiKueue worker of the cluster rendered (``Cluster.role`` worker, ``manager`` this one): its name in the
    portal (its MultiKueueCluster's name, what ``status.clusterName`` reads back) and its kubeconfig text. The
    kubeconfig goes into a Secret only: never into a diff, a log or a page (:func:`redacted`)."""

    name: str
    kubeconfig: str = field(repr=False)


@dataclass(frozen=True)
class Snapshot:
    """Everything rendering needs, read in one go. Projects listed are the active ones only."""

    cluster: ClusterRow
    flavors: tuple[FlavorRow, ...] = ()
    tenants: tuple[TenantRow, ...] = ()
    projects: tuple[ProjectRow, ...] = ()
    installation: str = DEFAULT_INSTALLATION
    # "namespace/name" of the portal's own ServiceAccount on this cluster (PORTAL_SERVICE_ACCOUNT): when set,
    # every project namespace (retained archived ones too) gets a RoleBinding of NAMESPACED_ROLE to it.
    service_account: str = ""
    # Per node, the label values of the topology's levels above the host (``hypernode_levels``, highest first; the
    # preset: (block, rack)), as the inventory read them: its Volcano HyperNodes.
    racks: tuple[tuple[str, ...], ...] = ()
    # A MultiKueue manager's workers (empty elsewhere): its MultiKueue objects (render_multikueue).
    workers: tuple[WorkerRow, ...] = ()

    def with_architecture(self, architecture: str) -> Snapshot:
        return replace(self, cluster=replace(self.cluster, architecture=architecture))


# ----------------------------------------------------------------------------------------- small helpers
def labels(**extra: str) -> dict[str, str]:
    out = {MANAGED_BY: MANAGER}
    out.update({k: v for k, v in extra.items() if v})
    return out


def _tenant_labels(tenant: str, project: str | None = None) -> dict[str, str]:
    out = {MANAGED_BY: MANAGER, TENANT_LABEL: tenant}
    if project:
        out[PROJECT_LABEL] = project
    return out


def offered_kinds(cluster: ClusterRow) -> set[str]:
    """Flavor kinds an architecture materializes (``architectures.Arch.mig`` / ``hami``, the cluster's switches)."""
    return architectures.of(cluster).offered_kinds(use_mig=cluster.use_mig, use_hami=cluster.use_hami)


def volcano_owned(cluster: ClusterRow | Cluster, flavor: FlavorRow | Flavor) -> bool:
    """Is this flavor's capacity handed out by Volcano instead of Kueue (architecture E: ``Arch.volcano_pool``)?

    Reads only ``cluster.architecture``, ``flavor.kind`` and ``flavor.pool_label``, so the rows here
    and the models (the workload renderer, the submit checks) ask the same question of one function.

    How E never grants the same GPUs twice: the whole-GPU flavors of the offline (training) pool
    belong to Volcano alone. They get no ResourceFlavor and appear in no ClusterQueue or Cohort, so
    Kueue admits nothing onto those nodes (Kueue pins admitted pods to their flavor's nodeLabels);
    each project's quota rows for them become its Volcano Queue's ``capability`` (and ``deserved`` /
    ``guarantee``). Every other flavor (online whole GPUs, MIG, HAMi — HAMi under Volcano would need
    the different ``volcano.sh/vgpu-*`` resources, docs/cluster-objects.md "HAMi") stays Kueue's. The same quota row therefore
    feeds exactly one of the two systems, and the tenant/capacity invariants over those rows bound both.
    """
    pool = architectures.of(cluster).volcano_pool
    return bool(pool) and flavor.kind == "whole" and flavor.pool_label == pool


def kueue_flavors(cluster: ClusterRow, flavors: Iterable[FlavorRow]) -> list[FlavorRow]:
    kinds = offered_kinds(cluster)
    chosen = [f for f in flavors if f.kind in kinds and not volcano_owned(cluster, f)]
    return sorted(chosen, key=lambda f: (f.order, f.name))


def local_queue_name(cluster: ClusterRow | Cluster, project_slug: str, *, serving: bool = False) -> str:
    """The LocalQueue a workload of ``project_slug`` names in ``kueue.x-k8s.io/queue-name``: ``<project>-online``
    for a serving kind (``Kind.serving``, workloads/kinds/) where the architecture keeps an online pool.

    Never ``default``: a LocalQueue named ``default`` would make Kueue's pod integration gate every
    unlabelled pod of the namespace, which breaks Volcano gangs in architecture E (docs/cluster-objects.md, "Kueue and Volcano together").
    """
    if architectures.of(cluster).online_for(serving=serving):
        return f"{project_slug}-online"
    return project_slug


def _limit_name(base: str, suffix: str) -> str:
    name = f"{base}{suffix}"
    return name if len(name) <= 63 else f"{base[: 63 - len(suffix)]}{suffix}"


# ----------------------------------------------------------------------------------------- resource groups
@dataclass
class _Entry:
    nominal: Decimal = Decimal(0)
    borrowing: Decimal | None = None
    lending: Decimal | None = None


def resource_groups(flavors: list[FlavorRow], entries: Mapping[tuple[str, str], _Entry], *, cohort: bool) -> list[dict]:
    """Kueue ``resourceGroups`` for ``flavors`` (already in the order Kueue should try them).

    Flavors that share a resource name must share a group (a resource may be in only one group), e.g.
    whole GPUs and HAMi both use ``nvidia.com/gpu``; every flavor of a group lists every covered
    resource in the same order, with ``0`` where it has none (docs/cluster-objects.md, "Cluster queues and resource groups"). Borrowing and
    lending limits are written only when the queue is in a cohort (Kueue rejects them otherwise).
    """
    parent = list(range(len(flavors)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, flavor in enumerate(flavors):
        for resource in flavor.resource_names:
            if resource in owner:
                parent[find(i)] = find(owner[resource])
            else:
                owner[resource] = i
    groups: dict[int, list[FlavorRow]] = {}
    for i, flavor in enumerate(flavors):
        groups.setdefault(find(i), []).append(flavor)
    out = []
    for members in sorted(groups.values(), key=lambda ms: flavors.index(ms[0])):
        covered: list[str] = []
        for flavor in members:
            covered += [r for r in flavor.resource_names if r not in covered]
        rendered = []
        for flavor in members:
            resources = []
            for resource in covered:
                entry = entries.get((flavor.name, resource)) or _Entry()
                item: dict[str, Any] = {"name": resource, "nominalQuota": kube_quantity(resource, entry.nominal)}
                if cohort and entry.borrowing is not None:
                    item["borrowingLimit"] = kube_quantity(resource, entry.borrowing)
                if cohort and entry.lending is not None:
                    item["lendingLimit"] = kube_quantity(resource, min(entry.lending, entry.nominal))
                resources.append(item)
            rendered.append({"name": flavor.name, "resources": resources})
        out.append({"coveredResources": covered, "flavors": rendered})
    return out


def _entries(rows: Iterable[QuotaRow]) -> dict[tuple[str, str], _Entry]:
    return {(r.flavor, r.resource): _Entry(r.nominal, r.borrowing_limit, r.lending_limit) for r in rows}


# ----------------------------------------------------------------------------------------- objects
def topology_flavor(cluster: ClusterRow | Cluster, flavor: FlavorRow | Flavor) -> bool:
    """Does ``flavor`` take part in ``cluster``'s topology (a whole-GPU flavor Kueue admits, with node labels,
    on a cluster with a topology)? Only those get ``spec.topologyName`` and only they offer placement by rack."""
    return (has_topology(cluster) and flavor.kind == "whole" and bool(flavor.node_labels)
            and not volcano_owned(cluster, flavor))


def tas_cpu_and_memory(cluster: ClusterRow, data: Snapshot, flavors: list[FlavorRow]) -> tuple[Snapshot, list[FlavorRow]]:
    """On a cluster with a topology, each placed flavor covers ``cpu`` and ``memory`` as well, with the quota each
    owner has on the CPU-and-memory flavor. Kueue's TAS takes every resource a placed pod asks for from its one TAS
    flavor: a flavor without a topology that covers a resource the pod requests is refused ("Flavor "cpu" does not
    support TopologyAwareScheduling", found on the real control plane, tests/realcluster/test_topology_parity.py).
    The placed flavor and the CPU flavor then share one resource group (they share ``cpu``); a pod that asks for no
    placement skips the placed flavor (Kueue: "supports only TopologyAwareScheduling") and takes the CPU flavor."""
    placed = [f.name for f in flavors if topology_flavor(cluster, f)]
    if not placed:
        return data, flavors
    extra = ("cpu", "memory")
    cpu = next((f.name for f in flavors if f.kind == "cpu"), None)

    def widen(f: FlavorRow) -> FlavorRow:
        return replace(f, resource_names=f.resource_names + tuple(r for r in extra if r not in f.resource_names)) \
            if f.name in placed else f

    def copied(rows: tuple[QuotaRow, ...]) -> tuple[QuotaRow, ...]:
        return rows + tuple(replace(r, flavor=name) for r in rows if cpu and r.flavor == cpu and r.resource in extra
                            for name in placed)

    data = replace(data, flavors=tuple(widen(f) for f in data.flavors),
                   tenants=tuple(replace(t, quotas=copied(t.quotas)) for t in data.tenants),
                   projects=tuple(replace(p, quotas=copied(p.quotas)) for p in data.projects))
    return data, [widen(f) for f in flavors]


def volcano_topology_flavor(cluster: ClusterRow | Cluster, flavor: FlavorRow | Flavor) -> bool:
    """Does ``flavor`` take part in ``cluster``'s topology through Volcano (a whole-GPU flavor Volcano hands out, on a
    cluster with a topology)? Its gangs may ask for one rack or block: ``spec.networkTopology`` over the HyperNodes."""
    return has_topology(cluster) and flavor.kind == "whole" and volcano_owned(cluster, flavor)


def placed_by_topology(cluster: ClusterRow | Cluster, flavor: FlavorRow | Flavor) -> bool:
    """May a request on ``flavor`` ask for one rack or block: Kueue TAS or Volcano HyperNodes."""
    return topology_flavor(cluster, flavor) or volcano_topology_flavor(cluster, flavor)


def cluster_levels(cluster: ClusterRow | Cluster | Any) -> tuple[tuple[str, str], ...]:
    """A cluster's topology levels, (name, node label), highest first: the preset's, the ones ops named (topology
    "custom"), or () without a topology."""
    topology = getattr(cluster, "topology", "") or ""
    if topology == CUSTOM_TOPOLOGY:
        out = []
        for level in getattr(cluster, "topology_levels", None) or ():
            name, label = (level.get("name"), level.get("label")) if isinstance(level, Mapping) else level
            out.append((str(name or ""), str(label or "")))
        return tuple(out)
    return TOPOLOGY_LEVELS.get(topology, ())


def has_topology(cluster: ClusterRow | Cluster | Any) -> bool:
    return bool(cluster_levels(cluster))


def level_names(cluster: ClusterRow | Cluster | Any) -> list[str]:
    """The names of ``cluster``'s topology levels, highest first (["block", "rack", "host"] for the preset)."""
    return [name for name, _label in cluster_levels(cluster)]


def hypernode_levels(cluster: ClusterRow | Cluster | Any) -> tuple[tuple[str, str], ...]:
    """The levels Volcano HyperNodes are written for: every level above the host, highest first."""
    return tuple((n, lbl) for n, lbl in cluster_levels(cluster) if lbl != HOSTNAME_LABEL)


def hypernode_tier(cluster: ClusterRow | Cluster | Any, level: str) -> int:
    """A level's HyperNode tier (1: the lowest level above the host); 0 when the cluster has no such level."""
    names = [n for n, _lbl in hypernode_levels(cluster)]
    return len(names) - names.index(level) if level in names else 0


def network_topology(cluster: ClusterRow | Cluster, flavor: FlavorRow | Flavor, placement: str) -> dict[str, Any]:
    """A Volcano Job's ``spec.networkTopology`` for a placement choice: "rack" -> ``{"mode": "hard",
    "highestTierAllowed": 1}`` (the rack level's tier); {} for "", a flavor not placed through Volcano or a level
    the cluster does not have."""
    if placement not in VOLCANO_PLACEMENTS or not volcano_topology_flavor(cluster, flavor):
        return {}
    mode, level = VOLCANO_PLACEMENTS[placement]
    tier = hypernode_tier(cluster, level)
    return {"mode": mode, "highestTierAllowed": tier} if tier else {}


def hypernode_name(level: str, value: str) -> str:
    """A HyperNode's name: the label value, prefixed by its level unless it already says it ("rack-a1", "block-a")."""
    name = value if value.startswith(f"{level}-") else f"{level}-{value}"
    return re.sub(r"[^a-z0-9.-]", "-", name.lower()).strip("-.")[:253]


def render_hypernodes(racks: Iterable[tuple[str, ...]],
                      levels: tuple[tuple[str, str], ...] = (("block", BLOCK_LABEL), ("rack", RACK_LABEL))) -> list[dict]:
    """Volcano HyperNodes from the nodes' label values of ``levels`` (the levels above the host, highest first;
    the preset's (block, rack) by default): one per value of the lowest level (tier 1, its nodes by that level's
    label) and one per value of each level above (one tier higher, the HyperNodes below it by name). A node without
    a value at some level is in no HyperNode from there up (a rack without a block gets no block)."""
    depth = len(levels)
    members: list[dict[str, set[str]]] = [{} for _ in levels]
    for row in sorted(set(racks)):
        values = tuple(row)[:depth] + ("",) * (depth - len(row))
        below = ""
        for i in range(depth - 1, -1, -1):
            name, _label = levels[i]
            value = values[i]
            if not value or (i < depth - 1 and not below):
                break
            members[i].setdefault(value, set())
            if i < depth - 1:
                members[i][value].add(below)
            below = hypernode_name(name, value)
    out = []
    for i in range(depth - 1, -1, -1):
        name, label = levels[i]
        tier = depth - i
        for value, children in sorted(members[i].items()):
            if i == depth - 1:
                spec_members = [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {label: value}}}}]
            else:
                spec_members = [{"type": "HyperNode", "selector": {"exactMatch": {"name": n}}} for n in sorted(children)]
            out.append({"apiVersion": VOLCANO_TOPOLOGY, "kind": "HyperNode",
                        "metadata": {"name": hypernode_name(name, value), "labels": labels()},
                        "spec": {"tier": tier, "tierName": name, "members": spec_members}})
    return out


def topology_label(cluster: ClusterRow | Cluster, level: str) -> str:
    """The node label of a topology level ("rack", "block", "nvlink") on ``cluster``; "" when it has no such level."""
    return dict(cluster_levels(cluster)).get(level, "")


def placement_annotations(cluster: ClusterRow | Cluster, placement: str) -> dict[str, str]:
    """The pod template annotation of a placement choice (``PLACEMENTS``): e.g. "rack" ->
    ``{"kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-rack"}``; {} for "", no topology or a
    level the cluster does not have."""
    annotation, level = PLACEMENTS.get(placement or "", ("", ""))
    label = topology_label(cluster, level) if annotation else ""
    return {annotation: label} if label else {}


def placement_offered(cluster: ClusterRow | Cluster, placement: str) -> bool:
    """Does ``cluster``'s topology have the level a placement choice asks for ("" is always offered)?"""
    return not placement or bool(topology_label(cluster, PLACEMENTS.get(placement, ("", ""))[1]))


def render_topology(cluster: ClusterRow) -> dict:
    """Kueue's Topology: the levels' node labels, highest first (Kueue requires hostname, if present, last)."""
    levels = [{"nodeLabel": label} for _name, label in cluster_levels(cluster)]
    return {"apiVersion": KUEUE, "kind": "Topology", "metadata": {"name": TOPOLOGY_NAME, "labels": labels()},
            "spec": {"levels": levels}}


def render_resource_flavor(flavor: FlavorRow, *, topology: str = "") -> dict:
    spec: dict[str, Any] = {}
    if flavor.node_labels:
        spec["nodeLabels"] = {str(k): str(v) for k, v in sorted(flavor.node_labels.items())}
    if flavor.taints:
        spec["nodeTaints"] = [dict(t) for t in flavor.taints]
    if flavor.tolerations:
        spec["tolerations"] = [dict(t) for t in flavor.tolerations]
    if topology:
        spec["topologyName"] = topology
    return {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": flavor.name, "labels": labels()}, "spec": spec}


def multikueue_secret_name(worker: str) -> str:
    return f"{worker}-kubeconfig"


def render_multikueue(check: str, workers: Iterable[WorkerRow]) -> list[dict]:
    """A MultiKueue manager's objects, as Kueue's MultiKueue documentation writes them: per worker a Secret in
    ``kueue-system`` holding its kubeconfig under ``kubeconfig`` and a MultiKueueCluster named as the worker pointing
    at it; one MultiKueueConfig (named as the check) listing the workers; the AdmissionCheck ``check`` whose
    parameters name that config. Nothing without workers (Kueue wants at least one cluster in a config)."""
    workers = sorted(workers, key=lambda w: w.name)
    if not check or not workers:
        return []
    objects: list[dict] = []
    for worker in workers:
        secret = multikueue_secret_name(worker.name)
        objects.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": {"name": secret, "namespace": MULTIKUEUE_NAMESPACE, "labels": labels()},
                        "data": {"kubeconfig": base64.b64encode(worker.kubeconfig.encode()).decode()}})
        objects.append({"apiVersion": KUEUE, "kind": "MultiKueueCluster",
                        "metadata": {"name": worker.name, "labels": labels()},
                        "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": secret}}}})
    objects.append({"apiVersion": KUEUE, "kind": "MultiKueueConfig", "metadata": {"name": check, "labels": labels()},
                    "spec": {"clusters": [w.name for w in workers]}})
    objects.append({"apiVersion": KUEUE, "kind": "AdmissionCheck", "metadata": {"name": check, "labels": labels()},
                    "spec": {"controllerName": MULTIKUEUE_CONTROLLER,
                             "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": check}}})
    return objects


def redacted(obj: Any) -> Any:
    """``obj`` as a page, a plan diff or an export may show it: a Secret's values become their length and a short
    digest (a changed kubeconfig still shows as a change, its content never does)."""
    if not isinstance(obj, dict) or obj.get("kind") != "Secret":
        return obj
    out = dict(obj)
    for key in ("data", "stringData"):
        if isinstance(obj.get(key), dict):
            out[key] = {k: f"<hidden: {len(str(v))} bytes, sha256 {hashlib.sha256(str(v).encode()).hexdigest()[:12]}>"
                        for k, v in obj[key].items()}
    return out


def render_priority_classes() -> list[dict]:
    return [
        {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name, "labels": labels()},
         "value": value, "description": description}
        for name, value, description in PRIORITY_CLASSES
    ]


def render_cohort(tenant: TenantRow, flavors: list[FlavorRow], projects: list[ProjectRow]) -> dict:
    """The tenant's Cohort. Its own ``resourceGroups`` hold the tenant quota *not* given to projects.

    Why the remainder and not the tenant total: a Cohort's quota is *added* to its members' nominal
    quotas (docs/cluster-objects.md, "Cohorts and borrowing"), so writing the total would double the tenant's promise. With the
    remainder the cohort's capacity is exactly the tenant's nominal quota: projects first use their own
    nominal, then borrow unused sibling quota and this unassigned pool. Borrowing/lending limits are
    left out: Kueue accepts them on a Cohort only when it has a parent, and tenants have none.
    """
    assigned: dict[tuple[str, str], Decimal] = {}
    for project in projects:
        for row in project.quotas:
            assigned[(row.flavor, row.resource)] = assigned.get((row.flavor, row.resource), Decimal(0)) + row.nominal
    names = {f.name for f in flavors}
    entries = {
        (r.flavor, r.resource): _Entry(max(Decimal(0), r.nominal - assigned.get((r.flavor, r.resource), Decimal(0))))
        for r in tenant.quotas
        if r.flavor in names
    }
    spec: dict[str, Any] = {}
    if flavors:
        spec["resourceGroups"] = resource_groups(flavors, entries, cohort=False)
    return {"apiVersion": KUEUE, "kind": "Cohort", "metadata": {"name": tenant.slug, "labels": _tenant_labels(tenant.slug)},
            "spec": spec}


def _cluster_queue(name: str, *, tenant: str, project: str | None, cohort: str | None, selector: dict,
                   groups: list[dict], preemption: dict, hold: bool) -> dict:
    spec: dict[str, Any] = {}
    if cohort:
        spec["cohortName"] = cohort
    spec["namespaceSelector"] = selector
    spec["queueingStrategy"] = "BestEffortFIFO"
    spec["resourceGroups"] = groups
    spec["preemption"] = preemption
    # Flavor fungibility, written deliberately (docs/cluster-objects.md, "Flavor fungibility"): Kueue tries the flavors
    # of a group in their order; a job whose pods allow several flavors stops at the first it fits, borrowing included
    # (its preferred model on quota the cohort lends beats a later model), but tries the next before preempting.
    spec["flavorFungibility"] = dict(FLAVOR_FUNGIBILITY)
    # A suspended tenant's queues admit nothing new; running work continues (stopPolicy Hold).
    spec["stopPolicy"] = "Hold" if hold else "None"
    meta_labels = _tenant_labels(tenant, project) if tenant else labels()
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name, "labels": meta_labels}, "spec": spec}


def _project_selector(project: str) -> dict:
    return {"matchLabels": {PROJECT_LABEL: project}}


B_PREEMPTION = {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
# Kueue v1beta2's values (v1beta1: MayStopSearch is also spelled Borrow; portal/kueue_compat.py converts).
FLAVOR_FUNGIBILITY = {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}


def _tenant_flavor_names(tenant: TenantRow, projects: list[ProjectRow]) -> set[str]:
    names = {r.flavor for r in tenant.quotas}
    for project in projects:
        names |= {r.flavor for r in project.quotas}
    return names


def _b_queue(project: ProjectRow, tenant: TenantRow, flavors: list[FlavorRow], hold: bool) -> dict:
    """Architectures B–E: the project's ClusterQueue in its tenant's cohort.

    It lists every flavor its tenant has quota for, with nominal 0 where the project has none: a
    ClusterQueue can only borrow a (flavor, resource) it lists (docs/cluster-objects.md, "Cohorts and borrowing"). No project row = no borrowing
    limit = it may borrow whatever the cohort has unused.
    """
    groups = resource_groups(flavors, _entries(project.quotas), cohort=True)
    return _cluster_queue(project.slug, tenant=tenant.slug, project=project.slug, cohort=tenant.slug,
                          selector=_project_selector(project.slug), groups=groups, preemption=dict(B_PREEMPTION), hold=hold)


def _f_queues(project: ProjectRow, tenant: TenantRow, tenant_projects: list[ProjectRow], flavors: list[FlavorRow],
              hold: bool, *, online_pool: str = ONLINE) -> list[dict]:
    """Architecture F: an offline ClusterQueue (training, notebooks) and an online one (inference only).

    * Offline ``<project>``: the offline-pool flavors and the pool-less ones (CPU), with the project's
      nominal/borrowing/lending; ``reclaimWithinCohort: Any`` so training takes lent GPUs back at once.
    * Online ``<project>-online``: the online-pool flavors with the project's quota, then the pool-less
      flavors with nominal 0 (it borrows CPU/memory from the offline side), then — the explicit lending —
      the offline GPU flavors with nominal 0 and ``borrowingLimit`` = the sum of the lending limits the
      tenant's projects set on those offline rows. No lending limit set = nothing lent: an offline GPU
      flavor is listed on the online side only when some project lends it.
    * ``borrowWithinCohort: LowerPriority`` with ``maxPriorityThreshold`` = batch: when inference has
      to borrow and the lent GPUs are held by batch work that is itself above its nominal quota, it
      preempts that work (never notebooks or production; Kueue only preempts from queues that borrow,
      so it cannot flap with the offline side's reclaim).
    * Only inference uses the online LocalQueue; the online flavors' nodes carry the pool taint, which
      only the online flavors tolerate, so nothing else lands there.
    """
    own = _entries(project.quotas)
    online = [f for f in flavors if f.pool_label == online_pool]
    offline = [f for f in flavors if f.pool_label != online_pool]
    pool_less = [f for f in offline if not f.pool_label]
    lent: dict[tuple[str, str], Decimal] = {}
    for sibling in tenant_projects:
        for row in sibling.quotas:
            if row.lending_limit is not None and row.lending_limit > 0:
                key = (row.flavor, row.resource)
                lent[key] = lent.get(key, Decimal(0)) + min(row.lending_limit, row.nominal)
    lent_flavors = [f for f in offline if f.pool_label == OFFLINE and any((f.name, r) in lent for r in f.resource_names)]

    offline_entries = {k: v for k, v in own.items() if k[0] in {f.name for f in offline}}
    offline_q = _cluster_queue(
        project.slug, tenant=tenant.slug, project=project.slug, cohort=tenant.slug,
        selector=_project_selector(project.slug), groups=resource_groups(offline, offline_entries, cohort=True),
        preemption=dict(B_PREEMPTION), hold=hold,
    )
    online_entries: dict[tuple[str, str], _Entry] = {k: v for k, v in own.items() if k[0] in {f.name for f in online}}
    for flavor in lent_flavors:
        for resource in flavor.resource_names:
            online_entries[(flavor.name, resource)] = _Entry(Decimal(0), lent.get((flavor.name, resource), Decimal(0)))
    online_list = online + pool_less + lent_flavors
    online_q = _cluster_queue(
        _limit_name(project.slug, "-online"), tenant=tenant.slug, project=project.slug, cohort=tenant.slug,
        selector=_project_selector(project.slug), groups=resource_groups(online_list, online_entries, cohort=True),
        preemption={**B_PREEMPTION, "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": BATCH_PRIORITY}},
        hold=hold,
    ) if online_list else None
    return [q for q in (offline_q, online_q) if q is not None]


def render_namespace(project: ProjectRow, cluster: ClusterRow) -> dict:
    meta_labels = _tenant_labels(project.tenant, project.slug)
    meta_labels.update(POD_SECURITY)
    if not project.active:
        meta_labels[ARCHIVED_LABEL] = "true"
    elif architectures.of(cluster).volcano_pool:
        # Tells the workload renderer which Volcano Queue this namespace's gang jobs go to. The
        # namespace has no LocalQueue named "default", so Kueue leaves Volcano's pods alone (docs/cluster-objects.md).
        meta_labels[VOLCANO_QUEUE_LABEL] = project.slug
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": project.ns, "labels": meta_labels}}


def render_role_binding(project: ProjectRow, service_account: str) -> dict:
    """The portal's access to what only lives in project namespaces (Secrets), granted here and nowhere else
    (docs/security.md, "The portal's cluster identity"): the ClusterRole NAMESPACED_ROLE bound in this namespace."""
    sa_namespace, _, sa_name = service_account.partition("/")
    return {"apiVersion": RBAC, "kind": "RoleBinding",
            "metadata": {"name": NAMESPACED_ROLE, "namespace": project.ns, "labels": _tenant_labels(project.tenant, project.slug)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAMESPACED_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": sa_namespace}]}


def render_local_queue(project: ProjectRow, name: str, cluster_queue: str) -> dict:
    return {"apiVersion": KUEUE, "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": project.ns, "labels": _tenant_labels(project.tenant, project.slug)},
            "spec": {"clusterQueue": cluster_queue}}


def render_limit_range(project: ProjectRow) -> dict:
    # Default *requests* only: a default limit smaller than a request the user gives would make the pod invalid.
    return {"apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": GUARDRAIL_NAME, "namespace": project.ns, "labels": _tenant_labels(project.tenant, project.slug)},
            "spec": {"limits": [{"type": "Container", "defaultRequest": dict(DEFAULT_REQUESTS)}]}}


def render_resource_quota(project: ProjectRow, ceilings: Mapping[str, Decimal]) -> dict:
    hard = {f"requests.{resource}": kube_quantity(resource, value) for resource, value in sorted(ceilings.items())}
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": GUARDRAIL_NAME, "namespace": project.ns, "labels": _tenant_labels(project.tenant, project.slug)},
            "spec": {"hard": hard}}


def gpu_ceilings(project: ProjectRow, tenant: TenantRow, flavors: Iterable[FlavorRow]) -> dict[str, Decimal]:
    """The most of each pod GPU resource the project's namespace could ever be granted, over all flavors.

    Per (flavor, resource): the tenant's nominal (a project can borrow at most its whole tenant), or
    the project's nominal + borrowing limit when that is smaller. Summed per resource name.
    """
    own = _entries(project.quotas)
    tenant_rows = _entries(tenant.quotas)
    out: dict[str, Decimal] = {}
    for flavor in flavors:
        for resource in flavor.resource_names:
            if not resource.startswith(POD_GPU_PREFIXES):
                continue
            mine = own.get((flavor.name, resource))
            ceiling = tenant_rows[(flavor.name, resource)].nominal if (flavor.name, resource) in tenant_rows else Decimal(0)
            if mine is not None:
                ceiling = max(ceiling, mine.nominal)
                if mine.borrowing is not None:
                    ceiling = min(ceiling, mine.nominal + mine.borrowing)
            out[resource] = out.get(resource, Decimal(0)) + ceiling
    return out


def render_volcano_queue(project: ProjectRow, tenant: TenantRow, flavors: list[FlavorRow], *, capacity_plugin: bool) -> dict:
    """Architecture E: the project's Volcano Queue over the Volcano-owned flavors (see :func:`volcano_owned`).

    ``capability`` (hard cap) = nominal + borrowing limit (no limit: the tenant's whole training
    share); ``deserved`` = nominal; ``guarantee`` = nominal − lending limit (what Kueue would never
    lend), the last two only with Volcano's capacity plugin. ``weight`` ∝ nominal for the default
    proportion plugin. Volcano queues are flat (no ``parent``: hierarchy needs a scheduler option the
    portal cannot see). Only GPU resources are capped: CPU and memory stay bounded by the pool's nodes.
    """
    own = _entries(project.quotas)
    tenant_rows = _entries(tenant.quotas)
    deserved: dict[str, Decimal] = {}
    capability: dict[str, Decimal] = {}
    guarantee: dict[str, Decimal] = {}
    for flavor in flavors:
        for resource in flavor.resource_names:
            entry = own.get((flavor.name, resource)) or _Entry()
            tenant_total = tenant_rows[(flavor.name, resource)].nominal if (flavor.name, resource) in tenant_rows else entry.nominal
            cap = max(tenant_total, entry.nominal) if entry.borrowing is None else entry.nominal + entry.borrowing
            deserved[resource] = deserved.get(resource, Decimal(0)) + entry.nominal
            capability[resource] = capability.get(resource, Decimal(0)) + cap
            if entry.lending is not None:
                guarantee[resource] = guarantee.get(resource, Decimal(0)) + max(Decimal(0), entry.nominal - entry.lending)
    gpus = deserved.get("nvidia.com/gpu", Decimal(0))
    spec: dict[str, Any] = {
        "weight": max(1, min(65535, int(gpus))),
        "reclaimable": True,
        "capability": {r: kube_quantity(r, v) for r, v in sorted(capability.items())},
    }
    if capacity_plugin:
        spec["deserved"] = {r: kube_quantity(r, v) for r, v in sorted(deserved.items())}
        if guarantee:
            spec["guarantee"] = {"resource": {r: kube_quantity(r, v) for r, v in sorted(guarantee.items())}}
    return {"apiVersion": VOLCANO_QUEUE, "kind": "Queue",
            "metadata": {"name": project.slug, "labels": _tenant_labels(project.tenant, project.slug)}, "spec": spec}


def _a_totals(snapshot: Snapshot) -> dict[tuple[str, str], Decimal]:
    """Architecture A's quota: per (flavor, resource) the sum over tenants of what each is promised
    (its tenant row, or its projects' sum when that is larger)."""
    totals: dict[tuple[str, str], Decimal] = {}
    for tenant in snapshot.tenants:
        per = {(r.flavor, r.resource): r.nominal for r in tenant.quotas}
        sums: dict[tuple[str, str], Decimal] = {}
        for project in snapshot.projects:
            if project.active and project.tenant == tenant.slug:
                for r in project.quotas:
                    sums[(r.flavor, r.resource)] = sums.get((r.flavor, r.resource), Decimal(0)) + r.nominal
        for key in per.keys() | sums.keys():
            totals[key] = totals.get(key, Decimal(0)) + max(per.get(key, Decimal(0)), sums.get(key, Decimal(0)))
    return totals


def _shared_queue(totals: Mapping[tuple[str, str], Decimal], flavors: list[FlavorRow]) -> dict:
    """Architecture A: one ClusterQueue for every portal namespace, no cohort."""
    entries = {k: _Entry(v) for k, v in totals.items()}
    selector = {"matchExpressions": [{"key": PROJECT_LABEL, "operator": "Exists"}]}
    return _cluster_queue(SHARED_QUEUE, tenant="", project=None, cohort=None, selector=selector,
                          groups=resource_groups(flavors, entries, cohort=False),
                          preemption={"withinClusterQueue": "LowerPriority"}, hold=False)


# ----------------------------------------------------------------------------------------- the whole state
def _a_ceilings(totals: Mapping[tuple[str, str], Decimal], flavors: list[FlavorRow]) -> dict[str, Decimal]:
    """The shared queue's GPU ceilings per pod resource (every namespace's ResourceQuota under A)."""
    out: dict[str, Decimal] = {}
    for f in flavors:
        for r in f.resource_names:
            if r.startswith(POD_GPU_PREFIXES):
                out[r] = out.get(r, Decimal(0)) + totals.get((f.name, r), Decimal(0))
    return out


@dataclass(frozen=True)
class _Context:
    """What every project's objects are rendered from: the cluster, its architecture entry, its flavors."""

    cluster: ClusterRow
    arch: architectures.Arch
    flavors: list[FlavorRow]  # Kueue's, in try order
    volcano_flavors: list[FlavorRow]  # Volcano's (architecture E's offline whole GPUs)
    shared_ceilings: Mapping[str, Decimal] = field(default_factory=dict)  # SHARED layout only
    service_account: str = ""  # Snapshot.service_account


def _project_queue_objects(ctx: _Context, project: ProjectRow, tenant: TenantRow, projects: list[ProjectRow],
                           tenant_flavors: list[FlavorRow]) -> list[dict]:
    """A project's ClusterQueue(s), LocalQueue(s) and ResourceQuota, by the architecture's queue layout."""
    hold = not tenant.active
    if ctx.arch.queues == architectures.SHARED:
        return [render_local_queue(project, project.slug, SHARED_QUEUE), render_resource_quota(project, ctx.shared_ceilings)]
    if ctx.arch.queues == architectures.POOLS:
        queues = _f_queues(project, tenant, projects, tenant_flavors, hold, online_pool=ctx.arch.online_pool)
        local = [render_local_queue(project, q["metadata"]["name"], q["metadata"]["name"]) for q in queues]
        return [*queues, *local, render_resource_quota(project, gpu_ceilings(project, tenant, tenant_flavors))]
    return [_b_queue(project, tenant, tenant_flavors, hold), render_local_queue(project, project.slug, project.slug),
            render_resource_quota(project, gpu_ceilings(project, tenant, tenant_flavors + ctx.volcano_flavors))]


def _project_objects(ctx: _Context, project: ProjectRow, tenant: TenantRow, projects: list[ProjectRow],
                     tenant_flavors: list[FlavorRow]) -> list[dict]:
    objects = [render_namespace(project, ctx.cluster)]
    objects += _project_queue_objects(ctx, project, tenant, projects, tenant_flavors)
    objects.append(render_limit_range(project))
    if ctx.service_account:
        objects.append(render_role_binding(project, ctx.service_account))
    if ctx.arch.volcano_pool:
        objects.append(render_volcano_queue(project, tenant, ctx.volcano_flavors,
                                            capacity_plugin=ctx.cluster.volcano_capacity_plugin))
    return objects


def _projects_by_tenant(data: Snapshot) -> tuple[dict[str, list[ProjectRow]], list[ProjectRow]]:
    """Active projects per tenant slug (sorted), and the archived ones whose namespace is retained."""
    tenants = {t.slug for t in data.tenants}
    active: dict[str, list[ProjectRow]] = {}
    retained: list[ProjectRow] = []
    for project in data.projects:
        if project.tenant not in tenants:
            continue
        if project.active:
            active.setdefault(project.tenant, []).append(project)
        else:  # archived, namespace kept until its retention ends or ops release it
            retained.append(project)
    return {k: sorted(v, key=lambda p: p.slug) for k, v in active.items()}, retained


def desired_state(cluster: ClusterRow | Any, data: Snapshot) -> list[dict]:
    """Every object the portal wants on ``cluster``, in apply order (KIND_ORDER, then name).

    ``cluster`` is a :class:`ClusterRow` or anything with the same attributes (a ``Cluster`` row). What
    differs per architecture comes from its ``quotas.architectures`` entry.
    """
    if not isinstance(cluster, ClusterRow):
        cluster = ClusterRow(cluster.name, cluster.architecture, cluster.use_mig, cluster.use_hami, cluster.volcano_capacity_plugin,
                             getattr(cluster, "topology", ""), getattr(cluster, "multikueue_check", ""),
                             cluster_levels(cluster))
    arch = architectures.of(cluster)
    flavors = kueue_flavors(cluster, data.flavors)
    data, flavors = tas_cpu_and_memory(cluster, data, flavors)
    flavor_names = {f.name for f in flavors}
    ctx = _Context(cluster, arch, flavors,
                   sorted((f for f in data.flavors if volcano_owned(cluster, f)), key=lambda f: (f.order, f.name)),
                   service_account=data.service_account)
    objects: list[dict] = [render_resource_flavor(f, topology=TOPOLOGY_NAME if topology_flavor(cluster, f) else "")
                           for f in flavors]
    if any(topology_flavor(cluster, f) for f in flavors):
        objects.append(render_topology(cluster))
    if any(volcano_topology_flavor(cluster, f) for f in data.flavors):
        objects += render_hypernodes(data.racks, hypernode_levels(cluster))
    objects += render_priority_classes()
    if arch.shared_queue:
        totals = _a_totals(data)
        objects.append(_shared_queue(totals, flavors))
        ctx = replace(ctx, shared_ceilings=_a_ceilings(totals, flavors))
    projects_by_tenant, retained = _projects_by_tenant(data)
    for tenant in sorted(data.tenants, key=lambda t: t.slug):
        projects = projects_by_tenant.get(tenant.slug, [])
        used = _tenant_flavor_names(tenant, projects) & flavor_names
        tenant_flavors = [f for f in flavors if f.name in used]
        if arch.cohorts:
            objects.append(render_cohort(tenant, tenant_flavors, projects))
        for project in projects:
            objects += _project_objects(ctx, project, tenant, projects, tenant_flavors)
    for project in retained:
        objects.append(render_namespace(project, cluster))
        if data.service_account:  # an archived namespace's contents are still counted before it is deleted
            objects.append(render_role_binding(project, data.service_account))
    if cluster.admission_check:  # a MultiKueue manager: its Kueue admits work here, then dispatches it to a worker
        for obj in objects:
            if obj["kind"] == "ClusterQueue":
                obj["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": cluster.admission_check}]}
        objects += render_multikueue(cluster.admission_check, data.workers)
    return sort_objects([mark(obj, data.installation) for obj in objects])


# ----------------------------------------------------------------------------------------- what can run
def _queue_quota(cq: Mapping[str, Any]) -> dict[tuple[str, str], tuple[Decimal, Decimal | None, Decimal | None]]:
    """(flavor, resource) → (nominal, borrowing limit, lending limit) as a rendered ClusterQueue or Cohort lists them."""
    out = {}
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                out[(flavor["name"], r["name"])] = (
                    parse_quantity(r.get("nominalQuota", 0)),
                    None if r.get("borrowingLimit") is None else parse_quantity(r["borrowingLimit"]),
                    None if r.get("lendingLimit") is None else parse_quantity(r["lendingLimit"]))
    return out


@dataclass(frozen=True)
class RenderedQueues:
    """The rendered objects indexed for :func:`queue_admits`: LocalQueues, ClusterQueues, Cohorts, flavors, Volcano."""

    local: Mapping[tuple[str, str], str]  # (namespace, LocalQueue) → ClusterQueue
    cluster_queues: Mapping[str, Mapping[str, Any]]
    cohorts: Mapping[str, Mapping[str, Any]]
    resource_flavors: frozenset[str]
    volcano: Mapping[str, Mapping[str, Any]]  # project slug → Volcano Queue

    @classmethod
    def of(cls, objects: Iterable[Mapping[str, Any]]) -> RenderedQueues:
        local, cqs, cohorts, flavors, volcano = {}, {}, {}, set(), {}
        for obj in objects:
            kind, meta = obj["kind"], obj.get("metadata") or {}
            if obj["apiVersion"] == KUEUE and kind == "LocalQueue":
                local[(meta.get("namespace", ""), meta["name"])] = obj["spec"]["clusterQueue"]
            elif obj["apiVersion"] == KUEUE and kind == "ClusterQueue":
                cqs[meta["name"]] = obj
            elif obj["apiVersion"] == KUEUE and kind == "Cohort":
                cohorts[meta["name"]] = obj
            elif obj["apiVersion"] == KUEUE and kind == "ResourceFlavor":
                flavors.add(meta["name"])
            elif obj["apiVersion"] == VOLCANO_QUEUE and kind == "Queue":
                volcano[meta["name"]] = obj
        return cls(local, cqs, cohorts, frozenset(flavors), volcano)

    def most(self, cq_name: str, flavor: str, resource: str) -> Decimal:
        """The most of (flavor, resource) ClusterQueue ``cq_name`` could ever be admitted with, every queue idle
        (Kueue's "maximum capacity"): its nominal, or in a cohort what it keeps (nominal − lendable) plus the cohort's
        pool (every member's lendable part and the cohort's own quota), within its borrowing limit."""
        cq = self.cluster_queues[cq_name]
        own = _queue_quota(cq)
        if (flavor, resource) not in own:
            return Decimal(0)
        nominal, borrowing, _lending = own[(flavor, resource)]
        cohort = (cq.get("spec") or {}).get("cohortName")
        if not cohort:
            return nominal

        def lendable(values: tuple[Decimal, Decimal | None, Decimal | None]) -> Decimal:
            return values[0] if values[2] is None else min(values[0], values[2])

        pool = sum((lendable(_queue_quota(other).get((flavor, resource), (Decimal(0), None, None)))
                    for other in self.cluster_queues.values() if (other.get("spec") or {}).get("cohortName") == cohort),
                   Decimal(0))
        pool += _queue_quota(self.cohorts.get(cohort) or {}).get((flavor, resource), (Decimal(0), None, None))[0]
        most = nominal - lendable(own[(flavor, resource)]) + pool
        return most if borrowing is None else min(most, nominal + borrowing)


class KindTraits(Protocol):
    """What the quota side asks of a template kind (``workloads.kinds.Kind`` has these): it never names one."""

    name: str
    gang: bool  # gang-scheduled: may run on a Volcano-owned pool
    serving: bool  # a long-running server: goes to the online pool where there is one


def queue_admits(queues: RenderedQueues, cluster: ClusterRow, project: ProjectRow, kind: KindTraits,
                 flavor: FlavorRow) -> bool:
    """Can a request of template ``kind`` in ``project`` on ``flavor`` ever be admitted by the queues rendered for
    ``cluster``, given enough free capacity? The one rule of what the portal offers (``workloads.selectors``
    asks it for the form, the catalogue, the API and the submission check).

    Kueue: the LocalQueue the request names (:func:`local_queue_name`) leads to a ClusterQueue that lists the flavor,
    whose ResourceFlavor exists, with more than 0 of each of the flavor's resources at most (:meth:`RenderedQueues.most`;
    a HAMi flavor needs vGPU slots, cores and memory). Volcano (architecture E's offline whole GPUs): only gang-scheduled kinds
    (``Kind.gang``), and the project's Volcano Queue caps the flavor's resource above 0.
    """
    if volcano_owned(cluster, flavor):
        if not kind.gang:
            return False
        capability = ((queues.volcano.get(project.slug) or {}).get("spec") or {}).get("capability") or {}
        return all(parse_quantity(capability.get(r, 0)) > 0 for r in flavor.resource_names)
    if flavor.name not in queues.resource_flavors:
        return False
    cq_name = queues.local.get((project.ns, local_queue_name(cluster, project.slug, serving=kind.serving)))
    if cq_name is None or cq_name not in queues.cluster_queues:
        return False
    return all(queues.most(cq_name, flavor.name, r) > 0 for r in flavor.resource_names)


def queue_offers(data: Snapshot, kinds: Iterable[KindTraits]) -> set[tuple[str, str, str]]:
    """(project slug, template kind, flavor name) for every active project of ``data`` and every one of ``kinds``
    that :func:`queue_admits` on the queues :func:`desired_state` renders. Pure; a snapshot of some tenants only
    gives the same answer for their projects (a project's queues depend on its tenant alone, A's shared queue
    holds at least its tenant's quota)."""
    queues = RenderedQueues.of(desired_state(data.cluster, data))
    kinds = list(kinds)
    return {(p.slug, kind.name, f.name) for p in data.projects if p.active for kind in kinds for f in data.flavors
            if queue_admits(queues, data.cluster, p, kind, f)}


def object_key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta["name"])


def sort_objects(objects: list[dict]) -> list[dict]:
    return sorted(objects, key=lambda o: (KIND_RANK.get((o["apiVersion"], o["kind"]), 99), object_key(o)[2], object_key(o)[3]))


def owner_of(obj: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(tenant slug, project slug) an object belongs to; (None, None) for cluster-wide objects."""
    meta_labels = (obj.get("metadata") or {}).get("labels") or {}
    return meta_labels.get(TENANT_LABEL), meta_labels.get(PROJECT_LABEL)


# ----------------------------------------------------------------------------------------- ownership
def owner_text(installation: str, tenant: str | None = None, project: str | None = None) -> str:
    """The owner annotation: which portal installation wrote the object, for which tenant and project."""
    parts = [f"gpu-portal installation {installation}"]
    if tenant:
        parts.append(f"tenant {tenant}")
    if project:
        parts.append(f"project {project}")
    return "; ".join(parts)


def mark(obj: dict, installation: str) -> dict:
    """``obj`` with our ownership labels and annotation (a new dict; the input is not changed)."""
    meta = dict(obj.get("metadata") or {})
    meta_labels = dict(meta.get("labels") or {})
    meta_labels[MANAGED_BY] = MANAGER
    meta_labels[INSTALLATION_LABEL] = installation
    meta["labels"] = meta_labels
    annotations = dict(meta.get("annotations") or {})
    annotations[OWNER_ANNOTATION] = owner_text(installation, meta_labels.get(TENANT_LABEL), meta_labels.get(PROJECT_LABEL))
    meta["annotations"] = annotations
    return {**obj, "metadata": meta}


def owner_selector(installation: str) -> dict[str, str]:
    """The labels that make a live object ours."""
    return {MANAGED_BY: MANAGER, INSTALLATION_LABEL: installation}


def ownership(obj: Mapping[str, Any] | None, installation: str) -> str:
    """``"ours"`` (our two labels), ``"legacy"`` (managed-by us, no installation label: written before
    installation ids existed), ``"missing"`` (no object) or ``"foreign"`` (anything else)."""
    if obj is None:
        return "missing"
    meta_labels = (obj.get("metadata") or {}).get("labels") or {}
    if meta_labels.get(MANAGED_BY) != MANAGER:
        return "foreign"
    found = meta_labels.get(INSTALLATION_LABEL)
    if found == installation:
        return "ours"
    return "legacy" if found is None else "foreign"


def reserved_namespace(name: str, extra: Iterable[str] = ()) -> bool:
    """Is ``name`` a namespace no project may use (the built-in list plus ``extra``; ``x-*`` is a prefix)?"""
    for given in (*RESERVED_NAMESPACES, *extra):
        pattern = given.strip()
        if not pattern:
            continue
        if pattern.endswith("*") and name.startswith(pattern[:-1]):
            return True
        if name == pattern:
            return True
    return False

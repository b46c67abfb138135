"""Reads for MIG changes, scoped by who asks (docs/architecture.md, "Who sees what").

Ops see every change and every MIG pool; a tenant admin sees the changes their tenant proposed and the MIG
pools their tenant uses (it holds quota on a flavor the pool's nodes serve); everyone else sees none.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import QuerySet

from portal.labels import MIG_CONFIG_LABEL
from portal.quantities import parse_quantity
from quotas.capacity import flavor_matches
from quotas.inventory import model_key
from quotas.models import Cluster, Flavor, Node, NodePool, Quota
from tenants.access import Actor, scope_of
from tenants.models import Tenant
from workloads.models import RequestState, WorkloadRequest

from .layouts import MIG_PREFIX, layouts_for
from .models import MigChange, MigChangeStep

ACTIVE_REQUESTS = (RequestState.QUEUED, RequestState.RUNNING)


def _admin_tenant_ids(actor: Actor) -> list[int] | None:
    """None: everything (ops, the system); else the tenants the actor administers."""
    if actor.user is None:
        return None
    scope = scope_of(actor)
    if scope.everything and actor.token is None:
        return None
    if actor.token is not None:
        return []
    return scope.tenant_ids("manage_members_tenant")


def mig_changes_for(*, actor: Actor) -> QuerySet[MigChange]:
    qs = MigChange.objects.select_related("cluster", "tenant", "proposed_by", "approved_by")
    tenants = _admin_tenant_ids(actor)
    if tenants is None:
        return qs
    return qs.filter(tenant_id__in=tenants)


def impact_for(impact: dict[str, Any] | None, *, actor: Actor) -> dict[str, Any] | None:
    """A change's impact as ``actor`` may see it. Ops (and the system) see all of it. A tenant admin sees the
    capacity and their own tenants' quota rows and running requests; the rows of other tenants (their tenant,
    project, flavor, amounts, requests and owners are 404s to them everywhere else) are left out, and only
    ``others_cut`` / ``others_running`` say that there were some (docs/security.md)."""
    if not impact or _admin_tenant_ids(actor) is None:
        return impact
    scope = scope_of(actor)
    mine = set(Tenant.objects.filter(pk__in=sorted(scope.visible_tenants)).values_list("slug", flat=True))
    quotas = dict(impact.get("quotas") or {})
    changes = quotas.get("changes") or []
    quotas["changes"] = [row for row in changes if row.get("tenant") in mine]
    running = impact.get("running") or []
    # Pods that are not the portal's (no id) name a namespace: shown to ops only.
    kept = [row for row in running if row.get("id") and row.get("tenant") in mine]
    return impact | {"quotas": quotas, "running": kept,
                     "others_cut": len(quotas["changes"]) < len(changes), "others_running": len(kept) < len(running)}


def mig_change_steps(change: MigChange) -> QuerySet[MigChangeStep]:
    return MigChangeStep.objects.filter(change=change).order_by("seq", "id")


def admin_tenants_for(*, actor: Actor) -> QuerySet[Tenant]:
    """The tenants a (non-ops) actor may propose for."""
    tenants = _admin_tenant_ids(actor)
    qs = Tenant.objects.order_by("name")
    return qs if tenants is None else qs.filter(pk__in=tenants)


def pool_nodes(pool: NodePool) -> list[Node]:
    return list(Node.objects.filter(pool=pool, present=True).select_related("pool").order_by("name"))


def pool_model(nodes: list[Node]) -> tuple[str, int]:
    """(GPU model key, GPUs per node) of a pool, from its first node's labels."""
    if not nodes:
        return "", 0
    labels = nodes[0].labels or {}
    model = model_key(labels)
    return model, gpus_of(nodes[0], model)


def gpus_of(node: Node, model: str) -> int:
    """Physical GPUs of a node. GFD's ``nvidia.com/gpu.count`` counts only the whole GPUs under the mixed MIG
    strategy (0 when every GPU is cut), so the count is read back from the current layout: the instances the node
    advertises divided by the instances per GPU."""
    labels = node.labels or {}
    try:
        whole = int(labels.get("nvidia.com/gpu.count", "0"))
    except ValueError:
        whole = 0
    per_gpu = layouts_for(model).get(labels.get(MIG_CONFIG_LABEL, ""))
    if not per_gpu:
        return whole
    alloc = node.allocatable or {}
    counts = [int(parse_quantity(alloc.get(MIG_PREFIX + profile))) // n for profile, n in per_gpu.items() if n]
    return max([whole, *counts])


def pool_flavors(pool: NodePool, nodes: list[Node]) -> list[Flavor]:
    """The cluster's active flavors that the pool's nodes serve."""
    flavors = Flavor.objects.filter(cluster_id=pool.cluster_id, active=True)
    return [f for f in flavors if any(flavor_matches(f, n) for n in nodes)]


def pool_tenant_ids(pool: NodePool, nodes: list[Node] | None = None) -> set[int]:
    """The tenants that use a pool: quota above zero on a flavor its nodes serve."""
    flavors = pool_flavors(pool, nodes if nodes is not None else pool_nodes(pool))
    return set(Quota.objects.filter(flavor__in=flavors, project__isnull=True, nominal__gt=0)
               .values_list("tenant_id", flat=True))


def mig_pools_for(*, actor: Actor) -> list[NodePool]:
    """MIG pools the actor may propose a change for (ops: all; a tenant admin: the ones their tenant uses)."""
    pools = list(NodePool.objects.filter(sharing=NodePool.Sharing.MIG, nodes__present=True).distinct()
                 .select_related("cluster").order_by("cluster__name", "name"))
    tenants = _admin_tenant_ids(actor)
    if tenants is None:
        return pools
    mine = set(tenants)
    return [p for p in pools if pool_tenant_ids(p) & mine]


def mig_pool_get(*, actor: Actor, pk: Any) -> NodePool | None:
    return next((p for p in mig_pools_for(actor=actor) if str(p.pk) == str(pk)), None)


def cluster_nodes(cluster: Cluster) -> list[Node]:
    return list(Node.objects.filter(cluster=cluster).select_related("pool"))


def cluster_flavors(cluster: Cluster) -> list[Flavor]:
    return list(Flavor.objects.filter(cluster=cluster, active=True).order_by("order", "name"))


def cluster_quota_rows(cluster: Cluster) -> list[dict[str, Any]]:
    """Every quota row of a cluster as plain dicts (the impact's input)."""
    rows = (Quota.objects.filter(flavor__cluster=cluster)
            .values("id", "tenant_id", "tenant__slug", "project__slug", "flavor_id", "flavor__name", "resource", "nominal"))
    return [{"id": r["id"], "tenant_id": r["tenant_id"], "tenant": r["tenant__slug"], "project": r["project__slug"],
             "flavor_id": r["flavor_id"], "flavor": r["flavor__name"], "resource": r["resource"],
             "nominal": str(r["nominal"])} for r in rows]


def requests_by_id(ids: set[int]) -> list[WorkloadRequest]:
    return list(WorkloadRequest.objects.filter(pk__in=ids).select_related("project", "tenant", "requested_by", "flavor")
                .order_by("pk"))


def active_requests_on(ids: set[int]) -> list[WorkloadRequest]:
    return [r for r in requests_by_id(ids) if r.state in ACTIVE_REQUESTS]


def quota_rows_by_id(ids: list[int]) -> dict[int, Quota]:
    return {q.pk: q for q in Quota.objects.filter(pk__in=ids).select_related("tenant", "project", "flavor")}


def open_change_of(cluster: Cluster, nodes: list[str]) -> MigChange | None:
    """An unfinished change touching any of ``nodes`` (one change per node at a time)."""
    from .states import OPEN

    for change in MigChange.objects.filter(cluster=cluster, status__in=OPEN):
        if set(change.nodes) & set(nodes):
            return change
    return None


def due_changes() -> list[int]:
    """Ids the beat sweep moves on: approved ones whose window opened, and running or rolling back ones."""
    from django.utils import timezone

    from .states import ACTIVE

    S = MigChange.Status
    due = MigChange.objects.filter(status=S.APPROVED, window_start__lte=timezone.now())
    active = MigChange.objects.filter(status__in=ACTIVE)
    return sorted(set(due.values_list("pk", flat=True)) | set(active.values_list("pk", flat=True)))


def decimal(value: Any) -> Decimal:
    return Decimal(str(value))

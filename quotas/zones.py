"""Zones: what each cluster offers as a GPU-model zone, the projects' spill-over policies, and draining a cluster.

A cluster is a zone (``Cluster.zone``, its name when empty) in a failure domain (``Cluster.failure_domain``): one GPU
model's pool, as a rule. Its flavors know the card they give (``Flavor.gpu_model``, ``gpu_memory_mib``,
``compute_capability``, read off GPU Feature Discovery's node labels by ``flavor_facts_refresh`` after each inventory
sync), which the compatibility check of ``workloads/routing.py`` compares with what an image needs.

Writes here (audited): ``spill_policy_set`` (project and tenant admins) and ``cluster_drain`` / ``cluster_undrain``
(ops). A drain queues ``workloads.tasks.requests_redispatch_task`` by name: the work that has not started there moves
elsewhere once (``workloads.routing.requests_redispatch``). ``zone_fault_set`` (ops): the demo's zone fault on a
sandbox cluster, from the zones page and ``manage.py zone_fault``. Reads: ``zone_inventory`` and
``zone_fault_states`` (the ops "Zones" page). See docs/federation.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.events import after_commit, enqueue
from portal.exceptions import Invalid
from tenants.access import Actor
from tenants.audit import audit_record, snapshot
from tenants.guards import require
from tenants.models import Project
from tenants.policy import may_change_project

from . import policy
from .capacity import capacity_by_flavor
from .models import Cluster, Flavor, Node, Quota, SpillPolicy

COMPUTE_CAPABILITY = re.compile(r"^\d{1,2}\.\d$")
GPU_KINDS = (Flavor.Kind.WHOLE, Flavor.Kind.MIG, Flavor.Kind.HAMI)


# ----------------------------------------------------------------------------------------- what a card is
def node_card(labels: dict[str, str]) -> dict[str, Any]:
    """What GPU Feature Discovery says of a node's cards: memory (MiB), compute capability, driver and CUDA versions."""
    major, minor = labels.get("nvidia.com/gpu.compute.major", ""), labels.get("nvidia.com/gpu.compute.minor", "")
    try:
        memory = int(labels.get("nvidia.com/gpu.memory", "0") or 0)
    except ValueError:
        memory = 0
    return {
        "memory_mib": memory,
        "compute_capability": f"{major}.{minor}" if major.isdigit() and minor.isdigit() else "",
        "driver": labels.get("nvidia.com/cuda.driver-version.full", ""),
        "cuda": labels.get("nvidia.com/cuda.runtime-version.full", ""),
    }


def flavor_facts(flavor: Flavor, labels: dict[str, str]) -> tuple[int, str]:
    """(memory one unit of ``flavor`` gives in MiB, compute capability) on a node with ``labels``: a MIG slice's
    memory is its profile's (``1g.10gb``: 10 GiB), a HAMi share's its size, a whole GPU's the card's."""
    card = node_card(labels)
    memory = card["memory_mib"]
    if flavor.kind == Flavor.Kind.MIG and (m := re.search(r"\.(\d+)gb", flavor.mig_profile)):
        memory = int(m.group(1)) * 1024
    elif flavor.kind == Flavor.Kind.HAMI and flavor.hami_memory_mib:
        memory = flavor.hami_memory_mib
    return memory, card["compute_capability"]


def flavor_facts_refresh(cluster: Cluster) -> int:
    """Set each GPU flavor's memory and compute capability from the nodes it selects (inventory sync's rows, read
    from the cluster). Returns the number of flavors changed."""
    from .capacity import flavor_matches

    nodes = [n for n in Node.objects.filter(cluster=cluster, present=True).select_related("pool")]
    changed = []
    for flavor in Flavor.objects.filter(cluster=cluster, kind__in=GPU_KINDS):
        labels = next((n.labels or {} for n in nodes if flavor_matches(flavor, n)), None)
        if labels is None:
            continue
        facts = flavor_facts(flavor, labels)
        if (flavor.gpu_memory_mib, flavor.compute_capability) != facts:
            flavor.gpu_memory_mib, flavor.compute_capability = facts
            changed.append(flavor)
    if changed:
        Flavor.objects.bulk_update(changed, ["gpu_memory_mib", "compute_capability"])
    return len(changed)


def capability_tuple(text: str) -> tuple[int, int]:
    major, _, minor = (text or "0.0").partition(".")
    return int(major or 0), int(minor or 0)


def gpu_models() -> list[str]:
    """Every GPU model some active flavor offers (``h100-80gb``, ``a100-80gb``...), sorted."""
    return sorted({m for m in Flavor.objects.filter(active=True, kind__in=GPU_KINDS).values_list("gpu_model", flat=True) if m})


# ----------------------------------------------------------------------------------------- spill-over policy
def spill_policy_of(project: Project) -> SpillPolicy:
    """The project's policy (an unsaved "not allowed" one when none was set)."""
    return SpillPolicy.objects.filter(project=project).first() or SpillPolicy(project=project)


def spill_policy_set(*, actor: Actor, project: Project, allowed: bool, target_models: list[str] | None = None,
                     needs_approval: bool = False) -> SpillPolicy:
    """Project and tenant admins decide whether the project's work may spill over, to which models, and whether a
    spilled request waits for an approver. Audited ``project.spill_policy``."""
    require(may_change_project(actor, project), "Only the project's admins, its tenant's admins and ops set its spill-over policy.")
    targets = [str(m).strip().lower() for m in (target_models or []) if str(m).strip()]
    known = set(gpu_models())
    unknown = [m for m in targets if m not in known]
    if unknown:
        raise Invalid(f"No cluster offers {', '.join(unknown)}; known models: {', '.join(sorted(known)) or 'none'}.",
                      field="target_models")
    with transaction.atomic():
        row = SpillPolicy.objects.select_for_update().filter(project=project).first()
        before = snapshot(row, ["allowed", "target_models", "needs_approval"]) if row else None
        row = row or SpillPolicy(project=project)
        row.allowed, row.target_models, row.needs_approval = bool(allowed), list(dict.fromkeys(targets)), bool(needs_approval)
        row.save()
        audit_record(actor=actor, action="project.spill_policy", target=project, tenant=project.tenant, project=project,
                     before=before, after=snapshot(row, ["allowed", "target_models", "needs_approval"]))
    return row


# ----------------------------------------------------------------------------------------- draining a cluster
def cluster_drain(*, actor: Actor, cluster: Cluster, reason: str) -> Cluster:
    """Ops drain a cluster: nothing new is routed there, and its pending work that has not started is re-dispatched
    elsewhere (once, audited per request); running work finishes where it is. Audited ``cluster.drain``."""
    require(policy.may_manage_capacity(actor), "Only platform ops drain clusters.")
    reason = (reason or "").strip()
    if not reason:
        raise Invalid("Say why the cluster is drained: it is shown on the zones page and in the requests it moves.", field="reason")
    if len(reason) > 500:
        raise Invalid("At most 500 characters.", field="reason")
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
        before = snapshot(cluster, ["draining", "drain_reason"])
        cluster.draining, cluster.drain_reason, cluster.drained_at = True, reason, timezone.now()
        cluster.save(update_fields=["draining", "drain_reason", "drained_at"])
        audit_record(actor=actor, action="cluster.drain", target=cluster, before=before,
                     after=snapshot(cluster, ["draining", "drain_reason"]))
        after_commit(enqueue, "workloads.tasks.requests_redispatch_task", cluster.pk)
    return cluster


def cluster_undrain(*, actor: Actor, cluster: Cluster) -> Cluster:
    """Ops take a cluster back into routing. Audited ``cluster.undrain``."""
    require(policy.may_manage_capacity(actor), "Only platform ops drain clusters.")
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
        before = snapshot(cluster, ["draining", "drain_reason"])
        cluster.draining, cluster.drain_reason, cluster.drained_at = False, "", None
        cluster.save(update_fields=["draining", "drain_reason", "drained_at"])
        audit_record(actor=actor, action="cluster.undrain", target=cluster, before=before,
                     after=snapshot(cluster, ["draining", "drain_reason"]))
    return cluster


# ----------------------------------------------------------------------------------------- the zone fault (demo)
ZONE_DOWN = {"error_rate": 1.0, "error_codes": [503], "retry_after": 1}
NOT_A_SANDBOX = "only sandbox clusters have fault injection"


def zone_fault_set(*, actor: Actor, cluster: Cluster, down: bool) -> Cluster:
    """Take a sandbox zone's API down (every API call answered 503, through the sandbox's fault injection,
    sandbox/faults.py) or bring it back: the demo's zone fault (docs/federation.md), from ``manage.py zone_fault`` and
    the ops zones page alike. The status follower then marks the cluster unhealthy; after
    ``PORTAL_REDISPATCH_AFTER_SECONDS`` housekeeping moves its pending work elsewhere, once. A real cluster has no
    fault endpoint: Invalid, nothing changes. Ops only; audited ``cluster.zone_fault`` (who, which zone, when)."""
    from portal.kube import ClusterError, ClusterRejected, kube_for

    require(policy.may_manage_capacity(actor), "Only platform ops take zones down.")
    try:
        kube_for(cluster).sandbox_faults(ZONE_DOWN if down else {})
    except ClusterRejected as exc:
        raise Invalid(f"{cluster.name}: {NOT_A_SANDBOX} (it answered {exc.status}).", field="cluster") from exc
    except (ClusterError, OSError, ValueError) as exc:
        raise Invalid(f"{cluster.name}: its fault injection did not answer ({exc}); {NOT_A_SANDBOX}.",
                      field="cluster") from exc
    audit_record(actor=actor, action="cluster.zone_fault", target=cluster, after={
        "zone": cluster.zone_name, "down": bool(down), "at": timezone.now().isoformat()})
    return cluster


def zone_fault_states(clusters: list[Cluster]) -> dict[int, bool]:
    """Which clusters are sandboxes, and whether each is down now: ``{cluster id: down}``, read from each sandbox's
    fault settings (a short timeout; the control endpoint is never failed on purpose, so a zone taken down still
    answers). Real clusters (no fault endpoint) and clusters that do not answer are left out: no button for them."""
    from portal.kube import kube_for

    out: dict[int, bool] = {}
    for cluster in clusters:
        try:
            faults = kube_for(cluster).sandbox_faults_read()
        except Exception:  # a probe: any failure (no answer, a kubeconfig that does not load or decrypt) = no button
            continue
        out[cluster.pk] = float(faults.get("error_rate") or 0) >= 1.0
    return out


# ----------------------------------------------------------------------------------------- one inventory (ops)
@dataclass
class ZoneModel:
    """One GPU flavor of one zone: capacity, what is in use (the ClusterQueues' reservations as the last reconcile
    read them back) and what is promised (the tenants' nominal quotas)."""

    flavor: Flavor
    capacity: Decimal = Decimal(0)
    used: Decimal = Decimal(0)
    promised: Decimal = Decimal(0)

    @property
    def free(self) -> Decimal:
        return max(Decimal(0), self.capacity - self.used)


@dataclass
class Zone:
    cluster: Cluster
    driver: str = ""
    cuda: str = ""
    models: list[ZoneModel] = field(default_factory=list)
    fault_down: bool | None = None  # the demo's zone fault: down or up on a sandbox; None: no fault injection

    @property
    def health(self) -> str:
        if self.cluster.draining:
            return "draining"
        return self.cluster.health


def zone_inventory(*, actor: Actor) -> list[Zone]:
    """Every cluster as a zone (ops only): its GPU flavors with capacity, used and promised, its driver and CUDA
    versions (GPU Feature Discovery's labels), its health and failure domain. A fixed number of queries."""
    require(policy.may_manage_capacity(actor), "Only platform ops see every zone.")
    clusters = list(Cluster.objects.order_by("failure_domain", "zone", "name"))
    flavors = list(Flavor.objects.filter(active=True, kind__in=GPU_KINDS).select_related("cluster"))
    nodes = list(Node.objects.filter(present=True).select_related("pool"))
    quotas = list(Quota.objects.filter(flavor__in=flavors, resource__in=["nvidia.com/gpu"] + [
        r for f in flavors for r in f.resource_names[:1]]).values_list("flavor_id", "project_id", "resource", "nominal", "used"))
    out = []
    for cluster in clusters:
        mine = [f for f in flavors if f.cluster_id == cluster.pk]
        my_nodes = [n for n in nodes if n.cluster_id == cluster.pk]
        capacity = capacity_by_flavor(cluster, flavors=mine, nodes=my_nodes)
        card = next((node_card(n.labels or {}) for n in my_nodes if (n.labels or {}).get("nvidia.com/gpu.product")), {})
        zone = Zone(cluster, driver=card.get("driver", ""), cuda=card.get("cuda", ""))
        for f in mine:
            resource = f.primary_resource
            zm = ZoneModel(f, capacity=capacity.get((f.pk, resource), Decimal(0)))
            for flavor_id, project_id, res, nominal, used in quotas:
                if flavor_id == f.pk and res == resource:
                    if project_id is None:
                        zm.promised += nominal
                    else:
                        zm.used += used
            zone.models.append(zm)
        out.append(zone)
    return out

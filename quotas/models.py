"""Capacity, flavors and quotas: what exists, who is promised how much of it, and what we applied.

A ``Cluster`` runs one reference architecture (A–F). Its ``Node`` rows come from inventory sync and
are grouped into ``NodePool`` rows; each ``Flavor`` is one GPU offering (whole GPU, a MIG profile, a
HAMi share) or the CPU/memory flavor, and knows its Kubernetes resource names, node labels and
tolerations. ``Quota`` rows are per (tenant or project, flavor, resource): nominal quota, borrowing
limit and lending limit, exactly the numbers of a ClusterQueue's ``resourceGroups``. A tenant's rows
are its Kueue cohort's pool; a project's rows become its ClusterQueue. ``AppliedObject`` remembers
what the materializer last applied, so an unchanged object is not written again.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from portal.quantities import fmt
from tenants.models import DNS1123_LABEL, Project, Tenant

from . import architectures

FLAVOR_NAME = RegexValidator(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "Use lower-case letters, digits, '-' and '.' (a DNS-1123 subdomain)."
)


# The reference architectures' letters and labels come from their registry (quotas/architectures.py).
Architecture = models.TextChoices("Architecture", [(letter, (letter, label)) for letter, label in architectures.choices()])


# Cluster.topology's choices (a key of quotas.manifests.TOPOLOGY_LEVELS, "custom" for the levels ops name in
# Cluster.topology_levels, or "" for off).
CLUSTER_TOPOLOGIES = [("", "None"), ("block-rack-host", "Block, rack, host"), ("custom", "The levels named below")]
# How work reaches a cluster (docs/federation.md, "Kueue MultiKueue"): the portal routes to a standalone cluster itself;
# a MultiKueue manager's Kueue sends what the portal submits there on to its workers; a worker takes work only from its
# manager (the portal routes nothing to it directly, but provisions its projects' queues, which MultiKueue needs).
CLUSTER_ROLES = [("standalone", "Standalone (the portal routes)"), ("manager", "MultiKueue manager"),
                 ("worker", "MultiKueue worker")]


class Cluster(models.Model):
    """A Kubernetes cluster the portal drives. The kubeconfig is encrypted at rest or read from a file."""

    name = models.CharField(max_length=63, unique=True, validators=[DNS1123_LABEL])
    architecture = models.CharField(max_length=1, choices=Architecture.choices, default=Architecture.B)
    # Architecture E's data planes for training under Volcano: C or D features stay switchable.
    use_mig = models.BooleanField(default=False, help_text="Offer MIG flavors (architectures C, E, F).")
    use_hami = models.BooleanField(default=False, help_text="Offer HAMi flavors (architectures D, E, F).")
    volcano_capacity_plugin = models.BooleanField(default=False, help_text="Volcano runs the capacity plugin: write deserved/guarantee.")
    kubeconfig_encrypted = models.TextField(blank=True, help_text="Fernet-encrypted kubeconfig (see portal/crypto.py).")
    kubeconfig_path = models.CharField(max_length=500, blank=True, help_text="Or: a secret file mounted into the portal.")
    overcommit_percent = models.PositiveIntegerField(
        default=0, help_text="How far tenants' nominal quotas may exceed capacity, in percent (an ops setting)."
    )
    inventory_synced_at = models.DateTimeField(null=True, blank=True)
    inventory_error = models.TextField(blank=True)
    reconciled_at = models.DateTimeField(null=True, blank=True)
    # Written by the status follower and the reconcile: did the last contact work, and what went wrong if not.
    health = models.CharField(max_length=10, choices=[("unknown", "Unknown"), ("healthy", "Healthy"),
                                                      ("unhealthy", "Unhealthy")], default="unknown")
    last_error = models.TextField(blank=True, help_text="The last error talking to the cluster (empty when healthy).")
    last_seen_at = models.DateTimeField(null=True, blank=True, help_text="When the cluster last answered.")
    # Seen by the inventory sync: the Kueue API version the portal speaks there and the versions its Kueue serves.
    kueue_api = models.CharField(max_length=20, blank=True, help_text="Kueue API version in use (empty: no Kueue).")
    kueue_served = models.CharField(max_length=100, blank=True, help_text="Kueue API versions the cluster serves.")
    # Kueue Topology Aware Scheduling (docs/cluster-objects.md, "Topology-aware placement"): with a topology, the
    # reconcile writes a Kueue Topology (levels block, rack, hostname) and points the whole-GPU flavors at it, and
    # multi-pod training may ask to be placed within one rack or block.
    topology = models.CharField(
        max_length=20, blank=True, choices=CLUSTER_TOPOLOGIES,
        help_text="Topology-aware placement: the node labels of blocks and racks (empty: off).",
    )
    # With topology "custom": the levels, highest first, [{"name": "rack", "label": "example.com/rack"}, ...]
    # (quotas.services checks them: Kubernetes label keys, at most 8, no duplicates, the hostname only last).
    topology_levels = models.JSONField(default=list, blank=True,
                                       help_text="Topology \"custom\": its levels, highest first (name, node label).")
    # Federation (docs/federation.md): the zone this cluster is (one GPU model's pool, as a rule), the failure domain
    # it shares with other clusters (a site, a power feed: what one outage takes down together), and whether ops
    # drain it (no new work is routed here; pending work that has not started moves elsewhere once).
    zone = models.CharField(max_length=63, blank=True, help_text="Zone name (empty: the cluster's name).")
    failure_domain = models.CharField(max_length=63, blank=True, help_text="What fails together, e.g. a site or a power feed.")
    prometheus_cluster = models.CharField(
        max_length=63, blank=True,
        help_text="The value of the PROMETHEUS_CLUSTER_LABEL label on this cluster's DCGM series when one Prometheus "
                  "answers for several clusters (empty: the cluster's name).")
    role = models.CharField(max_length=12, choices=CLUSTER_ROLES, default="standalone",
                            help_text="How work reaches it: the portal's own routing, or Kueue MultiKueue.")
    manager = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="workers",
                                help_text="A MultiKueue worker's manager cluster (its MultiKueueCluster there has this "
                                          "cluster's name).")
    admission_check = models.CharField(
        max_length=63, blank=True, default="",
        help_text="A MultiKueue manager's AdmissionCheck (controllerName kueue.x-k8s.io/multikueue) that its "
                  "ClusterQueues name (empty: multikueue).")
    draining = models.BooleanField(default=False, help_text="Drained by ops: nothing new is routed here.")
    drain_reason = models.CharField(max_length=500, blank=True)
    drained_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def unhealthy(self) -> bool:
        return self.health == "unhealthy"

    @property
    def zone_name(self) -> str:
        return self.zone or self.name

    @property
    def prometheus_cluster_value(self) -> str:
        """What this cluster's series carry in ``settings.PROMETHEUS_CLUSTER_LABEL`` (docs/measured-use.md)."""
        return self.prometheus_cluster or self.name

    @property
    def multikueue_check(self) -> str:
        """The AdmissionCheck a MultiKueue manager's ClusterQueues name ("" on other clusters)."""
        return (self.admission_check or "multikueue") if self.role == "manager" else ""

    @property
    def routable(self) -> bool:
        """New work may be routed here: neither unhealthy nor drained (workloads/routing.py)."""
        return not (self.unhealthy or self.draining)

    def health_record(self, error: str = "") -> None:
        """Record how the last contact went (the status follower each cycle, the reconcile each run):
        no ``error``: healthy and seen now; else unhealthy with the error (``last_seen_at`` stays)."""
        from django.utils import timezone

        now = timezone.now()
        if error:
            if self.health == "unhealthy" and self.last_error == error[:2000]:
                return  # nothing new: no write per follower cycle
            values: dict = {"health": "unhealthy", "last_error": error[:2000]}
        else:
            if self.health == "healthy" and self.last_seen_at and (now - self.last_seen_at).total_seconds() < 60:
                return
            values = {"health": "healthy", "last_error": "", "last_seen_at": now}
        Cluster.objects.filter(pk=self.pk).update(**values)
        for name, value in values.items():
            setattr(self, name, value)


class NodePool(models.Model):
    """Nodes that offer the same thing: one GPU model, one sharing mode, one pool label."""

    class Sharing(models.TextChoices):
        WHOLE = "whole", "Whole GPUs"
        MIG = "mig", "MIG slices"
        HAMI = "hami", "HAMi shared vGPU"
        NONE = "none", "No GPUs"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pools")
    name = models.CharField(max_length=100)
    gpu_product = models.CharField(max_length=100, blank=True)
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    sharing = models.CharField(max_length=8, choices=Sharing.choices, default=Sharing.WHOLE)
    mig_config = models.CharField(max_length=60, blank=True)
    pool_label = models.CharField(max_length=30, blank=True, help_text="online / offline (architecture F).")

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="pool_name_unique_in_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name}"


class Node(models.Model):
    """A node as inventory sync last saw it. Vanished or NotReady nodes stay visible, flagged."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    pool = models.ForeignKey(NodePool, on_delete=models.SET_NULL, null=True, related_name="nodes")
    name = models.CharField(max_length=253)
    ready = models.BooleanField(default=True)
    present = models.BooleanField(default=True, help_text="False once the node disappeared from the cluster.")
    labels = models.JSONField(default=dict)
    allocatable = models.JSONField(default=dict)
    mig_config_state = models.CharField(max_length=20, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The health view (docs/measured-use.md, "Health"): as inventory sync last read them, and the reason ops gave
    # when they cordoned the node from the portal (kept while it stays cordoned).
    conditions = models.JSONField(default=list, blank=True, help_text="status.conditions: type, status, reason, message.")
    unschedulable = models.BooleanField(default=False, help_text="spec.unschedulable (cordoned).")
    cordon_reason = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="node_name_unique_in_cluster")]

    def __str__(self) -> str:
        return self.name

    @property
    def counts_capacity(self) -> bool:
        """Only ready, present nodes count; a MIG node only while its layout change succeeded."""
        if not (self.ready and self.present):
            return False
        return self.mig_config_state in ("", "success")


def gib_words(mib: int | Decimal) -> str:
    """MiB (HAMi's ``gpumem`` unit) as GiB for people: ``11264`` -> ``11``, ``92136`` -> ``90``, ``1536`` -> ``1.5``."""
    return f"{(Decimal(mib) / 1024).quantize(Decimal('0.1')).normalize():f}"


def share_words(memory_mib: int, cores_percent: int) -> str:
    """A HAMi share as people say it: ``11 GiB, 25 % of the cores``."""
    return f"{gib_words(memory_mib)} GiB, {cores_percent} % of the cores"


# Letters whose name starts with a vowel sound: "an L40S", "an H100", "an A100", but "a T4", "a B200".
_AN_LETTERS = set("AEFHILMNORSX")


def card_words(flavor: Any) -> str:
    """The card behind a GPU flavor for people, with its article: ``an L40S`` (its ``gpu_model``, else its
    ``gpu_product``), ``a card`` when neither is known."""
    name = (getattr(flavor, "gpu_model", "") or getattr(flavor, "gpu_product", "") or "").strip()
    if not name:
        return "a card"
    name = name.upper() if getattr(flavor, "gpu_model", "") else name
    return f"{'an' if name[0].upper() in _AN_LETTERS else 'a'} {name}"


def share_of_card_words(memory_mib: int, cores_percent: int, flavor: Any) -> str:
    """A HAMi share with its card: ``10 GiB, 25 % of an L40S``."""
    return f"{gib_words(memory_mib)} GiB, {cores_percent} % of {card_words(flavor)}"


class Flavor(models.Model):
    """One GPU offering (or the CPU/memory flavor); a Kueue ResourceFlavor of the same name."""

    class Kind(models.TextChoices):
        WHOLE = "whole", "Whole GPU"
        MIG = "mig", "MIG slice"
        HAMI = "hami", "HAMi shared vGPU"
        CPU = "cpu", "CPU and memory"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="flavors")
    name = models.CharField(max_length=63, validators=[FLAVOR_NAME])
    display_name = models.CharField(max_length=100, blank=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    gpu_product = models.CharField(max_length=100, blank=True, help_text="nvidia.com/gpu.product of the nodes.")
    gpu_model = models.CharField(max_length=40, blank=True, help_text="Short model key, e.g. a100-80gb, for the MIG profile table.")
    mig_profile = models.CharField(max_length=20, blank=True, help_text="e.g. 1g.10gb")
    # What an image needs of the card (workloads/routing.py: the compatibility check), from GPU Feature Discovery's
    # node labels at inventory sync (quotas/zones.py: flavor_facts_refresh); 0 / empty: not known.
    gpu_memory_mib = models.PositiveIntegerField(default=0, help_text="Memory of one card (MiB), nvidia.com/gpu.memory.")
    compute_capability = models.CharField(max_length=8, blank=True, help_text="CUDA compute capability, e.g. 9.0.")
    hami_memory_mib = models.PositiveIntegerField(default=0, help_text="HAMi: memory per vGPU (MiB).")
    hami_cores_percent = models.PositiveIntegerField(default=0, help_text="HAMi: compute per vGPU (% of a card).")
    pool_label = models.CharField(max_length=30, blank=True, help_text="online / offline: architecture F pool.")
    node_labels = models.JSONField(default=dict, blank=True)
    taints = models.JSONField(default=list, blank=True)
    tolerations = models.JSONField(default=list, blank=True)
    order = models.PositiveIntegerField(default=100, help_text="Kueue tries flavors in this order.")
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["cluster", "order", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="flavor_name_unique_in_cluster")]

    def __str__(self) -> str:
        return self.display_name or self.name

    @property
    def resource_names(self) -> list[str]:
        """The Kubernetes resources this flavor's quota covers, in ClusterQueue order."""
        if self.kind == self.Kind.WHOLE:
            return ["nvidia.com/gpu"]
        if self.kind == self.Kind.MIG:
            return [f"nvidia.com/mig-{self.mig_profile}"]
        if self.kind == self.Kind.HAMI:
            # Kueue sees HAMi through resource transformations (docs/cluster-objects.md, "HAMi").
            return ["nvidia.com/gpu", "nvidia.com/total-gpucores", "nvidia.com/total-gpumem"]
        return ["cpu", "memory"]

    @property
    def primary_resource(self) -> str:
        return self.resource_names[0]

    @property
    def hami_sized(self) -> bool:
        """A HAMi flavor is usable only with its share size set (what each vGPU gets: memory and cores)."""
        return self.kind != self.Kind.HAMI or bool(self.hami_memory_mib and self.hami_cores_percent)

    @property
    def share(self) -> str:
        """A HAMi flavor's share as people say it ("11 GiB, 25 % of the cores"); "" for other kinds or unsized."""
        if self.kind != self.Kind.HAMI or not self.hami_sized:
            return ""
        return share_words(self.hami_memory_mib, self.hami_cores_percent)

    @property
    def offered_label(self) -> str:
        """The name researchers pick it by: with its share for HAMi ("L40S shared (HAMi) · 11 GiB, 25 % of the cores")."""
        return f"{self} · {self.share}" if self.share else str(self)


class Quota(models.Model):
    """Nominal quota, borrowing and lending limits for one (tenant or project, flavor, resource).

    Tenant rows (project null) bound the sum of their projects' nominal quotas and form the
    tenant's cohort; project rows become the project's ClusterQueue. ``None`` limits mean "no limit".
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="quotas")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="quotas")
    resource = models.CharField(max_length=100)
    nominal = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0), validators=[MinValueValidator(0)])
    borrowing_limit = models.DecimalField(max_digits=14, decimal_places=3, null=True, blank=True, validators=[MinValueValidator(0)])
    lending_limit = models.DecimalField(max_digits=14, decimal_places=3, null=True, blank=True, validators=[MinValueValidator(0)])
    # Read back from the cluster (ClusterQueue status) by the reconcile task.
    used = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0))
    borrowed = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0))
    usage_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "project", "flavor__order", "resource"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "flavor", "resource"], condition=Q(project__isnull=True), name="one_tenant_quota_per_resource"
            ),
            models.UniqueConstraint(fields=["project", "flavor", "resource"], name="one_project_quota_per_resource"),
            models.CheckConstraint(condition=Q(nominal__gte=0), name="quota_nominal_not_negative"),
        ]

    def __str__(self) -> str:
        owner = self.project.slug if self.project_id else self.tenant.slug
        return f"{owner} {self.flavor.name} {self.resource}={self.nominal}"


class QuotaRequest(models.Model):
    """A member asks for more quota for a while; an approver with the headroom decides."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        CANCELLED = "cancelled", "Cancelled"
        REVERTED = "reverted", "Ended (reverted)"

    class Approver(models.TextChoices):
        PROJECT_ADMIN = "project_admin", "Project admin"
        TENANT_ADMIN = "tenant_admin", "Tenant admin"
        OPS = "ops", "Platform ops"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="quota_requests")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    resource = models.CharField(max_length=100)
    amount = models.DecimalField(max_digits=14, decimal_places=3, validators=[MinValueValidator(Decimal("0.001"))])
    # A HAMi flavor's request is in shares: ``amount`` shares of this size (the flavor's preset when asked, or one
    # within bounds); approval raises the flavor's three rows together (``share_rows``). 0 for other kinds.
    share_memory_mib = models.PositiveIntegerField(default=0, help_text="HAMi: GPU memory per share (MiB).")
    share_cores_percent = models.PositiveIntegerField(default=0, help_text="HAMi: GPU cores per share (% of a card).")
    until = models.DateTimeField(null=True, blank=True, help_text="When the extra quota ends; empty = permanent.")
    reason = models.TextField(max_length=2000)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    approver = models.CharField(max_length=16, choices=Approver.choices, help_text="Who owns the headroom, when asked.")
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, max_length=2000)
    # What approval changed, so the revert undoes exactly that.
    applied = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When its approvers were last reminded that it waits (``workloads.approvals.approvals_remind``).
    reminded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        # The lists' order, newest first: read backwards from the index and stopped at a page, not sorted whole.
        indexes = [models.Index(fields=["created_at", "id"], name="quota_request_created")]

    def __str__(self) -> str:
        return f"+{self.amount} {self.resource} ({self.flavor.name}) for {self.project.slug}"

    @property
    def is_share(self) -> bool:
        """A HAMi request in shares (one request for the flavor's vGPU slots, cores and memory)."""
        return bool(self.share_memory_mib and self.share_cores_percent)

    @property
    def share_size(self) -> str:
        """``11 GiB, 25 % of the cores``; "" when not a share request."""
        return share_words(self.share_memory_mib, self.share_cores_percent) if self.is_share else ""

    def share_rows(self) -> list[tuple[str, Decimal]]:
        """The quota rows this request raises and by how much: for shares, vGPU slots, the cores (% of a card) and
        the memory (MiB) of that many shares, in the flavor's resource order; else its one (resource, amount)."""
        if not self.is_share:
            return [(self.resource, self.amount)]
        return [("nvidia.com/gpu", self.amount), ("nvidia.com/total-gpucores", self.amount * self.share_cores_percent),
                ("nvidia.com/total-gpumem", self.amount * self.share_memory_mib)]

    @property
    def share_totals(self) -> str:
        """What that many shares add up to: ``44 GiB of GPU memory and 100 % of a card's cores``."""
        if not self.is_share:
            return ""
        return (f"{gib_words(self.amount * self.share_memory_mib)} GiB of GPU memory and "
                f"{fmt(self.amount * self.share_cores_percent)} % of a card's cores")

    @property
    def what(self) -> str:
        """What is asked, for people: ``+4 shares of L40S shared (HAMi) · 11 GiB, 25 % of the cores`` or
        ``+6 nvidia.com/gpu (h100-80gb)``."""
        if self.is_share:
            return f"+{fmt(self.amount)} share{'' if self.amount == 1 else 's'} of {self.flavor} · {self.share_size}"
        return f"+{fmt(self.amount)} {self.resource} ({self.flavor.name})"


class AppliedObject(models.Model):
    """What the materializer last applied for one cluster object, for idempotency and drift repair."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="applied")
    api_version = models.CharField(max_length=100)
    kind = models.CharField(max_length=60)
    namespace = models.CharField(max_length=63, blank=True)
    name = models.CharField(max_length=253)
    tenant = models.ForeignKey(Tenant, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    hash = models.CharField(max_length=64, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    error_at = models.DateTimeField(null=True, blank=True)
    # ClusterQueues and Cohorts only: when a reconcile last found the object on the cluster as the portal
    # wants it (or wrote it successfully), and the nominal quota the cluster holds ({flavor: {resource:
    # "6"}}, our units), so the quota pages can say "confirmed at" and flag drift (reconcile.queues_confirm).
    confirmed_at = models.DateTimeField(null=True, blank=True)
    live_quota = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["cluster", "kind", "namespace", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "api_version", "kind", "namespace", "name"], name="applied_object_unique"),
        ]

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


class ArchitectureChange(models.Model):
    """Ops applying a reviewed plan to a cluster, maybe switching its reference architecture. Started by
    ``quotas.architecture.architecture_change_start``, applied by a Celery task under the cluster's
    reconcile lock; its state moves only through ``quotas/architecture_states.py``."""

    class State(models.TextChoices):
        REQUESTED = "requested", "Requested"
        APPLYING = "applying", "Applying"
        APPLIED = "applied", "Applied"
        FAILED = "failed", "Failed"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="architecture_changes")
    from_architecture = models.CharField(max_length=1, choices=Architecture.choices)
    to_architecture = models.CharField(max_length=1, choices=Architecture.choices)
    fingerprint = models.CharField(max_length=64, help_text="The plan the person reviewed (a sha256 of what it writes).")
    state = models.CharField(max_length=10, choices=State.choices, default=State.REQUESTED)
    state_reason = models.TextField(blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    # What the apply did: {"applied": n, "deleted": n, "skipped": n, "failed": [[object, error], ...]}.
    result = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.cluster} {self.from_architecture} → {self.to_architecture} ({self.state})"


class SpillPolicy(models.Model):
    """Whether a project's work may spill over to another GPU model when its own model's zone is full, to which
    models, and whether a spilled request waits for an approver. Set by the project's admins and tenant admins
    (``quotas.zones.spill_policy_set``); no row: spill-over is not allowed (docs/federation.md)."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="spill_policy")
    allowed = models.BooleanField(default=False, help_text="Work may spill over to another GPU model (with the job's consent).")
    target_models = models.JSONField(default=list, blank=True, help_text="GPU models it may spill to (empty: any).")
    needs_approval = models.BooleanField(default=False, help_text="A request that spills waits for an approver.")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"spill policy of {self.project}"

    def admits(self, model: str) -> bool:
        return self.allowed and (not self.target_models or model in self.target_models)

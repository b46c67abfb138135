"""The service catalogue and the requests researchers and CI pipelines make from it.

``ServiceTemplate`` rows are versioned: a request keeps pointing at the version it was made from.
``WorkloadRequest`` is one notebook, training job or inference service; its ``state`` moves only
through ``workloads/states.py``. ``RequestEvent`` is its timeline.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from guardian.models import UserObjectPermissionBase

from quotas.models import Cluster, Flavor, share_of_card_words
from tenants.models import ApiToken, DNS1123_LABEL, Project, Tenant

from . import kinds


# The template kinds' values and labels come from their registry (workloads/kinds/).
TemplateKind = models.TextChoices("TemplateKind", [(name.upper(), (name, label)) for name, label in kinds.choices()])


class Image(models.Model):
    """A curated container image. Requests may only use listed images unless the project allows custom ones."""

    name = models.CharField(max_length=100)
    reference = models.CharField(max_length=300, help_text="registry/repo:tag or registry/repo@sha256:digest")
    description = models.TextField(blank=True)
    kinds = models.JSONField(default=list, help_text="Template kinds that may use it, e.g. ['notebook', 'training'].")
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["reference"], name="image_reference_unique")]

    def __str__(self) -> str:
        return f"{self.name} ({self.reference})"


class ServiceTemplate(models.Model):
    """A versioned template: what it renders, its limits, and its parameters as a JSON Schema."""

    kind = models.CharField(max_length=10, choices=TemplateKind.choices)
    slug = models.CharField(max_length=50, validators=[DNS1123_LABEL])
    version = models.PositiveIntegerField(default=1)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    parameters_schema = models.JSONField(default=dict, help_text="JSON Schema of the parameters; the form is generated from it.")
    allowed_flavors = models.ManyToManyField(Flavor, related_name="templates", blank=True)
    default_gpus = models.PositiveIntegerField(default=1)
    max_gpus = models.PositiveIntegerField(default=8)
    default_cpu = models.DecimalField(max_digits=6, decimal_places=2, default=4)
    max_cpu = models.DecimalField(max_digits=6, decimal_places=2, default=64)
    default_memory_gib = models.PositiveIntegerField(default=32)
    max_memory_gib = models.PositiveIntegerField(default=512)
    max_duration_hours = models.PositiveIntegerField(default=24)
    idle_timeout_minutes = models.PositiveIntegerField(null=True, blank=True, help_text="Notebooks: stop after this long idle.")
    idle_gpu_percent = models.FloatField(null=True, blank=True, help_text=(
        "Measured GPU utilisation below which a running request counts as idle (empty: MEASURED_IDLE_PERCENT)."))
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kind", "slug", "-version"]
        constraints = [models.UniqueConstraint(fields=["slug", "version"], name="template_version_unique")]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


# Priorities nobody gets without an approver's decision (see ApprovalRule and services.approval_decide).
APPROVER_ONLY_PRIORITIES = frozenset({"production"})


def default_self_service_priorities() -> list[str]:
    """The default of both role lists of an ApprovalRule: everything but production."""
    return ["interactive", "batch"]


class ApprovalRule(models.Model):
    """When a request is approved without a human. Most specific rule wins: project+template, project, template, global."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="approval_rules")
    template_slug = models.CharField(max_length=50, blank=True, help_text="Empty: every template.")
    auto_approve_max_gpus = models.PositiveIntegerField(default=0, help_text="Auto-approve up to this many GPUs…")
    auto_approve_max_hours = models.PositiveIntegerField(default=0, help_text="…and up to this many hours.")
    require_admin_for_inference = models.BooleanField(default=True)
    # Which priorities each role gets without an approver's decision (within the limits above for members).
    # ``production`` is never in them: it preempts other people's work, so an approver always decides.
    member_priorities = models.JSONField(
        default=default_self_service_priorities,
        help_text="Priorities members' (and API tokens') requests may be approved with automatically.",
    )
    admin_priorities = models.JSONField(
        default=default_self_service_priorities,
        help_text="Priorities approvers' own requests (project/tenant admins, ops) are approved with on submission.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project", "template_slug"]
        constraints = [
            models.UniqueConstraint(fields=["project", "template_slug"], name="one_rule_per_scope"),
            models.UniqueConstraint(fields=["template_slug"], condition=Q(project__isnull=True), name="one_global_rule_per_template"),
        ]

    def __str__(self) -> str:
        return f"rule {self.project or 'all projects'} / {self.template_slug or 'all templates'}"


class RequestState(models.TextChoices):
    SUBMITTED = "submitted", "Submitted"
    PENDING_APPROVAL = "pending_approval", "Pending approval"
    APPROVED = "approved", "Approved"
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    STOPPED = "stopped", "Stopped"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"
    EXPIRED = "expired", "Expired"
    PREEMPTED = "preempted", "Preempted (requeued)"


class Priority(models.TextChoices):
    INTERACTIVE = "interactive", "Interactive"
    BATCH = "batch", "Batch"
    PRODUCTION = "production", "Production"


# The states in which a request's name is taken (every state but the final ones, ``states.FINAL``).
LIVE_STATES = ["submitted", "pending_approval", "approved", "queued", "running", "preempted"]


# A request's placement choices (WorkloadRequest.topology; the API names them RequestTopologyEnum).
REQUEST_TOPOLOGIES = [("", "Anywhere"), ("rack", "Within one rack"), ("block", "Within one block"),
                      ("prefer-rack", "Prefer one rack"), ("nvlink", "Within one NVLink domain"),
                      ("prefer-nvlink", "Prefer one NVLink domain")]


class WorkloadRequest(models.Model):
    """One notebook, training job or inference service, from submission to its end."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="requests")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="requests")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="requests")
    template = models.ForeignKey(ServiceTemplate, on_delete=models.PROTECT, related_name="requests")
    name = models.CharField(max_length=40, validators=[DNS1123_LABEL], help_text="Short name, unique in the project while active.")
    image = models.CharField(max_length=300)
    flavor = models.ForeignKey(Flavor, on_delete=models.PROTECT, related_name="requests")
    gpus = models.PositiveIntegerField(default=1, help_text="GPUs (or slices / vGPUs) per replica or worker.")
    replicas = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(64)], help_text="Inference replicas or training workers.")
    cpu = models.DecimalField(max_digits=6, decimal_places=2, default=4)
    memory_gib = models.PositiveIntegerField(default=32)
    # A HAMi flavor's share of a card per vGPU, as submitted (the flavor's preset, or a size of the requester's own):
    # what the pod asks as nvidia.com/gpumem (MiB) and nvidia.com/gpucores. 0 for other kinds.
    share_memory_mib = models.PositiveIntegerField(default=0, help_text="HAMi: GPU memory per vGPU (MiB).")
    share_cores_percent = models.PositiveIntegerField(default=0, help_text="HAMi: % of a card's cores per vGPU.")
    parameters = models.JSONField(default=dict)
    duration_hours = models.PositiveIntegerField(default=8)
    priority = models.CharField(max_length=12, choices=Priority.choices, default=Priority.BATCH)
    state = models.CharField(max_length=20, choices=RequestState.choices, default=RequestState.SUBMITTED, db_index=True)
    state_reason = models.CharField(max_length=500, blank=True)
    # The approver's words on approving or rejecting (a rejection always has them): the requester sees them.
    decision_comment = models.TextField(max_length=1000, blank=True, default="")
    pending_reason = models.CharField(max_length=500, blank=True, help_text="Plain answer to 'why is it still pending?'.")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    token = models.ForeignKey(ApiToken, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    idempotency_key = models.CharField(max_length=200, blank=True)
    # sha256 of the submission's canonical JSON (services._submission_fingerprint): a retry with the key
    # must send the same body. Empty on rows made before it was recorded (only project/template compared).
    idempotency_fingerprint = models.CharField(max_length=64, blank=True, default="")
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    admitted_at = models.DateTimeField(null=True, blank=True, help_text="When the cluster admitted its current run (Kueue Admitted, or the Volcano gang assembled).")
    # The first admission since the (last) approval: kept across preemptions, so that queue-wait metrics count a
    # request once (docs/insights.md, "Queue wait"); a restart (a new approval) clears it with ``admitted_at``.
    first_admitted_at = models.DateTimeField(null=True, blank=True, help_text="When the cluster first admitted it since its approval (kept across preemptions).")
    started_at = models.DateTimeField(null=True, blank=True)
    # Set by insights' idle detection when its measured GPU use stayed below the template's threshold (one idle
    # episode: flagged, and the requester told, once); cleared when the use rises again.
    measured_idle_since = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_active_at = models.DateTimeField(null=True, blank=True, help_text="Notebooks: last activity seen.")
    # What the cluster said last (conditions, phases), for the detail page and why-pending.
    cluster_status = models.JSONField(default=dict, blank=True)
    applied_hash = models.CharField(max_length=64, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # When a materializer claimed the request (workloads/materialize.py): others leave it alone until the
    # claim is older than the lease; cleared when it is recorded queued or released after an outage.
    claimed_at = models.DateTimeField(null=True, blank=True)
    # When the approvers were last reminded that it waits (``workloads.approvals.approvals_remind``).
    approval_reminded_at = models.DateTimeField(null=True, blank=True)
    seeded = models.BooleanField(default=False, help_text="Demo history written by seed_demo, not real use.")
    # The UID of its current Kueue Workload, as the status follower last read it: Kueue names a preemptor only by
    # its Workload UID ("Preempted to accommodate a workload (UID: ...)"), so a reclaim links to the lender by it.
    workload_uid = models.CharField(max_length=64, blank=True, default="", db_index=True,
                                    help_text="UID of its current Kueue Workload (empty: none seen).")
    # Federation (workloads/routing.py, docs/federation.md). What the job declares: the GPU models it accepts in order of
    # preference, what its image needs of a card, and whether it consents to run on another model than its first.
    accepted_models = models.JSONField(default=list, blank=True, help_text="GPU models it accepts, preferred first.")
    min_gpu_memory_gib = models.PositiveIntegerField(null=True, blank=True, help_text="Memory per card the image needs.")
    min_compute_capability = models.CharField(max_length=8, blank=True, default="", help_text="CUDA compute capability the image needs.")
    spill_consent = models.BooleanField(default=False, help_text="May run on another GPU model than its first choice.")
    # What routing decided (``cluster`` and ``flavor`` say where it runs): whether it spilled, from which model, and why.
    spilled = models.BooleanField(default=False)
    spilled_from_model = models.CharField(max_length=40, blank=True, default="")
    route_reason = models.CharField(max_length=500, blank=True, default="")
    # Kueue's flavor fungibility inside its cluster (docs/federation.md, "Inside one cluster: Kueue chooses"): the
    # flavors of its ClusterQueue Kueue may choose between, in the queue's order, its own first, each as
    # ``{"name", "model", "node_labels", "tolerations"}`` (its pods allow each one's nodes). Empty: pinned to ``flavor``.
    # The status follower sets ``flavor`` to the one Kueue admitted it on.
    kueue_flavors = models.JSONField(default=list, blank=True,
                                     help_text="Flavors of its cluster Kueue may choose between (empty: pinned to its flavor).")
    # A spill's source at routing time (``routing.source_wait_estimate``): the workloads waiting in its first model's
    # zones, and the estimated wait there, from what runs and waits there and their time limits (the queue wait
    # saved by spilling is that estimate less the wait it had on the target; insights "spill-over").
    spill_source_pending = models.PositiveIntegerField(null=True, blank=True)
    spill_source_wait_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Moved off a drained or unhealthy cluster before it started (at most once); its objects there are removed when
    # that cluster answers (``leftovers_removed_at``).
    redispatched_from = models.ForeignKey(Cluster, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    leftovers_removed_at = models.DateTimeField(null=True, blank=True)
    # Topology-aware placement (docs/cluster-objects.md, "Topology-aware placement"): multi-pod training on a
    # flavor of a cluster with a topology may ask for all its pods within one rack or block (Kueue TAS).
    topology = models.CharField(
        max_length=20, blank=True, default="", choices=REQUEST_TOPOLOGIES,
        help_text="Placement of its pods (multi-pod training on a topology-aware flavor).",
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["requested_by", "idempotency_key"], condition=~Q(idempotency_key=""), name="idempotency_key_unique_per_user"
            ),
            # A name is unique in its project among the requests that are not over (states.FINAL's complement;
            # tests/workloads/test_names.py checks the two lists agree). The database decides under concurrency.
            models.UniqueConstraint(
                fields=["project", "name"], condition=Q(state__in=LIVE_STATES), name="request_name_unique_while_live"
            ),
        ]
        indexes = [
            models.Index(fields=["project", "state"]), models.Index(fields=["cluster", "state"]),
            # The lists' order and cursor (newest first, ties by id): everyone's (ops), a project's (a token, the
            # project filter), a tenant's, a requester's (?mine) and a state's, each read backwards from the cursor.
            models.Index(fields=["created_at", "id"], name="request_created"),
            models.Index(fields=["project", "created_at", "id"], name="request_project_created"),
            models.Index(fields=["tenant", "created_at", "id"], name="request_tenant_created"),
            models.Index(fields=["requested_by", "created_at", "id"], name="request_requester_created"),
            models.Index(fields=["state", "created_at", "id"], name="request_state_created"),
            # The acceptance metrics read requests by approval time (insights: queue wait, success rate).
            models.Index(fields=["approved_at"], name="request_approved"),
        ]
        # Shared with a named colleague (``RequestShare``): ``view_workloadrequest`` (Django's own) to see it,
        # ``operate_workloadrequest`` also to read its logs and open its notebook.
        permissions = [("operate_workloadrequest", "Read the logs and open the notebook of a shared request")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name} ({self.state})"

    @property
    def k8s_name(self) -> str:
        """Cluster object names derive from our key, so a retry can never create a second copy."""
        return f"req-{self.pk}"

    @property
    def hami_share(self) -> tuple[int, int]:
        """A HAMi request's share per vGPU as (GPU memory MiB, % of a card's cores): the size it was submitted
        with, else (rows from before sizes were recorded) the flavor's preset; (0, 0) for other kinds."""
        if self.flavor.kind != Flavor.Kind.HAMI:
            return 0, 0
        return (self.share_memory_mib or self.flavor.hami_memory_mib,
                self.share_cores_percent or self.flavor.hami_cores_percent)

    @property
    def share(self) -> str:
        """The HAMi share as people say it, ``10 GiB, 25 % of an L40S``; "" for other kinds."""
        memory_mib, cores_percent = self.hami_share
        return share_of_card_words(memory_mib, cores_percent, self.flavor) if memory_mib and cores_percent else ""

    @property
    def share_is_preset(self) -> bool:
        """A HAMi request with its flavor's preset share (not a size of the requester's own)."""
        return bool(self.share) and self.hami_share == (self.flavor.hami_memory_mib, self.flavor.hami_cores_percent)


class RequestEvent(models.Model):
    """One step of a request's timeline: a state change or a notable cluster event."""

    request = models.ForeignKey(WorkloadRequest, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20, blank=True)
    actor_label = models.CharField(max_length=200)
    message = models.CharField(max_length=1000)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.from_state}→{self.to_state} {self.message}"


class Reclaim(models.Model):
    """A borrower's eviction to give a lender back quota it lent to the cohort (Kueue: "Preempted to accommodate a
    workload (UID: <lender's Workload>) due to reclamation within the cohort").

    Written by the status follower when it moves the borrower to ``preempted``; the lender (the request whose
    Workload has the preemptor's UID) is linked as soon as the follower has seen that Workload, with when the
    lender's run started waiting (``queued_at`` then) and, once seen, when it was admitted. Reclaim latency
    (docs/insights.md) is read from these rows."""

    borrower = models.ForeignKey(WorkloadRequest, on_delete=models.CASCADE, related_name="reclaims_suffered")
    evicted_at = models.DateTimeField(db_index=True, help_text="When the follower saw the borrower evicted.")
    preemptor_uid = models.CharField(max_length=64, db_index=True, help_text="The lender's Workload UID (Kueue's message).")
    lender = models.ForeignKey(WorkloadRequest, on_delete=models.CASCADE, null=True, blank=True, related_name="reclaims")
    lender_queued_at = models.DateTimeField(null=True, blank=True, help_text="When the lender's run started waiting.")
    lender_admitted_at = models.DateTimeField(null=True, blank=True, help_text="When the lender's run was admitted.")
    seeded = models.BooleanField(default=False, help_text="Demo history written by seed_demo, not real use.")

    class Meta:
        ordering = ["evicted_at", "id"]
        indexes = [models.Index(fields=["lender_queued_at"], name="reclaim_lender_queued")]

    def __str__(self) -> str:
        return f"{self.borrower_id} evicted for {self.preemptor_uid} at {self.evicted_at:%H:%M:%S}"


class Volume(models.Model):
    """A PersistentVolumeClaim in a project's namespace that requests may mount, and whose it is.

    ``owner`` set: the user's own (a notebook's home volume is its requester's); empty: shared by the project
    (registered by a project admin). A request may mount only its requester's own volumes and the project's
    shared ones (``services.request_submit``, ``parameters.data_volume``).
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="volumes")
    name = models.CharField(max_length=253, help_text="The PersistentVolumeClaim's name in the project's namespace.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="+",
                              help_text="Empty: shared by the whole project.")
    request = models.ForeignKey(WorkloadRequest, on_delete=models.SET_NULL, null=True, blank=True, related_name="volumes",
                                help_text="The notebook whose home volume it is.")
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="volume_name_unique_per_project")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"

    @property
    def shared(self) -> bool:
        return self.owner_id is None


class ExtensionRequest(models.Model):
    """The requester asks the approvers for more than the approval rule grants by itself: more hours
    (``hours``), or, for an inference service, more replicas (``replicas``, the number asked for; ``hours``
    is 0 then).

    Its ``status`` moves only through ``workloads/extension_states.py``; approving extends or scales the
    request (``workloads/extensions.py``). At most one of each kind is pending per request.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        CANCELLED = "cancelled", "Cancelled"
        LAPSED = "lapsed", "Lapsed"  # the request ended before anyone decided

    request = models.ForeignKey(WorkloadRequest, on_delete=models.CASCADE, related_name="extension_requests")
    hours = models.PositiveIntegerField(default=0, help_text="More hours asked for (0: a scale request).")
    # A scale request: the replicas the service should have (null: an extension by ``hours``).
    replicas = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    reason = models.TextField(max_length=2000)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(max_length=1000, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    reminded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["request"], condition=Q(status="pending", replicas__isnull=True),
                                    name="one_pending_extension_per_request"),
            models.UniqueConstraint(fields=["request"], condition=Q(status="pending", replicas__isnull=False),
                                    name="one_pending_scale_request_per_request"),
            models.CheckConstraint(condition=Q(replicas__isnull=True, hours__gte=1) | Q(replicas__gte=1, hours=0),
                                   name="extension_request_hours_or_replicas"),
        ]

    def __str__(self) -> str:
        return f"{self.short} for {self.request_id} ({self.status})"

    @property
    def is_scale(self) -> bool:
        return self.replicas is not None

    @property
    def asked(self) -> str:
        """What is asked for, in words: "4 more hours", "scaling to 3 replicas"."""
        return f"scaling to {self.replicas} replicas" if self.is_scale else f"{self.hours} more hours"

    @property
    def short(self) -> str:
        """For a subject line: "+4 h", "to 3 replicas"."""
        return f"to {self.replicas} replicas" if self.is_scale else f"+{self.hours} h"


class RequestPreset(models.Model):
    """A user's saved new-request form values under a name, for one project and one template (by slug: a preset
    follows the template's live version). Only its owner sees it, and only while they see the project."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="request_presets")
    template_slug = models.CharField(max_length=50, validators=[DNS1123_LABEL])
    name = models.CharField(max_length=60)
    # What the form would submit, without the request's own name: flavor (name), image, gpus, replicas, cpu
    # (text), memory_gib, duration_hours, priority, parameters. Missing keys take the template's defaults.
    values = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "project", "name"], name="request_preset_name_unique")]

    def __str__(self) -> str:
        return f"{self.name} ({self.template_slug} in {self.project.slug})"


class RequestShare(UserObjectPermissionBase):
    """One request shared with one named colleague of its tenant: django-guardian's per-object permission with a
    direct foreign key (an integer column, indexed, unlike guardian's generic text-keyed table), written by
    ``workloads.sharing`` and read by the same predicates and selectors as roles (docs/security.md, "Sharing one
    request")."""

    content_object = models.ForeignKey(WorkloadRequest, on_delete=models.CASCADE, related_name="shares")
    shared_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)


class InferenceKey(models.Model):
    """An API key of one inference service (docs/inference.md): clients send it as ``Authorization: Bearer <key>`` to
    the service's route or the portal's proxy. Only its SHA-256 is kept (the key is shown once, when made); a
    revoked key stays for the record. Written by ``workloads.endpoints``."""

    request = models.ForeignKey(WorkloadRequest, on_delete=models.CASCADE, related_name="inference_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The key's first characters, to tell keys apart.")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the key (hex).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name}) of request {self.request_id}"


class ReplicaSample(models.Model):
    """An inference service's replica count when the status follower saw it change (the request page's chart)."""

    request = models.ForeignKey(WorkloadRequest, on_delete=models.CASCADE, related_name="replica_samples")
    at = models.DateTimeField()
    replicas = models.PositiveIntegerField()
    ready = models.PositiveIntegerField()

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["request", "at"], name="replica_sample_request_at")]

from __future__ import annotations

from decimal import Decimal

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.api import DateTimeField, IdOrNameField, JSONObjectField, JSONObjectListField, StrictSerializerMixin
from portal.quantities import fmt

from ..capacity import flavor_enforcement
from ..models import CLUSTER_ROLES, Architecture, ArchitectureChange, Cluster, Flavor, Quota, QuotaRequest, gib_words

QUANTITY = {"max_digits": 14, "decimal_places": 3}
ROLE_HELP = ("How work reaches the cluster (docs/federation.md, \"Kueue MultiKueue\"): standalone (the portal routes to "
             "it), manager (a Kueue MultiKueue manager: dispatches to its workers), worker (takes work from its manager "
             "only; needs `manager`).")
MANAGER_HELP = "A MultiKueue worker's manager cluster (name); null for other roles."
CHECK_HELP = "A MultiKueue manager's AdmissionCheck name (empty: multikueue); ops only."
LEVELS_HELP = ('With topology "custom": its levels, highest first, each {"name", "label"} (a name such as zone, block, '
               'rack, nvlink or host and a node label key), at most 8, no duplicates, kubernetes.io/hostname only last; '
               "[] otherwise. Placement asks for one rack, block or NVLink domain (level nvlink).")


class ClusterSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    """The ops view. ``kubeconfig`` is write-only: it is stored encrypted and never shown again."""

    kubeconfig = serializers.CharField(write_only=True, required=False, allow_blank=True, trim_whitespace=False,
                                       help_text="The whole kubeconfig file; stored encrypted. Empty removes it.")
    has_kubeconfig = serializers.SerializerMethodField()
    architecture = serializers.ChoiceField(choices=Architecture.choices, required=False)
    role = serializers.ChoiceField(choices=CLUSTER_ROLES, required=False, help_text=ROLE_HELP)
    manager = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all(), required=False,
                                           allow_null=True, help_text=MANAGER_HELP)
    admission_check = serializers.CharField(max_length=63, required=False, allow_blank=True, help_text=CHECK_HELP)
    topology_levels = JSONObjectListField(required=False, help_text=LEVELS_HELP)

    class Meta:
        model = Cluster
        fields = [
            "id", "name", "architecture", "use_mig", "use_hami", "volcano_capacity_plugin", "overcommit_percent",
            "topology", "topology_levels", "role", "manager", "admission_check", "kubeconfig", "kubeconfig_path", "has_kubeconfig",
            "inventory_synced_at", "inventory_error", "reconciled_at", "created_at", "health", "last_error",
            "last_seen_at",
        ]
        read_only_fields = ["id", "has_kubeconfig", "inventory_synced_at", "inventory_error", "reconciled_at", "created_at",
                            "health", "last_error", "last_seen_at"]
        # Uniqueness and the architecture rules are checked by the service, as field errors.
        validators: list = []
        extra_kwargs = {"name": {"validators": []}}

    def get_has_kubeconfig(self, cluster: Cluster) -> bool:
        return bool(cluster.kubeconfig_encrypted)

    def validate(self, attrs: dict) -> dict:
        if "manager" in attrs:  # the services take the manager's id (the rules are theirs: quotas/services.py)
            manager = attrs.pop("manager")
            attrs["manager_id"] = manager.pk if manager else None
        return attrs


# What only ops read about a cluster; everyone else gets these keys with null (one shape for everyone).
CLUSTER_OPS_ONLY = [
    "use_mig", "use_hami", "volcano_capacity_plugin", "overcommit_percent", "topology", "topology_levels",
    "admission_check", "kubeconfig_path", "has_kubeconfig",
    "inventory_synced_at", "inventory_error", "reconciled_at", "created_at", "health", "last_error", "last_seen_at",
]
OPS_ONLY = "Ops only: null for everyone else."


class ClusterReadSerializer(serializers.ModelSerializer):
    """A cluster as ``GET /clusters/`` and ``GET /clusters/{id}/`` answer it, to everyone: every key is always
    there. ``id``, ``name`` and ``architecture`` are for everyone; the settings and the sync state are ops-only
    and null for everyone else (``context["ops"]`` says whether the caller is ops)."""

    architecture = serializers.ChoiceField(choices=Architecture.choices, read_only=True)
    use_mig = serializers.BooleanField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    use_hami = serializers.BooleanField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    volcano_capacity_plugin = serializers.BooleanField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    overcommit_percent = serializers.IntegerField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    topology = serializers.ChoiceField(choices=Cluster._meta.get_field("topology").choices, read_only=True, allow_null=True,
                                       help_text=OPS_ONLY)
    topology_levels = JSONObjectListField(read_only=True, allow_null=True, help_text=f"{LEVELS_HELP} {OPS_ONLY}")
    kubeconfig_path = serializers.CharField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    has_kubeconfig = serializers.SerializerMethodField(help_text=OPS_ONLY)
    inventory_synced_at = serializers.DateTimeField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    inventory_error = serializers.CharField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    reconciled_at = serializers.DateTimeField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    created_at = serializers.DateTimeField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    health = serializers.ChoiceField(choices=Cluster._meta.get_field("health").choices, read_only=True, allow_null=True,
                                     help_text=OPS_ONLY)
    last_error = serializers.CharField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    last_seen_at = serializers.DateTimeField(read_only=True, allow_null=True, help_text=OPS_ONLY)
    role = serializers.ChoiceField(choices=CLUSTER_ROLES, read_only=True, help_text=ROLE_HELP)
    manager = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True, help_text=MANAGER_HELP)
    admission_check = serializers.CharField(read_only=True, allow_null=True, help_text=CHECK_HELP)

    class Meta:
        model = Cluster
        fields = ["id", "name", "architecture", "role", "manager", *CLUSTER_OPS_ONLY]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField(allow_null=True))
    def get_has_kubeconfig(self, cluster: Cluster) -> bool | None:
        return bool(cluster.kubeconfig_encrypted)

    def to_representation(self, cluster: Cluster) -> dict:
        data = super().to_representation(cluster)
        if not self.context.get("ops"):
            data.update(dict.fromkeys(CLUSTER_OPS_ONLY))
        return data


class FlavorSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all(), help_text="Cluster name.")
    resource_names = serializers.ListField(child=serializers.CharField(), read_only=True)
    kind = serializers.ChoiceField(choices=Flavor.Kind.choices)
    node_labels = JSONObjectField(required=False)
    taints = JSONObjectListField(required=False)
    tolerations = JSONObjectListField(required=False)
    enforced = serializers.SerializerMethodField(help_text="Does the cluster's architecture enforce this flavor? "
                                                           "Researchers only ever see enforced ones.")
    enforcement = serializers.SerializerMethodField(help_text="enforced, by (kueue/volcano/empty), reason, remedy.")

    class Meta:
        model = Flavor
        fields = [
            "id", "cluster", "name", "display_name", "kind", "gpu_product", "gpu_model", "mig_profile",
            "hami_memory_mib", "hami_cores_percent", "pool_label", "node_labels", "taints", "tolerations", "order",
            "active", "resource_names", "enforced", "enforcement",
        ]
        read_only_fields = ["id", "active", "resource_names", "enforced", "enforcement"]
        validators: list = []
        extra_kwargs = {"name": {"validators": []}}

    def get_enforced(self, flavor: Flavor) -> bool:
        return flavor_enforcement(flavor.cluster, flavor).enforced

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_enforcement(self, flavor: Flavor) -> dict:
        return flavor_enforcement(flavor.cluster, flavor).as_dict()


class FlavorUpdateSerializer(FlavorSerializer):
    """Everything but the id; the service refuses to change cluster, name and kind."""

    class Meta(FlavorSerializer.Meta):
        read_only_fields = ["id", "resource_names", "enforced", "enforcement"]


class QuotaSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    cluster = serializers.CharField(source="flavor.cluster.name", read_only=True)
    flavor_name = serializers.CharField(source="flavor.name", read_only=True)

    class Meta:
        model = Quota
        fields = [
            "id", "tenant", "project", "cluster", "flavor", "flavor_name", "resource", "nominal", "borrowing_limit",
            "lending_limit", "used", "borrowed", "usage_at", "updated_at",
        ]
        read_only_fields = fields


class QuotaSetSerializer(StrictSerializerMixin, serializers.Serializer):
    """Upsert one quota row: a tenant's (ops) or a project's (tenant admins, ops)."""

    tenant = serializers.CharField(required=False, max_length=40, help_text="Tenant slug, for the tenant's own quota.")
    project = serializers.CharField(required=False, max_length=63, help_text="Project slug, for a project's quota.")
    cluster = serializers.CharField(required=False, max_length=63, help_text="Cluster name, when a flavor name is ambiguous.")
    flavor = IdOrNameField(help_text="Flavor id or name.")
    resource = serializers.CharField(required=False, max_length=100, help_text="Default: the flavor's first resource.")
    nominal = serializers.DecimalField(min_value=Decimal(0), **QUANTITY)
    borrowing_limit = serializers.DecimalField(required=False, allow_null=True, min_value=Decimal(0), **QUANTITY,
                                               help_text="null: no limit.")
    lending_limit = serializers.DecimalField(required=False, allow_null=True, min_value=Decimal(0), **QUANTITY,
                                             help_text="null: no limit.")

    def validate(self, attrs: dict) -> dict:
        if bool(attrs.get("tenant")) == bool(attrs.get("project")):
            raise serializers.ValidationError({"project": ["Give either a tenant or a project."]})
        return attrs


class QuotaUpdateSerializer(StrictSerializerMixin, serializers.Serializer):
    nominal = serializers.DecimalField(required=False, min_value=Decimal(0), **QUANTITY)
    borrowing_limit = serializers.DecimalField(required=False, allow_null=True, min_value=Decimal(0), **QUANTITY)
    lending_limit = serializers.DecimalField(required=False, allow_null=True, min_value=Decimal(0), **QUANTITY)


class ShareRowSerializer(serializers.Serializer):
    resource = serializers.CharField()
    amount = serializers.CharField()


class ShareSerializer(serializers.Serializer):
    shares = serializers.CharField(help_text="How many shares.")
    memory_gib = serializers.CharField(help_text="GPU memory of each share, GiB.")
    memory_mib = serializers.IntegerField(help_text="The same in MiB (HAMi's gpumem unit).")
    cores_percent = serializers.IntegerField(help_text="Each share's % of a card's cores.")
    size = serializers.CharField(help_text='Each share for people: "11 GiB, 25 % of the cores".')
    total = serializers.CharField(help_text="What the shares add up to.")
    rows = ShareRowSerializer(many=True, help_text="The quota rows approval raises together, in their units.")


class QuotaRequestSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="project.tenant.slug", read_only=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    cluster = serializers.CharField(source="flavor.cluster.name", read_only=True)
    flavor_name = serializers.CharField(source="flavor.name", read_only=True)
    requested_by = serializers.CharField(source="requested_by.username", read_only=True)
    decided_by = serializers.CharField(source="decided_by.username", read_only=True, allow_null=True)
    what = serializers.CharField(read_only=True, help_text="What is asked, for people.")
    share = serializers.SerializerMethodField(
        help_text="HAMi flavors: the request in shares (how many, the size of each, and the three quota rows approval "
                  "raises together); null for other flavors.")

    class Meta:
        model = QuotaRequest
        fields = [
            "id", "tenant", "project", "cluster", "flavor", "flavor_name", "resource", "amount", "what", "share", "until",
            "reason", "requested_by", "status", "approver", "decided_by", "decided_at", "comment", "applied", "created_at",
        ]
        read_only_fields = fields

    def to_representation(self, instance: QuotaRequest) -> dict:
        """The row, written at once rather than field by field (DRF's loop reads each field's attribute path and
        checks it for None: about 60 % of a page of 50 quota requests). The declared fields above are the schema and
        format the amount and the dates; ``tests/quotas/test_quota_request_json.py`` holds the text to DRF's own."""
        f = self.fields
        project, flavor, decided_by = instance.project, instance.flavor, instance.decided_by
        until, decided_at = instance.until, instance.decided_at
        return {
            "id": instance.pk, "tenant": project.tenant.slug, "project": project.slug, "cluster": flavor.cluster.name,
            "flavor": instance.flavor_id, "flavor_name": flavor.name, "resource": instance.resource,
            "amount": f["amount"].to_representation(instance.amount), "what": str(instance.what),
            "share": self.get_share(instance),
            "until": None if until is None else f["until"].to_representation(until), "reason": instance.reason,
            "requested_by": instance.requested_by.username, "status": instance.status, "approver": instance.approver,
            "decided_by": None if decided_by is None else decided_by.username,
            "decided_at": None if decided_at is None else f["decided_at"].to_representation(decided_at),
            "comment": instance.comment, "applied": instance.applied,
            "created_at": f["created_at"].to_representation(instance.created_at),
        }

    @extend_schema_field(ShareSerializer(allow_null=True))
    def get_share(self, request: QuotaRequest) -> dict | None:
        if not request.is_share:
            return None
        return {"shares": fmt(request.amount), "memory_gib": gib_words(request.share_memory_mib),
                "memory_mib": request.share_memory_mib, "cores_percent": request.share_cores_percent,
                "size": request.share_size, "total": request.share_totals,
                "rows": [{"resource": resource, "amount": fmt(amount)} for resource, amount in request.share_rows()]}


class QuotaRequestCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    project = serializers.CharField(max_length=63, help_text="Project slug.")
    cluster = serializers.CharField(required=False, max_length=63, help_text="Cluster name, when a flavor name is ambiguous.")
    flavor = IdOrNameField(help_text="Flavor id or name.")
    resource = serializers.CharField(required=False, max_length=100, help_text="Default: the flavor's first resource.")
    amount = serializers.DecimalField(required=False, min_value=Decimal("0.001"), **QUANTITY,
                                      help_text="How much more; for a HAMi flavor, the number of shares.")
    shares = serializers.IntegerField(required=False, min_value=1,
                                      help_text="HAMi flavors: how many shares (instead of amount).")
    share_memory_gib = serializers.DecimalField(
        required=False, max_digits=8, decimal_places=3, min_value=Decimal("0.001"),
        help_text="HAMi flavors: GPU memory of each share in GiB (default: the flavor's preset), at most one card's.")
    share_cores_percent = serializers.IntegerField(
        required=False, min_value=1, max_value=100,
        help_text="HAMi flavors: each share's % of a card's cores (default: the flavor's preset).")
    until = DateTimeField(required=False, allow_null=True, help_text="When the extra quota ends; omit for good.")
    reason = serializers.CharField(max_length=2000)

    def validate(self, attrs: dict) -> dict:
        if "shares" in attrs and "amount" in attrs and attrs["shares"] != attrs["amount"]:
            raise serializers.ValidationError({"shares": ["Give shares or amount, not both."]})
        if "shares" in attrs:
            attrs["amount"] = Decimal(attrs.pop("shares"))
        if "amount" not in attrs:
            raise serializers.ValidationError({"amount": ["How much more: amount (for a HAMi flavor, shares)."]})
        return attrs


class DecisionSerializer(StrictSerializerMixin, serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, max_length=2000, help_text="Required to reject.")


class ProjectQuotaRowSerializer(serializers.Serializer):
    cluster = serializers.CharField()
    flavor = serializers.CharField()
    flavor_id = serializers.IntegerField()
    resource = serializers.CharField()
    nominal = serializers.DecimalField(**QUANTITY)
    borrowing_limit = serializers.DecimalField(allow_null=True, **QUANTITY)
    lending_limit = serializers.DecimalField(allow_null=True, **QUANTITY)
    used = serializers.DecimalField(**QUANTITY)
    borrowed = serializers.DecimalField(**QUANTITY)
    free = serializers.DecimalField(**QUANTITY)
    usage_at = serializers.DateTimeField(allow_null=True, help_text="When used/borrowed last changed.")
    usage_read_at = serializers.DateTimeField(allow_null=True, help_text="When the portal last read the cluster's queues: "
                                                                         "used/borrowed are as of then (null: never read).")
    enforced = serializers.BooleanField(help_text="false: the cluster's architecture enforces nothing of this flavor; "
                                                  "the row promises nothing (free is 0).")
    enforcement_reason = serializers.CharField(help_text="Why not, and what would make it usable (empty when enforced).")
    confirmed_at = serializers.DateTimeField(allow_null=True, help_text="When the last reconcile found the project's "
                                                                        "ClusterQueues on the cluster as the portal wants them.")
    cluster_nominal = serializers.DecimalField(allow_null=True, help_text="nominalQuota the live ClusterQueues hold.", **QUANTITY)
    drift = serializers.BooleanField(allow_null=True, help_text="true: the cluster's nominalQuota differs from the portal's "
                                                                "quota (not applied yet, or refused); null: cannot be told.")


class ProjectQuotaSerializer(serializers.Serializer):
    tenant = serializers.CharField()
    project = serializers.CharField()
    quotas = ProjectQuotaRowSerializer(many=True)


class OvercommitRowSerializer(serializers.Serializer):
    flavor = serializers.CharField()
    flavor_id = serializers.IntegerField()
    resource = serializers.CharField()
    promised = serializers.DecimalField(**QUANTITY)
    capacity = serializers.DecimalField(**QUANTITY)
    over = serializers.DecimalField(**QUANTITY)
    percent_over = serializers.DecimalField(max_digits=14, decimal_places=1, allow_null=True,
                                            help_text="null: promised with no capacity at all.")
    allowed = serializers.DecimalField(**QUANTITY)
    within_limit = serializers.BooleanField()


class ArchitectureChangeSerializer(serializers.ModelSerializer):
    """An architecture change (or an apply of the current architecture's plan) and its progress."""

    cluster = serializers.CharField(source="cluster.name", read_only=True)
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ArchitectureChange
        fields = ["id", "cluster", "from_architecture", "to_architecture", "fingerprint", "state", "state_reason",
                  "requested_by", "result", "created_at", "started_at", "finished_at"]
        read_only_fields = fields


class ArchitectureChangeStartSerializer(StrictSerializerMixin, serializers.Serializer):
    architecture = serializers.ChoiceField(choices=Architecture.choices)
    fingerprint = serializers.RegexField(r"^[0-9a-f]{64}$", help_text="The fingerprint of the plan you reviewed "
                                         "(GET this endpoint with ?architecture=X).")
    policy = serializers.ChoiceField(choices=["drain", "requeue", "keep"], default="drain", help_text=(
        "What happens to work still admitted in ClusterQueues the plan removes: drain (they admit nothing new and "
        "go once their work is done), requeue (evicted and queued again in the new queues), keep (it runs on; the "
        "queues stay Terminating until empty)."))


class WorkloadMoveSerializer(serializers.Serializer):
    namespace = serializers.CharField()
    workload = serializers.CharField()
    owner = serializers.CharField(help_text="The object the Workload belongs to (a request's req-<id>).")
    state = serializers.ChoiceField(choices=["running", "pending"])
    from_queue = serializers.CharField(source="from", allow_null=True, help_text="ClusterQueue now.")
    to_queue = serializers.CharField(source="to", allow_null=True, help_text="ClusterQueue its LocalQueue leads to after.")
    looser = serializers.BooleanField(help_text="Pending work that may be admitted under a queue that is not its "
                                                "project's (its project quota no longer holds it back).")
    effects = serializers.DictField(child=serializers.CharField(), help_text="What happens to it under each policy.")


class ArchitecturePlanSerializer(serializers.Serializer):
    architecture = serializers.CharField()
    fingerprint = serializers.CharField()
    summary = serializers.CharField()
    empty = serializers.BooleanField()
    text = serializers.CharField()
    workloads = WorkloadMoveSerializer(many=True, help_text="The Workloads this plan moves, re-queues or admits "
                                                            "under looser limits, and what each policy does to them.")


class ArchitectureStatusSerializer(serializers.Serializer):
    change = ArchitectureChangeSerializer(allow_null=True, help_text="The latest change of the cluster, if any.")
    plan = ArchitecturePlanSerializer(allow_null=True, help_text="With ?architecture=X: the plan to review.")

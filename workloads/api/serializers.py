from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

from portal.api import IdOrNameField, JSONObjectField, StrictSerializerMixin
from portal.extensions import cost_estimator, cost_so_far
from quotas.capacity import flavor_enforcement
from quotas.models import Flavor, gib_words, share_of_card_words
from tenants.access import Actor

from .. import selectors
from ..models import (
    ApprovalRule,
    ExtensionRequest,
    Image,
    REQUEST_TOPOLOGIES,
    Priority,
    RequestEvent,
    RequestPreset,
    ServiceTemplate,
    TemplateKind,
    Volume,
    WorkloadRequest,
)
from ..schema import form_fields
from ..status import dispatched_worker


class FlavorBriefSerializer(serializers.ModelSerializer):
    enforced = serializers.SerializerMethodField(help_text="Does the cluster's architecture enforce it? (Only ops see false.)")

    class Meta:
        model = Flavor
        fields = ["id", "name", "display_name", "kind", "enforced", "share", "hami_memory_mib", "hami_cores_percent"]
        read_only_fields = fields
        extra_kwargs = {"hami_memory_mib": {"help_text": "HAMi: GPU memory per vGPU (MiB, what the pod asks as "
                                                         "nvidia.com/gpumem); 0 for other kinds."},
                        "hami_cores_percent": {"help_text": "HAMi: % of a card's cores per vGPU (nvidia.com/gpucores)."}}

    share = serializers.CharField(read_only=True, help_text='HAMi: the share as people say it ("11 GiB, 25 % of the '
                                                            'cores"); empty for other kinds.')

    def get_enforced(self, flavor: Flavor) -> bool:
        return flavor_enforcement(flavor.cluster, flavor).enforced


class TemplateSerializer(serializers.ModelSerializer):
    allowed_flavors = serializers.SerializerMethodField(
        help_text="The flavors it may run on. Researchers see what the new-request form offers them: the flavors the "
                  "queues of the projects they may submit in can admit (?project=: in that one; the list narrows only "
                  "with ?project=); with no such project, those the cluster's architecture enforces.")
    form_fields = serializers.SerializerMethodField(help_text="The new-request form's fields, generated from parameters_schema.")

    class Meta:
        model = ServiceTemplate
        fields = [
            "id", "kind", "slug", "version", "name", "description", "parameters_schema", "form_fields",
            "allowed_flavors", "default_gpus", "max_gpus", "default_cpu", "max_cpu", "default_memory_gib",
            "max_memory_gib", "max_duration_hours", "idle_timeout_minutes", "idle_gpu_percent", "active", "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": "array", "items": {"type": "object"}})
    def get_form_fields(self, template: ServiceTemplate) -> list[dict[str, Any]]:
        return form_fields(template.parameters_schema)

    @extend_schema_field(FlavorBriefSerializer(many=True))
    def get_allowed_flavors(self, template: ServiceTemplate) -> list[dict[str, Any]]:
        flavors = list(template.allowed_flavors.all())
        request = self.context.get("request")
        if request is not None and not Actor.from_request(request).is_ops:
            flavors = [f for f in flavors if flavor_enforcement(f.cluster, f).enforced]
            projects = self.context.get("offer_projects")
            if projects:  # what the form offers in those projects (selectors.template_flavors_for), in its order
                offered = {f.pk for f in selectors.template_flavors_for(template=template, projects=projects)}
                flavors = [f for f in flavors if f.pk in offered]
            elif self.context.get("offer_project"):  # ?project= names none of the caller's: nothing is offered there
                flavors = []
        return FlavorBriefSerializer(flavors, many=True).data


class TemplateWriteSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    allowed_flavors = serializers.PrimaryKeyRelatedField(
        many=True, queryset=Flavor.objects.filter(active=True), required=False, help_text="Flavor ids."
    )
    parameters_schema = JSONObjectField(required=False)

    class Meta:
        model = ServiceTemplate
        fields = [
            "kind", "slug", "name", "description", "parameters_schema", "allowed_flavors", "default_gpus", "max_gpus",
            "default_cpu", "max_cpu", "default_memory_gib", "max_memory_gib", "max_duration_hours",
            "idle_timeout_minutes", "idle_gpu_percent", "active",
        ]
        validators: list = []  # slug+version uniqueness: the service picks the next version


class ImageSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    kinds = serializers.ListField(child=serializers.ChoiceField(choices=TemplateKind.choices), allow_empty=False, min_length=1)

    class Meta:
        model = Image
        fields = ["id", "name", "reference", "description", "kinds", "active"]
        read_only_fields = ["id"]
        validators: list = []  # reference uniqueness: reported by the model's full_clean as a field error


class ApprovalRuleSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = ApprovalRule
        fields = [
            "id", "project", "template_slug", "auto_approve_max_gpus", "auto_approve_max_hours",
            "require_admin_for_inference", "member_priorities", "admin_priorities", "updated_at",
        ]
        read_only_fields = fields


class ApprovalRuleWriteSerializer(StrictSerializerMixin, serializers.Serializer):
    project = serializers.CharField(
        max_length=63, allow_null=True, required=False, default=None,
        help_text="Project slug; null for a global rule (ops only).",
    )
    template_slug = serializers.CharField(max_length=50, allow_blank=True, required=False, default="")
    auto_approve_max_gpus = serializers.IntegerField(min_value=0, required=False)
    auto_approve_max_hours = serializers.IntegerField(min_value=0, required=False)
    require_admin_for_inference = serializers.BooleanField(required=False)
    member_priorities = serializers.ListField(
        child=serializers.ChoiceField(choices=Priority.choices), required=False, allow_empty=True,
        help_text="Priorities members' requests may be approved with automatically (never production).",
    )
    admin_priorities = serializers.ListField(
        child=serializers.ChoiceField(choices=Priority.choices), required=False, allow_empty=True,
        help_text="Priorities approvers' own requests are approved with on submission (never production).",
    )


class VolumeSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    shared = serializers.BooleanField(read_only=True)
    request = serializers.PrimaryKeyRelatedField(read_only=True, allow_null=True)

    class Meta:
        model = Volume
        fields = ["id", "project", "name", "owner", "shared", "request", "description", "created_at"]
        read_only_fields = fields


class VolumeWriteSerializer(StrictSerializerMixin, serializers.Serializer):
    project = serializers.CharField(max_length=63, help_text="Project slug.")
    name = serializers.CharField(max_length=253, help_text="An existing PersistentVolumeClaim in the project's namespace.")
    shared = serializers.BooleanField(required=False, default=False,
                                      help_text="Shared with the whole project (project admins); else your own.")
    description = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)


class TemplateBriefSerializer(serializers.ModelSerializer):
    class Meta:
        model = ServiceTemplate
        fields = ["id", "kind", "slug", "version", "name"]
        read_only_fields = fields


class RequestEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RequestEvent
        fields = ["at", "from_state", "to_state", "actor_label", "message"]
        read_only_fields = fields


class RequestShareSerializer(serializers.Serializer):
    memory_gib = serializers.CharField(help_text="GPU memory of each vGPU, GiB.")
    memory_mib = serializers.IntegerField(help_text="The same in MiB: what the pod asks as nvidia.com/gpumem.")
    cores_percent = serializers.IntegerField(help_text="Each vGPU's % of a card's cores (nvidia.com/gpucores).")
    size = serializers.CharField(help_text='For people: "10 GiB, 25 % of an L40S".')
    preset = serializers.BooleanField(help_text="Is it the flavor's preset share (else a size of the requester's own)?")


def share_data(memory_mib: int, cores_percent: int, flavor: Flavor | None) -> dict[str, Any] | None:
    """A HAMi request's ``share`` as the API shows it; None for other kinds."""
    if flavor is None or flavor.kind != Flavor.Kind.HAMI or not (memory_mib and cores_percent):
        return None
    return {"memory_gib": gib_words(memory_mib), "memory_mib": memory_mib, "cores_percent": cores_percent,
            "size": share_of_card_words(memory_mib, cores_percent, flavor),
            "preset": (memory_mib, cores_percent) == (flavor.hami_memory_mib, flavor.hami_cores_percent)}


class RequestRowsSerializer(serializers.ListSerializer):
    """A page of requests: the flavors a cost estimate or a share reads come in one query for the page."""

    def to_representation(self, data: Any) -> list[dict[str, Any]]:
        rows = list(data.all() if hasattr(data, "all") else data)
        child: RequestSerializer = self.child  # type: ignore[assignment]
        if rows and isinstance(rows[0], dict):
            flavors = RowFlavors(rows)
            return [child.row_json(row, flavors) for row in rows]
        return [child.to_representation(row) for row in rows]


class RequestSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    namespace = serializers.CharField(source="project.namespace", read_only=True)
    k8s_name = serializers.CharField(read_only=True)
    template = TemplateBriefSerializer(read_only=True)
    flavor = serializers.SlugRelatedField(slug_field="name", read_only=True)
    requested_by = serializers.CharField(source="requested_by.username", read_only=True)
    approved_by = serializers.CharField(source="approved_by.username", read_only=True, allow_null=True, default=None)
    pending_reason = serializers.CharField(read_only=True, help_text="Why it is not running yet; empty when not waiting.")
    cost_estimate = serializers.DecimalField(
        max_digits=12, decimal_places=2, allow_null=True, read_only=True,
        help_text="What it would cost over its duration at today's prices; null without a price list.")
    share = RequestShareSerializer(allow_null=True, read_only=True,
                                   help_text="HAMi flavors: each vGPU's share of a card (the flavor's preset "
                                             "or the requester's own size); null for other kinds.")

    class Meta:
        model = WorkloadRequest
        fields = [
            "id", "name", "k8s_name", "namespace", "tenant", "project", "template", "image", "flavor", "gpus",
            "share", "replicas", "cpu", "memory_gib", "parameters", "duration_hours", "priority", "topology", "state",
            "state_reason",
            "pending_reason", "cost_estimate", "requested_by", "approved_by", "decision_comment", "created_at",
            "updated_at", "approved_at", "queued_at", "started_at", "finished_at", "expires_at",
        ]
        read_only_fields = fields
        extra_kwargs = {"decision_comment": {"help_text": "The approver's words: the reason of a rejection "
                                                          "(always given), or an approval's comment."}}
        list_serializer_class = RequestRowsSerializer

    detail = False  # RequestDetailSerializer: a detail row (request_rows(detail=True)), with its extra fields

    def to_representation(self, instance: dict[str, Any] | WorkloadRequest) -> dict[str, Any]:
        """The JSON of a row of ``selectors.request_rows`` (the list's and the detail's), or of a request in memory
        (the inbox's, a submission's: made a row first, ``request_row``). Written here once, not field by field:
        the declared fields above are the schema and give the columns' formats (dates, decimals)."""
        if isinstance(instance, WorkloadRequest):
            return self.row_json(request_row(instance, detail=self.detail), _KnownFlavor(instance.flavor))
        return self.row_json(instance, RowFlavors([instance]))

    def row_json(self, row: dict[str, Any], flavors: RowFlavors | _KnownFlavor) -> dict[str, Any]:
        f = _row_fields()
        estimate = None
        if cost_estimator.active:
            estimate = selectors.request_cost_estimate(_EstimateView(row, flavors))
        # A HAMi request's share (rows of other kinds have none): its flavor read with the page's, only then.
        share = share_data(row["share_memory_mib"], row["share_cores_percent"], flavors.get(row["flavor_id"])) \
            if row["share_memory_mib"] else None
        return {
            "id": row["id"], "name": f["name"].to_representation(row["name"]), "k8s_name": f"req-{row['id']}",
            "namespace": row["project_cluster_namespace"] or row["project_slug"],  # Project.namespace
            "tenant": row["tenant_slug"], "project": row["project_slug"],
            "template": {"id": row["template_id"], "kind": row["template_kind"], "slug": row["template_slug"],
                         "version": row["template_version"], "name": row["template_name"]},
            "image": row["image"], "flavor": row["flavor_name"], "gpus": row["gpus"], "share": share,
            "replicas": row["replicas"],
            "cpu": _plain(f, "cpu", row["cpu"]), "memory_gib": row["memory_gib"],
            "parameters": _plain(f, "parameters", row["parameters"]), "duration_hours": row["duration_hours"],
            "priority": row["priority"], "topology": row["topology"], "state": row["state"],
            "state_reason": row["state_reason"],
            "pending_reason": selectors.request_pending_reason(_PendingView(row)),  # type: ignore[arg-type]
            "cost_estimate": estimate, "requested_by": row["requested_by_username"],
            "approved_by": row["approved_by_username"], "decision_comment": row["decision_comment"],
            **_iso_dates(f, row, _DATE_COLUMNS, flavors.zone),
        }


class ExtensionRequestSerializer(serializers.ModelSerializer):
    request = serializers.PrimaryKeyRelatedField(read_only=True)
    request_name = serializers.CharField(source="request.name", read_only=True)
    project = serializers.CharField(source="request.project.slug", read_only=True)
    tenant = serializers.CharField(source="request.project.tenant.slug", read_only=True)
    duration_hours = serializers.IntegerField(source="request.duration_hours", read_only=True,
                                              help_text="The request's duration now.")
    requested_by = serializers.CharField(source="requested_by.username", read_only=True)
    decided_by = serializers.CharField(source="decided_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = ExtensionRequest
        fields = ["id", "request", "request_name", "project", "tenant", "hours", "replicas", "duration_hours", "reason",
                  "status", "requested_by", "decided_by", "decided_at", "comment", "created_at"]
        read_only_fields = fields
        extra_kwargs = {"comment": {"help_text": "The approver's words: the reason of a rejection, or an approval's comment."},
                        "hours": {"help_text": "More hours asked for (0 for a scale request)."},
                        "replicas": {"help_text": "A scale request: the replicas asked for (null for an extension)."}}


class ExtensionRequestCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    request = serializers.IntegerField(min_value=1, help_text="The request (id) to run longer, or to scale.")
    hours = serializers.IntegerField(min_value=1, max_value=24 * 366, required=False,
                                     help_text="How many more hours (an extension). Give this or replicas.")
    replicas = serializers.IntegerField(min_value=1, max_value=64, required=False,
                                        help_text="The replicas an inference service should have (a scale request). "
                                                  "Give this or hours.")
    reason = serializers.CharField(max_length=2000, help_text="Why: the approvers decide on it.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("hours" in attrs) == ("replicas" in attrs):
            raise serializers.ValidationError(
                {"hours": ["Give either hours (more time) or replicas (a scale request), not both or neither."]})
        return attrs


class PlacementSerializer(serializers.Serializer):
    """Where the request runs, and why (docs/federation.md)."""

    cluster = serializers.CharField()
    zone = serializers.CharField()
    gpu_model = serializers.CharField()
    spilled = serializers.BooleanField(help_text="It runs on another GPU model than its first choice (with its consent).")
    spilled_from_model = serializers.CharField(help_text="Its first choice, when it spilled over.")
    reason = serializers.CharField(help_text="Why it runs there (empty: where it was asked, no choice made).")
    redispatched_from = serializers.CharField(allow_null=True, help_text="The drained or unhealthy cluster it left.")
    accepted_models = serializers.ListField(child=serializers.CharField())
    min_gpu_memory_gib = serializers.IntegerField(allow_null=True)
    min_compute_capability = serializers.CharField()
    spill_consent = serializers.BooleanField()
    kueue_models = serializers.ListField(
        child=serializers.CharField(), help_text="Inside its cluster, the GPU models Kueue chooses between in its queue's "
                                                 "flavor order (empty: pinned to its flavor's model).")
    worker = serializers.CharField(required=False, allow_null=True,
                                   help_text="On a Kueue MultiKueue manager cluster: the worker cluster it was "
                                             "dispatched to (null until one admitted it, and on other clusters).")


def placement_data(*, cluster: str, zone: str, model: str, redispatched_from: str | None, spilled: bool,
                   spilled_from_model: str, route_reason: str, spill_consent: bool, accepted_models: Any,
                   min_gpu_memory_gib: int | None, min_compute_capability: str, kueue_flavors: Any = None) -> dict[str, Any]:
    if isinstance(kueue_flavors, str):  # a JSON column read as text
        kueue_flavors = json.loads(kueue_flavors or "[]")
    return {"cluster": cluster, "zone": zone or cluster, "gpu_model": model or "", "spilled": spilled,
            "spilled_from_model": spilled_from_model, "reason": route_reason, "redispatched_from": redispatched_from,
            "accepted_models": list(accepted_models or []), "min_gpu_memory_gib": min_gpu_memory_gib,
            "min_compute_capability": min_compute_capability, "spill_consent": spill_consent,
            "kueue_models": [str(c.get("model") or c.get("name")) for c in kueue_flavors or [] if isinstance(c, dict)]}


class RequestDetailSerializer(RequestSerializer):
    timeline = RequestEventSerializer(many=True, read_only=True)
    extension_requests = ExtensionRequestSerializer(many=True, read_only=True,
                                                    help_text="Extensions asked for, newest first.")
    cost_so_far = serializers.DecimalField(
        max_digits=12, decimal_places=2, allow_null=True, read_only=True,
        help_text="What its usage cost until now (finished runs, and running ones up to now); null without a price list.")
    placement = PlacementSerializer(read_only=True, help_text="Where it runs (cluster, zone, GPU model), whether it "
                                                              "spilled over, and why.")

    class Meta(RequestSerializer.Meta):
        fields = RequestSerializer.Meta.fields + ["cluster_status", "timeline", "extension_requests", "cost_so_far",
                                                  "placement"]
        read_only_fields = fields

    detail = True

    def row_json(self, row: dict[str, Any], flavors: RowFlavors | _KnownFlavor) -> dict[str, Any]:
        """A row of ``selectors.request_rows(detail=True)``: the timeline comes with the row on PostgreSQL (else
        one query), the extension requests in one query when there are any."""
        f = _row_fields()
        data = super().row_json(row, flavors)
        data["cluster_status"] = _plain(f, "cluster_status", row["cluster_status"])
        data["placement"] = placement_data(
            cluster=row["cluster_name"], zone=row["cluster_zone"], model=row["flavor_gpu_model"],
            redispatched_from=row["redispatched_from_name"], **{k: row[k] for k in selectors.PLACEMENT_COLUMNS})
        data["placement"]["worker"] = dispatched_worker(data["cluster_status"])  # Kueue MultiKueue
        if "timeline" in row:  # a request in memory (``request_row``)
            events = row["timeline"]
        elif "timeline_json" in row:
            events = [{"at": datetime.fromisoformat(at), "from_state": from_state, "to_state": to_state,
                       "actor_label": actor_label, "message": message}
                      for at, from_state, to_state, actor_label, message in json.loads(row["timeline_json"])]
        else:
            events = list(selectors.request_timeline_rows(row["id"]))
        data["timeline"] = [
            {"at": _plain(f, "event_at", event["at"]), "from_state": event["from_state"], "to_state": event["to_state"],
             "actor_label": event["actor_label"], "message": event["message"]}
            for event in events
        ]
        data["extension_requests"] = [
            {"id": ext["id"], "request": row["id"], "request_name": data["name"], "project": row["project_slug"],
             "tenant": ext["project_tenant_slug"], "hours": ext["hours"], "replicas": ext["replicas"],
             "duration_hours": row["duration_hours"],
             "reason": ext["reason"], "status": ext["status"], "requested_by": ext["requested_by_username"],
             "decided_by": ext["decided_by_username"], "decided_at": _plain(f, "ext_decided_at", ext["decided_at"]),
             "comment": ext["comment"], "created_at": _plain(f, "ext_created_at", ext["created_at"])}
            for ext in (selectors.request_extension_rows(row["id"]) if row["has_extension_requests"] else [])
        ]
        so_far = cost_so_far.estimate(_Keyed(row["id"]))  # billing's, through portal.extensions
        data["cost_so_far"] = None if so_far is None else str(so_far)
        return data


class RequestCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    project = serializers.CharField(max_length=63, required=False, help_text="Project slug; with a token, defaults to its project.")
    template = IdOrNameField(max_length=60, help_text="Template id, or slug (its newest active version).")
    image = serializers.CharField(max_length=300, required=False, allow_blank=True)
    flavor = serializers.CharField(max_length=63, required=False, help_text="Flavor name; default: the template's first.")
    gpus = serializers.IntegerField(min_value=0, required=False)
    replicas = serializers.IntegerField(min_value=1, required=False)
    cpu = serializers.DecimalField(max_digits=6, decimal_places=2, min_value=0, required=False)
    memory_gib = serializers.IntegerField(min_value=1, required=False)
    share_memory_gib = serializers.DecimalField(
        required=False, max_digits=8, decimal_places=3, min_value=Decimal("0.001"),
        help_text="HAMi flavors: GPU memory of each vGPU in GiB, at most one card's (default: the flavor's preset).")
    share_cores_percent = serializers.IntegerField(
        required=False, min_value=1, max_value=100,
        help_text="HAMi flavors: each vGPU's % of a card's cores, 1 to 100 (default: the flavor's preset).")
    share_preset = serializers.BooleanField(
        required=False, help_text="HAMi flavors: true for the flavor's preset share (then give no size), false for a "
                                  "size of your own. Default: the preset unless a size is given.")
    parameters = JSONObjectField(required=False, help_text="Checked against the template's parameters_schema.")
    duration_hours = serializers.IntegerField(min_value=1, required=False)
    priority = serializers.ChoiceField(choices=Priority.choices, required=False)
    name = serializers.CharField(max_length=40, required=False, allow_blank=True)
    # Federation (docs/federation.md): what the job accepts and needs; checked before anything is dispatched.
    accepted_models = serializers.ListField(
        child=serializers.CharField(max_length=40), required=False, max_length=8,
        help_text="GPU models the job accepts, preferred first (e.g. [\"h100-80gb\", \"a100-80gb\"]); the first is "
                  "the flavor's model. Default: the flavor's model only.")
    min_gpu_memory_gib = serializers.IntegerField(required=False, min_value=1, max_value=4096,
                                                  help_text="GPU memory per card the image needs, in GiB.")
    min_compute_capability = serializers.RegexField(
        r"^\d{1,2}\.\d$", required=False, allow_blank=True, help_text="CUDA compute capability the image needs, e.g. 8.0.",
        error_messages={"invalid": "A CUDA compute capability such as 8.0 or 9.0."})
    spill_consent = serializers.BooleanField(
        required=False, help_text="The job may run on a later accepted model when its first is full (and the "
                                  "project allows it). Default: false: it waits for its first model.")
    topology = serializers.ChoiceField(
        choices=REQUEST_TOPOLOGIES, required=False, allow_blank=True,
        help_text="Distributed training (2 or more workers) on a flavor of a cluster with racks and blocks: place "
                  "every pod within one rack or block (it waits until one has room), or prefer one rack. Default: "
                  "anywhere.")


class CloneSerializer(StrictSerializerMixin, serializers.Serializer):
    name = serializers.CharField(max_length=40, required=False, allow_blank=True, default="",
                                 help_text="The new request's name; empty: a new one is made up.")


class PresetSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    template = serializers.CharField(source="template_slug", read_only=True, help_text="Template slug (its live version).")
    values = JSONObjectField(read_only=True, help_text="What a submission from the preset sends: any of flavor, image, "
                                                       "gpus, replicas, cpu, memory_gib, duration_hours, priority, parameters.")

    class Meta:
        model = RequestPreset
        fields = ["id", "name", "project", "template", "values", "created_at", "updated_at"]
        read_only_fields = fields


class PresetWriteSerializer(StrictSerializerMixin, serializers.Serializer):
    """A preset: its name, project and template, and the values of ``POST /requests/`` it keeps (the request's
    own name excepted). Saving under a name you already use in the project replaces that preset."""

    name = serializers.CharField(max_length=60, help_text="The preset's name, unique per user and project.")
    project = serializers.CharField(max_length=63, required=False, help_text="Project slug; with a token, defaults to its project.")
    template = serializers.CharField(max_length=50, help_text="Template slug.")
    image = serializers.CharField(max_length=300, required=False, allow_blank=True)
    flavor = serializers.CharField(max_length=63, required=False, allow_blank=True, help_text="Flavor name.")
    gpus = serializers.IntegerField(min_value=0, required=False)
    replicas = serializers.IntegerField(min_value=1, required=False)
    cpu = serializers.DecimalField(max_digits=6, decimal_places=2, min_value=0, required=False)
    memory_gib = serializers.IntegerField(min_value=1, required=False)
    parameters = JSONObjectField(required=False)
    duration_hours = serializers.IntegerField(min_value=1, required=False)
    priority = serializers.ChoiceField(choices=Priority.choices, required=False)
    topology = serializers.ChoiceField(choices=REQUEST_TOPOLOGIES, required=False, allow_blank=True,
                                       help_text="Placement of distributed training: within one rack or block, or "
                                                 "prefer one rack.")


class CommentSerializer(StrictSerializerMixin, serializers.Serializer):
    comment = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


REJECT_REASON = "Say why it is rejected: the requester sees the reason."


class RejectSerializer(StrictSerializerMixin, serializers.Serializer):
    comment = serializers.CharField(
        max_length=1000, help_text="Why it is rejected (required): the requester sees it.",
        error_messages={"required": REJECT_REASON, "blank": REJECT_REASON},
    )


class BulkDecisionSerializer(StrictSerializerMixin, serializers.Serializer):
    decision = serializers.ChoiceField(choices=["approve", "reject"])
    comment = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="",
                                    help_text="For every item; required to reject (the reason the requesters see).")
    requests = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False, default=list,
                                     max_length=100, help_text="Workload request ids.")
    extension_requests = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False,
                                               default=list, max_length=100, help_text="Extension request ids.")
    quota_requests = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False, default=list,
                                           max_length=100, help_text="Quota request ids.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not (attrs["requests"] or attrs["extension_requests"] or attrs["quota_requests"]):
            raise serializers.ValidationError({"requests": ["Name at least one request, extension request or quota request."]})
        if attrs["decision"] == "reject" and not attrs["comment"].strip():
            raise serializers.ValidationError({"comment": [REJECT_REASON]})
        return attrs


class BulkItemErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    field = serializers.CharField(allow_null=True)


class BulkItemSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["request", "extension_request", "quota_request"])
    id = serializers.IntegerField()
    ok = serializers.BooleanField()
    status = serializers.CharField(help_text="Its state or status afterwards; empty when not found.")
    label = serializers.CharField()
    error = BulkItemErrorSerializer(required=False, help_text="Why this one was not decided (absent when ok).")


class BulkResultSerializer(serializers.Serializer):
    decision = serializers.CharField()
    done = serializers.IntegerField()
    failed = serializers.IntegerField()
    results = BulkItemSerializer(many=True)


class WaitingSerializer(serializers.Serializer):
    requests = serializers.IntegerField(help_text="Workload requests and extension requests waiting for you.")
    quota_requests = serializers.IntegerField(help_text="Quota requests waiting for you.")
    total = serializers.IntegerField()


class ReasonSerializer(StrictSerializerMixin, serializers.Serializer):
    reason = serializers.CharField(max_length=400, required=False, allow_blank=True, default="")


class ExtendSerializer(StrictSerializerMixin, serializers.Serializer):
    hours = serializers.IntegerField(min_value=1, max_value=24 * 366)


class ScaleSerializer(StrictSerializerMixin, serializers.Serializer):
    replicas = serializers.IntegerField(min_value=1, max_value=64)


class InboxSerializer(RequestSerializer):
    context = serializers.DictField(
        read_only=True,
        help_text="quota (the project's rows for this flavor), in_use, waiting_ahead, cost_estimate (null without a price list)."
    )

    class Meta(RequestSerializer.Meta):
        fields = RequestSerializer.Meta.fields + ["context"]
        read_only_fields = fields

    def row_json(self, row: dict[str, Any], flavors: RowFlavors | _KnownFlavor) -> dict[str, Any]:
        """A row of ``selectors.request_rows(..., also=("project_id",))`` with its context put in it
        (``selectors.with_approval_context_rows``): the request's JSON and its ``context``, whose cost estimate is
        the request's."""
        data = super().row_json(row, flavors)
        data["context"] = selectors.approval_context_of(
            quota_rows=row["quota_rows"], flavor_id=row["flavor_id"], in_use=row["in_use"],
            waiting_ahead=row["waiting_ahead"], cost_estimate=data["cost_estimate"])
        return data


class LogsQuerySerializer(serializers.Serializer):
    tail = serializers.IntegerField(min_value=1, max_value=5000, required=False, default=200,
                                    help_text="Lines per pod (the last ones).")


class PodLogSerializer(serializers.Serializer):
    name = serializers.CharField()
    phase = serializers.CharField()
    node = serializers.CharField()
    log = serializers.CharField(allow_null=True, help_text="Null when the pod is gone.")


class RequestLogsSerializer(serializers.Serializer):
    pods = PodLogSerializer(many=True)


# What RequestSerializer / RequestDetailSerializer write a row with (``selectors.request_rows``): no model instance
# per row. The model's own columns go through the serializers' own declared fields (dates, decimals).

_ROW_FIELDS: dict[str, serializers.Field] = {}


def _row_fields() -> dict[str, serializers.Field]:
    if not _ROW_FIELDS:
        _ROW_FIELDS.update(RequestDetailSerializer().fields)
        _ROW_FIELDS.update({f"event_{name}": field for name, field in RequestEventSerializer().fields.items()})
        _ROW_FIELDS.update({f"ext_{name}": field for name, field in ExtensionRequestSerializer().fields.items()})
    return _ROW_FIELDS


def _plain(fields: dict[str, serializers.Field], name: str, value: Any) -> Any:
    return None if value is None else fields[name].to_representation(value)


_DATE_COLUMNS = ("created_at", "updated_at", "approved_at", "queued_at", "started_at", "finished_at", "expires_at")


def _iso_dates(fields: dict[str, serializers.Field], row: dict[str, Any], names: tuple[str, ...],
               zone: Any = None) -> dict[str, Any]:
    """``DateTimeField.to_representation`` of each column, without its per-value work: the current time zone is
    looked up once (``zone``: a page's, looked up once for all its rows), not per value. The same text (ISO 8601 in
    the current time zone, ``Z`` for UTC) while the fields keep DRF's default format; otherwise each goes through
    its field."""
    if not _iso_fields(fields, names):
        return {name: _plain(fields, name, row[name]) for name in names}
    if zone is None:
        zone = timezone.get_current_timezone()
    # In UTC (the default), a value read from PostgreSQL is already in it (datetime.UTC): written as it is.
    utc = zone is UTC or getattr(zone, "key", None) == "UTC"
    out = {}
    for name in names:
        value = row[name]
        if value is None:
            out[name] = None
            continue
        if not (utc and value.tzinfo is UTC):
            value = value.astimezone(zone) if value.utcoffset() is not None else timezone.make_aware(value, zone)
        text = value.isoformat()
        out[name] = text[:-6] + "Z" if text.endswith("+00:00") else text
    return out


_ISO_OK: dict[tuple[str, ...], bool] = {}


def _iso_fields(fields: dict[str, serializers.Field], names: tuple[str, ...]) -> bool:
    ok = _ISO_OK.get(names)
    if ok is None:
        ok = _ISO_OK[names] = settings.USE_TZ and all(
            isinstance(fields[name], serializers.DateTimeField) and not hasattr(fields[name], "timezone")
            and str(getattr(fields[name], "format", api_settings.DATETIME_FORMAT)).lower() == ISO_8601
            for name in names)
    return ok


class _PendingView:
    """What ``selectors.request_pending_reason`` reads of a request, from a row."""

    __slots__ = ("state", "pending_reason", "updated_at", "project", "gpus", "flavor", "replicas", "slug")

    def __init__(self, row: dict[str, Any]) -> None:
        self.state, self.pending_reason, self.updated_at = row["state"], row["pending_reason"], row["updated_at"]
        self.gpus, self.replicas = row["gpus"], row["replicas"]
        self.project = self
        self.slug = row["project_slug"]
        self.flavor = row["flavor_display_name"] or row["flavor_name"]  # str(Flavor)


class _EstimateView:
    """What a cost estimator reads of a request (``portal.extensions``), from a row; its flavor is read (for the
    whole page at once, see ``RowFlavors``) only when the estimator asks for it."""

    __slots__ = ("pk", "tenant", "project", "template", "gpus", "replicas", "cpu", "memory_gib",
                 "duration_hours", "priority", "parameters", "kind", "hami_share", "_flavor_id", "_flavors")

    def __init__(self, row: dict[str, Any], flavors: RowFlavors) -> None:
        self.pk = row["id"]
        self.tenant = _Keyed(row["tenant_id"])
        self.project = None
        self.kind = row["template_kind"]
        self.template = self
        self._flavor_id, self._flavors = row["flavor_id"], flavors
        self.gpus, self.replicas, self.cpu = row["gpus"], row["replicas"], row["cpu"]
        self.memory_gib, self.duration_hours = row["memory_gib"], row["duration_hours"]
        self.priority, self.parameters = row["priority"], row["parameters"]
        self.hami_share = (row["share_memory_mib"], row["share_cores_percent"])

    @property
    def flavor(self) -> Flavor | None:
        return self._flavors.get(self._flavor_id)


class _Keyed:
    __slots__ = ("pk", "id")

    def __init__(self, pk: int) -> None:
        self.pk = self.id = pk


class RowFlavors:
    """The flavors of a page of rows, read in one query the first time an estimate needs one (never while
    there is no price list)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._ids = {row["flavor_id"] for row in rows}
        self._flavors: dict[int, Flavor] | None = None
        self.zone = timezone.get_current_timezone()  # the page's dates are written in it (looked up once a page)

    def get(self, flavor_id: int) -> Flavor | None:
        if self._flavors is None or flavor_id not in self._flavors:
            self._flavors = selectors.flavors_by_id(self._ids | {flavor_id})
        return self._flavors.get(flavor_id)


class _KnownFlavor:
    """``RowFlavors`` for one request whose flavor is in memory already: no query."""

    def __init__(self, flavor: Flavor | None) -> None:
        self._flavor = flavor
        self.zone = None  # one row: looked up by _iso_dates

    def get(self, flavor_id: int) -> Flavor | None:
        return self._flavor


def _related(obj: Any, name: str) -> Any:
    return None if obj is None else getattr(obj, name)


def request_row(req: WorkloadRequest, *, detail: bool = False) -> dict[str, Any]:
    """A request in memory as a row of ``selectors.request_rows`` (``detail``: of ``detail=True``), from its related
    objects as they are (a submission's, written by the service, or the inbox's, read with them). A request just
    submitted carries the entries the service wrote (``written_timeline``): not read again, and no extension yet."""
    row = {name: getattr(req, name) for name in selectors.REQUEST_ROW_COLUMNS}
    project, template, flavor = req.project, req.template, req.flavor
    approved_by = req.approved_by if req.approved_by_id is not None else None
    row.update(
        tenant_slug=req.tenant.slug, project_slug=project.slug, project_cluster_namespace=project.cluster_namespace,
        template_kind=_related(template, "kind"), template_slug=_related(template, "slug"),
        template_version=_related(template, "version"), template_name=_related(template, "name"),
        flavor_name=_related(flavor, "name"), flavor_display_name=_related(flavor, "display_name"),
        requested_by_username=_related(req.requested_by, "username"),
        approved_by_username=_related(approved_by, "username"),
    )
    if not detail:
        return row
    # The flavor's cluster when it is the request's (a submission's, in memory), else the request's own.
    cluster = flavor.cluster if flavor is not None and flavor.cluster_id == req.cluster_id else req.cluster
    written = getattr(req, "written_timeline", None)
    events = selectors.request_timeline_rows(req.pk) if written is None else [
        {"at": e.at, "from_state": e.from_state, "to_state": e.to_state, "actor_label": e.actor_label,
         "message": e.message} for e in written]
    row.update(
        cluster_status=req.cluster_status, project_id=req.project_id, cluster_name=cluster.name,
        cluster_zone=cluster.zone, flavor_gpu_model=_related(flavor, "gpu_model"),
        redispatched_from_name=req.redispatched_from.name if req.redispatched_from_id else None,
        timeline=list(events), has_extension_requests=written is None,
        **{k: getattr(req, k) for k in selectors.PLACEMENT_COLUMNS},
    )
    return row

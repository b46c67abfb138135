"""REST API for MIG changes (``/api/v1/mig-changes/``): ops and tenant admins (docs/mig-changes.md).

Reads start from ``maintenance.selectors`` (ops: every change; a tenant admin: their tenant's proposals; others:
403 on the list, 404 by id); writes go through ``maintenance.services``.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api import DateTimeField, StrictSerializerMixin
from portal.exceptions import Invalid, NotAllowed
from tenants.guards import actor_of

from .. import policy, selectors, services
from ..filters import MigChangeFilter
from ..models import MigChange, MigChangeStep


class StepSerializer(serializers.ModelSerializer):
    class Meta:
        model = MigChangeStep
        fields = ["seq", "step", "outcome", "message", "detail", "at"]
        read_only_fields = fields


class MigChangeSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    pool = serializers.CharField(source="pool_name", read_only=True)
    tenant = serializers.CharField(source="tenant.slug", read_only=True, allow_null=True, default=None)
    proposed_by = serializers.CharField(source="proposed_by.username", read_only=True)
    approved_by = serializers.CharField(source="approved_by.username", read_only=True, allow_null=True, default=None)
    nodes = serializers.ListField(child=serializers.CharField(), read_only=True)
    impact = serializers.JSONField(read_only=True, help_text="Capacity per flavor before/after, the quota plan, the "
                                                             "running requests on the nodes (shown before approval).")
    rollback = serializers.JSONField(read_only=True)

    def to_representation(self, instance: MigChange) -> dict[str, Any]:
        data = super().to_representation(instance)
        request = self.context.get("request")
        if request is not None:  # the rows of other tenants only for ops (docs/security.md)
            data["impact"] = selectors.impact_for(data["impact"], actor=actor_of(request))
        return data

    class Meta:
        model = MigChange
        fields = ["id", "cluster", "pool", "nodes", "gpu_model", "gpus_per_node", "from_layout", "to_layout", "tenant",
                  "reason", "proposed_by", "approved_by", "decided_at", "decision_comment", "window_start", "deadline",
                  "status", "status_reason", "step", "progress", "impact", "rollback", "created_at", "started_at",
                  "finished_at"]
        read_only_fields = fields


class MigChangeDetailSerializer(MigChangeSerializer):
    steps = StepSerializer(many=True, read_only=True)

    class Meta(MigChangeSerializer.Meta):
        fields = [*MigChangeSerializer.Meta.fields, "steps"]
        read_only_fields = fields


class ProposeSerializer(StrictSerializerMixin, serializers.Serializer):
    pool = serializers.IntegerField(min_value=1, max_value=2**31 - 1, help_text="The MIG node pool's id.")
    to_layout = serializers.CharField(max_length=60, help_text="e.g. all-1g.10gb, all-3g.40gb, all-balanced, all-disabled.")
    window_start = DateTimeField(help_text="When the window opens (the nodes are cordoned then).")
    deadline = DateTimeField(help_text="Running work still on the nodes then is stopped; its owners are told.")
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    tenant = serializers.SlugField(required=False, help_text="Tenant admins: the tenant proposing (default: your only one).")


class MigDecisionSerializer(StrictSerializerMixin, serializers.Serializer):
    comment = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class MigChangeViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """MIG layout changes of node pools: proposals with their impact, decisions, and the window's progress."""

    queryset = MigChange.objects.none()
    serializer_class = MigChangeSerializer
    filterset_class = MigChangeFilter
    ordering_fields = ["created_at", "window_start", "id"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular building the schema
            return MigChange.objects.none()
        actor = actor_of(self.request)
        if not policy.may_view_mig_changes(actor):
            raise NotAllowed("MIG changes are for platform ops and tenant admins.")
        qs = selectors.mig_changes_for(actor=actor)
        if self.action == "retrieve":
            qs = qs.prefetch_related("steps")
        return qs

    def get_serializer_class(self):
        return MigChangeDetailSerializer if self.action == "retrieve" else MigChangeSerializer

    @extend_schema(request=ProposeSerializer, responses={201: MigChangeDetailSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        actor = actor_of(request)
        if not policy.may_view_mig_changes(actor):
            raise NotAllowed("MIG changes are proposed by platform ops and tenant admins.")
        data = ProposeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        pool = selectors.mig_pool_get(actor=actor, pk=values.pop("pool"))
        if pool is None:
            raise Invalid("No such MIG pool (or your tenant does not use it).", field="pool")
        tenant = None
        slug = values.pop("tenant", None)
        if slug:
            tenant = selectors.admin_tenants_for(actor=actor).filter(slug=slug).first()
            if tenant is None:
                raise Invalid("No such tenant among those you administer.", field="tenant")
        change = services.mig_change_propose(actor=actor, pool=pool, tenant=tenant, **values)
        return Response(MigChangeDetailSerializer(change, context={"request": request}).data, status=status.HTTP_201_CREATED)

    def _decide(self, request: Request, fn: Any, **extra: Any) -> Response:
        change = self.get_object()
        data = MigDecisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        change = fn(actor=actor_of(request), change=change, **{k: data.validated_data["comment"] for k in extra})
        return Response(MigChangeSerializer(change, context={"request": request}).data)

    @extend_schema(request=MigDecisionSerializer, responses={200: MigChangeSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, services.mig_change_approve, comment=True)

    @extend_schema(request=MigDecisionSerializer, responses={200: MigChangeSerializer})
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, services.mig_change_reject, comment=True)

    @extend_schema(request=MigDecisionSerializer, responses={200: MigChangeSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, services.mig_change_cancel, reason=True)

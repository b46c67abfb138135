"""REST API for statements (finance tooling): list, detail with lines, CSV, and a draft on demand.

Scoped by ``statements.statements_for``: tenant admins their tenants', ops everyone's; anyone else a 404."""

from __future__ import annotations

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api import StrictSerializerMixin
from portal.exceptions import Invalid
from tenants.guards import actor_of

from .. import statements
from ..filters import StatementFilter
from ..models import Statement, StatementLine


class StatementLineSerializer(serializers.ModelSerializer):
    project = serializers.CharField(source="project_slug", read_only=True)

    class Meta:
        model = StatementLine
        fields = ["project", "unit", "key", "period_start", "period_end", "quantity", "unit_price", "gross",
                  "discount_percent", "amount"]
        read_only_fields = fields


class StatementSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    month = serializers.SerializerMethodField()

    class Meta:
        model = Statement
        fields = ["id", "number", "tenant", "month", "status", "mode", "cost_centre", "currency", "subtotal", "discount",
                  "total", "generated_at", "finalised_at"]
        read_only_fields = fields

    def get_month(self, obj: Statement) -> str:
        return f"{obj.month:%Y-%m}"


class ProjectTotalSerializer(serializers.Serializer):
    project = serializers.CharField()
    total = serializers.DecimalField(max_digits=16, decimal_places=2)


class StatementDetailSerializer(StatementSerializer):
    lines = StatementLineSerializer(many=True, read_only=True)
    projects = serializers.SerializerMethodField()

    class Meta(StatementSerializer.Meta):
        fields = [*StatementSerializer.Meta.fields, "projects", "lines"]
        read_only_fields = fields

    @extend_schema(responses=ProjectTotalSerializer(many=True))
    def get_projects(self, obj: Statement) -> list[dict]:
        return [{"project": g["project"], "total": f"{g['total']:.2f}"} for g in statements.lines_by_project(obj)]


class DraftSerializer(StrictSerializerMixin, serializers.Serializer):
    tenant = serializers.CharField(max_length=63, help_text="Tenant slug.")
    month = serializers.CharField(max_length=7, required=False, help_text="YYYY-MM; this month by default.")


class StatementViewSet(viewsets.ReadOnlyModelViewSet):
    """Monthly statements per tenant: lines per project x unit x price window, totals, discount, cost centre.
    A draft is recomputed by ``POST draft/``; final ones are numbered and never change."""

    queryset = Statement.objects.none()
    filterset_class = StatementFilter
    ordering_fields = ["month", "total"]

    def get_queryset(self):
        qs = statements.statements_for(actor=actor_of(self.request))
        return qs.prefetch_related("lines") if self.action != "list" else qs

    def get_serializer_class(self):
        return StatementSerializer if self.action == "list" else StatementDetailSerializer

    @extend_schema(responses={(200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="The statement as CSV.")})
    @action(detail=True, methods=["get"], url_path="csv")
    def csv(self, request: Request, pk: str | None = None) -> HttpResponse:
        statement = self.get_object()
        response = HttpResponse(statements.csv_of(statement), content_type="text/csv; charset=utf-8")
        name = statement.number or f"draft-{statement.tenant.slug}-{statement.month:%Y-%m}"
        response["Content-Disposition"] = f'attachment; filename="statement-{name}.csv"'
        return response

    @extend_schema(request=DraftSerializer, responses={200: StatementDetailSerializer})
    @action(detail=False, methods=["post"], url_path="draft")
    def draft(self, request: Request) -> Response:
        actor = actor_of(request)
        data = DraftSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = statements.statement_tenants_for(actor=actor).filter(slug=data.validated_data["tenant"]).first()
        if tenant is None:
            raise Invalid("No such tenant.", field="tenant")
        month = data.validated_data.get("month")
        statement = statements.statement_draft(actor=actor, tenant=tenant,
                                               month=statements.parse_month(month) if month else timezone.now().date())
        return Response(StatementDetailSerializer(statement).data, status=status.HTTP_200_OK)

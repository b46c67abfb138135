"""REST API for budgets (``/api/v1/budgets/``) and aggregated costs (``/api/v1/costs/``), scoped per actor:
a project's members see their project, tenant admins their tenant, ops everything (docs/billing.md,
"Budgets and cost views")."""

from __future__ import annotations

from datetime import datetime

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api import DateTimeField, StrictSerializerMixin
from portal.exceptions import Invalid
from portal.quantities import round_money
from tenants.guards import actor_of
from tenants.selectors import projects_for, tenants_for

from .. import budgets, costs, selectors
from ..models import Budget, Unit


class BudgetSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    project = serializers.CharField(source="project.slug", read_only=True, allow_null=True, default=None)
    currency = serializers.SerializerMethodField()
    spent = serializers.SerializerMethodField(help_text="This month's spend so far (closed and running usage).")
    remaining = serializers.SerializerMethodField()
    forecast = serializers.SerializerMethodField(help_text="Month-end spend if the burn so far goes on (linear).")

    class Meta:
        model = Budget
        fields = ["id", "tenant", "project", "amount", "currency", "thresholds", "refuse_when_spent", "spent",
                  "remaining", "forecast", "created_at", "updated_at"]
        read_only_fields = fields

    def _status(self, budget: Budget) -> budgets.Status:
        found = self.context.get("statuses", {}).get(budget.pk)
        return found if found is not None else budgets.status_of(budget)

    def get_currency(self, budget: Budget) -> str:
        return selectors.currency()

    def get_spent(self, budget: Budget) -> str:
        return str(round_money(self._status(budget).spent))

    def get_remaining(self, budget: Budget) -> str:
        return str(self._status(budget).remaining)

    def get_forecast(self, budget: Budget) -> str:
        return str(round_money(self._status(budget).forecast))


class BudgetWriteSerializer(StrictSerializerMixin, serializers.Serializer):
    tenant = serializers.SlugField(required=False, help_text="The tenant's slug (on create).")
    project = serializers.SlugField(required=False, allow_null=True, help_text="A project's slug for a project budget.")
    amount = serializers.DecimalField(max_digits=14, decimal_places=2, help_text="Per month, in the billing currency.")
    thresholds = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=1000), required=False,
                                       min_length=1, max_length=10, help_text="Alert percentages (default 50, 80, 100).")
    refuse_when_spent = serializers.BooleanField(required=False, help_text="Ops only: refuse new submissions once spent.")


class BudgetViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin,
                    viewsets.ReadOnlyModelViewSet):
    """Monthly budgets with this month's spend, remaining and forecast. Tenant admins set their tenant's and its
    projects'; project admins their project's; only ops switch ``refuse_when_spent``."""

    queryset = Budget.objects.none()
    serializer_class = BudgetSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return budgets.budgets_for(actor=actor_of(self.request))

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if self.action == "list":  # one aggregate query for the page, not one per budget
            page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
            context["statuses"] = {s.budget.pk: s for s in budgets.spends(list(page or []))}
        return context

    @extend_schema(request=BudgetWriteSerializer, responses={201: BudgetSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = BudgetWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        project_slug = values.pop("project", None)
        tenant_slug = values.pop("tenant", None)
        project = None
        if project_slug:
            project = projects_for(actor=actor).select_related("tenant").filter(slug=project_slug).first()
            if project is None:
                raise Invalid("No such project.", field="project")
            tenant = project.tenant
            if tenant_slug and tenant_slug != tenant.slug:
                raise Invalid("The project is not in this tenant.", field="project")
        else:
            tenant = tenants_for(actor=actor).filter(slug=tenant_slug or "").first()
            if tenant is None:
                raise Invalid("No such tenant." if tenant_slug else "Name the tenant (or a project).", field="tenant")
        budget = budgets.budget_create(actor=actor, tenant=tenant, project=project, **values)
        return Response(BudgetSerializer(budget).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=BudgetWriteSerializer, responses={200: BudgetSerializer})
    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        budget = self.get_object()
        data = BudgetWriteSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        for fixed in ("tenant", "project"):
            if fixed in values:
                raise Invalid("A budget's tenant and project do not change; remove it and add another.", field=fixed)
        budget = budgets.budget_update(actor=actor_of(request), budget=budget, **values)
        return Response(BudgetSerializer(budget).data)

    @extend_schema(exclude=True)
    def update(self, request: Request, *args, **kwargs) -> Response:
        return self.partial_update(request, *args, **kwargs)

    def destroy(self, request: Request, *args, **kwargs) -> Response:
        budgets.budget_delete(actor=actor_of(request), budget=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class CostQuery(StrictSerializerMixin, serializers.Serializer):
    since = DateTimeField(required=False, help_text="Start (default: the start of this month, UTC).")
    until = DateTimeField(required=False, help_text="End, exclusive (default: the end of this month).")
    tenant = serializers.SlugField(required=False)
    project = serializers.SlugField(required=False)
    flavor = serializers.CharField(required=False, max_length=100, help_text="Flavor name.")
    unit = serializers.ChoiceField(choices=Unit.choices, required=False)
    group_by = serializers.ChoiceField(choices=["tenant", "project", "flavor", "user", "unit", "day"], required=False,
                                       default="project")


class CostRowSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="The group's value (a slug, a flavor name, a username, a unit or a day).")
    cost = serializers.DecimalField(max_digits=16, decimal_places=2)


class CostSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    currency = serializers.CharField()
    group_by = serializers.CharField()
    total = serializers.DecimalField(max_digits=16, decimal_places=2)
    rows = CostRowSerializer(many=True)


class CostView(APIView):
    """Usage cost summed over what the caller sees (their requests' usage), grouped by tenant, project, flavor,
    user, unit or day, with filters. Open usage accrues up to now."""

    @extend_schema(parameters=[CostQuery], responses={200: CostSerializer})
    def get(self, request: Request) -> Response:
        actor = actor_of(request)
        query = CostQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        month_since, month_until = costs.month_bounds()
        since: datetime = q.get("since") or month_since
        until: datetime = q.get("until") or month_until
        # An empty window (``until`` at or before ``since``) costs nothing, as an empty date range lists nothing
        # elsewhere in the API; it is not an error a read should refuse.
        intervals = selectors.usage_for(actor=actor) if until > since else selectors.usage_for(actor=actor).none()
        for name, lookup in (("tenant", "tenant__slug"), ("project", "project__slug"),
                             ("flavor", "request__flavor__name"), ("unit", "unit")):
            if q.get(name):
                intervals = intervals.filter(**{lookup: q[name]})
        rows = costs.cost_rows(intervals, since=since, until=until, by=(q["group_by"],))
        out = costs.labelled(rows, q["group_by"])
        return Response(CostSerializer({
            "since": since, "until": until, "currency": selectors.currency(), "group_by": q["group_by"],
            "total": round_money(sum((r["cost"] for r in rows), start=round_money(0))),
            "rows": [{"key": k, "cost": round_money(v)} for k, v in out],
        }).data)



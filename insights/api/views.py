"""REST API for the metrics: ``GET /api/v1/metrics/`` (definitions) and ``GET /api/v1/metrics/<key>/`` (one metric
for a period: table rows, chart points, columns and the note). Ops see every tenant; a tenant's admins their
tenant's slice; members, viewers and API tokens none (403). A tenant or project filter outside what the caller
sees is a 404, like every object they cannot see (docs/insights.md, "Pages, API and reports")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api import DateTimeField, Pagination, StrictSerializerMixin
from tenants.guards import actor_of
from tenants.selectors import tenants_for

from .. import policy, presentation, selectors
from ..registry import BUCKETS, GROUPS, Metric

PAGING = ("page", "page_size")


def _allowed(request: Request) -> Any:
    actor = actor_of(request)
    if not policy.may_view_some_metrics(actor):
        raise exceptions.PermissionDenied("Only platform ops and tenant admins see metrics (not through an API token).")
    return actor


class MetricDefinitionSerializer(serializers.Serializer):
    key = serializers.CharField()
    family = serializers.CharField(help_text="scheduling, fairness, efficiency or cost.")
    title = serializers.CharField()
    definition = serializers.CharField(help_text="What the metric measures, in one line.")
    groups = serializers.ListField(child=serializers.ChoiceField(choices=GROUPS), help_text="Its breakdowns (group_by).")


class MetricListView(generics.ListAPIView):
    """Every metric the portal computes, with its definition and breakdowns: ops and tenant admins."""

    serializer_class = MetricDefinitionSerializer
    pagination_class = Pagination
    filter_backends: list[Any] = []

    def get_queryset(self) -> list[Metric]:  # the registry, not a table
        if getattr(self, "swagger_fake_view", False):
            return []
        actor = _allowed(self.request)
        return selectors.metrics_for(ops_only=policy.may_view_all_metrics(actor))


class MetricQuery(StrictSerializerMixin, serializers.Serializer):
    start = DateTimeField(required=False, help_text="Start of the period (default: 7 whole UTC days before `end`).")
    end = DateTimeField(required=False, help_text="End, exclusive (default: the end of today, UTC). At most 400 days "
                                                  "after `start` (31 with hourly buckets).")
    group_by = serializers.ChoiceField(choices=GROUPS, required=False,
                                       help_text="The table's and the chart's breakdown (default: tenant for ops, "
                                                 "project for tenant admins); one of the metric's `groups`.")
    bucket = serializers.ChoiceField(choices=BUCKETS, required=False, default="day", help_text="The chart's time step.")
    cluster = serializers.CharField(required=False, max_length=63, help_text="Cluster name.")
    flavor = serializers.CharField(required=False, max_length=63, help_text="Flavor name (with `cluster` where "
                                                                              "several clusters have it).")
    tenant = serializers.SlugField(required=False, max_length=40, help_text="Tenant slug.")
    project = serializers.SlugField(required=False, max_length=63, help_text="Project slug.")


class MetricColumnSerializer(serializers.Serializer):
    key = serializers.CharField()
    title = serializers.CharField()
    unit = serializers.CharField(allow_blank=True)


class MetricRowSerializer(serializers.Serializer):
    group = serializers.CharField(help_text="The group's label (a tenant or project slug, a cluster, a flavor...).")
    group_id = serializers.CharField(allow_null=True, help_text="The group's id, as text (null when it has none).")
    values = serializers.DictField(child=serializers.FloatField(allow_null=True),
                                   help_text="Value per column key; null: not defined (e.g. no pending work).")


class MetricPointSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="The bucket's start.")
    series = serializers.CharField(help_text="The group the point belongs to.")
    value = serializers.FloatField(allow_null=True)


class MetricResultSerializer(serializers.Serializer):
    key = serializers.CharField()
    family = serializers.CharField()
    title = serializers.CharField()
    definition = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    group_by = serializers.CharField()
    bucket = serializers.CharField()
    note = serializers.CharField(allow_blank=True, help_text="Why a value is not defined, or other caveats.")
    seeded = serializers.BooleanField(help_text="The period includes seeded demo history.")
    chart_value = serializers.CharField(allow_blank=True, help_text="The column the chart draws.")
    columns = MetricColumnSerializer(many=True)
    count = serializers.IntegerField(help_text="How many rows in all (the rows are paginated).")
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    rows = MetricRowSerializer(many=True)
    points = MetricPointSerializer(many=True, help_text="The chart: one point per bucket and group (not paginated).")


class MetricView(generics.GenericAPIView):
    """One metric for a period, broken down by ``group_by``: the table (paginated ``rows``), the chart (``points``)
    and its ``note``. Ops see every tenant (``tenant`` narrows); a tenant admin sees their own tenant."""

    serializer_class = MetricResultSerializer
    pagination_class = Pagination
    filter_backends: list[Any] = []

    @extend_schema(parameters=[
        MetricQuery,
        OpenApiParameter("key", OpenApiTypes.STR, OpenApiParameter.PATH, description="The metric's key."),
        OpenApiParameter("page", OpenApiTypes.INT, description="Page of the rows, from 1."),
        OpenApiParameter("page_size", OpenApiTypes.INT, description="Rows per page (default 50, at most 500)."),
    ])
    def get(self, request: Request, key: str) -> Response:
        actor = _allowed(request)
        metric = selectors.metric_get(key, ops_only=policy.may_view_all_metrics(actor))
        if metric is None:  # unknown, or cluster-wide (ops only): not one of the caller's metrics
            raise exceptions.NotFound("No such metric.")
        data = {k: v for k, v in request.query_params.items() if k not in PAGING}
        checked = MetricQuery(data=data)
        checked.is_valid(raise_exception=True)
        v = checked.validated_data
        filters, tenants = self._filters(actor, metric, v)
        query = selectors.query_for(actor=actor, filters=filters, tenants=tenants)
        result = metric.compute(query)
        columns = presentation.columns_of(result)
        rows = [{"group": r.group, "group_id": None if r.group_id is None else str(r.group_id),
                 "values": {c[0]: presentation.number(r.values.get(c[0])) for c in columns}} for r in result.rows]
        paginator = self.paginator
        page = paginator.paginate_queryset(rows, request, view=self)
        return Response(MetricResultSerializer({
            "key": metric.key, "family": metric.family, "title": metric.title, "definition": metric.definition,
            "start": query.start, "end": query.end, "group_by": query.group_by, "bucket": query.bucket,
            "note": result.note, "seeded": selectors.seeded_in(query), "chart_value": result.chart_value,
            "columns": [{"key": k, "title": t, "unit": u} for k, t, u in columns],
            "count": paginator.page.paginator.count, "next": paginator.get_next_link(),
            "previous": paginator.get_previous_link(), "rows": page,
            "points": [{"at": p.at, "series": p.series, "value": presentation.number(p.value)} for p in result.points],
        }).data)

    def _filters(self, actor: Any, metric: Metric, v: dict[str, Any]) -> tuple[selectors.Filters, Any]:
        """The filters' objects (404 for what the caller cannot see) and the tenants in view (``None``: all)."""
        default_start, default_end = selectors.last_days()
        end = v.get("end") or (v["start"] + timedelta(days=selectors.DEFAULT_DAYS) if v.get("start") else default_end)
        start = v.get("start") or end - timedelta(days=selectors.DEFAULT_DAYS)
        problems = selectors.period_problems(start, end, v["bucket"])
        every = policy.may_view_all_metrics(actor)
        group_by = v.get("group_by") or selectors.group_for(metric, "tenant" if every else "project")
        if group_by not in metric.groups:
            problems["group_by"] = [f"This metric breaks down by {', '.join(metric.groups)}."]
        if problems:
            raise serializers.ValidationError(problems)
        tenant = None
        if v.get("tenant"):
            tenant = tenants_for(actor=actor).filter(slug=v["tenant"]).first()
            if tenant is None:
                raise exceptions.NotFound("No such tenant.")
            if not policy.may_view_metrics(actor, tenant):
                raise exceptions.PermissionDenied("Only the tenant's admins and platform ops see its metrics.")
        tenants = None if every else ([tenant] if tenant else list(selectors.metric_tenants_for(actor=actor)))
        project = None
        if v.get("project"):
            project = selectors.metric_projects_for(tenants=tenants).filter(slug=v["project"]).first()
            if project is None:
                raise exceptions.NotFound("No such project.")
            if tenant is not None and project.tenant_id != tenant.pk:
                raise serializers.ValidationError({"project": ["The project is not in this tenant."]})
        cluster = None
        if v.get("cluster"):
            cluster = selectors.metric_clusters_for(actor=actor).filter(name=v["cluster"]).first()
            if cluster is None:
                raise exceptions.NotFound("No such cluster.")
        flavor = None
        if v.get("flavor"):
            found = selectors.metric_flavors_for(actor=actor).filter(name=v["flavor"])
            found = list((found.filter(cluster=cluster) if cluster else found)[:2])
            if not found:
                raise exceptions.NotFound("No such flavor.")
            if len(found) > 1:
                raise serializers.ValidationError({"flavor": ["Several clusters have a flavor of this name; name the "
                                                              "cluster too."]})
            flavor = found[0]
        filters = selectors.Filters(start=start, end=end, group_by=group_by, bucket=v["bucket"], cluster=cluster,
                                    flavor=flavor, tenant=tenant, project=project)
        return filters, tenants

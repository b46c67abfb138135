"""The metric pages: ``/ops/metrics/`` (every tenant, ops) and ``/tenants/<slug>/metrics/`` (a tenant's own slice, its
admins): the overview by family, one metric's chart and table, and the per-period report (printable page and CSV).

Reads go through ``insights.selectors`` (the ``Query`` and its scope) and the metrics' own ``compute``; charts are
drawn by ``static/js/charts.js`` from JSON the page embeds (no inline script), and their numbers are in the tables."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse

from portal.ui import Pager
from tenants.access import Actor
from tenants.guards import actor_of, ops_only
from tenants.models import Tenant
from tenants.selectors import tenants_for
from tenants.ui import page

from . import memo, policy, presentation, reports, selectors
from .forms import MetricFilterForm
from .registry import Metric

FAMILIES = ["scheduling", "fairness", "efficiency", "cost", "measured"]
ROWS_PER_PAGE = 50


class _Where:
    """Ops' view of every tenant, or one tenant's slice: what to compute for and where the links go."""

    def __init__(self, actor: Actor, tenant: Tenant | None) -> None:
        self.actor = actor
        self.tenant = tenant
        self.tenants = None if tenant is None else [tenant]
        self.default_group = "tenant" if tenant is None else "project"
        # A tenant's pages leave out the cluster-wide metrics (every tenant's pools), even for ops looking there.
        self.ops_only = tenant is None

    def url(self, name: str, *args: Any) -> str:
        if self.tenant is None:
            return reverse(f"ops-{name}", args=args)
        return reverse(f"tenant-{name}", args=(self.tenant.slug, *args))

    def context(self) -> dict[str, Any]:
        return {"tab": "metrics", "tenant": self.tenant, "overview_url": self.url("metrics"),
                "report_url": self.url("metrics-report")}


def _ops(request: HttpRequest) -> _Where:
    return _Where(ops_only(request), None)


def _tenant(request: HttpRequest, slug: str) -> _Where:
    """404 for a tenant the actor does not see, 403 for one they see but may not read the metrics of."""
    actor = actor_of(request)
    tenant = get_object_or_404(tenants_for(actor=actor), slug=slug)
    if not policy.may_view_metrics(actor, tenant):
        raise PermissionDenied("Only the tenant's admins and platform ops see its metrics.")
    return _Where(actor, tenant)


def _form(request: HttpRequest, where: _Where, metric: Metric | None = None) -> MetricFilterForm:
    # A metric's page defaults to a breakdown it has (the pool metrics: cluster).
    default_group = selectors.group_for(metric, where.default_group) if metric else where.default_group
    return MetricFilterForm(request.GET,  # always bound: no parameters = the defaults
                            actor=where.actor, tenants=where.tenants, default_group=default_group)


def _query(where: _Where, filters: selectors.Filters, metric: Metric | None = None):
    group = selectors.group_for(metric, filters.group_by) if metric else filters.group_by
    return selectors.query_for(actor=where.actor, filters=filters, tenants=where.tenants, group_by=group)


def _overview(request: HttpRequest, where: _Where) -> HttpResponse:
    with memo.one_page():  # the metrics share their labels, scope and rollup plans
        return _overview_page(request, where)


def _overview_page(request: HttpRequest, where: _Where) -> HttpResponse:
    form = _form(request, where)
    context: dict[str, Any] = where.context() | {"form": form, "families": [], "seeded": False}
    if not form.is_valid():
        return page(request, "insights/overview.html", context, status=400)
    filters = form.filters(tenant=where.tenant)
    keep = request.GET.urlencode()
    metrics = selectors.metrics_for(ops_only=where.ops_only)
    names = FAMILIES + sorted({m.family for m in metrics} - set(FAMILIES))
    for family in names:
        items = []
        for metric in (m for m in metrics if m.family == family):
            result = metric.compute(_query(where, filters, metric))
            chart = presentation.chart_spec(metric, result, bucket=filters.bucket, small=True)
            items.append({"metric": metric, "result": result, "headline": presentation.headline(result),
                          "chart": chart, "url": where.url("metric", metric.key) + (f"?{keep}" if keep else "")})
        if items:
            context["families"].append({"name": family, "items": items})
    context |= {"seeded": selectors.seeded_in(_query(where, filters)), "period": form.period_label(), "keep": keep}
    return page(request, "insights/overview.html", context)


def _detail(request: HttpRequest, where: _Where, key: str) -> HttpResponse:
    metric = selectors.metric_get(key, ops_only=where.ops_only)
    if metric is None:
        raise Http404("No such metric (cluster-wide metrics are on the platform's metrics page only).")
    form = _form(request, where, metric)
    context: dict[str, Any] = where.context() | {"form": form, "metric": metric}
    ok = form.is_valid()
    if ok and form.cleaned_data.get("group_by") and form.cleaned_data["group_by"] not in metric.groups:
        form.add_error("group_by", f"This metric breaks down by {', '.join(metric.groups)}.")
        ok = False
    if not ok:
        return page(request, "insights/detail.html", context, status=400)
    filters = form.filters(tenant=where.tenant)
    query = _query(where, filters, metric)
    result = metric.compute(query)
    columns, rows = presentation.table(result)
    keep = request.GET.urlencode()
    context |= {
        "query": query, "result": result, "columns": columns, "pager": Pager(request, rows, per_page=ROWS_PER_PAGE,
                                                                               count=len(rows)),
        "chart": presentation.chart_spec(metric, result, bucket=filters.bucket), "headline": presentation.headline(result),
        "seeded": selectors.seeded_in(query), "period": form.period_label(), "keep": keep,
        "api_url": reverse("insights-api:metric", args=(metric.key,)),
    }
    return page(request, "insights/detail.html", context)


def _report(request: HttpRequest, where: _Where) -> HttpResponse:
    with memo.one_page():
        return _report_page(request, where)


def _report_page(request: HttpRequest, where: _Where) -> HttpResponse:
    form = _form(request, where)
    context: dict[str, Any] = where.context() | {"form": form, "sections": []}
    if not form.is_valid():
        return page(request, "insights/report.html", context, status=400)
    filters = form.filters(tenant=where.tenant)
    sections = reports.sections_of(selectors.metrics_for(ops_only=where.ops_only), lambda m: _query(where, filters, m))
    seeded = selectors.seeded_in(_query(where, filters))
    if request.GET.get("format") == "csv":
        response = HttpResponse(reports.csv_of(sections, start=filters.start, end=filters.end, seeded=seeded),
                                content_type="text/csv; charset=utf-8")
        name = f"{where.tenant.slug}-" if where.tenant else ""
        last = filters.end - timedelta(days=1)  # the last day included, as the page names the period
        response["Content-Disposition"] = (f'attachment; filename="metrics-{name}{filters.start:%Y%m%d}-'
                                           f'{last:%Y%m%d}.csv"')
        return response
    query = request.GET.copy()
    query["format"] = "csv"
    context |= {"sections": sections, "seeded": seeded, "period": form.period_label(), "csv_url": "?" + query.urlencode()}
    return page(request, "insights/report.html", context)


@login_required
def ops_metrics(request: HttpRequest) -> HttpResponse:
    return _overview(request, _ops(request))


@login_required
def ops_metric(request: HttpRequest, key: str) -> HttpResponse:
    return _detail(request, _ops(request), key)


@login_required
def ops_report(request: HttpRequest) -> HttpResponse:
    return _report(request, _ops(request))


@login_required
def tenant_metrics(request: HttpRequest, slug: str) -> HttpResponse:
    return _overview(request, _tenant(request, slug))


@login_required
def tenant_metric(request: HttpRequest, slug: str, key: str) -> HttpResponse:
    return _detail(request, _tenant(request, slug), key)


@login_required
def tenant_report(request: HttpRequest, slug: str) -> HttpResponse:
    return _report(request, _tenant(request, slug))

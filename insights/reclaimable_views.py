"""Reclaimable capacity (``insights/reclaimable.py``): the ops page (every tenant, sorted by what would be freed, with
a drill-down per tenant), a tenant admin's page of their own tenant, and the API twins ``GET /api/v1/reclaimable/``
and ``GET /api/v1/reclaimable/<tenant>/``.

Ops pages: 404 for everyone but ops. A tenant's page: 404 for a tenant the actor does not see, 403 for one they see
but whose metrics they may not read (``insights.policy.may_view_metrics``: its tenant admins and ops).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api import Pagination
from portal.ui import Pager
from tenants.access import Actor
from tenants.guards import actor_of, ops_only
from tenants.models import Tenant
from tenants.selectors import tenants_for
from tenants.ui import page

from . import policy, selectors
from .reclaimable import RequestLine, TenantLine, chart_of, reclaimable, totals

ROWS_PER_PAGE = 50
PAGE = {"type": "integer", "minimum": 1}  # page and page_size (portal.api.Pagination refuses less than 1)


def _tenant_for(actor: Actor, slug: str) -> Tenant:
    tenant = get_object_or_404(tenants_for(actor=actor), slug=slug)
    if not policy.may_view_metrics(actor, tenant):
        raise PermissionDenied("Only the tenant's admins and platform ops see its reclaimable capacity.")
    return tenant


def _one(tenant: Tenant) -> TenantLine:
    found = reclaimable(tenants=[tenant])
    return found[0] if found else TenantLine(tenant=tenant)


@login_required
def ops_reclaimable(request: HttpRequest) -> HttpResponse:
    ops_only(request)
    lines = reclaimable()
    pager = Pager(request, lines, per_page=ROWS_PER_PAGE, count=len(lines))
    return page(request, "insights/reclaimable.html", {
        "tab": "reclaimable", "ops_capacity_section": True, "pager": pager, "totals": totals(lines),
        "chart": chart_of(list(pager)), "api_url": reverse("insights-api:reclaimable"),
    })


def _tenant_page(request: HttpRequest, tenant: Tenant, *, ops_view: bool) -> HttpResponse:
    line = _one(tenant)
    pager = Pager(request, line.lines, per_page=ROWS_PER_PAGE, count=len(line.lines))
    return page(request, "insights/reclaimable_tenant.html", {
        "tab": "reclaimable" if ops_view else "metrics", "ops_capacity_section": ops_view, "ops_view": ops_view,
        "tenant": tenant, "line": line, "pager": pager,
        "api_url": reverse("insights-api:reclaimable-tenant", args=(tenant.slug,)),
    })


@login_required
def ops_reclaimable_tenant(request: HttpRequest, slug: str) -> HttpResponse:
    ops_only(request)
    return _tenant_page(request, get_object_or_404(Tenant, slug=slug), ops_view=True)


@login_required
def tenant_reclaimable(request: HttpRequest, slug: str) -> HttpResponse:
    return _tenant_page(request, _tenant_for(actor_of(request), slug), ops_view=False)


# ------------------------------------------------------------------------------------------------ API
class ReclaimableTenantSerializer(serializers.Serializer):
    tenant = serializers.CharField(help_text="The tenant's slug.")
    tenant_name = serializers.CharField()
    running = serializers.IntegerField(help_text="Running GPU requests.")
    running_with_suggestion = serializers.IntegerField(help_text="... of them with a rightsizing suggestion.")
    held_cards = serializers.FloatField(help_text="Card-equivalents the running requests hold now.")
    would_hold_cards = serializers.FloatField(help_text="... with every suggestion taken.")
    freed_cards = serializers.FloatField(help_text="Card-equivalents the suggestions would free now.")
    finished_with_suggestion = serializers.IntegerField(help_text="Runs finished in the last 7 days with a suggestion.")
    freed_gpu_hours_per_week = serializers.FloatField(help_text="GPU-hours their suggestions would have saved.")


class ReclaimableRequestSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    project = serializers.CharField()
    state = serializers.CharField()
    flavor = serializers.CharField()
    gpus = serializers.IntegerField()
    replicas = serializers.IntegerField()
    held_cards = serializers.FloatField()
    suggested_flavor = serializers.CharField()
    suggested_gpus = serializers.IntegerField()
    would_hold_cards = serializers.FloatField()
    freed_cards = serializers.FloatField(help_text="Freed while it runs (running requests).")
    saving_gpu_hours = serializers.FloatField(help_text="Per run: the difference in card share × replicas × hours.")
    evidence = serializers.CharField()


class ReclaimableTenantDetailSerializer(ReclaimableTenantSerializer):
    count = serializers.IntegerField(help_text="Requests with a suggestion in all (paginated).")
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    requests = ReclaimableRequestSerializer(many=True)


def _request_data(r: RequestLine) -> dict[str, Any]:
    req, s = r.request, r.suggestion
    return {"id": req.pk, "name": req.name, "project": req.project.slug, "state": req.state,
            "flavor": req.flavor.name, "gpus": req.gpus, "replicas": req.replicas, "held_cards": round(r.held, 2),
            "suggested_flavor": s.flavor.name if s.flavor else "", "suggested_gpus": s.gpus,
            "would_hold_cards": round(r.would_hold, 2), "freed_cards": round(r.freed, 2),
            "saving_gpu_hours": s.saving_gpu_hours, "evidence": s.evidence}


def _api_actor(request: Request) -> Actor:
    actor = actor_of(request)
    if not policy.may_view_some_metrics(actor):
        raise exceptions.PermissionDenied("Only platform ops and tenant admins see reclaimable capacity "
                                          "(not through an API token).")
    return actor


class ReclaimableView(generics.GenericAPIView):
    """What would be freed if every rightsizing suggestion were taken, by tenant, most freed first: ops see every
    tenant, a tenant admin the tenants they administer."""

    serializer_class = ReclaimableTenantSerializer
    pagination_class = Pagination
    filter_backends: list[Any] = []

    @extend_schema(parameters=[
        OpenApiParameter("page", PAGE, description="Page, from 1."),
        OpenApiParameter("page_size", PAGE, description="Rows per page (default 50; more than 500 is read as 500)."),
    ], responses={200: ReclaimableTenantSerializer(many=True)})
    def get(self, request: Request) -> Response:
        actor = _api_actor(request)
        tenants = None if policy.may_view_all_metrics(actor) else list(selectors.metric_tenants_for(actor=actor))
        rows = [x.as_data() for x in reclaimable(tenants=tenants)]
        got = self.paginate_queryset(rows)
        return self.get_paginated_response(ReclaimableTenantSerializer(got, many=True).data)


class ReclaimableTenantView(generics.GenericAPIView):
    """One tenant's reclaimable capacity with its requests that have a suggestion (evidence and suggestion)."""

    serializer_class = ReclaimableTenantDetailSerializer
    pagination_class = Pagination
    filter_backends: list[Any] = []

    @extend_schema(parameters=[
        OpenApiParameter("tenant", OpenApiTypes.STR, OpenApiParameter.PATH, description="The tenant's slug."),
        OpenApiParameter("page", PAGE, description="Page of the requests, from 1."),
        OpenApiParameter("page_size", PAGE, description="Requests per page (default 50; more than 500 is read as 500)."),
    ])
    def get(self, request: Request, tenant: str) -> Response:
        actor = _api_actor(request)
        found = tenants_for(actor=actor).filter(slug=tenant).first()
        if found is None:
            raise exceptions.NotFound("No such tenant.")
        if not policy.may_view_metrics(actor, found):
            raise exceptions.PermissionDenied("Only the tenant's admins and platform ops see its reclaimable capacity.")
        line = _one(found)
        paginator = self.paginator
        got = paginator.paginate_queryset([_request_data(r) for r in line.lines], request, view=self)
        return Response(ReclaimableTenantDetailSerializer(line.as_data() | {
            "count": paginator.page.paginator.count, "next": paginator.get_next_link(),
            "previous": paginator.get_previous_link(), "requests": got}).data)

"""REST API for clusters, flavors, quotas and quota requests. Querysets start from selectors;
writes go through services; a row the caller may not see is a 404."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view, inline_serializer
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.exceptions import Invalid
from portal.inputs import is_id
from tenants.access import Actor
from tenants.guards import actor_of, require_ops
from tenants.selectors import projects_for, tenants_for

from .. import selectors, services
from ..filters import ClusterFilter, FlavorFilter, QuotaFilter, QuotaRequestFilter
from ..models import Architecture, Cluster, Flavor, Quota, QuotaRequest
from .serializers import (
    ArchitectureChangeSerializer,
    ArchitectureChangeStartSerializer,
    ArchitectureStatusSerializer,
    ClusterReadSerializer,
    ClusterSerializer,
    DecisionSerializer,
    FlavorSerializer,
    FlavorUpdateSerializer,
    OvercommitRowSerializer,
    ProjectQuotaSerializer,
    QuotaRequestCreateSerializer,
    QuotaRequestSerializer,
    QuotaSerializer,
    QuotaSetSerializer,
    QuotaUpdateSerializer,
)


DETAIL_RESPONSE = OpenApiResponse(
    inline_serializer("Accepted", {"detail": serializers.CharField()}), description="Queued.",
)


def _require_ops(request: Request, message: str) -> Actor:
    """The caller, if they are ops (API views whose only service is ops-only)."""
    actor = actor_of(request)
    require_ops(actor, message)
    return actor


CLUSTER_UNREADABLE = OpenApiResponse(description="The cluster could not be read for the plan: `detail` says why.")


@contextmanager
def _cluster_unavailable_is_503() -> Iterator[None]:
    """A plan reads the cluster: when it cannot be read, say so (503) instead of failing with a 500."""
    from portal.kube import ClusterError

    try:
        yield
    except ClusterError as exc:
        error = exceptions.APIException(f"The cluster could not be read: {exc}", code="cluster_unavailable")
        error.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        raise error from exc


def flavor_find(*, actor: Actor, key: Any, cluster: str | None = None) -> Flavor:
    """A flavor the caller can see, by id or by name (plus cluster name when the name is ambiguous)."""
    flavors = selectors.flavors_for(actor=actor)
    if cluster:
        flavors = flavors.filter(cluster__name=cluster)
    key = str(key)
    found = list(flavors.filter(pk=int(key)) if is_id(key) else flavors.filter(name=key)[:2])
    if not found:
        raise Invalid(f"No such flavor: {key}.", field="flavor")
    if len(found) > 1:
        raise Invalid(f"Several clusters offer a flavor named {key}: give the cluster too.", field="cluster")
    return found[0]


CLUSTER_KEY = OpenApiParameter("id", str, OpenApiParameter.PATH, description="Numeric id or cluster name.")
FLAVOR_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="Flavor id.")


@contextmanager
def _manager_field() -> Iterator[None]:
    """The services name a worker's manager ``manager_id`` (the form's field); the API's field is ``manager``."""
    try:
        yield
    except Invalid as exc:
        if exc.field == "manager_id":
            raise Invalid(exc.message, field="manager") from exc
        raise


@extend_schema_view(
    list=extend_schema(responses=ClusterReadSerializer(many=True)),
    retrieve=extend_schema(responses=ClusterReadSerializer, parameters=[CLUSTER_KEY]),
)
class ClusterViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Clusters: everyone sees name and architecture; ops register and configure them."""

    queryset = Cluster.objects.none()  # for the OpenAPI schema; get_queryset() scopes

    filterset_class = ClusterFilter
    ordering_fields = ["name", "architecture", "created_at"]
    search_fields = ["name"]
    lookup_value_regex = "[^/]+"
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self):
        return selectors.clusters_for(actor=actor_of(self.request))

    def get_serializer_class(self):
        # Reads have one shape for everyone (ops-only keys are null for others); writes take the ops serializer.
        return ClusterReadSerializer if self.action in ("list", "retrieve") else ClusterSerializer

    def get_serializer_context(self) -> dict:
        context = super().get_serializer_context()
        context["ops"] = not getattr(self, "swagger_fake_view", False) and actor_of(self.request).is_ops
        return context

    def get_object(self):
        return selectors.lookup_by_id_or_name(self.get_queryset(), self.kwargs["pk"])

    @extend_schema(request=ClusterSerializer, responses={201: ClusterSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)  # the service refuses who may not (403)
        data = ClusterSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with _manager_field():
            cluster = services.cluster_create(actor=actor, **data.validated_data)
        return Response(ClusterSerializer(cluster).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ClusterSerializer, responses={200: ClusterSerializer}, parameters=[CLUSTER_KEY])
    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        cluster = self.get_object()
        actor = actor_of(request)  # the service refuses who may not (403)
        data = ClusterSerializer(cluster, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        with _manager_field():
            cluster = services.cluster_update(actor=actor, cluster=cluster, **data.validated_data)
        return Response(ClusterSerializer(cluster).data)

    @extend_schema(exclude=True)
    def update(self, request: Request, *args, **kwargs) -> Response:
        return self.partial_update(request, *args, **kwargs)

    @extend_schema(responses={200: OvercommitRowSerializer(many=True)}, parameters=[CLUSTER_KEY])
    @action(detail=True, methods=["get"], filter_backends=[])
    def overcommit(self, request: Request, pk: str | None = None) -> Response:
        """Per flavor and resource: promised to tenants, capacity that counts, and how far over. Paginated
        like every list (``page``, ``page_size``); the cluster list's filters do not apply here."""
        cluster = self.get_object()
        _require_ops(request, "Only platform ops see the cluster's promises.")
        rows = self.paginate_queryset(selectors.overcommit_for(cluster=cluster))
        return self.get_paginated_response(OvercommitRowSerializer(rows, many=True).data)


    @extend_schema(request=None, responses={202: DETAIL_RESPONSE}, parameters=[CLUSTER_KEY])
    @action(detail=True, methods=["post"])
    def sync(self, request: Request, pk: str | None = None) -> Response:
        """Read the cluster's nodes now (inventory sync), then reconcile its queues. Ops only; queued."""
        cluster = self.get_object()
        services.cluster_sync(actor=actor_of(request), cluster=cluster)  # the service refuses who may not (403)
        return Response({"detail": "Inventory sync and reconcile queued."}, status=202)

    @extend_schema(methods=["GET"], parameters=[OpenApiParameter("architecture", str, enum=list(Architecture.values),
                                                                 description="Also plan for this architecture.")],
                   responses={200: ArchitectureStatusSerializer, 503: CLUSTER_UNREADABLE})
    @extend_schema(methods=["POST"], request=ArchitectureChangeStartSerializer,
                   responses={202: ArchitectureChangeSerializer, 503: CLUSTER_UNREADABLE})
    @action(detail=True, methods=["get", "post"])
    def architecture(self, request: Request, pk: str | None = None) -> Response:
        """Ops: GET the latest architecture change and its progress (with ``?architecture=X``, also the plan
        to review, its fingerprint and the Workloads it moves); POST ``{architecture, fingerprint, policy}`` to start
        applying that plan (``policy``: drain, requeue or keep, for work admitted in queues it removes).
        A worker applies it under the cluster's reconcile lock; poll GET for its state."""
        from .. import architecture as architecture_service
        from ..reconcile import POLICIES, impact_text, plan_fingerprint

        cluster = self.get_object()
        actor = _require_ops(request, "Only platform ops change a cluster's architecture.")
        if request.method == "POST":
            data = ArchitectureChangeStartSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            with _cluster_unavailable_is_503():
                change = architecture_service.architecture_change_start(actor=actor, cluster=cluster, **data.validated_data)
            return Response(ArchitectureChangeSerializer(change).data, status=status.HTTP_202_ACCEPTED)
        wanted = request.query_params.get("architecture")
        plan = None
        if wanted:
            if wanted not in Architecture.values:
                raise Invalid("Choose one of the reference architectures.", field="architecture")
            with _cluster_unavailable_is_503():
                made = architecture_service.plan_for(cluster, wanted)
            plan = {"architecture": made.architecture, "fingerprint": plan_fingerprint(made), "summary": made.summary(),
                    "empty": made.empty, "text": made.text(),
                    "workloads": [e | {"effects": {p: impact_text(e, p) for p in POLICIES}} for e in made.impact or []]}
        change = selectors.architecture_change_latest(cluster)
        return Response(ArchitectureStatusSerializer({"change": change, "plan": plan}).data)


class FlavorViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Flavors on offer (ops also see deactivated ones). Ops create, change and deactivate them."""

    queryset = Flavor.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = FlavorSerializer
    filterset_class = FlavorFilter
    ordering_fields = ["name", "order", "kind", "cluster__name"]
    search_fields = ["name", "display_name", "gpu_product", "gpu_model"]
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self):
        return selectors.flavors_for(actor=actor_of(self.request))

    @extend_schema(request=FlavorSerializer, responses={201: FlavorSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)  # the service refuses who may not (403)
        data = FlavorSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        flavor = services.flavor_create(actor=actor, **data.validated_data)
        return Response(FlavorSerializer(flavor).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=FlavorUpdateSerializer, responses={200: FlavorSerializer})
    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        flavor = self.get_object()
        actor = actor_of(request)  # the service refuses who may not (403)
        data = FlavorUpdateSerializer(flavor, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        changes = dict(data.validated_data)
        if "cluster" in changes:
            changes["cluster"] = changes["cluster"].pk
        flavor = services.flavor_update(actor=actor, flavor=flavor, **changes)
        return Response(FlavorSerializer(flavor).data)

    @extend_schema(exclude=True)
    def update(self, request: Request, *args, **kwargs) -> Response:
        return self.partial_update(request, *args, **kwargs)

    @extend_schema(request=None, responses={200: FlavorSerializer})
    @action(detail=True, methods=["post"])
    def deactivate(self, request: Request, pk: str | None = None) -> Response:
        flavor = self.get_object()
        actor = actor_of(request)  # the service refuses who may not (403)
        return Response(FlavorSerializer(services.flavor_deactivate(actor=actor, flavor=flavor)).data)


class QuotaViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Quota rows you can see. ``POST`` sets (creates or replaces) one row: a tenant's (ops) or a
    project's (tenant admins, ops); ``PATCH`` changes a row's numbers."""

    serializer_class = QuotaSerializer
    filterset_class = QuotaFilter
    ordering_fields = ["tenant__slug", "project__slug", "flavor__name", "resource", "nominal", "updated_at"]
    search_fields = ["tenant__slug", "project__slug", "flavor__name", "resource"]
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Quota.objects.none()
        return selectors.quotas_for(actor=actor_of(self.request))

    @extend_schema(request=QuotaSetSerializer, responses={200: QuotaSerializer, 201: QuotaSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = QuotaSetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        tenant = project = None
        if values.get("project"):
            project = projects_for(actor=actor).filter(slug=values["project"]).first()
            if project is None:
                raise Invalid("No such project.", field="project")
        else:
            tenant = tenants_for(actor=actor).filter(slug=values["tenant"]).first()
            if tenant is None:
                raise Invalid("No such tenant.", field="tenant")
        flavor = flavor_find(actor=actor, key=values["flavor"], cluster=values.get("cluster"))
        resource = values.get("resource") or flavor.primary_resource
        existed = selectors.quotas_for(actor=actor).filter(
            tenant=tenant or project.tenant, project=project, flavor=flavor, resource=resource
        ).exists()
        row = services.quota_set(
            actor=actor, tenant=tenant, project=project, flavor=flavor, resource=resource, nominal=values["nominal"],
            borrowing_limit=values.get("borrowing_limit"), lending_limit=values.get("lending_limit"),
        )
        row = selectors.quotas_for(actor=actor).get(pk=row.pk)
        return Response(QuotaSerializer(row).data, status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED)

    @extend_schema(request=QuotaUpdateSerializer, responses={200: QuotaSerializer})
    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        row = self.get_object()
        data = QuotaUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = {"nominal": row.nominal, "borrowing_limit": row.borrowing_limit, "lending_limit": row.lending_limit}
        values |= data.validated_data
        owner = {"project": row.project} if row.project_id else {"tenant": row.tenant}
        services.quota_set(actor=actor, flavor=row.flavor, resource=row.resource, **owner, **values)
        return Response(QuotaSerializer(self.get_queryset().get(pk=row.pk)).data)

    @extend_schema(exclude=True)
    def update(self, request: Request, *args, **kwargs) -> Response:
        return self.partial_update(request, *args, **kwargs)


class QuotaRequestViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Requests for more quota: your own, and those you approve (``?inbox=true``: waiting for you)."""

    serializer_class = QuotaRequestSerializer
    filterset_class = QuotaRequestFilter
    ordering_fields = ["created_at", "decided_at", "status", "amount", "until"]
    search_fields = ["reason", "project__slug", "flavor__name", "requested_by__username"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return QuotaRequest.objects.none()
        requests = selectors.quota_requests_for(actor=actor_of(self.request))
        if self.action == "list":
            # The quota request table's own columns only; the related rows a page shows come after it, in one query
            # (``paginate_queryset``), not as four joins and five more models per row.
            return selectors.quota_requests_listed(requests, "applied")
        return requests

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        return None if page is None else selectors.with_shown_related(list(page))

    def kept_count(self) -> int | None:
        """How many the unfiltered list holds, kept per user (``portal.api.Pagination`` asks; None: it counts)."""
        counts = selectors.quota_request_counts_kept(actor=actor_of(self.request))
        return None if counts is None else counts["seen"]

    @extend_schema(request=QuotaRequestCreateSerializer, responses={201: QuotaRequestSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = QuotaRequestCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        project = projects_for(actor=actor).filter(slug=values["project"]).first()
        if project is None:
            raise Invalid("No such project.", field="project")
        flavor = flavor_find(actor=actor, key=values["flavor"], cluster=values.get("cluster"))
        created = services.quota_request_create(
            actor=actor, project=project, flavor=flavor, resource=values.get("resource") or flavor.primary_resource,
            amount=values["amount"], until=values.get("until"), reason=values["reason"],
            share_memory_gib=values.get("share_memory_gib"), share_cores_percent=values.get("share_cores_percent"),
        )
        return Response(QuotaRequestSerializer(created).data, status=status.HTTP_201_CREATED)

    def _decide(self, request: Request, decide: Any) -> Response:
        quota_request = self.get_object()
        data = DecisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        done = decide(actor=actor_of(request), request=quota_request, comment=data.validated_data.get("comment", ""))
        return Response(QuotaRequestSerializer(done).data)

    @extend_schema(request=DecisionSerializer, responses={200: QuotaRequestSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        """Approve and apply the extra quota now (409 when someone else decided first)."""
        return self._decide(request, services.quota_request_approve)

    @extend_schema(request=DecisionSerializer, responses={200: QuotaRequestSerializer})
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        """Reject, with a comment saying why."""
        return self._decide(request, services.quota_request_reject)

    @extend_schema(request=None, responses={200: QuotaRequestSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """The requester withdraws a pending request."""
        done = services.quota_request_cancel(actor=actor_of(request), request=self.get_object())
        return Response(QuotaRequestSerializer(done).data)


class ProjectQuotaView(APIView):
    """A project's quota per flavor and resource: promised, limits, in use, borrowed and free."""

    @extend_schema(responses=ProjectQuotaSerializer, parameters=[OpenApiParameter("slug", str, OpenApiParameter.PATH)])
    def get(self, request: Request, slug: str) -> Response:
        project = projects_for(actor=actor_of(request)).filter(slug=slug).first()
        if project is None:
            from django.http import Http404

            raise Http404
        body = {"tenant": project.tenant.slug, "project": project.slug, "quotas": selectors.project_quota_summary(project=project)}
        return Response(ProjectQuotaSerializer(body).data)




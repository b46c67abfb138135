"""REST API for the catalogue and requests. Querysets start from selectors; writes go through services."""

from __future__ import annotations

import hashlib
import json

from django.http import Http404
from django.shortcuts import get_object_or_404
from django.utils.http import parse_etags
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from portal.api import CursorPagination
from portal.exceptions import Invalid
from portal.inputs import NUL, NUL_MESSAGE, filters_asked, is_id
from portal.throttles import SubmitRateThrottle, allow_each
from quotas.selectors import flavors_for
from tenants.access import Actor
from tenants.guards import actor_of, require
from tenants.selectors import projects_for, projects_where

from .. import (
    approvals,
    catalogue_services,
    extensions,
    policy,
    routing,
    selectors,
    services,
)
from ..filters import (
    ExtensionRequestFilter,
    ImageFilter,
    PresetFilter,
    RequestFilter,
    TemplateFilter,
)
from ..models import (
    ApprovalRule,
    ExtensionRequest,
    Image,
    RequestPreset,
    ServiceTemplate,
    Volume,
    WorkloadRequest,
)
from .endpoints import RequestKeysMixin
from .serializers import (
    ApprovalRuleSerializer,
    ApprovalRuleWriteSerializer,
    BulkDecisionSerializer,
    BulkResultSerializer,
    CloneSerializer,
    CommentSerializer,
    ExtendSerializer,
    ExtensionRequestCreateSerializer,
    ExtensionRequestSerializer,
    ImageSerializer,
    InboxSerializer,
    LogsQuerySerializer,
    PresetSerializer,
    PresetWriteSerializer,
    ReasonSerializer,
    RejectSerializer,
    RequestCreateSerializer,
    RequestDetailSerializer,
    RequestLogsSerializer,
    RequestSerializer,
    ScaleSerializer,
    TemplateSerializer,
    TemplateWriteSerializer,
    VolumeSerializer,
    VolumeWriteSerializer,
    WaitingSerializer,
)
from .sharing import RequestSharesMixin

IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
    description="A retried POST with the same key (same user) returns the first request (200) and creates nothing. "
                "At most 200 characters.",
)
ETAG_HEADER = OpenApiParameter(
    "ETag", str, OpenApiParameter.HEADER, response=True, required=True,
    description="The detail body's version: send it back in If-None-Match to get a 304 while nothing changed.",
)
IF_NONE_MATCH_HEADER = OpenApiParameter(
    "If-None-Match", str, OpenApiParameter.HEADER, required=False,
    description="An ETag from an earlier response (or *): 304 with no body if the request has not changed.",
)
REPLAYED_HEADER = OpenApiParameter(
    "Idempotent-Replayed", str, OpenApiParameter.HEADER, response=[200], required=True, enum=["true"],
    description="The Idempotency-Key was seen before: this is the request the first call made.",
)
LOCATION_HEADER = OpenApiParameter(
    "Location", str, OpenApiParameter.HEADER, response=[201], required=True, description="The new request's URL.",
)
TEMPLATE_KEY = OpenApiParameter("id", str, OpenApiParameter.PATH, description="Template id, or slug (its newest version).")


def _by_id_or_slug(queryset, key: str):
    """A template by id, or by slug: its newest version in ``queryset``."""
    if is_id(key):
        return get_object_or_404(queryset, pk=int(key))
    if NUL in key:
        return get_object_or_404(queryset.none(), pk=0)
    found = queryset.filter(slug=key).order_by("-version").first()
    if found is None:
        return get_object_or_404(queryset.none(), pk=0)
    return found


# portal.extensions.submission_guard fails closed: when the budget cannot be checked, nothing is submitted.
BUDGET_UNCHECKED = OpenApiResponse(description="The project's budget could not be checked (`error`: `unavailable`): "
                                               "nothing was submitted; try again in a few minutes.")

OFFER_PROJECT = OpenApiParameter(
    "project", str, OpenApiParameter.QUERY, required=False,
    description="A project you may submit in (slug): allowed_flavors lists what the new-request form offers there "
                "(one template without it: in any of your projects; none in a project you may not submit in).")


class TemplateViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """The service catalogue. Everyone reads the active templates (with the generated form's fields);
    ops create templates and new versions (POST with an existing slug) and edit or retire them."""

    queryset = ServiceTemplate.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = TemplateSerializer
    filterset_class = TemplateFilter
    ordering_fields = ["kind", "slug", "version", "name", "created_at"]
    search_fields = ["name", "slug", "description"]
    lookup_value_regex = "[^/]+"
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_serializer_context(self) -> dict:
        """``offer_projects``: where a researcher may submit (``?project=``: that one), so ``allowed_flavors`` says
        what the form offers there: nothing in a project one may not submit in (or that does not exist), as a filter
        that matches nothing. One template: always; the list: with ``?project=``."""
        context = super().get_serializer_context()
        actor = actor_of(self.request)
        slug = self.request.query_params.get("project")
        # The list narrows only when asked (?project=): its cost stays a fixed handful of queries otherwise.
        if self.request.method != "GET" or actor.is_ops or (self.action == "list" and not slug):
            return context
        projects = list(projects_where(actor=actor, perm="submit_project").filter(status="active", tenant__status="active"))
        if slug:
            projects = [p for p in projects if p.slug == slug]
            context["offer_project"] = slug
        context["offer_projects"] = projects
        return context

    def get_queryset(self):
        actor = actor_of(self.request)
        # The list is the catalogue, one entry per slug; ops ask for ?versions=all to see retired versions too.
        if self.action == "list" and not (actor.is_ops and self.request.query_params.get("versions") == "all"):
            return selectors.catalogue_for(actor=actor)
        return selectors.templates_for(actor=actor)

    @extend_schema(parameters=[OpenApiParameter(
        "versions", str, OpenApiParameter.QUERY, required=False, enum=["all"],
        description="Ops: list every version, retired ones included (default: one entry per slug, its live version)."),
        OFFER_PROJECT])
    def list(self, request: Request, *args, **kwargs) -> Response:
        if request.query_params.get("versions", "") not in ("", "all"):
            raise Invalid("The only value is all (every version, retired ones included).", field="versions")
        return super().list(request, *args, **kwargs)

    @extend_schema(parameters=[TEMPLATE_KEY, OFFER_PROJECT])
    def retrieve(self, request: Request, *args, **kwargs) -> Response:
        return super().retrieve(request, *args, **kwargs)

    def get_object(self):
        return _by_id_or_slug(self.get_queryset(), self.kwargs["pk"])

    @extend_schema(request=TemplateWriteSerializer, responses={201: TemplateSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = TemplateWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        template = catalogue_services.template_create(actor=actor, **data.validated_data)
        return Response(TemplateSerializer(template).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=TemplateWriteSerializer, responses={200: TemplateSerializer}, parameters=[TEMPLATE_KEY])
    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        template = self.get_object()
        data = TemplateWriteSerializer(template, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        template = catalogue_services.template_update(actor=actor, template=template, **data.validated_data)
        return Response(TemplateSerializer(template).data)

    @extend_schema(exclude=True)
    def update(self, request: Request, *args, **kwargs) -> Response:
        return self.partial_update(request, *args, **kwargs)


class ImageViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """The curated image list: everyone reads the active images; ops add, change and retire them."""

    queryset = Image.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = ImageSerializer
    filterset_class = ImageFilter
    ordering_fields = ["name", "reference"]
    search_fields = ["name", "reference", "description"]
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self):
        return selectors.images_for(actor=actor_of(self.request))

    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = ImageSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        image = catalogue_services.image_create(actor=actor, **data.validated_data)
        return Response(ImageSerializer(image).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        image = self.get_object()
        data = ImageSerializer(image, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        image = catalogue_services.image_update(actor=actor, image=image, **data.validated_data)
        return Response(ImageSerializer(image).data)

    @extend_schema(exclude=True)
    def update(self, request: Request, *args, **kwargs) -> Response:
        return self.partial_update(request, *args, **kwargs)


class ApprovalRuleViewSet(viewsets.ModelViewSet):
    """When requests are approved without a human. Project admins set their projects' rules; ops the
    global ones. Everyone reads the global rules and those of the projects they see."""

    queryset = ApprovalRule.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = ApprovalRuleSerializer
    ordering_fields = ["template_slug", "updated_at"]
    filterset_fields = ["template_slug"]
    search_fields = ["template_slug", "project__slug", "project__name"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return selectors.approval_rules_for(actor=actor_of(self.request))

    def _project(self, actor: Actor, slug: str | None):
        if not slug:
            return None
        project = projects_for(actor=actor).filter(slug=slug).first()
        if project is None:
            raise Invalid("No such project.", field="project")
        return project

    @extend_schema(request=ApprovalRuleWriteSerializer, responses={201: ApprovalRuleSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = ApprovalRuleWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        project = self._project(actor, values.pop("project", None))
        rule = catalogue_services.approval_rule_create(actor=actor, project=project, **values)
        return Response(ApprovalRuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ApprovalRuleWriteSerializer, responses={200: ApprovalRuleSerializer})
    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        rule = self.get_object()
        data = ApprovalRuleWriteSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        if "project" in values and values.pop("project") != (rule.project.slug if rule.project else None):
            raise Invalid("The project of a rule cannot change; create another rule.", field="project")
        rule = catalogue_services.approval_rule_update(actor=actor_of(request), rule=rule, **values)
        return Response(ApprovalRuleSerializer(rule).data)

    @extend_schema(exclude=True)
    def update(self, request: Request, *args, **kwargs) -> Response:
        return self.partial_update(request, *args, **kwargs)

    def destroy(self, request: Request, *args, **kwargs) -> Response:
        catalogue_services.approval_rule_delete(actor=actor_of(request), rule=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class VolumeViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Volumes requests may mount (``parameters.data_volume``): a user's own (notebook homes are registered
    for their requester) and those a project admin shares with the project. POST registers an existing claim."""

    queryset = Volume.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = VolumeSerializer
    ordering_fields = ["name", "created_at"]
    filterset_fields = ["name"]

    def get_queryset(self):
        return selectors.volumes_for(actor=actor_of(self.request))

    @extend_schema(request=VolumeWriteSerializer, responses={201: VolumeSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = VolumeWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        project = projects_for(actor=actor).filter(slug=values.pop("project")).first()
        if project is None:
            raise Invalid("No such project.", field="project")
        volume = catalogue_services.volume_register(actor=actor, project=project, **values)
        return Response(VolumeSerializer(volume).data, status=status.HTTP_201_CREATED)


class PresetViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet):
    """Your saved request presets: a name, a project, a template and the values a submission from them sends.
    Only you see yours (a token: those of its project). POST saves one (the same name in the project replaces it:
    200 instead of 201); to submit from a preset, send its template, project and values to ``POST /requests/``."""

    queryset = RequestPreset.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = PresetSerializer
    filterset_class = PresetFilter
    ordering_fields = ["name", "created_at", "updated_at"]
    ordering = ["name", "id"]
    search_fields = ["name", "template_slug"]
    http_method_names = ["get", "post", "delete", "head", "options"]

    def get_queryset(self):
        return selectors.presets_for(actor=actor_of(self.request))

    @extend_schema(request=PresetWriteSerializer, responses={201: PresetSerializer, 200: PresetSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = PresetWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        slug = values.pop("project", None) or (actor.token.project.slug if actor.token is not None else "")
        if not slug:
            raise Invalid("Choose a project.", field="project")
        project = projects_for(actor=actor).filter(slug=slug).first()
        if project is None:
            raise Invalid("No such project.", field="project")
        preset, created = services.preset_save(actor=actor, project=project, template_slug=values.pop("template"),
                                               name=values.pop("name"), values=values)
        return Response(PresetSerializer(preset).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args, **kwargs) -> Response:
        services.preset_delete(actor=actor_of(request), preset=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


def _etag(body: object) -> str:
    raw = json.dumps(body, cls=JSONEncoder, sort_keys=True, separators=(",", ":")).encode()
    return f'"{hashlib.sha256(raw).hexdigest()[:32]}"'


class RequestViewSet(RequestKeysMixin, RequestSharesMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
                     viewsets.ReadOnlyModelViewSet):
    """Requests in the projects you can see. POST submits (honouring ``Idempotency-Key``); the
    detail carries the timeline and "why is it pending?" and an ETag for cheap polling
    (``If-None-Match`` → 304). Actions: approve, reject, cancel, stop, restart, extend, scale;
    DELETE removes the cluster objects and volumes (the record stays, ended)."""

    queryset = WorkloadRequest.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = RequestSerializer
    filterset_class = RequestFilter
    ordering_fields = ["created_at", "updated_at", "state", "name", "gpus", "priority", "project__slug"]
    ordering = ["-created_at", "-id"]
    search_fields = ["name", "project__slug", "template__slug"]

    pagination_class = CursorPagination

    def get_queryset(self):
        return selectors.requests_for(actor=actor_of(self.request))

    def get_throttles(self) -> list:
        throttles = super().get_throttles()
        return [*throttles, SubmitRateThrottle()] if self.action in ("create", "clone") else throttles

    def check_throttles(self, request: Request) -> None:
        """DRF's, with the user and submit rates of a submission checked in one round trip (``allow_each``)."""
        throttles = self.get_throttles()
        verdicts = allow_each(throttles, request, self)
        if verdicts is None:
            return super().check_throttles(request)
        waits = [t.wait() for t, allowed in zip(throttles, verdicts, strict=True) if not allowed]
        if waits:
            self.throttled(request, max((w for w in waits if w is not None), default=None))

    def _detail_body(self, pk: int, *, filtered: bool = False) -> dict:
        """The detail's JSON, read as rows (``selectors.request_rows``); ``filtered``: through the list's filters
        too, as DRF's retrieve does. 404 when the actor cannot see it."""
        if filtered and self._filters_asked():
            queryset = self.filter_queryset(selectors.request_scope_for(actor=actor_of(self.request)))
            row = selectors.request_rows(queryset.filter(pk=pk).order_by(), detail=True).first()
        else:
            row = selectors.request_detail_row(actor=actor_of(self.request), pk=pk)
        if row is None:
            raise Http404
        return RequestDetailSerializer(row).data

    def _filters_asked(self) -> bool:
        return filters_asked(self.request)

    def read_page(self, keys: list, values: list | None, backwards: bool, limit: int) -> list | None:
        """The list's page from a compiled query when nothing filters, searches or orders (``CursorPagination`` asks;
        None: it reads the page itself)."""
        if self.action != "list" or self._filters_asked():
            return None
        return selectors.request_page(actor=actor_of(self.request), keys=keys, values=values, backwards=backwards,
                                      limit=limit)

    def _detail(self, req: WorkloadRequest, *, code: int = status.HTTP_200_OK, headers: dict | None = None) -> Response:
        body = self._detail_body(req.pk)
        return Response(body, status=code, headers={"ETag": _etag(body), **(headers or {})})

    def list(self, request: Request, *args, **kwargs) -> Response:
        """Newest first (``?ordering=`` another order); paged by cursor: follow ``next`` (docs: README, Using the API)."""
        if self._filters_asked():
            queryset = selectors.request_rows(self.filter_queryset(selectors.request_scope_for(actor=actor_of(request))))
        else:
            # The page is read by ``read_page`` (the actor's rows, from a compiled query): ``queryset`` only gives the
            # pagination its order and model. An empty one (building the actor's scope as a queryset, ~0.4 ms, would
            # be thrown away); were it ever read, it would read nothing, never another tenant's rows.
            queryset = WorkloadRequest.objects.none().order_by(*self.ordering)
        page = list(self.paginate_queryset(queryset))
        return self.get_paginated_response(RequestSerializer(page, many=True).data)

    @extend_schema(
        parameters=[IF_NONE_MATCH_HEADER, ETAG_HEADER],
        responses={200: RequestDetailSerializer, 304: OpenApiResponse(description="Not modified since the ETag you sent.")},
    )
    def retrieve(self, request: Request, *args, **kwargs) -> Response:
        key = self.kwargs["pk"]
        if not is_id(key):
            raise Http404
        body = self._detail_body(int(key), filtered=True)
        etag = _etag(body)
        if etag in parse_etags(request.headers.get("If-None-Match", "")) or request.headers.get("If-None-Match") == "*":
            return Response(status=status.HTTP_304_NOT_MODIFIED, headers={"ETag": etag})
        return Response(body, headers={"ETag": etag})

    @extend_schema(
        request=RequestCreateSerializer, parameters=[IDEMPOTENCY_HEADER, ETAG_HEADER, REPLAYED_HEADER, LOCATION_HEADER],
        responses={
            201: RequestDetailSerializer, 200: RequestDetailSerializer,
            422: OpenApiResponse(description="The Idempotency-Key was already used with a different body "
                                             "(`error`: `idempotency_key_reused`): send the same body to retry, or use a new key."),
            503: BUDGET_UNCHECKED,
        },
    )
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = RequestCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)

        slug = values.pop("project", None)
        if slug is None and actor.token is not None:
            slug = actor.token.project.slug
        if not slug:
            raise Invalid("Choose a project.", field="project")
        if actor.token is not None and slug == actor.token.project.slug:
            project = actor.token.project  # read with the token in this request (with its tenant): its only project
        else:
            project = projects_for(actor=actor).filter(slug=slug).first()
        if project is None:
            raise Invalid("No such project.", field="project")

        key = values.pop("template")
        template = selectors.template_to_submit(actor=actor, key=key)
        if template is None:
            raise Invalid("No such template.", field="template")

        flavor = None
        flavor_name = values.pop("flavor", None)
        if flavor_name:
            flavor = (
                # prefetched with their clusters; a MultiKueue worker's flavor last (work reaches it through its manager)
                next((f for f in sorted(template.allowed_flavors.all(), key=lambda f: f.cluster.role == "worker")
                      if f.name == flavor_name), None)
                or flavors_for(actor=actor).filter(name=flavor_name, active=True).order_by("pk").first()
            )
            if flavor is None:
                raise Invalid(f"No such flavor {flavor_name}.", field="flavor")

        idempotency_key = request.headers.get("Idempotency-Key", "")
        if NUL in idempotency_key:
            raise Invalid(NUL_MESSAGE, field="Idempotency-Key")
        needs = routing.needs_parse(**{k: values.pop(k) for k in ("accepted_models", "min_gpu_memory_gib",
                                                                   "min_compute_capability", "spill_consent") if k in values})
        req = services.request_submit(
            actor=actor, project=project, template=template, flavor=flavor,
            idempotency_key=idempotency_key, project_is_fresh=True, needs=needs, **values,
        )
        if getattr(req, "replayed", False):
            return self._detail(req, headers={"Idempotent-Replayed": "true"})
        # The new row as written, with its relations in memory: not read back (``serializers.request_row``).
        body = RequestDetailSerializer(req).data
        return Response(body, status=status.HTTP_201_CREATED,
                        headers={"ETag": _etag(body), "Location": f"{request.path}{req.pk}/"})

    @extend_schema(
        request=CloneSerializer, parameters=[IDEMPOTENCY_HEADER, ETAG_HEADER, REPLAYED_HEADER, LOCATION_HEADER],
        responses={
            201: RequestDetailSerializer, 200: RequestDetailSerializer,
            422: OpenApiResponse(description="The Idempotency-Key was already used with a different body "
                                             "(`error`: `idempotency_key_reused`)."),
            503: BUDGET_UNCHECKED,
        },
    )
    @action(detail=True, methods=["post"])
    def clone(self, request: Request, pk: str | None = None) -> Response:
        """Submit this request again: same project, template (its live version), flavor, image, size, parameters,
        duration and priority, under ``name`` (empty: a new one). Checked like any submission; honours
        ``Idempotency-Key``. Anyone who may submit in the project may clone what they can see there."""
        original = self.get_object()
        data = CloneSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        idempotency_key = request.headers.get("Idempotency-Key", "")
        if NUL in idempotency_key:
            raise Invalid(NUL_MESSAGE, field="Idempotency-Key")
        req = services.request_clone(actor=actor_of(request), request=original, name=data.validated_data["name"],
                                     idempotency_key=idempotency_key)
        if getattr(req, "replayed", False):
            return self._detail(req, headers={"Idempotent-Replayed": "true"})
        location = request.path.rsplit("/", 3)[0] + f"/{req.pk}/"
        return self._detail(req, code=status.HTTP_201_CREATED, headers={"Location": location})

    @extend_schema(request=None, responses={202: RequestDetailSerializer}, parameters=[ETAG_HEADER])
    def destroy(self, request: Request, *args, **kwargs) -> Response:
        req = services.request_delete(actor=actor_of(request), request=self.get_object())
        return self._detail(req, code=status.HTTP_202_ACCEPTED)

    @extend_schema(request=CommentSerializer, responses={200: RequestDetailSerializer}, parameters=[ETAG_HEADER])
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        req = self.get_object()
        data = CommentSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        req = services.request_approve(actor=actor_of(request), request=req, comment=data.validated_data["comment"])
        return self._detail(req)

    @extend_schema(request=RejectSerializer, responses={200: RequestDetailSerializer}, parameters=[ETAG_HEADER])
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        """Reject, saying why (``comment``, required: 400 without it). The requester sees it as ``decision_comment``."""
        req = self.get_object()
        data = RejectSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        req = services.request_reject(actor=actor_of(request), request=req, comment=data.validated_data["comment"])
        return self._detail(req)

    @extend_schema(request=ReasonSerializer, responses={200: RequestDetailSerializer}, parameters=[ETAG_HEADER])
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        req = self.get_object()
        data = ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        req = services.request_cancel(actor=actor_of(request), request=req, reason=data.validated_data["reason"])
        return self._detail(req)

    @extend_schema(request=ReasonSerializer, responses={200: RequestDetailSerializer}, parameters=[ETAG_HEADER])
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        req = self.get_object()
        data = ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        req = services.request_stop(actor=actor_of(request), request=req, reason=data.validated_data["reason"])
        return self._detail(req)

    @extend_schema(request=None, responses={200: RequestDetailSerializer}, parameters=[ETAG_HEADER])
    @action(detail=True, methods=["post"])
    def restart(self, request: Request, pk: str | None = None) -> Response:
        req = services.request_restart(actor=actor_of(request), request=self.get_object())
        return self._detail(req)

    @extend_schema(request=ExtendSerializer, responses={200: RequestDetailSerializer}, parameters=[ETAG_HEADER])
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pk: str | None = None) -> Response:
        req = self.get_object()
        data = ExtendSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        req = services.request_extend(actor=actor_of(request), request=req, hours=data.validated_data["hours"])
        return self._detail(req)

    @extend_schema(request=ScaleSerializer, responses={200: RequestDetailSerializer}, parameters=[ETAG_HEADER])
    @action(detail=True, methods=["post"])
    def scale(self, request: Request, pk: str | None = None) -> Response:
        req = self.get_object()
        data = ScaleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        req = services.request_scale(actor=actor_of(request), request=req, replicas=data.validated_data["replicas"])
        return self._detail(req)

    @extend_schema(parameters=[LogsQuerySerializer],
                   responses={200: RequestLogsSerializer, 503: OpenApiResponse(description="The cluster did not answer.")})
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """The last ``tail`` log lines of each of the request's pods (read-only; 503 when the cluster does not answer)."""
        # An empty parameter is no parameter (as the schema's allowEmptyValue says): ``?tail=`` is the default.
        query = LogsQuerySerializer(data={k: v for k, v in request.query_params.dict().items() if v != ""})
        query.is_valid(raise_exception=True)
        req = self.get_object()
        # A request shared to view only shows no logs (``policy.may_read_logs``).
        require(policy.may_read_logs(actor_of(request), req), "This request was shared with you to view, not to read its logs.")
        return Response({"pods": request_pod_logs(req, tail=query.validated_data["tail"])})


class ClusterUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "cluster_unavailable"
    default_detail = "The cluster did not answer."


def request_pod_logs(req: WorkloadRequest, *, tail: int) -> list[dict]:
    """The request's pods (by our request label) with their last ``tail`` log lines, through portal.kube."""
    if not (req.cluster.kubeconfig_encrypted or req.cluster.kubeconfig_path):
        return []
    from portal.kube import kube_for

    from ..manifests import REQUEST_LABEL

    try:
        kube = kube_for(req.cluster)
        items, _ = kube.list("v1", "Pod", req.project.namespace, label_selector=f"{REQUEST_LABEL}={req.pk}")
        return [
            {"name": pod["metadata"]["name"], "phase": (pod.get("status") or {}).get("phase", ""),
             "node": (pod.get("spec") or {}).get("nodeName", ""),
             "log": kube.pod_log(req.project.namespace, pod["metadata"]["name"], tail_lines=tail)}
            for pod in sorted(items, key=lambda p: p["metadata"]["name"])
        ]
    except Exception as exc:
        raise ClusterUnavailable(f"The cluster did not answer: {exc}") from exc


class ApprovalInboxViewSet(viewsets.GenericViewSet, mixins.ListModelMixin):
    """Requests awaiting your approval, oldest first, each with its context (quota, queue, cost)."""

    queryset = WorkloadRequest.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = InboxSerializer
    filterset_class = RequestFilter
    ordering_fields = ["created_at", "gpus"]
    ordering = ["created_at", "id"]

    def get_queryset(self):
        # The requests alone, no related table joined: the filters and the order apply to them.
        return selectors.approvals_inbox_rows(actor=actor_of(self.request))

    def paginate_queryset(self, queryset):
        # The page read as rows (what it shows of the related tables as subqueries, as the request list), then their
        # context: two queries for the page, not two subqueries per row that each count the project's whole queue
        # in that flavor.
        page = super().paginate_queryset(selectors.request_rows(queryset, also=("project_id",)))
        return None if page is None else selectors.with_approval_context_rows(list(page))

    @extend_schema(responses={200: WaitingSerializer})
    @action(detail=False, methods=["get"], pagination_class=None, filter_backends=[])
    def waiting(self, request: Request) -> Response:
        """How many requests wait for your decision (the navigation's badge): workload and extension requests,
        and quota requests."""
        counts = selectors.approvals_waiting_counts(actor=actor_of(request))
        return Response({"requests": counts["requests"], "quota_requests": counts["quota"],
                         "total": counts["requests"] + counts["quota"]})

    @extend_schema(request=BulkDecisionSerializer, responses={200: BulkResultSerializer})
    @action(detail=False, methods=["post"], pagination_class=None, filter_backends=[])
    def bulk(self, request: Request) -> Response:
        """Approve or reject several requests, extension requests and quota requests at once, each through the same
        path as one decision (its checks, locks and notifications). 200 with one result per item: an item that was
        decided meanwhile, is not yours to decide or no longer fits the quota is reported with its error and the
        others go ahead; ids you cannot see are ``not_found``. A rejection needs ``comment`` (400 without)."""
        data = BulkDecisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        items = ([("request", pk) for pk in values["requests"]]
                 + [("extension_request", pk) for pk in values["extension_requests"]]
                 + [("quota_request", pk) for pk in values["quota_requests"]])
        outcome = approvals.decide_many(actor=actor_of(request), items=items, decision=values["decision"],
                                        comment=values["comment"])
        return Response({"decision": outcome.decision, "done": len(outcome.done), "failed": len(outcome.failed),
                         "results": [r.as_dict() for r in outcome.results]})


class ExtensionRequestViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Asking the approvers for more hours than the approval rule grants (``POST /requests/{id}/extend/`` applies
    what it grants at once), or for more replicas of an inference service (``replicas``: a scale request, where
    ``POST /requests/{id}/scale/`` is refused). The requester creates and withdraws; the project's approvers approve (the request
    runs longer at once) or reject (with a reason). Listed: those of the requests you can see;
    ``?inbox=true``: those waiting for your decision."""

    queryset = ExtensionRequest.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = ExtensionRequestSerializer
    filterset_class = ExtensionRequestFilter
    ordering_fields = ["created_at", "hours", "status"]
    ordering = ["-created_at", "-id"]

    def get_queryset(self):
        return selectors.extension_requests_for(actor=actor_of(self.request))

    @extend_schema(request=ExtensionRequestCreateSerializer, responses={201: ExtensionRequestSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = ExtensionRequestCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        req = selectors.requests_for(actor=actor).filter(pk=values["request"]).first()
        if req is None:
            raise Invalid("No such request.", field="request")
        if "replicas" in values:
            ext = extensions.scale_request_create(actor=actor, request=req, replicas=values["replicas"],
                                                  reason=values["reason"])
        else:
            ext = extensions.extension_request_create(actor=actor, request=req, hours=values["hours"],
                                                      reason=values["reason"])
        return Response(ExtensionRequestSerializer(self.get_queryset().get(pk=ext.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=CommentSerializer, responses={200: ExtensionRequestSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        """Grant the hours: the request's duration and deadline grow at once; or the replicas: the service is
        scaled at once (409 when decided already)."""
        ext = self.get_object()
        data = CommentSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        done = extensions.extension_request_approve(actor=actor_of(request), extension=ext,
                                                    comment=data.validated_data["comment"])
        return Response(ExtensionRequestSerializer(done).data)

    @extend_schema(request=RejectSerializer, responses={200: ExtensionRequestSerializer})
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        """Turn it down, saying why (``comment``, required)."""
        ext = self.get_object()
        data = RejectSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        done = extensions.extension_request_reject(actor=actor_of(request), extension=ext,
                                                   comment=data.validated_data["comment"])
        return Response(ExtensionRequestSerializer(done).data)

    @extend_schema(request=None, responses={200: ExtensionRequestSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """The requester withdraws a pending extension request."""
        done = extensions.extension_request_cancel(actor=actor_of(request), extension=self.get_object())
        return Response(ExtensionRequestSerializer(done).data)

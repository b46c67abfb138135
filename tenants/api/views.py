"""REST API for tenancy. Every queryset starts from a selector; writes go through services."""

from __future__ import annotations

from django.utils.cache import add_never_cache_headers
from drf_spectacular.utils import extend_schema
from drf_spectacular.utils import OpenApiParameter, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.exceptions import Invalid, NotAllowed

from .. import policy, selectors, services
from ..guards import actor_of
from ..filters import AuditEntryFilter, InvitationFilter, MembershipFilter, ProjectFilter, TenantFilter, TokenFilter
from ..models import ApiToken, AuditEntry, Invitation, Membership, Project, Tenant
from .serializers import (
    AuditEntrySerializer,
    InvitationCreateSerializer,
    InvitationSerializer,
    MembershipCreateSerializer,
    MembershipSerializer,
    MembershipUpdateSerializer,
    MeSerializer,
    ProjectCreateSerializer,
    ProjectSerializer,
    TenantCreateSerializer,
    TenantSerializer,
    TokenCreatedSerializer,
    TokenCreateSerializer,
    TokenSerializer,
)


ID_OR_SLUG = OpenApiParameter("id", str, OpenApiParameter.PATH, description="Numeric id or slug.")


class IdOrSlugMixin:
    """``/things/<id>/`` and ``/things/<slug>/`` both work, within the caller's visible set only."""

    lookup_value_regex = "[^/]+"

    def get_object(self):
        obj = selectors.lookup(self.get_queryset(), self.kwargs[self.lookup_field])
        self.check_object_permissions(self.request, obj)
        return obj


@extend_schema_view(retrieve=extend_schema(parameters=[ID_OR_SLUG]), partial_update=extend_schema(parameters=[ID_OR_SLUG]))
class TenantViewSet(IdOrSlugMixin, mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Tenants you belong to (ops: all). Ops create tenants and suspend them; tenant admins edit details."""

    queryset = Tenant.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = TenantSerializer
    filterset_class = TenantFilter
    ordering_fields = ["name", "slug", "created_at"]
    search_fields = ["name", "slug", "cost_centre"]
    lookup_field = "pk"
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self):
        return selectors.tenants_for(actor=actor_of(self.request))

    @extend_schema(request=TenantCreateSerializer, responses={201: TenantSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        data = TenantCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = services.tenant_create(actor=actor_of(request), **data.validated_data)
        return Response(TenantSerializer(tenant).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        tenant = self.get_object()
        data = TenantSerializer(tenant, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        tenant = services.tenant_update(actor=actor_of(request), tenant=tenant, **data.validated_data)
        return Response(TenantSerializer(tenant).data)


@extend_schema_view(retrieve=extend_schema(parameters=[ID_OR_SLUG]), partial_update=extend_schema(parameters=[ID_OR_SLUG]))
class ProjectViewSet(IdOrSlugMixin, mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Projects you can see. Tenant admins create and archive; project admins edit the description."""

    queryset = Project.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = ProjectSerializer
    filterset_class = ProjectFilter
    ordering_fields = ["name", "slug", "created_at", "tenant__name"]
    search_fields = ["name", "slug", "description"]
    lookup_field = "pk"
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self):
        return selectors.projects_for(actor=actor_of(self.request))

    @extend_schema(request=ProjectCreateSerializer, responses={201: ProjectSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = ProjectCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        tenant = selectors.tenants_for(actor=actor).filter(slug=values.pop("tenant")).first()
        if tenant is None:
            raise Invalid("No such tenant.", field="tenant")
        project = services.project_create(actor=actor, tenant=tenant, **values)
        return Response(ProjectSerializer(project).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        project = self.get_object()
        data = ProjectSerializer(project, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        project = services.project_update(actor=actor_of(request), project=project, **data.validated_data)
        return Response(ProjectSerializer(project).data)


class MembershipViewSet(viewsets.ModelViewSet):
    """Who holds which role where. Tenant admins and ops add, change and remove memberships."""

    queryset = Membership.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = MembershipSerializer
    filterset_class = MembershipFilter
    ordering_fields = ["created_at", "role", "user__username"]
    search_fields = ["user__username", "user__email"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return selectors.memberships_for(actor=actor_of(self.request))

    @extend_schema(request=MembershipCreateSerializer, responses={201: MembershipSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = MembershipCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        tenant = selectors.tenants_for(actor=actor).filter(slug=values["tenant"]).first()
        if tenant is None:
            raise Invalid("No such tenant.", field="tenant")
        if not policy.may_manage_members(actor, tenant):
            raise NotAllowed("Only tenant admins and ops manage members.")
        project = None
        if values.get("project"):
            project = selectors.projects_for(actor=actor).filter(tenant=tenant, slug=values["project"]).first()
            if project is None:
                raise Invalid("No such project in this tenant.", field="project")
        user = services.tenant_member_by_name(actor=actor, tenant=tenant, username=values["user"])
        membership = services.membership_create(actor=actor, tenant=tenant, project=project, user=user, role=values["role"])
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=MembershipUpdateSerializer, responses={200: MembershipSerializer})
    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        membership = self.get_object()
        data = MembershipUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.membership_update(actor=actor_of(request), membership=membership, role=data.validated_data["role"])
        return Response(MembershipSerializer(membership).data)

    @extend_schema(exclude=True)
    def update(self, request: Request, *args, **kwargs) -> Response:
        return self.partial_update(request, *args, **kwargs)

    def destroy(self, request: Request, *args, **kwargs) -> Response:
        services.membership_delete(actor=actor_of(request), membership=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Invitations by email to the tenants you administer. POST invites (the single-use link is emailed,
    never returned); ``resend`` sends a new link (the old one stops working); ``revoke`` withdraws it."""

    queryset = Invitation.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = InvitationSerializer
    filterset_class = InvitationFilter
    ordering_fields = ["created_at", "sent_at", "expires_at", "email", "status"]
    search_fields = ["email"]

    def get_queryset(self):
        return selectors.invitations_for(actor=actor_of(self.request))

    @staticmethod
    def _base_url(request: Request) -> str:
        return request.build_absolute_uri("/").rstrip("/")

    @extend_schema(request=InvitationCreateSerializer, responses={201: InvitationSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        if actor.token is not None:
            raise NotAllowed("API tokens cannot invite people; sign in to invite.")
        data = InvitationCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        tenant = selectors.tenants_for(actor=actor).filter(slug=values["tenant"]).first()
        if tenant is None:
            raise Invalid("No such tenant.", field="tenant")
        if not policy.may_manage_members(actor, tenant):
            raise NotAllowed("Only tenant admins and ops invite members.")
        project = None
        if values.get("project"):
            project = selectors.projects_for(actor=actor).filter(tenant=tenant, slug=values["project"]).first()
            if project is None:
                raise Invalid("No such project in this tenant.", field="project")
        invitation = services.invitation_create(actor=actor, tenant=tenant, email=values["email"], role=values["role"],
                                                project=project, base_url=self._base_url(request))
        return Response(InvitationSerializer(invitation).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: InvitationSerializer})
    @action(detail=True, methods=["post"])
    def resend(self, request: Request, pk: str | None = None) -> Response:
        invitation = services.invitation_resend(actor=actor_of(request), invitation=self.get_object(),
                                                base_url=self._base_url(request))
        return Response(InvitationSerializer(invitation).data)

    @extend_schema(request=None, responses={200: InvitationSerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        invitation = services.invitation_revoke(actor=actor_of(request), invitation=self.get_object())
        return Response(InvitationSerializer(invitation).data)


class TokenViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet):
    """API tokens for CI. The secret is in the create response only; DELETE (or POST revoke) revokes at once."""

    queryset = ApiToken.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = TokenSerializer
    filterset_class = TokenFilter
    ordering_fields = ["created_at", "expires_at", "last_used_at", "name"]
    search_fields = ["name", "prefix"]

    def get_queryset(self):
        return selectors.tokens_for(actor=actor_of(self.request))

    @extend_schema(request=TokenCreateSerializer, responses={201: TokenCreatedSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        if actor.token is not None:
            raise NotAllowed("API tokens cannot create tokens; sign in to create one.")
        data = TokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        project = selectors.projects_for(actor=actor).filter(slug=values.pop("project")).first()
        if project is None:
            raise Invalid("No such project.", field="project")
        token, secret = services.token_create(actor=actor, project=project, **values)
        body = TokenSerializer(token).data | {"secret": secret}
        response = Response(body, status=status.HTTP_201_CREATED)
        add_never_cache_headers(response)  # the secret is shown once: no cached copy anywhere (no-store)
        return response

    @extend_schema(request=None, responses={200: TokenSerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = services.token_revoke(actor=actor_of(request), token=self.get_object())
        return Response(TokenSerializer(token).data)

    def destroy(self, request: Request, *args, **kwargs) -> Response:
        services.token_revoke(actor=actor_of(request), token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditEntryViewSet(viewsets.ReadOnlyModelViewSet):
    """The append-only audit log: read-only for everyone, scoped to what you administer."""

    queryset = AuditEntry.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = AuditEntrySerializer
    filterset_class = AuditEntryFilter
    ordering_fields = ["created_at", "action"]
    search_fields = ["target_repr", "actor_label", "action"]

    def get_queryset(self):
        return selectors.audit_entries_for(actor=actor_of(self.request))


class MeView(APIView):
    """Who the API thinks you are: user, ops flag, memberships and the token in use."""

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        actor = actor_of(request)
        memberships = selectors.own_memberships_for(actor=actor)
        body = {
            "username": request.user.get_username(),
            "is_ops": actor.is_ops,
            "memberships": MembershipSerializer(memberships, many=True).data,
            "token": TokenSerializer(actor.token).data if actor.token else None,
        }
        return Response(body)



"""A project's spill-over policy (docs/federation.md): ``GET/PUT /api/v1/projects/<slug or id>/spill-policy/``.

Anyone who sees the project reads it; its admins, its tenant's admins and ops set it (``quotas.zones.
spill_policy_set``, audited ``project.spill_policy``). A project out of one's sight is a 404."""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.inputs import is_id
from tenants.guards import actor_of
from tenants.models import Project
from tenants.policy import may_change_project
from tenants.selectors import projects_for

from ..zones import spill_policy_of, spill_policy_set


class SpillPolicySerializer(serializers.Serializer):
    project = serializers.CharField(read_only=True, help_text="The project's slug.")
    allowed = serializers.BooleanField(help_text="Work may spill over to another GPU model, with the job's consent.")
    target_models = serializers.ListField(
        child=serializers.CharField(min_length=1, max_length=60, trim_whitespace=False), required=False, max_length=16,
        help_text="GPU models it may spill to (empty: any model a cluster offers).")
    needs_approval = serializers.BooleanField(required=False, default=False,
                                              help_text="A request that spilled waits for an approver.")
    may_change = serializers.BooleanField(read_only=True, help_text="Whether the caller may change it.")


def _project(request: Request, key: str) -> Project:
    projects = projects_for(actor=actor_of(request)).select_related("tenant")
    project = projects.filter(pk=int(key)).first() if is_id(key) else projects.filter(slug=key).first()
    if project is None:
        raise Http404
    return project


def _body(request: Request, project: Project) -> dict:
    row = spill_policy_of(project)
    return {"project": project.slug, "allowed": row.allowed, "target_models": list(row.target_models or []),
            "needs_approval": row.needs_approval, "may_change": may_change_project(actor_of(request), project)}


class SpillPolicyView(APIView):
    """Whether the project's work may spill over to another GPU model, to which, and whether it needs approval."""

    @extend_schema(responses=SpillPolicySerializer, parameters=[OpenApiParameter("slug", str, OpenApiParameter.PATH)])
    def get(self, request: Request, slug: str) -> Response:
        project = _project(request, slug)
        return Response(SpillPolicySerializer(_body(request, project)).data)

    @extend_schema(request=SpillPolicySerializer, responses=SpillPolicySerializer,
                   parameters=[OpenApiParameter("slug", str, OpenApiParameter.PATH)])
    def put(self, request: Request, slug: str) -> Response:
        project = _project(request, slug)
        data = SpillPolicySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        spill_policy_set(actor=actor_of(request), project=project, allowed=values["allowed"],
                         target_models=values.get("target_models") or [], needs_approval=values.get("needs_approval", False))
        return Response(SpillPolicySerializer(_body(request, project)).data)

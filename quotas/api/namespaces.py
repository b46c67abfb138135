"""Ops API for project namespaces (docs/ownership.md): look, adopt, delete.

``GET  /api/v1/clusters/{cluster}/projects/{slug}/namespace/``         owner and object counts by kind
``POST /api/v1/clusters/{cluster}/projects/{slug}/namespace/adopt/``   ``{"confirm": <total shown>}``
``POST /api/v1/clusters/{cluster}/projects/{slug}/namespace/delete/``  ``{"confirm": <total shown>}`` (archived projects)
"""

from __future__ import annotations

from typing import Any

from django.http import Http404
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.kube import ClusterError
from tenants.models import Project
from tenants.selectors import projects_for

from .. import namespaces, selectors
from .views import _require_ops

InfoSerializer = inline_serializer("NamespaceInfo", {
    "cluster": serializers.CharField(), "namespace": serializers.CharField(), "exists": serializers.BooleanField(),
    "owner": serializers.ChoiceField(["ours", "legacy", "foreign", "missing"]), "project": serializers.CharField(allow_null=True),
    "labels": serializers.DictField(child=serializers.CharField()), "contents": serializers.DictField(child=serializers.IntegerField()),
    "total": serializers.IntegerField(),
})


class ConfirmSerializer(serializers.Serializer):
    confirm = serializers.IntegerField(min_value=0, help_text="The object total shown by GET: proves what was reviewed.")


def _targets(request: Request, cluster: str, slug: str) -> tuple[Any, Any, Project]:
    actor = _require_ops(request, "Only platform ops inspect, adopt or delete namespaces.")
    found = selectors.lookup_by_id_or_name(selectors.clusters_for(actor=actor), cluster)
    project = projects_for(actor=actor).filter(slug=slug).first()
    if project is None:
        raise Http404
    return actor, found, project


UNAVAILABLE = OpenApiResponse(description="The cluster did not answer: `detail` says why; retry later.")
UNASKABLE = OpenApiResponse(description="The portal has no way to ask this cluster (no kubeconfig, or one it cannot "
                                        "read): `detail` says why; ops set its kubeconfig first.")


def _unavailable(exc: ClusterError) -> Response:
    return Response({"error": "cluster_unavailable", "detail": f"The cluster could not be asked: {exc}"}, status=503)


class NamespaceView(APIView):
    @extend_schema(responses={200: InfoSerializer, 409: UNASKABLE, 503: UNAVAILABLE})
    def get(self, request: Request, cluster: str, slug: str) -> Response:
        _, found, project = _targets(request, cluster, slug)
        try:
            return Response(namespaces.namespace_inspect(found, project.namespace).as_dict())
        except ClusterError as exc:
            return _unavailable(exc)


class _NamespaceAction(APIView):
    service: Any = None

    @extend_schema(request=ConfirmSerializer, responses={200: InfoSerializer, 503: UNAVAILABLE})
    def post(self, request: Request, cluster: str, slug: str) -> Response:
        actor, found, project = _targets(request, cluster, slug)
        data = ConfirmSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            info = type(self).service(actor=actor, cluster=found, project=project, confirm=data.validated_data["confirm"])
        except ClusterError as exc:
            return _unavailable(exc)
        return Response(info.as_dict())


class NamespaceAdoptView(_NamespaceAction):
    service = staticmethod(namespaces.namespace_adopt)


class NamespaceDeleteView(_NamespaceAction):
    service = staticmethod(namespaces.namespace_release)

"""``/api/v1/requests/{id}/keys/``: an inference service's API keys (``workloads.endpoints``; docs/inference.md).

GET lists them (never the keys themselves), POST ``{"name": ...}`` makes one and answers it once in ``key``,
DELETE ``keys/{key id}/`` revokes one. The request is looked up in what the caller sees (404 otherwise); only its
requester and the project's approvers manage its keys (403); a request of a kind that does not serve has none (400)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from tenants.guards import actor_of, require

from .. import endpoints, policy
from ..models import InferenceKey


class InferenceKeyWriteSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, help_text="Who or what uses the key.")


class InferenceKeySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="The key's first characters.")
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)


class InferenceKeyMadeSerializer(InferenceKeySerializer):
    key = serializers.CharField(help_text="The key itself: shown this once, never again.")


def key_row(key: InferenceKey) -> dict[str, Any]:
    return {"id": key.pk, "name": key.name, "prefix": key.prefix,
            "created_by": key.created_by.get_username() if key.created_by is not None else None,
            "created_at": key.created_at, "last_used_at": key.last_used_at, "revoked_at": key.revoked_at}


class RequestKeysMixin:
    """The API-key actions of ``RequestViewSet``."""

    @extend_schema(request=InferenceKeyWriteSerializer,
                   responses={200: InferenceKeySerializer(many=True), 201: InferenceKeyMadeSerializer})
    @action(detail=True, methods=["get", "post"], url_path="keys", pagination_class=None)  # a short list, whole
    def keys(self, request: Request, pk: str | None = None) -> Response:
        """The inference service's API keys (GET), or a new one (POST; the key is in the answer, once)."""
        req = self.get_object()
        actor = actor_of(request)
        if request.method == "GET":
            require(policy.may_manage_inference_keys(actor, req),
                    "Only the requester and the project's approvers see this service's API keys.")
            return Response([key_row(k) for k in endpoints.keys_of(req)])
        data = InferenceKeyWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        made = endpoints.key_create(actor=actor, request=req, name=data.validated_data["name"])
        return Response({**key_row(made.key), "key": made.secret}, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: InferenceKeySerializer})
    @action(detail=True, methods=["delete"], url_path=r"keys/(?P<key_id>[0-9]{1,12})")
    def key_delete(self, request: Request, pk: str | None = None, key_id: str | None = None) -> Response:
        """Revoke one key (it stays listed, revoked). 404 when the service has no such key."""
        req = self.get_object()
        actor = actor_of(request)
        require(policy.may_manage_inference_keys(actor, req),
                "Only the requester and the project's approvers manage this service's API keys.")
        if not any(k.pk == int(key_id or 0) for k in endpoints.keys_of(req)):
            return Response({"error": "not_found", "detail": "This service has no such key."},
                            status=status.HTTP_404_NOT_FOUND)
        key = endpoints.key_revoke(actor=actor, request=req, key_id=int(key_id or 0))
        return Response(key_row(key))

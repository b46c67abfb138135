"""The floor: the least a token-authenticated DRF list and detail of requests can cost in this stack.

Same tables as ``GET /api/v1/requests/`` (``workloads.WorkloadRequest`` in the token's project), same
token rows (``tenants.ApiToken``, the secret checked against its hash), same middleware, same DRF
renderer and page size; nothing else: no filters, ordering or search backends, no throttles, no
related objects, a tiny serializer. List: token, count, page (3 queries); detail: token, row (2).

This module is also the URLconf of ``tests/bench/speed_settings.py``: the floor under ``/bench/floor/``
next to everything the portal serves. It is measuring kit, not product code; nothing imports it but the
benchmark.
"""

from __future__ import annotations

import hmac

from django.urls import include, path
from django.utils import timezone
from rest_framework import authentication, exceptions, generics, pagination, permissions, serializers

from tenants.authentication import TOKEN_PREFIX, token_hash
from tenants.models import ApiToken
from workloads.models import WorkloadRequest


class FloorTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer gpp_<prefix>_<secret>``: one query (the token with its user)."""

    def authenticate(self, request):
        kind, _, raw = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        if kind.lower() != "bearer":
            return None
        parts = raw.split("_", 2)
        if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
            raise exceptions.AuthenticationFailed("Invalid token.")
        token = (ApiToken.objects.select_related("user")
                 .filter(prefix=parts[1], revoked_at__isnull=True, expires_at__gt=timezone.now()).first())
        if token is None or not token.user.is_active or not hmac.compare_digest(token.secret_hash, token_hash(raw)):
            raise exceptions.AuthenticationFailed("Invalid token.")
        return token.user, token


class FloorSerializer(serializers.ModelSerializer):
    class Meta:
        model = WorkloadRequest
        fields = ["id", "project", "name", "state", "gpus", "replicas", "priority", "created_at", "updated_at"]


class FloorPagination(pagination.PageNumberPagination):
    page_size = 50


class FloorMixin:
    authentication_classes = [FloorTokenAuthentication]
    permission_classes = [permissions.IsAuthenticated]
    throttle_classes: list = []
    filter_backends: list = []
    serializer_class = FloorSerializer

    def get_queryset(self):
        return WorkloadRequest.objects.filter(project_id=self.request.auth.project_id).order_by("-created_at", "-id")


class FloorList(FloorMixin, generics.ListAPIView):
    pagination_class = FloorPagination


class FloorDetail(FloorMixin, generics.RetrieveAPIView):
    pass


urlpatterns = [
    path("bench/floor/requests/", FloorList.as_view()),
    path("bench/floor/requests/<int:pk>/", FloorDetail.as_view()),
    path("", include("portal.urls")),
]
handler404 = "portal.api.not_found"
handler500 = "portal.api.server_error"

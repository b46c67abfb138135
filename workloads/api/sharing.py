"""``/api/v1/requests/{id}/shares/``: share one request with a named colleague of its tenant (``workloads.sharing``).

GET lists who it is shared with, POST ``{"user": username or email, "level": "view" | "operate"}`` shares it (or
changes the level), DELETE ``shares/{username}/`` stops. The request is looked up in what the caller sees (404
otherwise); the service refuses whoever is neither its requester nor an approver of its project (403)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from tenants.guards import actor_of, require

from .. import policy, sharing


class ColleagueShareWriteSerializer(serializers.Serializer):
    user = serializers.CharField(max_length=254, help_text="The colleague's username or email address (same tenant).")
    level = serializers.ChoiceField(choices=sorted(sharing.LEVELS), default="view",
                                    help_text="view: see the request; operate: also read its logs and open its notebook.")


class ColleagueShareSerializer(serializers.Serializer):
    user = serializers.CharField()
    level = serializers.CharField()
    shared_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


def share_row(row: dict[str, Any]) -> dict[str, Any]:
    by = row["shared_by"]
    return {"user": row["user"].get_username(), "level": row["level"],
            "shared_by": by.get_username() if by is not None else None, "created_at": row["created_at"]}


class RequestSharesMixin:
    """The shares actions of ``RequestViewSet``."""

    @extend_schema(request=ColleagueShareWriteSerializer, responses={200: ColleagueShareSerializer(many=True), 201: ColleagueShareSerializer})
    @action(detail=True, methods=["get", "post"], url_path="shares", pagination_class=None)  # a short list, whole
    def shares(self, request: Request, pk: str | None = None) -> Response:
        """Who the request is shared with (GET), or share it with a colleague of its tenant (POST)."""
        req = self.get_object()
        actor = actor_of(request)
        if request.method == "GET":
            # The list names colleagues: only those who may share see it (the service's rule, asked for a read).
            require(policy.may_share_request(actor, req), "Only the requester and the project's admins see its shares.")
            return Response([share_row(row) for row in sharing.shares_of(req)])
        data = ColleagueShareWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        shared = sharing.request_share(actor=actor, request=req, user=data.validated_data["user"],
                                       level=data.validated_data["level"])
        row = next(r for r in sharing.shares_of(req) if r["user"].pk == shared["user"].pk)
        return Response(share_row(row), status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["delete"], url_path=r"shares/(?P<username>[^/]+)")
    def share_delete(self, request: Request, pk: str | None = None, username: str | None = None) -> Response:
        """Stop sharing the request with ``username`` (404 if it was not shared with them)."""
        req = self.get_object()
        if not sharing.request_unshare(actor=actor_of(request), request=req, user=username or ""):
            return Response({"error": "not_found", "detail": "The request is not shared with that user."},
                            status=status.HTTP_404_NOT_FOUND)
        return Response(status=status.HTTP_204_NO_CONTENT)

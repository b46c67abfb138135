"""Shared API plumbing: pagination, the one error format, strict input serializers."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, pagination, serializers
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.exceptions import PortalError
from portal.inputs import check_offset_text, reject_nul, validate_offset


class Pagination(pagination.PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


def _flatten(detail: Any) -> Any:
    if isinstance(detail, dict):
        return {key: _flatten(value) for key, value in detail.items()}
    if isinstance(detail, list):
        return [_flatten(value) for value in detail]
    return str(detail)


def exception_handler(exc: Exception, context: dict) -> Response | None:
    """Every error has one shape: ``{"error": code, "detail": message, "fields": {...}}``.

    ``fields`` is present on validation errors and maps a field name (``non_field_errors`` for the
    object as a whole) to a list of messages.
    """
    if isinstance(exc, PortalError):
        exc = exc.as_api_exception()
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        conflict = response.status_code == 409
        response.data = {
            "error": "conflict" if conflict else "invalid",
            "detail": "Conflicts with existing data." if conflict else "Invalid input.",
            "fields": _flatten(detail),
        }
    else:
        code = getattr(exc, "default_code", "error")
        codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else code
        response.data = {
            "error": codes if isinstance(codes, str) else code,
            "detail": str(getattr(exc, "detail", exc)),
        }
    return response


class StrictSerializerMixin:
    """Reject unknown input fields with a field error instead of silently ignoring them."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            writable = {name for name, field in self.fields.items() if not field.read_only}  # type: ignore[attr-defined]
            unknown = sorted(set(data) - writable)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)  # type: ignore[misc]


class DateTimeField(serializers.DateTimeField):
    """A date-time with an offset PostgreSQL can store (±15:59), so ``+20:00`` is a field error."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["validators"] = [*kwargs.get("validators", []), validate_offset]
        super().__init__(**kwargs)

    def to_internal_value(self, value: Any) -> Any:
        if isinstance(value, str):
            check_offset_text(value)
        validate_offset(value)
        return super().to_internal_value(value)


class JSONField(serializers.JSONField):
    """A JSON document jsonb can store: no NUL character in any key or string."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["validators"] = [*kwargs.get("validators", []), reject_nul]
        super().__init__(**kwargs)


# OpenAPI -----------------------------------------------------------------------------------------
# The schema documents what the code does: the one error shape on every operation, token and
# session authentication. ``schema_postprocess`` runs last (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]);
# tests/test_fuzz_api.py holds the API to it with schemathesis.

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every error has this shape. `fields` (validation errors only) maps a field name, "
                   "`non_field_errors`, a query parameter or a header to its messages.",
    "properties": {
        "error": {"type": "string", "description": "A stable code: invalid, conflict, not_found, permission_denied, ..."},
        "detail": {"type": "string", "description": "A sentence for people."},
        "fields": {
            "type": "object",
            "additionalProperties": {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "object"}]},
        },
    },
    "required": ["error", "detail"],
}

ERROR_RESPONSES = {
    "400": "Invalid input: `fields` says which field, query parameter or header, and why.",
    "401": "No credentials, or a token that is unknown, revoked or expired.",
    "403": "Signed in, but not allowed to do this (or the tenant is suspended).",
    "404": "No such object among those you may see (another tenant's objects are 404 too), or no such page.",
    "409": "Conflicts with the current state, e.g. a decided request or a quota invariant.",
    "415": "The request body is not JSON.",
    "429": "Too many requests; retry after the time in `Retry-After`.",
}
_UNSAFE = {"post", "put", "patch", "delete"}


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict:
        return {
            "type": "http", "scheme": "bearer",
            "description": "A project token (`gpp_...`), scoped to one project, `read` or `read+submit`.",
        }


def schema_postprocess(result: dict, generator: Any, request: Any, public: bool) -> dict:  # noqa: ARG001
    """Document the error responses and both authentication schemes on every API operation."""
    components = result.setdefault("components", {})
    components.setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    error_ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            operation["security"] = [{"bearerAuth": []}, {"cookieAuth": []}]
            codes = ["400", "401", "403", "404", "429"]
            if method in _UNSAFE:
                codes.append("409")
            if "requestBody" in operation:
                codes.append("415")
            responses = operation.setdefault("responses", {})
            for code in codes:
                responses.setdefault(code, {"description": ERROR_RESPONSES[code], "content": error_ref})
    return result

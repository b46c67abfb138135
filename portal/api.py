"""Shared API plumbing: pagination, the one error format, strict input serializers."""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import functools
import json
import math
import operator
import re
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.paginator import Paginator as DjangoPaginator
from django.db import models
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from drf_spectacular.utils import extend_schema_field
from rest_framework import exceptions, pagination, permissions, serializers
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.exceptions import PortalError
from portal.inputs import check_offset_text, filters_asked, reject_nul, validate_offset


class PageSizeMixin:
    """``page_size`` from 1 (default 50; more than 500 is read as 500). A page_size that is not a whole
    number from 1 is a 400 rather than silently the default."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Any) -> int:
        raw = request.query_params.get(self.page_size_query_param, "")
        if raw == "":
            return self.page_size
        if not (raw.isascii() and raw.isdecimal()) or int(raw) < 1:
            raise exceptions.ValidationError({self.page_size_query_param: ["A whole number from 1 is required."]})
        return min(int(raw), self.max_page_size)


class _Counted(DjangoPaginator):
    """A ``Paginator`` told its count (a count kept elsewhere): no ``COUNT(*)``."""

    def __init__(self, object_list: Any, per_page: int, *, count: int) -> None:
        super().__init__(object_list, per_page)
        self.__dict__["count"] = count  # Paginator.count is a cached_property: this is its value


class Pagination(PageSizeMixin, pagination.PageNumberPagination):
    """``page`` from 1, with ``count``: the small lists. A view with a ``kept_count()`` (the unfiltered list's count,
    kept elsewhere; None when it has none for this caller) is not counted again while no query parameter filters."""

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> list | None:
        kept = getattr(view, "kept_count", None)
        count = kept() if kept is not None and not filters_asked(request) else None
        self.django_paginator_class = DjangoPaginator if count is None else functools.partial(_Counted, count=count)
        return super().paginate_queryset(queryset, request, view)

    def get_schema_operation_parameters(self, view: Any) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
        return parameters


INVALID_CURSOR = "Invalid cursor: use the next or previous link of a page of this list, with the same ordering."
_BIGINT = 2 ** 63


class CursorPagination(PageSizeMixin, pagination.BasePagination):
    """Keyset pagination for the large lists (requests): ``next``/``previous`` links carrying a ``cursor``, no
    ``count`` and no page numbers, so a page costs the same at row 50 and row 100,000 and a list that grows
    while it is walked never repeats or skips a row.

    The order is the list's ``ordering`` (``?ordering=`` or the view's default) with the primary key appended
    as the tie-break, in the direction of the last field; the cursor holds the ordering and the values of the
    row at the page's edge, and the next page is "the rows after those values" (docs/performance.md). The
    ordering fields must not be null. A cursor made under another ordering, or altered, is a 400."""

    cursor_query_param = "cursor"

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> list:
        self.request = request
        self.page_size = self.get_page_size(request)
        keys = self._keys(queryset)
        raw = request.query_params.get(self.cursor_query_param, "")
        values, backwards = self._decode(raw, keys, queryset.model) if raw else (None, False)
        # The view may read the page itself (a query compiled once, portal.compiled); else it is read here.
        rows = None
        read_page = getattr(view, "read_page", None)
        if read_page is not None:
            rows = read_page(keys, values, backwards, self.page_size + 1)
        if rows is None:
            rows = list(keyset_page(queryset, keys, values, backwards)[: self.page_size + 1])
        more = len(rows) > self.page_size
        rows = rows[: self.page_size]
        if backwards:
            rows.reverse()
        self.keys = keys
        self.rows = rows
        self.has_next = True if backwards else more
        self.has_previous = more if backwards else values is not None
        return rows

    def _keys(self, queryset: Any) -> list[tuple[str, bool]]:
        order = [str(term) for term in (queryset.query.order_by or queryset.model._meta.ordering)]
        keys: list[tuple[str, bool]] = []
        for term in order:
            name = term.lstrip("-")
            keys.append(("pk" if name in {"pk", "id"} else name, term.startswith("-")))
            if keys[-1][0] == "pk":
                return keys
        return [*keys, ("pk", keys[-1][1] if keys else True)]

    def _decode(self, raw: str, keys: list[tuple[str, bool]], model: Any) -> tuple[list, bool]:
        try:
            data = json.loads(base64.urlsafe_b64decode(raw.encode("ascii") + b"=" * (-len(raw) % 4)))
            if data["o"] != [f"-{name}" if desc else name for name, desc in keys] or len(data["v"]) != len(keys):
                raise ValueError(raw)
            values = [_cursor_value(model, name, value) for (name, _), value in zip(keys, data["v"], strict=True)]
            return values, data.get("r") is True
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, DjangoValidationError,
                binascii.Error, UnicodeError):
            raise exceptions.ValidationError({self.cursor_query_param: [INVALID_CURSOR]}) from None

    def _encode(self, row: Any, *, backwards: bool) -> str:
        values = []
        for i in range(len(self.keys)):
            value = row[f"cursor_key_{i}"] if isinstance(row, dict) else getattr(row, f"cursor_key_{i}")
            values.append(value.isoformat() if hasattr(value, "isoformat") else str(value) if isinstance(value, Decimal) else value)
        data = {"o": [f"-{name}" if desc else name for name, desc in self.keys], "v": values}
        if backwards:
            data["r"] = True
        raw = base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")
        return pagination.replace_query_param(self.request.build_absolute_uri(), self.cursor_query_param, raw)

    def get_next_link(self) -> str | None:
        return self._encode(self.rows[-1], backwards=False) if self.has_next and self.rows else None

    def get_previous_link(self) -> str | None:
        return self._encode(self.rows[0], backwards=True) if self.has_previous and self.rows else None

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"next": self.get_next_link(), "previous": self.get_previous_link(), "results": data})

    def get_paginated_response_schema(self, schema: dict) -> dict:
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {
            "type": "object",
            "required": ["results"],
            "properties": {
                "next": {**link, "description": "The next page (null on the last); follow it as it is."},
                "previous": {**link, "description": "The page before (null on the first)."},
                "results": schema,
            },
        }

    def get_schema_operation_parameters(self, view: Any) -> list[dict]:
        return [
            {"name": self.cursor_query_param, "required": False, "in": "query",
             "description": "Where the page starts: taken from the next or previous link of the page before "
                            "(opaque; valid with the same ordering).",
             "schema": {"type": "string"}},
            {"name": self.page_size_query_param, "required": False, "in": "query",
             "description": f"Rows per page (default {self.page_size}, at most {self.max_page_size}).",
             "schema": {"type": "integer", "minimum": 1}},
        ]


def _cursor_value(model: Any, name: str, value: Any) -> Any:
    """A cursor's value for ordering field ``name``, checked as the database would need it (ValueError if not)."""
    field = model._meta.pk
    for part in name.split("__") if name != "pk" else []:
        field = model._meta.get_field(part)
        model = field.related_model or model
    if value is None or isinstance(value, (dict, list, bool)):
        raise ValueError(name)
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(name)
    if isinstance(value, int) and not -_BIGINT <= value < _BIGINT:
        raise ValueError(name)
    value = field.to_python(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ValueError(name)
        value = value.astimezone(datetime.UTC)
    return value


def keyset_page(queryset: Any, keys: list[tuple[str, bool]], values: list | None, backwards: bool) -> Any:
    """``queryset`` in the order ``keys`` from the rows after ``values`` (none: from the start), with the key's values
    as ``cursor_key_<i>``: a page of ``CursorPagination`` once sliced. ``backwards``: the page before ``values``,
    read in the reversed order (the caller turns it round)."""
    queryset = queryset.order_by(*[(f"-{name}" if desc != backwards else name) for name, desc in keys])
    if values is not None:
        queryset = queryset.filter(_after(keys, values, backwards=backwards))
    return queryset.annotate(**{f"cursor_key_{i}": models.F(name) for i, (name, _) in enumerate(keys)})


def _after(keys: list[tuple[str, bool]], values: list, *, backwards: bool) -> models.Q:
    """The rows after ``values`` in the order ``keys`` (before them when ``backwards``): on the first field
    ``<=`` (an index range the planner can use), then the lexicographic comparison of the whole key."""
    def op(desc: bool, strict: bool) -> str:
        return ("lt" if desc != backwards else "gt") + ("" if strict else "e")

    after = functools.reduce(operator.or_, [
        models.Q(**{keys[j][0]: values[j] for j in range(i)}, **{f"{name}__{op(desc, True)}": values[i]})
        for i, (name, desc) in enumerate(keys)
    ])
    return models.Q(**{f"{keys[0][0]}__{op(keys[0][1], False)}": values[0]}) & after


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
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            response.data["retry_after"] = math.ceil(exc.wait)  # as the Retry-After header says
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: the API answers in its one error shape, pages with the HTML error page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "server_error", "detail": "A server error occurred. It has been logged."}, status=500)
    return defaults.server_error(request)
@extend_schema_field({"oneOf": [{"type": "string", "minLength": 1, "maxLength": 63, "pattern": r"^[^\x00]*$"},
                                 {"type": "integer", "minimum": 1}]})
class IdOrNameField(serializers.CharField):
    """An object's id (a JSON number or digits) or its name/slug."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 63)
        super().__init__(**kwargs)


def _wrong_type(field: serializers.Field, value: Any) -> str | None:
    """JSON input of the wrong type for ``field`` (DRF would coerce ``0`` to ``"0"``, ``"1"`` to ``True``)."""
    if value is None:
        return None  # allow_null decides
    if isinstance(field, IdOrNameField):
        return None if isinstance(value, (str, int)) and not isinstance(value, bool) else "Must be an id or a name."
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else "Must be true or false."
    if isinstance(field, serializers.IntegerField):
        return None if isinstance(value, int) and not isinstance(value, bool) else "Must be a whole number."
    if isinstance(field, serializers.DecimalField):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) or isinstance(value, str) and value.strip() != ""
        return None if ok else "Must be a number."
    if isinstance(field, (serializers.CharField, serializers.DateTimeField, serializers.ChoiceField,
                          serializers.SlugRelatedField)) and not isinstance(
        field, serializers.MultipleChoiceField
    ):
        return None if isinstance(value, str) else "Must be a string."
    return None


def _number_size(field: serializers.Field, value: Any) -> str | None:
    """A number too large for ``field`` ("too large (at most 9999.99)"), where DRF would say "A valid
    number is required" (JSON ``1e309`` reads as infinity) or count its digits."""
    from .forms import number_problem

    if isinstance(field, serializers.DecimalField):
        return number_problem(value, kind="decimal", max_digits=field.max_digits, decimal_places=field.decimal_places,
                              max_value=field.max_value)
    if isinstance(field, serializers.IntegerField):
        if isinstance(value, float):  # 1.5 is "Must be a whole number"; 1e309 (infinity) is too large
            return None if math.isfinite(value) else number_problem(value, kind="integer", max_value=field.max_value)
        return number_problem(value, kind="integer") if field.max_value is None else None
    if isinstance(field, serializers.FloatField):
        return number_problem(value, kind="float", max_value=field.max_value)
    return None


def field_copy(field: serializers.Field) -> serializers.Field:
    """A declared field for one serializer instance, as good as DRF's deep copy for a field that is not a serializer.

    DRF deep-copies every declared field for each serializer it makes (``Field.__deepcopy__`` builds the field again
    from deep copies of its arguments): half a millisecond for a submission's 21 fields, most of its validation. What
    a field gains in use is what ``bind`` sets on it (name, parent, label, source), so a shallow copy, bound anew, is
    enough; a list's or dict's child is copied too, its parent the copy. Nested serializers keep DRF's deep copy.
    """
    if isinstance(field, serializers.BaseSerializer):
        return copy.deepcopy(field)
    new = copy.copy(field)
    child = getattr(field, "child", None)
    if isinstance(child, serializers.Field):
        new.child = field_copy(child)
        new.child.parent = new  # bound as the original's child is (its name and source "")
    return new


class StrictSerializerMixin:
    """Strict JSON input: unknown fields and values of the wrong JSON type are field errors, instead of
    being ignored or coerced (as the OpenAPI schema says). Its declared fields are copied per instance by
    ``field_copy``."""

    def get_fields(self) -> dict[str, serializers.Field]:
        if isinstance(self, serializers.ModelSerializer):
            return super().get_fields()  # type: ignore[misc]
        return {name: field_copy(field) for name, field in self._declared_fields.items()}  # type: ignore[attr-defined]

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            fields = {name: field for name, field in self.fields.items() if not field.read_only}  # type: ignore[attr-defined]
            errors = {name: ["Unknown field."] for name in sorted(set(data) - set(fields))}
            for name, value in data.items():
                problem = (_number_size(fields[name], value) or _wrong_type(fields[name], value)) if name in fields else None
                if problem:
                    errors[name] = [problem]
            if errors:
                raise serializers.ValidationError(errors)
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


def _infinite_at(value: Any, path: tuple[str, ...] = ()) -> tuple[tuple[str, ...], float] | None:
    """Where in a JSON document a number too large to hold is (``1e309`` reads as infinity)."""
    if isinstance(value, float) and math.isinf(value):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _infinite_at(item, (*path, str(key)))
        if found is not None:
            return found
    return None


class JSONField(serializers.JSONField):
    """A JSON document jsonb can store: no NUL character in any key or string, no infinite number."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["validators"] = [*kwargs.get("validators", []), reject_nul]
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        found = _infinite_at(data)
        if found is not None:  # DRF would say "Value must be valid JSON"
            path, value = found
            word = "large" if value > 0 else "small"
            raise serializers.ValidationError(f"This number is too {word}" + (f" (at {'.'.join(path)})." if path else "."))
        return super().to_internal_value(data)


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(JSONField):
    """A JSON object (not null, not a list)."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError("Expected a JSON object.")
        return super().to_internal_value(data)


@extend_schema_field({"type": "array", "items": {"type": "object", "additionalProperties": True}})
class JSONObjectListField(JSONField):
    """A JSON list of objects."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise serializers.ValidationError("Expected a list of JSON objects.")
        return super().to_internal_value(data)


# Rate limits ------------------------------------------------------------------------------------
# The rate limits (429 with Retry-After) live in portal/throttles.py: DRF imports its default throttle
# classes while it builds APIView, so their module must not import rest_framework.views (this one does).


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


def schema_postprocess(result: dict, generator: Any, request: Any, public: bool) -> dict:
    """Document the error responses and both authentication schemes on every API operation."""
    components = result.setdefault("components", {})
    components.setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    error_ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    bodies: set[str] = set()
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            for content in operation.get("requestBody", {}).get("content", {}).values():
                ref = content.get("schema", {}).get("$ref", "")
                bodies.add(ref.rsplit("/", 1)[-1])
            for parameter in operation.get("parameters", []):
                # An empty query parameter means "no filter" (django-filter and the paginator skip it).
                if parameter.get("in") == "query" and not parameter.get("required"):
                    parameter["allowEmptyValue"] = True
                _strict_parameter(parameter.get("schema", {}))
            operation["security"] = [{"projectToken": []}, {"cookieAuth": []}]  # tenants/authentication.py names them
            codes = ["400", "401", "403", "404", "429"]
            if method in _UNSAFE:
                codes.append("409")
            if "requestBody" in operation:
                codes.append("415")
            responses = operation.setdefault("responses", {})
            for code in codes:
                responses.setdefault(code, {"description": ERROR_RESPONSES[code], "content": error_ref})
            for code, response in responses.items():
                if code[0] in "45" and "content" not in response:  # e.g. a view's own 422 or 503: the error shape
                    response["content"] = error_ref
    for name in bodies:
        _strict_body(components["schemas"].get(name))
    return result


# What portal/inputs.py refuses, said in the schema: no NUL character in any parameter (400 from
# NulGuardMiddleware), and date-time offsets within ±15:59 (PostgreSQL's range).
NO_NUL = r"^[^\x00]*$"
DATE_TIME_OFFSET = r"(?:[Zz]|[+-](?:0[0-9]|1[0-5]):?[0-5][0-9]|T[0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]+)?)?)$"


def _strict_parameter(schema: dict) -> None:
    if schema.get("type") != "string" or "enum" in schema or "pattern" in schema:
        return
    schema["pattern"] = DATE_TIME_OFFSET if schema.get("format") == "date-time" else NO_NUL


def _strict_body(schema: dict | None) -> None:
    """Request bodies as the strict serializers read them: no unknown fields; decimals need a digit."""
    if not schema or schema.get("type") != "object":
        return
    schema["additionalProperties"] = False
    for prop in schema.get("properties", {}).values():
        if prop.get("format") == "decimal" and "pattern" in prop:
            # drf-spectacular's pattern also admits "", "-" and "."; every decimal we read is >= 0.
            whole, places = re.findall(r"\{0,(\d+)\}", prop["pattern"])[:2]
            prop["pattern"] = rf"^(?:\d{{1,{whole}}}(?:\.\d{{0,{places}}})?|\.\d{{1,{places}}})$"
            # JSON numbers are read too.
            text = {key: prop.pop(key) for key in ["type", "format", "pattern"]}
            prop["anyOf"] = [text, {"type": "number", "minimum": 0, "maximum": 10 ** int(whole) - 1}]


def permission_denied(request: Any, exception: Exception | None = None) -> Any:
    """handler403: under /api/ the API's error format; elsewhere the portal's page (templates/403.html)."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "permission_denied", "detail": str(exception or "") or "Not allowed."}, status=403)
    return defaults.permission_denied(request, exception)


def bad_request(request: Any, exception: Exception | None = None) -> Any:
    """handler400: under /api/ the API's error format; elsewhere the portal's page (templates/400.html)."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "invalid", "detail": "Bad request."}, status=400)
    return defaults.bad_request(request, exception)


def not_found(request: Any, exception: Exception | None = None) -> Any:
    """handler404: under /api/ a URL that matches no route is a 404 in the API's error format."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "not_found", "detail": "Not found."}, status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


# Who reads the schema and the API docs ----------------------------------------------------------------
# settings.PORTAL_SCHEMA_PUBLIC (default: on in development, off with PORTAL_ENV=production): when off, the
# schema needs a signed-in user or a token (401 in the error shape otherwise) and the docs pages send people
# to the sign-in page first. Read at each request, so a deployment (or a test) can change it.


class SchemaAccess(permissions.BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(settings.PORTAL_SCHEMA_PUBLIC or (request.user and request.user.is_authenticated))


def schema_view() -> Any:
    """``/api/schema/``: drf-spectacular's view behind ``SchemaAccess``; a refusal is JSON in the error shape
    (not rendered by the schema's own YAML renderer)."""
    from drf_spectacular.views import SpectacularAPIView
    from rest_framework.renderers import JSONRenderer

    class SchemaView(SpectacularAPIView):
        permission_classes = [SchemaAccess]

        def handle_exception(self, exc: Exception) -> Response:
            response = super().handle_exception(exc)
            self.request.accepted_renderer = JSONRenderer()
            self.request.accepted_media_type = JSONRenderer.media_type
            return response

    return SchemaView.as_view()


def schema_page(view: Any) -> Any:
    """A docs page (Swagger UI, Redoc): signed-in users only unless the schema is public."""
    from functools import wraps

    from django.contrib.auth.views import redirect_to_login

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.PORTAL_SCHEMA_PUBLIC and not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapped

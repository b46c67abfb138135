"""Input PostgreSQL cannot store or compare, refused before it reaches a query (a 400 or 404, not a 500).

- ``NulGuardMiddleware``: a NUL character (``\\x00``, ``%00``, ``\\u0000``) anywhere in the path (404),
  the query string, a header or a JSON body (400 with the field, in the API's error format). PostgreSQL
  ``text`` and ``jsonb`` cannot hold NUL, so such input could only ever fail in the database.
- ``is_id()``: an object id in a URL or a field is ASCII digits only. ``str.isdigit()`` is also true
  for ``²`` or ``١``, which ``int()`` refuses or reads as another number.
- ``validate_offset()``: PostgreSQL accepts time-zone offsets up to ±15:59; Python's up to ±23:59.
- ``reject_nul()``: the same NUL rule for values that do not come from HTTP (services, JSON fields).
- ``json_loads()`` / ``json_problem()``: JSON that parses but cannot be stored or walked safely: a lone
  surrogate (``"\\ud800"`` is valid JSON, yet no UTF-8 text: PostgreSQL, psycopg and the templates all
  fail on it) and nesting deeper than ``MAX_JSON_DEPTH`` (100,000 ``[`` overflow the parser's stack as a
  ``RecursionError``). The middleware, the API's JSON parser (``portal.api.JSONParser``) and the forms' JSON
  fields (``portal.forms.JSONField``) all ask these, so every way JSON comes in answers the same 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import bad_request

NUL = "\x00"
NUL_MESSAGE = "NUL characters (\\u0000) are not allowed."
MAX_OFFSET = timedelta(hours=15, minutes=59)
OFFSET_MESSAGE = "The time-zone offset must be between -15:59 and +15:59."
_ID = re.compile(r"[0-9]{1,18}")
MAX_JSON_DEPTH = 64
DEPTH_MESSAGE = f"JSON nested more than {MAX_JSON_DEPTH} levels deep is not accepted."
SURROGATE_MESSAGE = "Lone surrogate characters (\\ud800 to \\udfff) are not allowed: they are not text."
_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonRefused(ValueError):
    """JSON refused before or after parsing: ``path`` (keys and indexes, outermost first) and ``message``."""

    def __init__(self, path: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message

    @property
    def field(self) -> str:
        """The top-level field to name in a 400 (the whole body when the problem is at the top)."""
        return self.path[0] if self.path else "non_field_errors"

    @property
    def detail(self) -> str:
        """The message, saying where when the problem is inside a field (``(at parameters.command)``)."""
        return self.message[:-1] + f" (at {'.'.join(self.path)})." if len(self.path) > 1 else self.message


def _printable(key: str) -> str:
    """A key fit to show in a message: NUL and lone surrogates spelled as their JSON escapes."""
    key = key.replace(NUL, "\\u0000")
    return _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", key)


def json_problem(value: Any) -> JsonRefused | None:
    """The first thing in ``value`` (parsed JSON) that cannot be stored: a NUL or a lone surrogate in a key
    or a string, or nesting deeper than ``MAX_JSON_DEPTH``. Walked with a stack, not recursion, so any
    depth Python could build is answered."""
    stack: list[tuple[Any, tuple[str, ...], int]] = [(value, (), 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                return JsonRefused(path, NUL_MESSAGE)
            if _SURROGATE.search(item):
                return JsonRefused(path, SURROGATE_MESSAGE)
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            return JsonRefused(path, DEPTH_MESSAGE)
        children: list[tuple[Any, tuple[str, ...], int]] = []
        if isinstance(item, dict):
            for given, child in item.items():
                key = str(given)
                if NUL in key:
                    return JsonRefused((*path, _printable(key)), NUL_MESSAGE)
                if _SURROGATE.search(key):
                    return JsonRefused((*path, _printable(key)), SURROGATE_MESSAGE)
                children.append((child, (*path, key), depth + 1))
        else:
            children = [(child, (*path, str(index)), depth + 1) for index, child in enumerate(item)]
        stack.extend(reversed(children))  # depth first, in document order: the first problem is named
    return None


def json_loads(text: str | bytes) -> Any:
    """``json.loads`` that raises ``JsonRefused`` for what ``json_problem`` refuses, including nesting too
    deep for the parser itself (its ``RecursionError``), and ``ValueError`` for text that is not JSON."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JsonRefused((), DEPTH_MESSAGE) from None
    problem = json_problem(value)
    if problem is not None:
        raise problem
    return value


def is_id(key: Any) -> bool:
    """True for an id-looking key: 1 to 18 ASCII digits (fits a bigint), nothing else."""
    return isinstance(key, str) and _ID.fullmatch(key) is not None


def validate_offset(value: datetime | None) -> None:
    """Refuse a time-zone offset PostgreSQL cannot store (beyond ±15:59)."""
    offset = value.utcoffset() if isinstance(value, datetime) else None
    if offset is not None and abs(offset) > MAX_OFFSET:
        raise ValidationError(OFFSET_MESSAGE, code="invalid_offset")


_OFFSET_TEXT = re.compile(r"T[0-9:.,]+([+-])([0-9]{2}):?([0-9]{2})(?::?[0-9]{2})?$")


def check_offset_text(value: str) -> None:
    """The offset rule for text not yet parsed: ``...T00:00:00+99:00`` says why, not just "invalid"."""
    match = _OFFSET_TEXT.search(value.strip())
    if match and timedelta(hours=int(match[2]), minutes=int(match[3])) > MAX_OFFSET:
        raise ValidationError(OFFSET_MESSAGE, code="invalid_offset")


def nul_path(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Where in ``value`` (a JSON document) a NUL character is, in a key or a string; None if nowhere."""
    if isinstance(value, str):
        return path if NUL in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            if NUL in str(key):
                return (*path, str(key).replace(NUL, "\\u0000"))
            found = nul_path(item, (*path, str(key)))
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = nul_path(item, (*path, str(index)))
            if found is not None:
                return found
    return None


def reject_nul(value: Any) -> None:
    """A Django/DRF validator: no NUL character anywhere in ``value`` (a string or a JSON document)."""
    where = nul_path(value)
    if where is not None:
        at = f" (at {'.'.join(where)})" if where else ""
        raise ValidationError(NUL_MESSAGE[:-1] + at + ".", code="null_characters_not_allowed")


def _header_name(meta_key: str) -> str:
    return "-".join(part.capitalize() for part in meta_key.removeprefix("HTTP_").split("_"))


class NulGuardMiddleware:
    """Answer a request carrying a NUL character (or a JSON body ``json_loads`` refuses: a lone surrogate,
    nesting too deep) before any view, session or token lookup runs.

    Path → 404 (no object can have such a name). Query parameter, header or JSON body → 400; under
    ``/api/`` in the API's error format with the parameter, header or top-level body field as the
    field name, e.g. ``{"error": "invalid", "detail": "Invalid input.", "fields": {"parameters":
    ["NUL characters (\\u0000) are not allowed (at parameters.command)."]}}``.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        api = request.path_info.startswith("/api/")
        if NUL in request.path_info:
            if api:
                return JsonResponse({"error": "not_found", "detail": "Not found."}, status=404)
            raise Http404("No such page.")
        problem = self._problem(request)
        if problem is not None:
            field, message = problem
            if api:
                body = {"error": "invalid", "detail": "Invalid input.", "fields": {field: [message]}}
                return JsonResponse(body, status=400)
            return bad_request(request, ValueError(f"{field}: {message}"))
        return self.get_response(request)

    def _problem(self, request: HttpRequest) -> tuple[str, str] | None:
        try:
            query = request.GET
        except UnicodeDecodeError:  # pragma: no cover - Django decodes with replacement characters
            return None
        for name, values in query.lists():
            if NUL in name or any(NUL in value for value in values):
                return name.replace(NUL, "\\u0000"), NUL_MESSAGE
        for key, value in request.META.items():
            if key.startswith("HTTP_") and isinstance(value, str) and NUL in value:
                return _header_name(key), NUL_MESSAGE
        if request.content_type == "application/json" or request.content_type.endswith("+json"):
            try:
                json_loads(request.body or b"null")
            except JsonRefused as refused:
                return refused.field, refused.detail
            except ValueError:
                return None  # not JSON: the view's parser says so
        return None


def _filter_classes() -> tuple[type, type, type, type]:
    import django_filters
    from django import forms
    from django.db import models
    from django_filters import fields

    class IsoDateTimeField(fields.IsoDateTimeField):
        """ISO 8601 date-time whose offset PostgreSQL can store; ``+99:00`` gets the offset message too."""

        default_validators = [validate_offset]

        def to_python(self, value: Any) -> datetime | None:
            if isinstance(value, str):
                check_offset_text(value)
            return super().to_python(value)

    class IsoDateTimeFilter(django_filters.IsoDateTimeFilter):
        field_class = IsoDateTimeField

    class RawNullBooleanSelect(forms.NullBooleanSelect):
        """The same select on pages, but the value reaches the field as sent (so nonsense is an error)."""

        def value_from_datadict(self, data: Any, files: Any, name: str) -> Any:
            return data.get(name)

    class StrictBooleanField(forms.Field):
        """``true``/``false`` (also 1/0, yes/no, on/off); anything else is a field error, not "no filter"."""

        widget = RawNullBooleanSelect
        TRUE = {"true", "1", "yes", "on"}
        FALSE = {"false", "0", "no", "off"}

        def to_python(self, value: Any) -> bool | None:
            if value in (None, "", "unknown"):
                return None
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in self.TRUE:
                return True
            if text in self.FALSE:
                return False
            raise ValidationError("Use true or false.", code="invalid")

    class BooleanFilter(django_filters.BooleanFilter):
        field_class = StrictBooleanField

    class MultipleChoiceField(fields.MultipleChoiceField):
        """``?state=`` (empty) means no filter, like every other empty filter value."""

        def clean(self, value: Any) -> Any:
            return super().clean([item for item in value or [] if item != ""])

    class MultipleChoiceFilter(django_filters.MultipleChoiceFilter):
        field_class = MultipleChoiceField

    class FilterSet(django_filters.FilterSet):
        """The portal's FilterSet: model boolean fields filter with the strict boolean filter."""

        FILTER_DEFAULTS = {**django_filters.FilterSet.FILTER_DEFAULTS, models.BooleanField: {"filter_class": BooleanFilter}}

    return IsoDateTimeField, IsoDateTimeFilter, BooleanFilter, MultipleChoiceFilter, FilterSet


IsoDateTimeField, IsoDateTimeFilter, BooleanFilter, MultipleChoiceFilter, FilterSet = _filter_classes()


def _search_filter() -> type:
    from rest_framework import filters

    class SearchFilter(filters.SearchFilter):
        """DRF's ``?search=``, documented only on the lists that search something (their ``search_fields``),
        and saying which fields it matches. DRF's own documents it on every list, and ignores it where a view
        names no field: the schema would offer a filter that filters nothing."""

        def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
            fields = getattr(view, "search_fields", None)
            if not fields:
                return []
            parameters = super().get_schema_operation_parameters(view)
            names = ", ".join(str(f).lstrip("^=@$").replace("__", ".") for f in fields)
            for parameter in parameters:
                parameter["description"] = f"Words that must each appear (case-insensitive) in one of: {names}."
            return parameters

    return SearchFilter


SearchFilter = _search_filter()

# Query parameters that page a list and ask for nothing else: the paginations' (``portal.api``) and DRF's format.
PAGING_PARAMS = frozenset({"cursor", "page", "page_size", "format"})


def filters_asked(request: Any) -> bool:
    """Does a query parameter ask an API list for more than a page: a filter, an order, a search, or a name that no
    backend knows (the backends then run, and ignore it, as always)?"""
    return not PAGING_PARAMS.issuperset(request.query_params)


def _filter_backend() -> type:
    from django_filters.rest_framework import DjangoFilterBackend

    class FilterBackend(DjangoFilterBackend):
        """django-filter's backend (every API list's ``filterset_class``), not run when no query parameter asks for
        more than a page (``filters_asked``). Without a value every filter hands the queryset on unchanged, and
        building the FilterSet (a deep copy of each filter, its form, the form's validation) was about 6 % of a
        20-row API list. With any other parameter it runs as before: its 400s for bad values included."""

        def filter_queryset(self, request: Any, queryset: Any, view: Any) -> Any:
            if not filters_asked(request):
                return queryset
            return super().filter_queryset(request, queryset, view)

    return FilterBackend


FilterBackend = _filter_backend()


def _json_parser() -> type:
    from rest_framework import exceptions, parsers

    class JSONParser(parsers.JSONParser):
        """The API's JSON parser (``DEFAULT_PARSER_CLASSES``): DRF's, and a 400 naming the field for what
        ``json_loads`` refuses, so no view ever sees a lone surrogate or meets a ``RecursionError``."""

        def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
            try:
                data = super().parse(stream, media_type, parser_context)
            except RecursionError:
                data, problem = None, JsonRefused((), DEPTH_MESSAGE)
            else:
                problem = json_problem(data)
            if problem is not None:
                raise exceptions.ValidationError({problem.field: [problem.detail]})
            return data

    return JSONParser


JSONParser = _json_parser()

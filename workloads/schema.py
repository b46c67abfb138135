"""Template parameters as JSON Schema: one definition for the API's validation and the generated form.

``parameter_errors()`` turns jsonschema's errors into field errors keyed ``parameters.<path>``
(``parameters.retries``, ``parameters.args.0``), the shape the API's error format and the form use.
``form_fields()`` describes the fields a form renders from the same schema.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

from django.core.exceptions import ValidationError
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

PREFIX = "parameters"


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def schema_errors(schema: Any) -> list[str]:
    """Problems with a template's schema itself (ops write these): empty when it is usable."""
    if not isinstance(schema, dict):
        return ["The parameters schema must be a JSON object."]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return [f"{exc.message}" + (f" (at {where})" if where else "")]
    if schema.get("type", "object") != "object":
        return ["The parameters schema must describe an object (\"type\": \"object\")."]
    return []


def _field_of(error: Any) -> list[tuple[str, str]]:
    """(field key, message) pairs for one jsonschema error; some errors name several fields."""
    path = [str(part) for part in error.absolute_path]
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        missing = [name for name in error.validator_value if name not in instance]
        return [(".".join([PREFIX, *path, name]), "This parameter is required.") for name in missing]
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = set(error.schema.get("properties", {}))
        patterns = error.schema.get("patternProperties", {})
        extra = [
            name for name in instance
            if name not in known and not any(re.search(pattern, name) for pattern in patterns)
        ]
        if extra:
            return [(".".join([PREFIX, *path, name]), "Unknown parameter.") for name in extra]
    return [(".".join([PREFIX, *path]), error.message)]


def _too_large(value: Any, path: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Numbers JSON can write but nothing can hold: ``1e309`` reads as infinity."""
    if isinstance(value, float) and not math.isfinite(value) and not math.isnan(value):
        return [(".".join([PREFIX, *path]), "This number is too large." if value > 0 else "This number is too small.")]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _too_large(item, (*path, str(key)))]
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in _too_large(item, (*path, str(index)))]
    return []


def parameter_errors(schema: dict[str, Any], parameters: Any) -> dict[str, list[str]]:
    """Every problem of ``parameters`` against ``schema``, as ``{"parameters.<path>": [messages]}``."""
    errors: dict[str, list[str]] = {}
    for field, message in _too_large(parameters):
        errors.setdefault(field, []).append(message)
    if errors:
        return errors
    for error in sorted(_validator(schema or {}).iter_errors(parameters), key=lambda e: list(map(str, e.absolute_path))):
        for field, message in _field_of(error):
            errors.setdefault(field, []).append(message)
    return errors


def apply_defaults(schema: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` with the schema's top-level defaults filled in, so what we store is complete."""
    out = dict(parameters)
    for name, spec in (schema or {}).get("properties", {}).items():
        if name not in out and isinstance(spec, dict) and "default" in spec:
            out[name] = copy.deepcopy(spec["default"])
    return out


def parameters_validate(schema: dict[str, Any], parameters: Any) -> dict[str, Any]:
    """Validated parameters with defaults applied, or ``ValidationError`` with one entry per field."""
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise ValidationError({PREFIX: ["Parameters must be a JSON object."]})
    errors = parameter_errors(schema, parameters)
    if errors:
        raise ValidationError(errors)
    completed = apply_defaults(schema, parameters)
    # Defaults come from the same schema, so they validate too; checked anyway, since ops write schemas.
    errors = parameter_errors(schema, completed)
    if errors:
        raise ValidationError(errors)
    return completed


FORM_TYPES = {"string": "text", "integer": "integer", "number": "number", "boolean": "checkbox", "array": "list", "object": "mapping"}


def form_fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The fields of a form generated from ``schema``, in the schema's order.

    Each is ``{"name", "label", "type", "widget", "required", "description", "default", "enum",
    "minimum", "maximum", "min_length", "max_length", "items"}`` (absent keys are ``None``);
    ``widget`` is a hint: text, integer, number, checkbox, select, list (of ``items``), mapping.
    """
    required = set((schema or {}).get("required", []))
    fields = []
    for name, given in (schema or {}).get("properties", {}).items():
        spec = given if isinstance(given, dict) else {}
        kind = spec.get("type", "string")
        if isinstance(kind, list):  # ["string", "null"]: the first real type decides the widget
            kind = next((k for k in kind if k != "null"), "string")
        items = spec.get("items") if isinstance(spec.get("items"), dict) else None
        fields.append(
            {
                "name": name,
                "label": spec.get("title") or name.replace("_", " ").capitalize(),
                "type": kind,
                "widget": "select" if "enum" in spec else FORM_TYPES.get(kind, "text"),
                "required": name in required,
                "description": spec.get("description", ""),
                "default": spec.get("default"),
                "enum": spec.get("enum"),
                "minimum": spec.get("minimum"),
                "maximum": spec.get("maximum"),
                "min_length": spec.get("minLength"),
                "max_length": spec.get("maxLength"),
                "items": {"type": items.get("type", "string")} if items else None,
            }
        )
    return fields

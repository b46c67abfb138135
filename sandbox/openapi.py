"""OpenAPI v3 documents (``/openapi/v3`` and ``/openapi/v3/<api|apis>/<g>/<v>``).

What kubectl needs (sandbox/README.md, "What clients expect"):

* every kind has a ``patch`` operation on its item path carrying ``x-kubernetes-group-version-kind`` (an object)
  and the ``fieldValidation`` query parameter, so kubectl lets the server validate (``fieldValidation=Strict``);
* ``api/v1`` is always in the index and has a Namespace patch operation with that parameter;
* ``components.schemas`` has one schema per kind whose ``x-kubernetes-group-version-kind`` *list* names it
  (``kubectl explain``). CRD kinds get their ``openAPIV3Schema``; built-in kinds get a loose schema
  (``x-kubernetes-preserve-unknown-fields``) with the right GVK.

``/openapi/v2`` is not served (404), as recommended.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from pathlib import Path

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"

_OBJECT_META_SCHEMA = {
    "type": "object",
    "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "generateName": {"type": "string", "description": "Optional prefix used by the server to generate a unique name."},
        "namespace": {"type": "string", "description": "Namespace defines the space within which each name must be unique."},
        "uid": {"type": "string", "description": "UID is the unique in time and space value for this object."},
        "resourceVersion": {"type": "string", "description": "An opaque value that represents the internal version of this object."},
        "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state."},
        "creationTimestamp": {"type": "string", "format": "date-time", "description": "Time when this object was created."},
        "deletionTimestamp": {"type": "string", "format": "date-time", "description": "Time at which this resource will be deleted."},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""},
                   "description": "Map of string keys and values that can be used to organize and categorize objects."},
        "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""},
                        "description": "Annotations is an unstructured key value map stored with a resource."},
        "finalizers": {"type": "array", "items": {"type": "string", "default": ""},
                       "description": "Must be empty before the object is deleted from the registry.",
                       "x-kubernetes-list-type": "set"},
        "ownerReferences": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            "description": "List of objects depended by this object.",
                            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"],
                            "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge"},
        "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                          "description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow."},
    },
}

_LIST_META_SCHEMA = {
    "type": "object",
    "description": "ListMeta describes metadata that synthetic resources must have.",
    "properties": {
        "resourceVersion": {"type": "string"},
        "continue": {"type": "string"},
        "remainingItemCount": {"type": "integer", "format": "int64"},
    },
}

_STATUS_SCHEMA = {
    "type": "object",
    "description": "Status is a return value for calls that don't return other objects.",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "code": {"type": "integer", "format": "int32"},
        "message": {"type": "string"},
        "reason": {"type": "string"},
        "status": {"type": "string"},
        "details": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "metadata": {"$ref": f"#/components/schemas/{LIST_META}"},
    },
    "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Status"}],
}

_API_VERSION = {
    "type": "string",
    "description": "APIVersion defines the versioned schema of this representation of an object. "
    "Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values.",
}
_KIND = {
    "type": "string",
    "description": "Kind is a string value representing the REST resource this object represents. "
    "Servers may infer this from the endpoint the client submits requests to. In CamelCase.",
}

_PATCH_TYPES_CRD = ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]
_PATCH_TYPES_BUILTIN = _PATCH_TYPES_CRD + ["application/strategic-merge-patch+json"]


def _reverse_group(group: str) -> str:
    if not group:
        return "io.k8s.api.core"
    if group.endswith(".k8s.io") or "." not in group:
        # built-in groups: io.k8s.api.<first label>
        return "io.k8s.api." + group.split(".", maxsplit=1)[0]
    return ".".join(reversed(group.split(".")))


def schema_name(rt) -> str:
    return f"{_reverse_group(rt.group)}.{rt.version}.{rt.kind}"


def _gvk(rt) -> dict:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _param(name: str, where: str = "query", required: bool = False, schema_type: str = "string") -> dict:
    p = {"name": name, "in": where, "schema": {"type": schema_type, "uniqueItems": True}}
    if required:
        p["required"] = True
    return p


# -- built-in kinds: schemas from the kubernetes-validate package (JSON Schema of the Kubernetes OpenAPI) ---------------
_BUILTIN_K8S_VERSION = "v1.32.0"
_builtin_defs: dict | None = None
_builtin_lock = threading.Lock()


def _load_builtin_defs() -> dict:
    """{definition name: JSON schema} for Kubernetes built-in types, {} if kubernetes-validate is unavailable."""
    global _builtin_defs  # noqa: PLW0603 the schemas, parsed once per process (under the lock)
    with _builtin_lock:
        if _builtin_defs is None:
            defs: dict = {}
            try:
                import kubernetes_validate

                base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
                cand = base / f"{_BUILTIN_K8S_VERSION}-local" / "_definitions.json"
                if not cand.exists():
                    versions = sorted(p for p in base.glob("v*-local") if p.is_dir())
                    cand = versions[-1] / "_definitions.json" if versions else cand
                with open(cand) as fh:
                    defs = json.load(fh).get("$defs") or {}
            except Exception:
                defs = {}
            _builtin_defs = defs
        return _builtin_defs


def _convert_schema(node):
    """JSON Schema (kubernetes-validate flavour) -> OpenAPI 3.0 schema as the apiserver publishes it."""
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "$ref" and isinstance(v, str):
            out[k] = "#/components/schemas/" + v.rsplit("/", 1)[-1]
        elif k == "type" and isinstance(v, list):
            types = [t for t in v if t != "null"]
            out[k] = types[0] if types else "object"
        elif k == "properties" and isinstance(v, dict):
            out[k] = {pk: _convert_schema(pv) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties", "not") and isinstance(v, dict):
            out[k] = _convert_schema(v)
        elif k in ("allOf", "anyOf", "oneOf") and isinstance(v, list):
            out[k] = [_convert_schema(x) for x in v]
        else:
            out[k] = v
    if "oneOf" in out and all(isinstance(x, dict) and set(x) == {"type"} for x in out["oneOf"]):
        kinds = {x["type"] for x in out.pop("oneOf")}
        out["type"] = "string"
        if "integer" in kinds:
            out["format"] = "int-or-string"
            out["x-kubernetes-int-or-string"] = True
    if "$ref" in out and len(out) > 1:
        ref = out.pop("$ref")
        out["allOf"] = [{"$ref": ref}]
    return out


def _refs(node, acc: set) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                acc.add(v.rsplit("/", 1)[-1])
            else:
                _refs(v, acc)
    elif isinstance(node, list):
        for v in node:
            _refs(v, acc)


def builtin_definition_name(rt) -> str | None:
    defs = _load_builtin_defs()
    name = f"{_reverse_group(rt.group)}.{rt.version}.{rt.kind}"
    if name in defs:
        return name
    want = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    for n, d in defs.items():
        for g in d.get("x-kubernetes-group-version-kind") or []:
            if g == want:
                return n
    return None


def builtin_schemas(names: list[str]) -> dict:
    """The named definitions plus everything they reference, converted to OpenAPI 3 components."""
    defs = _load_builtin_defs()
    out: dict = {}
    todo = [n for n in names if n in defs]
    while todo:
        n = todo.pop()
        if n in out or n not in defs:
            continue
        out[n] = _convert_schema(defs[n])
        acc: set = set()
        _refs(out[n], acc)
        todo.extend(a for a in acc if a not in out)
    return out


def _kind_schema(rt) -> dict:
    if rt.schema:
        schema = copy.deepcopy(rt.schema)
    else:
        schema = {
            "type": "object",
            "description": f"{rt.kind} (built-in kind; the sandbox cluster does not publish its full schema).",
            "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
            "x-kubernetes-preserve-unknown-fields": True,
        }
    props = schema.setdefault("properties", {})
    props["apiVersion"] = dict(_API_VERSION)
    props["kind"] = dict(_KIND)
    meta = props.get("metadata") or {}
    props["metadata"] = {
        "description": meta.get("description") or "Standard object's metadata.",
        "allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}],
        "default": {},
    }
    schema.setdefault("type", "object")
    schema["x-kubernetes-group-version-kind"] = [_gvk(rt)]
    return schema


def _list_schema(rt) -> dict:
    return {
        "type": "object",
        "description": f"{rt.kind}List is a list of {rt.kind}",
        "required": ["items"],
        "properties": {
            "apiVersion": dict(_API_VERSION),
            "kind": dict(_KIND),
            "items": {"type": "array", "items": {"$ref": f"#/components/schemas/{schema_name(rt)}"}},
            "metadata": {"allOf": [{"$ref": f"#/components/schemas/{LIST_META}"}], "default": {}},
        },
        "x-kubernetes-group-version-kind": [{"group": rt.group, "version": rt.version, "kind": rt.kind + "List"}],
    }


def _ok(ref: str, code: str = "200") -> dict:
    return {
        code: {
            "description": "OK" if code == "200" else "Created",
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
        }
    }


def _paths_for(rt) -> dict:
    prefix = f"/api/{rt.version}" if not rt.group else f"/apis/{rt.group}/{rt.version}"
    ns_part = "/namespaces/{namespace}" if rt.namespaced else ""
    coll = f"{prefix}{ns_part}/{rt.plural}"
    item = f"{coll}/{{name}}"
    name = schema_name(rt)
    list_name = name + "List"
    gvk = _gvk(rt)
    ns_params = [_param("namespace", "path", True)] if rt.namespaced else []
    common = [_param("pretty")]
    write_params = [_param("dryRun"), _param("fieldManager"), _param("fieldValidation")]
    list_params = [
        _param("labelSelector"), _param("fieldSelector"), _param("limit", schema_type="integer"), _param("continue"),
        _param("resourceVersion"), _param("timeoutSeconds", schema_type="integer"), _param("watch", schema_type="boolean"),
        _param("allowWatchBookmarks", schema_type="boolean"),
    ]
    body = {"content": {"*/*": {"schema": {"$ref": f"#/components/schemas/{name}"}}}, "required": True}
    patch_types = _PATCH_TYPES_CRD if getattr(rt, "crd", rt.schema is not None) else _PATCH_TYPES_BUILTIN

    def op(action: str, verb: str, **extra) -> dict:
        d = {
            "description": f"{verb} {rt.kind}",
            "operationId": f"{verb}{rt.kind}",
            "tags": [f"{rt.group or 'core'}_{rt.version}"],
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": dict(gvk),
        }
        d.update(extra)
        return d

    paths = {
        coll: {
            "parameters": ns_params + common,
            "get": op("list", "list", parameters=list_params, responses=_ok(list_name)),
            "post": op("post", "create", parameters=write_params, requestBody=body, responses={**_ok(name), **_ok(name, "201")}),
            "delete": op("deletecollection", "deletecollection", parameters=list_params + [_param("dryRun")],
                         responses=_ok(STATUS)),
        },
        item: {
            "parameters": [_param("name", "path", True)] + ns_params + common,
            "get": op("get", "read", responses=_ok(name)),
            "put": op("put", "replace", parameters=write_params, requestBody=body, responses=_ok(name)),
            "patch": op(
                "patch",
                "patch",
                parameters=write_params + [_param("force", schema_type="boolean")],
                requestBody={"content": {t: {"schema": {"type": "object"}} for t in patch_types}, "required": True},
                responses=_ok(name),
            ),
            "delete": op("delete", "delete", parameters=[_param("dryRun"), _param("propagationPolicy"),
                                                         _param("gracePeriodSeconds", schema_type="integer")],
                         responses=_ok(STATUS)),
        },
    }
    if rt.namespaced:
        paths[f"{prefix}/{rt.plural}"] = {
            "parameters": common,
            "get": op("list", "listForAllNamespaces", parameters=list_params, responses=_ok(list_name)),
        }
    for sub in sorted(rt.subresources or ()):
        if sub == "scale":
            continue  # autoscaling/v1 Scale: not published
        paths[f"{item}/{sub}"] = {
            "parameters": [_param("name", "path", True)] + ns_params + common,
            "get": op("get", f"read{sub.title()}", responses=_ok(name)),
            "put": op("put", f"replace{sub.title()}", parameters=write_params, requestBody=body, responses=_ok(name)),
            "patch": op("patch", f"patch{sub.title()}", parameters=write_params + [_param("force", schema_type="boolean")],
                        requestBody={"content": {t: {"schema": {"type": "object"}} for t in patch_types}},
                        responses=_ok(name)),
        }
    return paths


def gv_document(registry, group: str, version: str) -> dict | None:
    kinds = [rt for rt in registry.all() if rt.group == group and rt.version == version]
    if not kinds:
        return None
    paths: dict = {}
    schemas: dict = {OBJECT_META: _OBJECT_META_SCHEMA, LIST_META: _LIST_META_SCHEMA, STATUS: _STATUS_SCHEMA}
    real_meta = builtin_schemas([OBJECT_META, LIST_META])
    schemas.update(real_meta)
    for rt in sorted(kinds, key=lambda r: r.plural):
        paths.update(_paths_for(rt))
        builtin = None if rt.schema else builtin_definition_name(rt)
        if builtin:
            schemas.update(builtin_schemas([builtin]))
            # the path operations reference schema_name(rt); alias it when the definition has another name
            if builtin != schema_name(rt):
                schemas[schema_name(rt)] = schemas[builtin]
        else:
            schemas[schema_name(rt)] = _kind_schema(rt)
        schemas[schema_name(rt) + "List"] = _list_schema(rt)
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


class OpenAPI:
    """Builds the documents lazily once per registry and serves them as pre-encoded JSON bytes."""

    def __init__(self, registry) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._docs: dict[str, tuple[bytes, str]] | None = None
        self._index: bytes | None = None

    def _gvs(self) -> list[tuple[str, str]]:
        seen = []
        for rt in self.registry.all():
            key = (rt.group, rt.version)
            if key not in seen:
                seen.append(key)
        if ("", "v1") not in seen:
            seen.insert(0, ("", "v1"))
        return seen

    def _build(self) -> None:
        docs: dict[str, tuple[bytes, str]] = {}
        for group, version in self._gvs():
            key = f"api/{version}" if not group else f"apis/{group}/{version}"
            doc = gv_document(self.registry, group, version) or {
                "openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": {},
                "components": {"schemas": {}},
            }
            body = json.dumps(doc, separators=(",", ":")).encode()
            digest = hashlib.sha512(body).hexdigest().upper()[:128]
            docs[key] = (body, digest)
        index = {"paths": {k: {"serverRelativeURL": f"/openapi/v3/{k}?hash={h}"} for k, (_, h) in docs.items()}}
        self._index = json.dumps(index, separators=(",", ":")).encode()
        self._docs = docs

    def index(self) -> bytes:
        with self._lock:
            if self._docs is None:
                self._build()
            return self._index  # type: ignore[return-value]

    def document(self, key: str) -> bytes | None:
        """``key`` is ``api/v1`` or ``apis/<group>/<version>``."""
        with self._lock:
            if self._docs is None:
                self._build()
            entry = self._docs.get(key.strip("/"))  # type: ignore[union-attr]
        return entry[0] if entry else None

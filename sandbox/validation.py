"""Schema validation, pruning and defaulting for the sandbox store.

* CRD kinds: the version's ``openAPIV3Schema`` (structural schema semantics: prune unknown fields, apply
  ``default``s, ``nullable``, ``x-kubernetes-preserve-unknown-fields``, ``x-kubernetes-int-or-string``,
  ``x-kubernetes-embedded-resource``, list-type map/set uniqueness, and a table of cheap CEL rules).
* Built-in kinds: the upstream 1.32 JSON schemas shipped by ``kubernetes-validate`` (unknown fields, types,
  enums, required fields) plus hand-written defaults and checks (``builtin_defaults`` / ``builtin_checks``).

Schemas are compiled once per ResourceType into ``Node`` trees (``schema_for(rt)``).
``validate(rt, obj, old=...)`` mutates ``obj`` in place (prune + default) and returns a ``Result`` with
``errors`` (status causes) and ``unknown`` (paths of unknown fields, like ``spec.foo``).
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

from .quantity import is_quantity, parse_quantity

_KV_DIR_CANDIDATES = ("v1.32.0-local",)

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


# ----------------------------------------------------------------------------------------------- helpers
def fmt_value(v: Any) -> str:
    """How apimachinery prints a bad value in 'Invalid value: ...'."""
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, dict):
        return '"object"'
    if isinstance(v, list):
        return '"array"' if v else "[]"
    return json.dumps(str(v))


def err_invalid(field: str, value: Any, detail: str) -> dict:
    return {"reason": "FieldValueInvalid", "message": f"Invalid value: {fmt_value(value)}: {detail}", "field": field}


def err_required(field: str, detail: str = "") -> dict:
    return {"reason": "FieldValueRequired", "message": "Required value" + (f": {detail}" if detail else ""), "field": field}


def err_type(field: str, value: Any, want: str) -> dict:
    return {
        "reason": "FieldValueTypeInvalid",
        "message": f"Invalid value: {fmt_value(value)}: {field} in body must be of type {want}: {_type_name(value)}",
        "field": field,
    }


def err_not_supported(field: str, value: Any, allowed) -> dict:
    supported = ", ".join(json.dumps(a) if isinstance(a, str) else fmt_value(a) for a in allowed)
    return {
        "reason": "FieldValueNotSupported",
        "message": f"Unsupported value: {fmt_value(value)}: supported values: {supported}",
        "field": field,
    }


def err_forbidden(field: str, detail: str) -> dict:
    return {"reason": "FieldValueForbidden", "message": f"Forbidden: {detail}", "field": field}


def err_duplicate(field: str, value: Any) -> dict:
    return {"reason": "FieldValueDuplicate", "message": f"Duplicate value: {_dup_repr(value)}", "field": field}


def err_too_many(field: str, n: int, limit: int) -> dict:
    return {"reason": "FieldValueTooMany", "message": f"Too many: {n}: must have at most {limit} items", "field": field}


def err_too_long(field: str, value: Any, limit: int) -> dict:
    return {
        "reason": "FieldValueTooLong",
        "message": f"Too long: may not be more than {limit} bytes",
        "field": field,
    }


def _dup_repr(v):
    if isinstance(v, dict):
        return json.dumps(v, separators=(",", ":"), sort_keys=True)
    return fmt_value(v)


def _type_name(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def summarize(kind_q: str, name: str, errors: list[dict]) -> str:
    """``Kind.group "name" is invalid: field: msg`` / ``[a: x, b: y]`` like apimachinery's NewInvalid."""
    parts = [f"{e['field']}: {e['message']}" if e.get("field") else e["message"] for e in errors]
    body = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return f'{kind_q} "{name}" is invalid: {body}'


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# ----------------------------------------------------------------------------------------------- schema nodes
_ABSENT = object()


class Node:
    """One compiled schema node (structural schema)."""

    __slots__ = (
        "type",
        "nullable",
        "props",
        "additional",
        "items",
        "required",
        "enum",
        "pattern",
        "pattern_src",
        "minimum",
        "maximum",
        "excl_min",
        "excl_max",
        "min_length",
        "max_length",
        "min_items",
        "max_items",
        "min_props",
        "max_props",
        "format",
        "preserve",
        "int_or_string",
        "quantity",
        "embedded",
        "free_form",
        "default",
        "defaulted",
        "list_type",
        "map_keys",
        "patch_key",
        "patch_strategy",
        "any_of",
        "one_of",
        "all_of",
        "not_",
        "rules",
        "raw",
    )

    def __init__(self):
        self.type = None
        self.nullable = False
        self.props = None
        self.additional = None  # Node, or True (anything), or None
        self.items = None
        self.required = ()
        self.enum = None
        self.pattern = None
        self.pattern_src = None
        self.minimum = self.maximum = None
        self.excl_min = self.excl_max = False
        self.min_length = self.max_length = None
        self.min_items = self.max_items = None
        self.min_props = self.max_props = None
        self.format = None
        self.preserve = False
        self.int_or_string = False
        self.quantity = False
        self.embedded = False
        self.free_form = False  # built-in object without properties: keep everything
        self.default = _ABSENT
        self.defaulted = ()  # names of props that carry a default
        self.list_type = None
        self.map_keys = ()
        self.patch_key = None
        self.patch_strategy = None
        self.any_of = self.one_of = self.all_of = None
        self.not_ = None
        self.rules = ()
        self.raw = None

    def prop(self, name: str):
        """Schema of child ``name`` of an object node (None when unknown)."""
        if self.props is not None:
            n = self.props.get(name)
            if n is not None:
                return n
        a = self.additional
        if isinstance(a, Node):
            return a
        return None


_regex_cache: dict[str, Any] = {}


def _compile_pattern(p: str):
    if p in _regex_cache:
        return _regex_cache[p]
    try:
        rx = re.compile(p)
    except re.error:
        rx = None
    _regex_cache[p] = rx
    return rx


def compile_schema(raw: dict, defs: dict | None = None, memo: dict | None = None, *, builtin: bool = False) -> Node:
    """Compile a (CRD or built-in JSON) schema dict into a Node tree. ``$ref`` into ``defs`` is memoized."""
    memo = {} if memo is None else memo
    return _compile(raw, defs or {}, memo, builtin)


_SPECIAL_REFS = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": "quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": "intorstring",
    "io.k8s.apimachinery.pkg.runtime.RawExtension": "free",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSON": "free",
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1": "free",
}


def _compile(raw: dict, defs: dict, memo: dict, builtin: bool) -> Node:
    ref = raw.get("$ref")
    if ref is not None:
        name = ref.rsplit("/", 1)[-1]
        node = memo.get(name)
        if node is not None:
            return node
        special = _SPECIAL_REFS.get(name)
        node = Node()
        memo[name] = node
        if special == "quantity":
            node.quantity = True
            node.int_or_string = True
            return node
        if special == "intorstring":
            node.int_or_string = True
            return node
        if special == "free":
            node.free_form = True
            node.preserve = True
            return node
        target = defs.get(name)
        if target is None:
            node.free_form = True
            node.preserve = True
            return node
        _fill(node, target, defs, memo, builtin)
        return node
    node = Node()
    _fill(node, raw, defs, memo, builtin)
    return node


def _fill(node: Node, raw: dict, defs: dict, memo: dict, builtin: bool) -> None:
    node.raw = raw
    t = raw.get("type")
    if isinstance(t, list):
        ts = [x for x in t if x != "null"]
        node.nullable = "null" in t
        t = ts[0] if len(ts) == 1 else None
    node.type = t
    if raw.get("nullable"):
        node.nullable = True
    if "properties" in raw:
        node.props = {k: _compile(v, defs, memo, builtin) for k, v in raw["properties"].items()}
        node.defaulted = tuple(k for k, v in node.props.items() if v.default is not _ABSENT)
    ap = raw.get("additionalProperties")
    if isinstance(ap, dict):
        node.additional = _compile(ap, defs, memo, builtin)
    elif ap is True:
        node.additional = True
    if "items" in raw and isinstance(raw["items"], dict):
        node.items = _compile(raw["items"], defs, memo, builtin)
    node.required = tuple(raw.get("required") or ())
    if "enum" in raw:
        node.enum = list(raw["enum"])
    if "pattern" in raw:
        node.pattern_src = raw["pattern"]
        node.pattern = _compile_pattern(raw["pattern"])
    node.minimum = raw.get("minimum")
    node.maximum = raw.get("maximum")
    node.excl_min = bool(raw.get("exclusiveMinimum"))
    node.excl_max = bool(raw.get("exclusiveMaximum"))
    node.min_length = raw.get("minLength")
    node.max_length = raw.get("maxLength")
    node.min_items = raw.get("minItems")
    node.max_items = raw.get("maxItems")
    node.min_props = raw.get("minProperties")
    node.max_props = raw.get("maxProperties")
    node.format = raw.get("format")
    node.preserve = bool(raw.get("x-kubernetes-preserve-unknown-fields"))
    node.int_or_string = bool(raw.get("x-kubernetes-int-or-string")) or node.int_or_string
    node.embedded = bool(raw.get("x-kubernetes-embedded-resource"))
    if "default" in raw:
        node.default = raw["default"]
    node.list_type = raw.get("x-kubernetes-list-type")
    node.map_keys = tuple(raw.get("x-kubernetes-list-map-keys") or ())
    node.patch_key = raw.get("x-kubernetes-patch-merge-key")
    node.patch_strategy = raw.get("x-kubernetes-patch-strategy")
    if builtin and node.patch_key and not node.map_keys:
        node.map_keys = (node.patch_key,)
    for key, attr in (("anyOf", "any_of"), ("oneOf", "one_of"), ("allOf", "all_of")):
        if key in raw and isinstance(raw[key], list):
            subs = [_compile(x, defs, memo, builtin) for x in raw[key]]
            if builtin and key == "oneOf":
                # built-in oneOf is only used for Quantity/IntOrString-like unions: accept any of the types
                node.int_or_string = True
                continue
            setattr(node, attr, subs)
    if isinstance(raw.get("not"), dict):
        node.not_ = _compile(raw["not"], defs, memo, builtin)
    if raw.get("x-kubernetes-validations"):
        rules = []
        for r in raw["x-kubernetes-validations"]:
            fn = CEL_RULES.get(" ".join(r.get("rule", "").split()))
            if fn is not None:
                rules.append((fn, r.get("message") or f"failed rule: {r.get('rule')}", "oldSelf" in r.get("rule", ""), r.get("fieldPath"), r.get("reason")))
        node.rules = tuple(rules)
    if builtin and node.type == "object" and node.props is None and node.additional is None:
        node.free_form = True
        node.preserve = True


# ----------------------------------------------------------------------------------------------- cheap CEL
def _has(d, k):
    return isinstance(d, dict) and k in d and d[k] is not None


def _cond_true(obj, ctype):
    st = obj.get("status") if isinstance(obj, dict) else None
    if not isinstance(st, dict):
        return False
    return any(c.get("type") == ctype and c.get("status") == "True" for c in st.get("conditions") or [])


def _tolerations_ok(pred):
    return lambda s, o: all(pred(x) for x in (s or []))


_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_CEL_RAW = {
    "self == oldSelf": lambda s, o: s == o,
    "!has(self.cohortName) && has(self.resourceGroups) ? self.resourceGroups.all(rg, rg.flavors.all(f, f.resources.all(r, !has(r.borrowingLimit)))) : true": lambda s, o: (
        not (not _has(s, "cohortName") and _has(s, "resourceGroups"))
        or all(not _has(r, "borrowingLimit") for rg in s["resourceGroups"] for f in rg.get("flavors") or [] for r in f.get("resources") or [])
    ),
    "!has(self.preference) || (self.whenCanBorrow == 'TryNextFlavor' && self.whenCanPreempt == 'TryNextFlavor')": lambda s, o: (
        not _has(s, "preference") or (s.get("whenCanBorrow") == "TryNextFlavor" and s.get("whenCanPreempt") == "TryNextFlavor")
    ),
    "!(self.reclaimWithinCohort == 'Never' && has(self.borrowWithinCohort) && self.borrowWithinCohort.policy != 'Never')": lambda s, o: not (
        s.get("reclaimWithinCohort") == "Never" and _has(s, "borrowWithinCohort") and s["borrowWithinCohort"].get("policy") != "Never"
    ),
    "self.flavors.all(x, size(x.resources) == size(self.coveredResources))": lambda s, o: all(
        len(x.get("resources") or []) == len(s.get("coveredResources") or []) for x in s.get("flavors") or []
    ),
    "!has(self.topologyName) || self.nodeLabels.size() >= 1": lambda s, o: not _has(s, "topologyName") or len(s.get("nodeLabels") or {}) >= 1,
    "self.all(x, x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])": _tolerations_ok(lambda x: x.get("effect") in _EFFECTS),
    "self.all(x, !has(x.key) ? x.operator == 'Exists' : true)": _tolerations_ok(lambda x: _has(x, "key") or x.get("operator") == "Exists"),
    "self.all(x, has(x.tolerationSeconds) ? x.effect == 'NoExecute' : true)": _tolerations_ok(
        lambda x: not _has(x, "tolerationSeconds") or x.get("effect") == "NoExecute"
    ),
    "self.all(x, !has(x.operator) || x.operator in ['Equal', 'Exists'])": _tolerations_ok(
        lambda x: not _has(x, "operator") or x["operator"] in ("Equal", "Exists")
    ),
    "self.all(x, has(x.operator) && x.operator == 'Exists' ? !has(x.value) : true)": _tolerations_ok(
        lambda x: x.get("operator") != "Exists" or not _has(x, "value")
    ),
    "self.all(x, !has(x.effect) || x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])": _tolerations_ok(
        lambda x: not _has(x, "effect") or x["effect"] in _EFFECTS
    ),
    "has(self.minCount) ? self.minCount <= self.count : true": lambda s, o: not _has(s, "minCount") or s["minCount"] <= s.get("count", 1),
    "!has(self.priorityClassRef) || has(self.priority)": lambda s, o: not _has(s, "priorityClassRef") or _has(s, "priority"),
    "(self.group == 'scheduling.k8s.io') ? self.kind == 'PriorityClass' : true": lambda s, o: s.get("group") != "scheduling.k8s.io"
    or s.get("kind") == "PriorityClass",
    "(self.group == 'kueue.x-k8s.io') ? self.kind == 'WorkloadPriorityClass' : true": lambda s, o: s.get("group") != "kueue.x-k8s.io"
    or s.get("kind") == "WorkloadPriorityClass",
    "[has(self.kubeConfig),has(self.clusterProfileRef)].filter(x,x==true).size() == 1": lambda s, o: _has(s, "kubeConfig")
    != _has(s, "clusterProfileRef"),
    "size(self.filter(i, size(self.filter(j, j == i)) > 1)) == 0": lambda s, o: all((s or []).count(i) == 1 for i in (s or [])),
    "!has(oldSelf.clusterName) || !has(self.clusterName) || oldSelf.clusterName == self.clusterName": lambda s, o: (
        not _has(o, "clusterName") or not _has(s, "clusterName") or o["clusterName"] == s["clusterName"]
    ),
    "!has(self.clusterName) || (!has(self.nominatedClusterNames) || (has(self.nominatedClusterNames) && size(self.nominatedClusterNames) == 0))": lambda s, o: (
        not _has(s, "clusterName") or not s.get("nominatedClusterNames")
    ),
    "!has(oldSelf.topologyName) || (has(self.topologyName) && self.topologyName == oldSelf.topologyName)": lambda s, o: (
        not _has(o, "topologyName") or (_has(s, "topologyName") and s["topologyName"] == o["topologyName"])
    ),
    # Kueue's ResourceFlavor: under a topology, nodeLabels and tolerations are immutable (applying Kueue's
    # sample-gpu-queues.yaml over its sample-queues.yaml meets the second on a real API server)
    "!has(oldSelf.topologyName) || (has(self.nodeLabels) == has(oldSelf.nodeLabels) && (!has(self.nodeLabels) || self.nodeLabels == oldSelf.nodeLabels))": lambda s, o: (
        not _has(o, "topologyName")
        or (_has(s, "nodeLabels") == _has(o, "nodeLabels") and (not _has(s, "nodeLabels") or s["nodeLabels"] == o["nodeLabels"]))
    ),
    "!has(oldSelf.topologyName) || (has(self.tolerations) == has(oldSelf.tolerations) && (!has(self.tolerations) || self.tolerations == oldSelf.tolerations))": lambda s, o: (
        not _has(o, "topologyName")
        or (_has(s, "tolerations") == _has(o, "tolerations") and (not _has(s, "tolerations") or s["tolerations"] == o["tolerations"]))
    ),
    # Volcano's HyperNode member selector: one of exactMatch, regexMatch, labelMatch.
    "has(self.exactMatch) || has(self.regexMatch) || has(self.labelMatch)": lambda s, o: any(
        _has(s, k) for k in ("exactMatch", "regexMatch", "labelMatch")),
    "(has(self.exactMatch) ? 1 : 0) + (has(self.regexMatch) ? 1 : 0) + (has(self.labelMatch) ? 1 : 0) <= 1": lambda s, o: (
        sum(_has(s, k) for k in ("exactMatch", "regexMatch", "labelMatch")) <= 1
    ),
}
CEL_RULES = {" ".join(k.split()): v for k, v in _CEL_RAW.items()}


# ----------------------------------------------------------------------------------------------- walker
class Result:
    __slots__ = ("errors", "unknown")

    def __init__(self):
        self.errors: list[dict] = []
        self.unknown: list[str] = []


def _is_type(v, t) -> bool:
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "string":
        return isinstance(v, str)
    if t == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "boolean":
        return isinstance(v, bool)
    return True


def _walk(v, n: Node, path: str, res: Result, old, root_meta: Node | None):
    """Validate/prune/default value ``v`` (not None) against ``n``. Returns the (possibly replaced) value."""
    t = n.type
    if n.int_or_string:
        if not (isinstance(v, str) or (isinstance(v, (int, float)) and not isinstance(v, bool))):
            res.errors.append(err_type(path, v, "integer,string" if not n.quantity else "string"))
            return v
        if isinstance(v, float) and v.is_integer() and not n.quantity:
            v = int(v)
        if n.quantity and not is_quantity(v):
            res.errors.append(
                err_invalid(path, v, "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
            )
            return v
    elif t is not None and not _is_type(v, t):
        res.errors.append(err_type(path, v, t))
        return v
    if isinstance(v, dict):
        if n.free_form and n.props is None:
            return v
        _walk_object(v, n, path, res, old, root_meta)
    elif isinstance(v, list):
        _walk_array(v, n, path, res, old, root_meta)
    else:
        if t == "integer" and isinstance(v, float):
            v = int(v)
        _scalar_checks(v, n, path, res)
    if n.any_of or n.one_of or n.all_of or n.not_ is not None:
        _combinators(v, n, path, res)
    if n.rules:
        _run_rules(v, n, path, res, old)
    return v


def _scalar_checks(v, n: Node, path: str, res: Result):
    if n.enum is not None and v not in n.enum:
        res.errors.append(err_not_supported(path, v, n.enum))
        return
    if isinstance(v, str):
        if n.pattern is not None and not n.pattern.search(v):
            res.errors.append(err_invalid(path, v, f"{path} in body should match '{n.pattern_src}'"))
        if n.max_length is not None and len(v) > n.max_length:
            res.errors.append(err_too_long(path, v, n.max_length))
        if n.min_length is not None and len(v) < n.min_length:
            res.errors.append(err_invalid(path, v, f"{path} in body should be at least {n.min_length} chars long"))
        if n.format == "date-time" and not _DATE_TIME.match(v):
            res.errors.append(err_invalid(path, v, f"{path} in body must be of type date-time: {json.dumps(v)}"))
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        if n.minimum is not None:
            if n.excl_min and v <= n.minimum:
                res.errors.append(err_invalid(path, v, f"{path} in body should be greater than {n.minimum}"))
            elif v < n.minimum:
                res.errors.append(err_invalid(path, v, f"{path} in body should be greater than or equal to {n.minimum}"))
        if n.maximum is not None:
            if n.excl_max and v >= n.maximum:
                res.errors.append(err_invalid(path, v, f"{path} in body should be less than {n.maximum}"))
            elif v > n.maximum:
                res.errors.append(err_invalid(path, v, f"{path} in body should be less than or equal to {n.maximum}"))


def _walk_object(v: dict, n: Node, path: str, res: Result, old, root_meta):
    props = n.props
    addl = n.additional
    old_is_dict = isinstance(old, dict)
    for key in list(v.keys()):
        val = v[key]
        child = props.get(key) if props is not None else None
        if child is None:
            if isinstance(addl, Node):
                child = addl
            elif addl is True:
                continue
            elif n.embedded and key in ("apiVersion", "kind"):
                if val is not None and not isinstance(val, str):
                    res.errors.append(err_type(join(path, key), val, "string"))
                continue
            elif n.embedded and key == "metadata" and root_meta is not None:
                child = root_meta
            elif n.preserve:
                continue
            else:
                res.unknown.append(join(path, key))
                del v[key]
                continue
        cpath = (f"{path}[{key}]" if child is addl else join(path, key))
        if val is None:
            if child.nullable:
                continue
            del v[key]
            continue
        nv = _walk(val, child, cpath, res, old.get(key) if old_is_dict else None, root_meta)
        if nv is not val:
            v[key] = nv
    for key in n.defaulted:
        if key not in v:
            child = props[key]
            dv = _copy(child.default)
            if dv is None and not child.nullable:
                continue
            v[key] = dv
            if dv is not None:
                _walk(dv, child, join(path, key), res, None, root_meta)
    for key in n.required:
        if key not in v:
            res.errors.append(err_required(join(path, key)))
    if n.max_props is not None and len(v) > n.max_props:
        res.errors.append(err_too_many(path, len(v), n.max_props))
    if n.min_props is not None and len(v) < n.min_props:
        res.errors.append(err_invalid(path, len(v), f"{path} in body should have at least {n.min_props} properties"))


def _walk_array(v: list, n: Node, path: str, res: Result, old, root_meta):
    it = n.items
    if it is not None:
        keys = n.map_keys if n.list_type == "map" else ()
        for i, item in enumerate(v):
            if item is None:
                if it.nullable:
                    continue
                res.errors.append(err_type(f"{path}[{i}]", item, it.type or "object"))
                continue
            old_item = None
            if keys and isinstance(old, list) and isinstance(item, dict):
                kv = tuple(item.get(k) for k in keys)
                for o in old:
                    if isinstance(o, dict) and tuple(o.get(k) for k in keys) == kv:
                        old_item = o
                        break
            nv = _walk(item, it, f"{path}[{i}]", res, old_item, root_meta)
            if nv is not item:
                v[i] = nv
    if n.max_items is not None and len(v) > n.max_items:
        res.errors.append(err_too_many(path, len(v), n.max_items))
    if n.min_items is not None and len(v) < n.min_items:
        res.errors.append(err_invalid(path, len(v), f"{path} in body should have at least {n.min_items} items"))
    lt = n.list_type
    if lt == "set":
        seen = []
        for i, item in enumerate(v):
            if item in seen:
                res.errors.append(err_duplicate(f"{path}[{i}]", item))
            else:
                seen.append(item)
    elif lt == "map" and n.map_keys:
        seen_keys = set()
        for i, item in enumerate(v):
            if not isinstance(item, dict):
                continue
            kv = tuple(json.dumps(item.get(k), sort_keys=True) for k in n.map_keys)
            if kv in seen_keys:
                res.errors.append(err_duplicate(f"{path}[{i}]", {k: item.get(k) for k in n.map_keys if k in item}))
            seen_keys.add(kv)


def _check_only(v, n: Node) -> bool:
    """Pure value validation (no pruning/defaulting) used for anyOf/oneOf/allOf/not branches."""
    r = Result()
    _walk(_copy(v), n, "x", r, None, None)
    return not r.errors


def _combinators(v, n: Node, path: str, res: Result):
    if n.any_of and not any(_check_only(v, s) for s in n.any_of):
        res.errors.append(err_invalid(path, v, f"{path} in body must match at least one schema (anyOf)"))
    if n.one_of and sum(1 for s in n.one_of if _check_only(v, s)) != 1:
        res.errors.append(err_invalid(path, v, f"{path} in body must validate one and only one schema (oneOf)"))
    if n.all_of:
        for s in n.all_of:
            if not _check_only(v, s):
                res.errors.append(err_invalid(path, v, f"{path} in body must validate all the schemas (allOf)"))
                break
    if n.not_ is not None and _check_only(v, n.not_):
        res.errors.append(err_invalid(path, v, f"{path} in body must not validate the schema (not)"))


def _run_rules(v, n: Node, path: str, res: Result, old):
    for fn, msg, transition, field_path, _reason in n.rules:
        if transition and old is None:
            continue
        try:
            ok = fn(v, old)
        except Exception:
            continue
        if not ok:
            p = path + (field_path or "") if field_path else path
            # the API server (1.35, apiextensions' cel validation) omits an object's or a list's value, prints a scalar
            shown = "" if isinstance(v, (dict, list)) else f"{fmt_value(v)}: "
            res.errors.append({"reason": "FieldValueInvalid", "message": f"Invalid value: {shown}{msg}", "field": p})


def _copy(v):
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    return v


# ----------------------------------------------------------------------------------------------- schema registry
_builtin_defs: dict | None = None
_builtin_memo: dict = {}
_schema_cache: dict = {}
_lock = threading.RLock()

_GVK_TO_DEF: dict[tuple[str, str, str], str] = {}


def _kv_dir() -> Path | None:
    try:
        import kubernetes_validate  # type: ignore
    except ImportError:  # pragma: no cover
        return None
    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    for cand in _KV_DIR_CANDIDATES:
        if (base / cand / "_definitions.json").exists():
            return base / cand
    return None


def _load_builtin_defs() -> dict:
    global _builtin_defs  # noqa: PLW0603 the schemas, loaded once per process
    if _builtin_defs is None:
        d = _kv_dir()
        defs: dict = {}
        if d is not None:
            with open(d / "_definitions.json", "rb") as fh:
                defs = json.load(fh).get("$defs", {})
        for name, sch in defs.items():
            for gvk in sch.get("x-kubernetes-group-version-kind") or []:
                _GVK_TO_DEF[(gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", ""))] = name
        _builtin_defs = defs
    return _builtin_defs


def object_meta_node() -> Node:
    with _lock:
        defs = _load_builtin_defs()
        name = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        if name in defs:
            return _compile({"$ref": "#/$defs/" + name}, defs, _builtin_memo, True)
        n = Node()
        n.type = "object"
        n.preserve = True
        n.free_form = True
        return n


def builtin_def_node(def_name: str) -> Node | None:
    with _lock:
        defs = _load_builtin_defs()
        if def_name not in defs:
            return None
        return _compile({"$ref": "#/$defs/" + def_name}, defs, _builtin_memo, True)


def schema_for(rt) -> Node | None:
    """Compiled root schema for a ResourceType (cached). None if unknown (everything preserved)."""
    node = _schema_cache.get(rt)
    if node is not None or rt in _schema_cache:
        return node
    with _lock:
        if rt in _schema_cache:
            return _schema_cache[rt]
        if rt.schema is not None:
            node = compile_schema(rt.schema, {}, {}, builtin=False)
        else:
            defs = _load_builtin_defs()
            name = _GVK_TO_DEF.get((rt.group, rt.version, rt.kind))
            node = _compile({"$ref": "#/$defs/" + name}, defs, _builtin_memo, True) if name else None
        _schema_cache[rt] = node
        return node


# top-level fields handled by the store itself
_TOP_SYSTEM = ("apiVersion", "kind", "metadata")


def validate(rt, obj: dict, *, old: dict | None = None, subresource: str | None = None) -> Result:
    """Prune, default and validate ``obj`` (in place) against the kind's schema."""
    res = Result()
    root = schema_for(rt)
    meta_node = object_meta_node()
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        _walk_object(meta, meta_node, "metadata", res, None, meta_node)
    if root is None:
        return res
    props = root.props or {}
    old_is_dict = isinstance(old, dict)
    for key in list(obj.keys()):
        if key in _TOP_SYSTEM:
            continue
        val = obj[key]
        child = props.get(key)
        if child is None:
            if isinstance(root.additional, Node):
                child = root.additional
            elif root.preserve or root.additional is True:
                continue
            else:
                res.unknown.append(key)
                del obj[key]
                continue
        if val is None:
            if not child.nullable:
                del obj[key]
            continue
        nv = _walk(val, child, key, res, old.get(key) if old_is_dict else None, meta_node)
        if nv is not val:
            obj[key] = nv
    for key in root.defaulted:
        if key not in obj and key not in _TOP_SYSTEM:
            dv = _copy(props[key].default)
            obj[key] = dv
            if dv is not None:
                _walk(dv, props[key], key, res, None, meta_node)
    for key in root.required:
        if key not in obj and key not in _TOP_SYSTEM:
            res.errors.append(err_required(key))
    if root.rules:
        _run_rules(obj, root, "", res, old)
    for e in res.errors:  # root-level rules have an empty path
        if e.get("field") == "":
            e["field"] = "<nil>"
    return res


# ----------------------------------------------------------------------------------------------- metadata & names
def check_name(name, *, label: bool = False, path: str = "metadata.name") -> list[dict]:
    if not isinstance(name, str) or not name:
        return [err_required(path, "name or generateName is required")]
    if label:
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            return [err_invalid(path, name, DNS1123_LABEL_MSG if len(name) <= 63 else "must be no more than 63 characters")]
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        return [err_invalid(path, name, DNS1123_SUBDOMAIN_MSG if len(name) <= 253 else "must be no more than 253 characters")]
    return []


def check_labels(labels, path="metadata.labels") -> list[dict]:
    errs = []
    if not isinstance(labels, dict):
        return errs
    for k, v in labels.items():
        kp = f"{path}"
        if not _qualified_key_ok(k):
            errs.append(err_invalid(kp, k, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"))
        if not isinstance(v, str):
            errs.append(err_type(f"{path}[{k}]" if False else kp, v, "string"))
        elif len(v) > 63 or not _LABEL_VALUE.match(v):
            errs.append(err_invalid(kp, v, "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"))
    return errs


def _qualified_key_ok(k: str) -> bool:
    if not isinstance(k, str) or not k:
        return False
    prefix, _, name = k.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_QUALIFIED_NAME.match(name))


def check_annotations(ann, path="metadata.annotations") -> list[dict]:
    errs = []
    if not isinstance(ann, dict):
        return errs
    total = 0
    for k, v in ann.items():
        if not _qualified_key_ok(k):
            errs.append(err_invalid(path, k, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"))
        if not isinstance(v, str):
            errs.append(err_type(path, v, "string"))
        else:
            total += len(k) + len(v)
    if total > 256 * 1024:
        errs.append(err_too_long(path, "", 256 * 1024))
    return errs


# ----------------------------------------------------------------------------------------------- built-in kinds
LABEL_NAME_KINDS = {("", "Namespace"), ("", "Service")}


def name_is_label(rt) -> bool:
    return (rt.group, rt.kind) in LABEL_NAME_KINDS


def _pod_spec_defaults(spec: dict) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            if not isinstance(c, dict):
                continue
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            if "imagePullPolicy" not in c:
                img = c.get("image") or ""
                tag = img.rsplit("/", 1)[-1]
                c["imagePullPolicy"] = "Always" if (":" not in tag or tag.endswith(":latest")) and "@" not in img else "IfNotPresent"
            c.setdefault("resources", {})
            res = c["resources"]
            if isinstance(res, dict) and isinstance(res.get("limits"), dict) and "requests" not in res:
                res["requests"] = dict(res["limits"])
            elif isinstance(res, dict) and isinstance(res.get("limits"), dict) and isinstance(res.get("requests"), dict):
                for k, q in res["limits"].items():
                    res["requests"].setdefault(k, q)
            for p in c.get("ports") or []:
                if isinstance(p, dict):
                    p.setdefault("protocol", "TCP")


def _template_defaults(tmpl: dict | None) -> None:
    if isinstance(tmpl, dict):
        tmpl.setdefault("metadata", {})
        if isinstance(tmpl.get("spec"), dict):
            _pod_spec_defaults(tmpl["spec"])


def builtin_defaults(rt, obj: dict, old: dict | None = None) -> None:
    """Defaults the apiserver applies to built-in kinds (the part clients rely on)."""
    g, k = rt.group, rt.kind
    spec = obj.get("spec")
    if g == "" and k == "Pod":
        if not isinstance(spec, dict):
            return
        _pod_spec_defaults(spec)
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        spec.setdefault("priority", 0)
        tolerations = spec.setdefault("tolerations", [])
        if isinstance(tolerations, list):
            have = {(t.get("key"), t.get("effect")) for t in tolerations if isinstance(t, dict)}
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
                if (key, "NoExecute") not in have:
                    tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
        st = obj.setdefault("status", {})
        if isinstance(st, dict):
            st.setdefault("phase", "Pending")
            st.setdefault("qosClass", _qos_class(spec))
    elif g == "" and k == "Namespace":
        meta = obj.setdefault("metadata", {})
        labels = meta.get("labels")
        if not isinstance(labels, dict):
            labels = meta["labels"] = {}
        if meta.get("name"):
            labels["kubernetes.io/metadata.name"] = meta["name"]
        if not isinstance(spec, dict):
            spec = obj["spec"] = {}
        spec.setdefault("finalizers", ["kubernetes"])
        st = obj.get("status")
        if not isinstance(st, dict):
            st = obj["status"] = {}
        st.setdefault("phase", "Active")
    elif g == "" and k == "Service":
        if not isinstance(spec, dict):
            return
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("ipFamilies", ["IPv4"])
        for p in spec.get("ports") or []:
            if isinstance(p, dict):
                p.setdefault("protocol", "TCP")
                if "port" in p:
                    p.setdefault("targetPort", p["port"])
        st = obj.get("status")
        if not isinstance(st, dict):
            obj["status"] = {"loadBalancer": {}}
    elif g == "" and k == "PersistentVolumeClaim":
        if not isinstance(spec, dict):
            return
        spec.setdefault("volumeMode", "Filesystem")
        st = obj.get("status")
        if not isinstance(st, dict) or not st.get("phase"):
            req = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
            obj["status"] = {
                "phase": "Bound",
                "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
                "capacity": {"storage": req} if req is not None else {},
            }
    elif g == "" and k == "Secret":
        obj.setdefault("type", "Opaque")
    elif g == "" and k == "ServiceAccount":
        pass
    elif g == "apps" and k in ("Deployment", "StatefulSet"):
        if not isinstance(spec, dict):
            return
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        if k == "Deployment":
            spec.setdefault("progressDeadlineSeconds", 600)
            strat = spec.setdefault("strategy", {"type": "RollingUpdate"})
            if isinstance(strat, dict):
                strat.setdefault("type", "RollingUpdate")
                if strat["type"] == "RollingUpdate":
                    ru = strat.setdefault("rollingUpdate", {})
                    if isinstance(ru, dict):
                        ru.setdefault("maxUnavailable", "25%")
                        ru.setdefault("maxSurge", "25%")
        else:
            spec.setdefault("podManagementPolicy", "OrderedReady")
            us = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
            if isinstance(us, dict):
                us.setdefault("type", "RollingUpdate")
                if us["type"] == "RollingUpdate":
                    us.setdefault("rollingUpdate", {"partition": 0})
            spec.setdefault("persistentVolumeClaimRetentionPolicy", {"whenDeleted": "Retain", "whenScaled": "Retain"})
        _template_defaults(spec.get("template"))
    elif g == "batch" and k == "Job":
        if not isinstance(spec, dict):
            return
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completions", 1) if spec.get("completionMode") != "Indexed" or "completions" in spec else None
        spec.setdefault("parallelism", 1)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("manualSelector", False) if False else None
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        tmpl = spec.get("template")
        _template_defaults(tmpl)
        uid = (obj.get("metadata") or {}).get("uid")
        if old is not None and isinstance(old.get("spec"), dict) and "selector" in old["spec"] and "selector" not in spec:
            spec["selector"] = old["spec"]["selector"]
        if uid and not spec.get("manualSelector") and isinstance(tmpl, dict):
            tlabels = tmpl["metadata"].setdefault("labels", {})
            tlabels.setdefault("batch.kubernetes.io/controller-uid", uid)
            tlabels.setdefault("controller-uid", uid)
            name = (obj.get("metadata") or {}).get("name")
            if name:
                tlabels.setdefault("batch.kubernetes.io/job-name", name)
                tlabels.setdefault("job-name", name)
            spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
        st = obj.get("status")
        if not isinstance(st, dict):
            obj["status"] = {}
    elif g == "scheduling.k8s.io" and k == "PriorityClass":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")


def _qos_class(spec: dict) -> str:
    conts = [c for c in (spec.get("containers") or []) if isinstance(c, dict)]
    any_set = False
    guaranteed = bool(conts)
    for c in conts:
        r = c.get("resources") or {}
        req, lim = r.get("requests") or {}, r.get("limits") or {}
        if req or lim:
            any_set = True
        for res_name in ("cpu", "memory"):
            if res_name not in lim or str(req.get(res_name, lim.get(res_name))) != str(lim.get(res_name)):
                guaranteed = False
    if guaranteed and any_set:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"


def _check_containers(spec: dict, path: str, errs: list[dict], required: bool = True) -> None:
    conts = spec.get("containers")
    if required and (not isinstance(conts, list) or not conts):
        errs.append(err_required(f"{path}.containers"))
        return
    seen = set()
    for key in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(key) or []):
            if not isinstance(c, dict):
                continue
            cp = f"{path}.{key}[{i}]"
            nm = c.get("name")
            if not nm:
                errs.append(err_required(f"{cp}.name"))
            elif not isinstance(nm, str) or len(nm) > 63 or not _DNS1123_LABEL.match(nm):
                errs.append(err_invalid(f"{cp}.name", nm, DNS1123_LABEL_MSG))
            elif nm in seen:
                errs.append(err_duplicate(f"{cp}.name", nm))
            else:
                seen.add(nm)
            if not c.get("image"):
                errs.append(err_required(f"{cp}.image"))
            res = c.get("resources") or {}
            if isinstance(res, dict):
                for part in ("limits", "requests"):
                    for rn, q in (res.get(part) or {}).items():
                        if not is_quantity(q):
                            errs.append(err_invalid(f"{cp}.resources.{part}[{rn}]", q, "must be a valid quantity"))
                lim, req = res.get("limits") or {}, res.get("requests") or {}
                for rn, q in req.items():
                    if rn in lim and is_quantity(q) and is_quantity(lim[rn]):
                        from .quantity import parse_quantity

                        if parse_quantity(q) > parse_quantity(lim[rn]):
                            errs.append(err_invalid(f"{cp}.resources.requests", q, f"must be less than or equal to {rn} limit of {lim[rn]}"))
            for j, p in enumerate(c.get("ports") or []):
                if isinstance(p, dict):
                    cpn = p.get("containerPort")
                    if not isinstance(cpn, int) or not (0 < cpn < 65536):
                        errs.append(err_invalid(f"{cp}.ports[{j}].containerPort", cpn, "must be between 1 and 65535, inclusive"))
    rp = spec.get("restartPolicy")
    if rp is not None and rp not in ("Always", "OnFailure", "Never"):
        errs.append(err_not_supported(f"{path}.restartPolicy", rp, ["Always", "OnFailure", "Never"]))


def _selector_matches_template(spec: dict, path: str, errs: list[dict]) -> None:
    from .selectors import selector_from_dict

    sel = spec.get("selector")
    tmpl = spec.get("template")
    if not isinstance(sel, dict) or not sel:
        errs.append(err_required(f"{path}.selector"))
        return
    if not isinstance(tmpl, dict):
        return
    labels = (tmpl.get("metadata") or {}).get("labels") or {}
    try:
        ok = selector_from_dict(sel).matches(labels)
    except (ValueError, TypeError):
        ok = False
    if not ok:
        errs.append(err_invalid(f"{path}.template.metadata.labels", labels, "`selector` does not match template `labels`"))


def crd_checks(rt, obj: dict, old: dict | None = None) -> list[dict]:
    """Hand-written checks of custom resources that their admission webhooks make (beyond the CRD schema).

    Kueue (ClusterQueue, Cohort): ``nominalQuota``, ``borrowingLimit`` and ``lendingLimit`` must not be negative
    (``ValidateNonnegativeQuantity`` in Kueue's webhook: ``must be greater than or equal to 0``)."""
    errs: list[dict] = []
    if rt.group == "kueue.x-k8s.io" and rt.kind in ("ClusterQueue", "Cohort"):
        spec = obj.get("spec")
        groups = spec.get("resourceGroups") if isinstance(spec, dict) else None
        for gi, g in enumerate(groups if isinstance(groups, list) else []):
            flavors = g.get("flavors") if isinstance(g, dict) else None
            for fi, f in enumerate(flavors if isinstance(flavors, list) else []):
                resources = f.get("resources") if isinstance(f, dict) else None
                for ri, r in enumerate(resources if isinstance(resources, list) else []):
                    if not isinstance(r, dict):
                        continue
                    for fld in ("nominalQuota", "borrowingLimit", "lendingLimit"):
                        v = r.get(fld)
                        if v is None or not is_quantity(v):
                            continue
                        try:
                            negative = parse_quantity(v) < 0
                        except (ValueError, ArithmeticError):
                            continue
                        if negative:
                            errs.append(err_invalid(f"spec.resourceGroups[{gi}].flavors[{fi}].resources[{ri}].{fld}",
                                                    v, "must be greater than or equal to 0"))
    return errs


def builtin_checks(rt, obj: dict, old: dict | None = None) -> list[dict]:
    """Hand-written validation of built-in kinds (beyond the JSON schema)."""
    errs: list[dict] = []
    g, k = rt.group, rt.kind
    spec = obj.get("spec")
    if g == "" and k == "Pod":
        if not isinstance(spec, dict):
            return [err_required("spec")]
        _check_containers(spec, "spec", errs)
        if old is not None:
            ospec = old.get("spec") or {}
            for fld in ("containers", "initContainers", "nodeName", "restartPolicy", "volumes"):
                if fld == "nodeName" and not ospec.get("nodeName"):
                    continue
                if fld in ("containers", "initContainers"):
                    a = [{kk: vv for kk, vv in (c or {}).items() if kk != "image"} for c in spec.get(fld) or []]
                    b = [{kk: vv for kk, vv in (c or {}).items() if kk != "image"} for c in ospec.get(fld) or []]
                    if a != b:
                        errs.append(err_forbidden("spec", "pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"))
                        break
                elif spec.get(fld) != ospec.get(fld):
                    errs.append(err_forbidden("spec", "pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"))
                    break
    elif g == "apps" and k in ("Deployment", "StatefulSet"):
        if not isinstance(spec, dict):
            return [err_required("spec")]
        tmpl = spec.get("template")
        if not isinstance(tmpl, dict):
            errs.append(err_required("spec.template"))
        else:
            _check_containers(tmpl.get("spec") or {}, "spec.template.spec", errs)
            rp = (tmpl.get("spec") or {}).get("restartPolicy")
            if rp not in (None, "Always"):
                errs.append(err_not_supported("spec.template.spec.restartPolicy", rp, ["Always"]))
        _selector_matches_template(spec, "spec", errs)
        reps = spec.get("replicas")
        if isinstance(reps, int) and reps < 0:
            errs.append(err_invalid("spec.replicas", reps, "must be greater than or equal to 0"))
        if old is not None and (old.get("spec") or {}).get("selector") != spec.get("selector"):
            errs.append(err_invalid("spec.selector", spec.get("selector"), "field is immutable"))
        if k == "StatefulSet" and old is not None:
            ospec = old.get("spec") or {}
            for fld in ("serviceName", "podManagementPolicy", "volumeClaimTemplates"):
                if ospec.get(fld) != spec.get(fld):
                    errs.append(err_forbidden("spec", "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"))
                    break
    elif g == "batch" and k == "Job":
        if not isinstance(spec, dict):
            return [err_required("spec")]
        tmpl = spec.get("template")
        if not isinstance(tmpl, dict):
            errs.append(err_required("spec.template"))
        else:
            tspec = tmpl.get("spec") or {}
            _check_containers(tspec, "spec.template.spec", errs)
            rp = tspec.get("restartPolicy")
            if rp not in ("OnFailure", "Never"):
                errs.append(err_not_supported("spec.template.spec.restartPolicy", rp, ["OnFailure", "Never"]))
        for fld in ("parallelism", "completions", "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
            val = spec.get(fld)
            if isinstance(val, int) and val < 0:
                errs.append(err_invalid(f"spec.{fld}", val, "must be greater than or equal to 0"))
        cm = spec.get("completionMode")
        if cm not in (None, "NonIndexed", "Indexed"):
            errs.append(err_not_supported("spec.completionMode", cm, ["NonIndexed", "Indexed"]))
        if old is not None:
            ospec = old.get("spec") or {}
            if ospec.get("selector") != spec.get("selector"):
                errs.append(err_invalid("spec.selector", spec.get("selector"), "field is immutable"))
            if ospec.get("completions") != spec.get("completions") and cm != "Indexed":
                errs.append(err_invalid("spec.completions", spec.get("completions"), "field is immutable"))
            if ospec.get("completionMode") != spec.get("completionMode"):
                errs.append(err_invalid("spec.completionMode", spec.get("completionMode"), "field is immutable"))
            # the pod template may change only while the Job is suspended (Kueue injects nodeSelectors then)
            if ospec.get("template") != spec.get("template") and not (ospec.get("suspend") or spec.get("suspend")):
                ot, nt = ospec.get("template") or {}, spec.get("template") or {}
                if _strip_sched(ot) != _strip_sched(nt):
                    errs.append(err_invalid("spec.template", "object", "field is immutable"))
    elif g == "" and k == "Service":
        if not isinstance(spec, dict):
            return [err_required("spec")]
        ports = spec.get("ports")
        if spec.get("type", "ClusterIP") != "ExternalName" and spec.get("clusterIP") != "None" and not ports:
            errs.append(err_required("spec.ports"))
        for i, p in enumerate(ports or []):
            if not isinstance(p, dict):
                continue
            port = p.get("port")
            if not isinstance(port, int) or not (0 < port < 65536):
                errs.append(err_invalid(f"spec.ports[{i}].port", port, "must be between 1 and 65535, inclusive"))
            if len(ports) > 1 and not p.get("name"):
                errs.append(err_required(f"spec.ports[{i}].name"))
        t = spec.get("type")
        if t not in (None, "ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
            errs.append(err_not_supported("spec.type", t, ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"]))
        if old is not None:
            ocip = (old.get("spec") or {}).get("clusterIP")
            if ocip and spec.get("clusterIP") not in (None, "", ocip):
                errs.append(err_invalid("spec.clusterIPs[0]", spec.get("clusterIP"), "may not change once set"))
    elif g == "" and k == "ConfigMap":
        for fld in ("data", "binaryData"):
            for key in (obj.get(fld) or {}):
                if not re.match(r"^[-._a-zA-Z0-9]+$", key) or len(key) > 253:
                    errs.append(err_invalid(f"{fld}[{key}]", key, "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"))
    elif g == "" and k == "Secret":
        for fld in ("data", "stringData"):
            for key in (obj.get(fld) or {}):
                if not re.match(r"^[-._a-zA-Z0-9]+$", key):
                    errs.append(err_invalid(f"{fld}[{key}]", key, "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"))
        if old is not None and old.get("immutable") and (old.get("data") != obj.get("data")):
            errs.append(err_forbidden("data", "field is immutable when `immutable` is set"))
    elif g == "" and k == "ResourceQuota":
        for part in ("hard",):
            for rn, q in ((spec or {}).get(part) or {}).items():
                if not is_quantity(q):
                    errs.append(err_invalid(f"spec.{part}[{rn}]", q, "must be a valid quantity"))
    elif g == "scheduling.k8s.io" and k == "PriorityClass":
        if "value" not in obj:
            errs.append(err_required("value"))
        if old is not None and old.get("value") != obj.get("value"):
            errs.append(err_forbidden("value", "may not be changed in an update."))
    return errs


def _strip_sched(tmpl: dict) -> dict:
    """Pod template without the fields Kueue may mutate (nodeSelector, tolerations, labels, annotations, schedulingGates)."""
    t = _copy(tmpl)
    sp = t.get("spec") or {}
    for f in ("nodeSelector", "tolerations", "schedulingGates", "affinity"):
        sp.pop(f, None)
    md = t.get("metadata") or {}
    md.pop("labels", None)
    md.pop("annotations", None)
    return t

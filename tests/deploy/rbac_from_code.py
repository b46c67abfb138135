"""What the portal does on a cluster, derived from its own code: (API group, resource, verb) triples.

Every call of the cluster client (``portal/kube.py``) in the product is found by reading the source (an AST
walk over the apps): the :class:`~portal.kube.Kube` verbs on a receiver named ``kube`` / ``self.kube`` /
``kube_for(...)``, plus the module functions ``pod_log_read`` and ``service_proxy``. A call names its kind either
literally (``kube.list("v1", "Node")``) or through one of the product's own tables or renderers, listed in
:data:`SOURCES` by call site; a call site missing there fails the test, so a new call cannot slip past the role.

Kinds become REST resources with the sandbox's discovery data (built-in types and the CRDs it serves, the same
files the real Kueue and Volcano install), and verbs become RBAC verbs: ``apply`` is server-side apply (a PATCH
that creates a missing object: ``create`` + ``patch``; with ``owner=`` it reads the object first: ``get``).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("portal", "tenants", "quotas", "workloads", "billing", "maintenance", "insights")
KUBE_VERBS = {"apply", "get", "list", "delete", "watch", "pod_log", "finalizer_remove", "patch"}
RBAC_OF = {"get": {"get"}, "list": {"list"}, "watch": {"watch"}, "delete": {"delete"}, "apply": {"create", "patch"},
           "patch": {"patch"},
           "finalizer_remove": {"get", "patch"}}  # read the finalizers, merge-patch the list back without ours
# portal/kube.py's node helpers (MIG changes): a merge patch of a Node.
NODE_HELPERS = {"node_cordon", "node_label"}
# The notebook proxy forwards the browser's method (GET, POST, PUT, PATCH, DELETE) to services/proxy.
PROXY_VERBS = {"get", "create", "update", "patch", "delete"}

# Where a call's kinds come from when its arguments are not literal: (module path, function) -> the table
# (``module:NAME`` of (apiVersion, kind) pairs or objects with api_version/kind) or ``render:<files>`` (the
# apiVersion/kind dict literals the renderers in those files build).
QUOTA_RENDER = "render:quotas/manifests.py"
WORKLOAD_RENDER = "render:workloads/kinds/*.py,workloads/manifests.py"
SOURCES: dict[tuple[str, str], str] = {
    ("quotas/namespaces.py", "namespace_inspect"): "quotas.namespaces:CONTENT_KINDS",
    ("quotas/reconcile.py", "_live_objects"): "quotas.manifests:KIND_ORDER",
    ("quotas/reconcile.py", "_any_objects"): "quotas.manifests:KIND_ORDER",
    ("quotas/reconcile.py", "plan_apply"): QUOTA_RENDER,
    ("quotas/reconcile.py", "run_unit"): QUOTA_RENDER,
    ("workloads/materialize.py", "request_materialize"): WORKLOAD_RENDER,
    ("workloads/materialize.py", "requests_materialize"): WORKLOAD_RENDER,
    ("workloads/materialize.py", "_apply_one"): WORKLOAD_RENDER,
    ("workloads/materialize.py", "_delete_objects"): WORKLOAD_RENDER,
    ("workloads/materialize.py", "request_act"): WORKLOAD_RENDER,
    ("workloads/materialize.py", "_serving_prune"): "workloads.materialize:SERVING_EXTRAS",
    ("workloads/status.py", "_list"): "workloads.status:FOLLOWED",
    ("workloads/status.py", "_watch"): "workloads.status:FOLLOWED",
    ("workloads/status.py", "_deleted_outside"): "workloads.status:FOLLOWED",
    ("workloads/status.py", "_follow"): "workloads.status:FOLLOWED",  # one list when every watch broke
    ("workloads/status.py", "_release_outcomes"): "workloads.status:OUTCOME_KINDS",
}


def _receiver_is_kube(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "kube"
    if isinstance(node, ast.Attribute):
        return node.attr == "kube"
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "kube_for"


def _constant(node: ast.AST, module: str) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):  # a module constant such as KUEUE
        value = getattr(importlib.import_module(module), node.id, None)
        return value if isinstance(value, str) else None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):  # another module's: m.KUEUE
        owner = getattr(importlib.import_module(module), node.value.id, None)
        value = getattr(owner, node.attr, None)
        return value if isinstance(value, str) else None
    return None


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def call_sites() -> list[dict]:
    """Every cluster call in the product: file, function, verb, literal (apiVersion, kind) or None, keywords."""
    sites = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "portal/kube.py" or "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if not isinstance(node, ast.Call):
                        continue
                    f = node.func
                    if isinstance(f, ast.Attribute) and f.attr in KUBE_VERBS and _receiver_is_kube(f.value):
                        verb = f.attr
                    elif isinstance(f, ast.Name) and f.id in ("pod_log_read", "service_proxy", *NODE_HELPERS):
                        verb = f.id
                    else:
                        continue
                    literal = None
                    if verb in ("get", "list", "delete", "watch", "finalizer_remove", "patch") and len(node.args) >= 2:
                        a, k = (_constant(arg, _module_name(path)) for arg in node.args[:2])
                        if a and k:
                            literal = (a, k)
                    sites.append({"file": rel, "function": fn.name, "verb": verb, "kind": literal,
                                  "keywords": {kw.arg for kw in node.keywords}})
    return sites


def _rendered(patterns: str) -> set[tuple[str, str]]:
    kinds = set()
    for pattern in patterns.split(","):
        for path in sorted(ROOT.glob(pattern)):
            module = _module_name(path)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Dict):
                    keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}
                    if "apiVersion" in keys and "kind" in keys:
                        a, k = _constant(keys["apiVersion"], module), _constant(keys["kind"], module)
                        assert a and k, f"{path}: a rendered object whose apiVersion/kind is not a constant"
                        kinds.add((a, k))
    return kinds


def kinds_of(source: str) -> set[tuple[str, str]]:
    if source.startswith("render:"):
        return _rendered(source.removeprefix("render:"))
    module, name = source.split(":")
    table = getattr(importlib.import_module(module), name)
    return {(item.api_version, item.kind) if hasattr(item, "kind") else tuple(item) for item in table}


def resources() -> dict[tuple[str, str], tuple[str, str]]:
    """(apiVersion, kind) -> (API group, plural), from the sandbox's discovery data."""
    from sandbox.inference import OPTIONAL_APIS
    from sandbox.registry import BUILTIN_TYPES, load_crd_types

    out = {}
    optional = [t for types in OPTIONAL_APIS.values() for t in types]  # Gateway API, KEDA: where a cluster serves them
    for t in (*BUILTIN_TYPES, *load_crd_types(), *optional):
        api_version = f"{t.group}/{t.version}" if t.group else t.version
        out[(api_version, t.kind)] = (t.group, t.plural)
    return out


def unmapped_sites() -> list[dict]:
    return [s for s in call_sites() if s["kind"] is None and s["verb"] in KUBE_VERBS - {"pod_log"}
            and (s["file"], s["function"]) not in SOURCES]


def required_rules() -> set[tuple[str, str, str]]:
    """The (group, resource, verb) triples the code needs."""
    plural = resources()
    triples: set[tuple[str, str, str]] = set()

    def add(kinds, verbs):
        for kind in kinds:
            group, resource = plural[kind]
            triples.update((group, resource, v) for v in verbs)

    for site in call_sites():
        verb = site["verb"]
        if verb in {"pod_log", "pod_log_read"}:
            triples.add(("", "pods/log", "get"))
            continue
        if verb == "service_proxy":
            triples.update(("", "services/proxy", v) for v in PROXY_VERBS)
            continue
        if verb in NODE_HELPERS:
            triples.add(("", "nodes", "patch"))
            continue
        kinds = {site["kind"]} if site["kind"] else kinds_of(SOURCES[(site["file"], site["function"])])
        verbs = set(RBAC_OF[verb])
        if verb == "apply" and "owner" in site["keywords"]:
            verbs.add("get")
        add(kinds, verbs)
    return triples


def role_rules(role: dict) -> set[tuple[str, str, str]]:
    """The (group, resource, verb) triples a ClusterRole grants (no wildcards allowed)."""
    triples = set()
    for rule in role.get("rules") or []:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    triples.add((group, resource, verb))
    return triples


def as_rules(triples: set[tuple[str, str, str]]) -> list[dict]:
    """Triples as ClusterRole rules: one rule per (group, verbs), resources sorted."""
    by_resource: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in triples:
        by_resource.setdefault((group, resource), set()).add(verb)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (group, resource), verbs in sorted(by_resource.items()):
        grouped.setdefault((group, tuple(sorted(verbs))), []).append(resource)
    return [{"apiGroups": [group], "resources": sorted(res), "verbs": list(verbs)}
            for (group, verbs), res in sorted(grouped.items())]


if __name__ == "__main__":  # print the rules for deploy/kubernetes/base/rbac.yaml
    import os
    import sys

    import django
    import yaml

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
    print(yaml.safe_dump(as_rules(required_rules()), sort_keys=False, default_flow_style=None, width=120))

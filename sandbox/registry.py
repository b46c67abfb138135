"""Kinds known to the sandbox cluster: a table of built-in Kubernetes kinds plus every CRD under ``sandbox/crds/``.

See ``CONTRACT.md``. ``ResourceType`` objects are immutable and hashed by identity, so they can be used as
cache keys (validation compiles one schema per ResourceType).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CRD_DIR = Path(__file__).parent / "crds"

try:  # libyaml is ~50x faster on the 1.4 MB Workload CRD
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader


@dataclass(frozen=True, eq=False)
class ResourceType:
    group: str  # "" for core
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()  # e.g. {"status"}, {"status", "scale"}
    schema: dict | None = None  # openAPIV3Schema for CRD versions; None for built-in kinds
    # extras (not in the minimal contract, all optional)
    printer_columns: tuple[dict, ...] = ()  # CRD additionalPrinterColumns of this version
    scale: dict | None = field(default=None)  # CRD scale subresource paths {specReplicasPath, statusReplicasPath, ...}
    storage: bool = True  # the CRD storage version (informational)
    crd: bool = False  # defined by a CustomResourceDefinition

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def resource(self) -> str:
        """``plural`` or ``plural.group`` as used in API error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """``Kind`` or ``Kind.group`` as used in 422 messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def __repr__(self) -> str:  # keep reprs short (schemas are huge)
        return f"ResourceType({self.api_version} {self.kind})"


def _builtin(group, version, kind, plural, namespaced=True, short=(), cats=(), sub=(), singular=None):
    return ResourceType(
        group=group,
        version=version,
        kind=kind,
        plural=plural,
        singular=singular or kind.lower(),
        namespaced=namespaced,
        short_names=tuple(short),
        categories=tuple(cats),
        subresources=frozenset(sub),
    )


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _builtin("", "v1", "Namespace", "namespaces", False, ("ns",), (), ("status",)),
    _builtin("", "v1", "Node", "nodes", False, ("no",), (), ("status",)),
    _builtin("", "v1", "Pod", "pods", True, ("po",), ("all",), ("status",)),
    _builtin("", "v1", "Service", "services", True, ("svc",), ("all",), ("status",)),
    _builtin("", "v1", "ConfigMap", "configmaps", True, ("cm",)),
    _builtin("", "v1", "Secret", "secrets", True),
    _builtin("", "v1", "ServiceAccount", "serviceaccounts", True, ("sa",)),
    _builtin("", "v1", "ResourceQuota", "resourcequotas", True, ("quota",), (), ("status",)),
    _builtin("", "v1", "LimitRange", "limitranges", True, ("limits",)),
    _builtin("", "v1", "Event", "events", True, ("ev",)),
    _builtin("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True, ("pvc",), (), ("status",)),
    _builtin("apps", "v1", "Deployment", "deployments", True, ("deploy",), ("all",), ("status", "scale")),
    _builtin("apps", "v1", "StatefulSet", "statefulsets", True, ("sts",), ("all",), ("status", "scale")),
    _builtin("batch", "v1", "Job", "jobs", True, (), ("all",), ("status",)),
    _builtin("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    _builtin("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    _builtin("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True, ("netpol",)),
    _builtin("networking.k8s.io", "v1", "Ingress", "ingresses", True, ("ing",), (), ("status",)),
    _builtin("networking.k8s.io", "v1", "IngressClass", "ingressclasses", False),
    _builtin("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True, ("pdb",), (), ("status",)),
    _builtin("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", True, ("hpa",), ("all",),
             ("status",)),
    _builtin("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    _builtin("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    _builtin("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False, ("pc",)),
    _builtin("events.k8s.io", "v1", "Event", "events", True, ("ev",)),
)


def load_crd_types(crd_dir: Path = CRD_DIR) -> list[ResourceType]:
    """One ResourceType per served version of every CustomResourceDefinition in ``crd_dir/**.yaml``."""
    out: list[ResourceType] = []
    for path in sorted(crd_dir.rglob("*.yaml")):
        with open(path, "rb") as fh:
            docs = list(yaml.load_all(fh, Loader=_Loader))
        for doc in docs:
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            out.extend(crd_to_types(doc))
    return out


def crd_to_types(crd: dict) -> list[ResourceType]:
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for v in spec.get("versions") or []:
        if not v.get("served", True):
            continue
        subs = v.get("subresources") or spec.get("subresources") or {}
        schema = ((v.get("schema") or spec.get("validation") or {}).get("openAPIV3Schema")) or {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
        out.append(
            ResourceType(
                group=spec["group"],
                version=v["name"],
                kind=names["kind"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=frozenset(k for k in ("status", "scale") if k in subs),
                schema=schema,
                printer_columns=tuple(v.get("additionalPrinterColumns") or spec.get("additionalPrinterColumns") or ()),
                scale=subs.get("scale"),
                storage=bool(v.get("storage", False)),
                crd=True,
            )
        )
    return out


class Registry:
    def __init__(self, types: list[ResourceType] | tuple[ResourceType, ...] = ()):
        self._types: list[ResourceType] = []
        self._by_kind: dict[tuple[str, str], ResourceType] = {}
        self._by_plural: dict[tuple[str, str, str], ResourceType] = {}
        for t in types:
            self.add(t)

    def add(self, t: ResourceType) -> None:
        key = (t.api_version, t.kind)
        old = self._by_kind.get(key)
        if old is not None:
            self._types.remove(old)
        self._types.append(t)
        self._by_kind[key] = t
        self._by_plural[(t.group, t.version, t.plural)] = t

    def by_kind(self, api_version: str, kind: str) -> ResourceType:
        return self._by_kind[(api_version, kind)]

    def by_plural(self, group: str, version: str, plural: str) -> ResourceType:
        return self._by_plural[(group, version, plural)]

    def all(self) -> list[ResourceType]:
        return list(self._types)

    def groups(self) -> dict[str, list[str]]:
        """group -> served versions (core group is "")."""
        out: dict[str, list[str]] = {}
        for t in self._types:
            vs = out.setdefault(t.group, [])
            if t.version not in vs:
                vs.append(t.version)
        return out


_default_types: list[ResourceType] | None = None
_default_lock = threading.Lock()


def default_registry() -> Registry:
    """A new Registry with the built-in kinds and the vendored CRDs (CRD files are parsed once per process)."""
    global _default_types  # noqa: PLW0603 the CRD files, parsed once per process (under the lock)
    with _default_lock:
        if _default_types is None:
            _default_types = list(BUILTIN_TYPES) + load_crd_types()
    return Registry(_default_types)

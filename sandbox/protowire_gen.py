"""Regenerate ``protowire_schema.py``: the protobuf field tables of the built-in kinds the sandbox decodes.

    python -m sandbox.protowire_gen <k8s.io/api module dir> <k8s.io/apimachinery module dir> > sandbox/protowire_schema.py

Field numbers, names and types come from each package's ``generated.proto``; whether a Go field is a pointer
and whether its JSON tag says ``omitempty``/``omitzero`` comes from the ``protobuf:"...,N,..."`` struct tags in
the package's Go sources (the wire format cannot tell a nil pointer from a zero value, the JSON can).
Only the messages reachable from ``ROOTS`` are written. Pure standard library; no Django.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# proto package directory (relative to its module) -> short prefix used in the tables
API_PACKAGES = {
    "core/v1": "core.v1", "apps/v1": "apps.v1", "batch/v1": "batch.v1", "rbac/v1": "rbac.v1",
    "networking/v1": "networking.v1", "policy/v1": "policy.v1", "autoscaling/v2": "autoscaling.v2",
    "scheduling/v1": "scheduling.v1", "events/v1": "events.v1",
}
MACHINERY_PACKAGES = {
    "pkg/apis/meta/v1": "meta.v1", "pkg/api/resource": "resource", "pkg/util/intstr": "intstr",
    "pkg/runtime": "runtime", "pkg/runtime/schema": "schema",
}
# (apiVersion, kind) -> message: the kinds a protobuf body may carry
ROOTS = {
    ("v1", "Namespace"): "core.v1.Namespace", ("v1", "Node"): "core.v1.Node", ("v1", "Pod"): "core.v1.Pod",
    ("v1", "Service"): "core.v1.Service", ("v1", "ConfigMap"): "core.v1.ConfigMap", ("v1", "Secret"): "core.v1.Secret",
    ("v1", "ServiceAccount"): "core.v1.ServiceAccount", ("v1", "ResourceQuota"): "core.v1.ResourceQuota",
    ("v1", "LimitRange"): "core.v1.LimitRange", ("v1", "Event"): "core.v1.Event",
    ("v1", "PersistentVolumeClaim"): "core.v1.PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "apps.v1.Deployment", ("apps/v1", "StatefulSet"): "apps.v1.StatefulSet",
    ("batch/v1", "Job"): "batch.v1.Job", ("batch/v1", "CronJob"): "batch.v1.CronJob",
    ("rbac.authorization.k8s.io/v1", "Role"): "rbac.v1.Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rbac.v1.RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "rbac.v1.ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "rbac.v1.ClusterRoleBinding",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networking.v1.NetworkPolicy",
    ("networking.k8s.io/v1", "Ingress"): "networking.v1.Ingress",
    ("networking.k8s.io/v1", "IngressClass"): "networking.v1.IngressClass",
    ("policy/v1", "PodDisruptionBudget"): "policy.v1.PodDisruptionBudget",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "autoscaling.v2.HorizontalPodAutoscaler",
    ("scheduling.k8s.io/v1", "PriorityClass"): "scheduling.v1.PriorityClass",
    ("events.k8s.io/v1", "Event"): "events.v1.Event",
    ("meta.k8s.io/v1", "DeleteOptions"): "meta.v1.DeleteOptions",
}
# messages whose JSON form is not an object (handled by name in protowire.py)
SPECIAL = {"meta.v1.Time", "meta.v1.MicroTime", "meta.v1.Duration", "meta.v1.FieldsV1", "resource.Quantity",
           "intstr.IntOrString", "runtime.RawExtension"}

_FIELD = re.compile(r"^\s*(optional|repeated)\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;")
_MAP = re.compile(r"^\s*map<\s*([\w.]+)\s*,\s*([\w.]+)\s*>\s+(\w+)\s*=\s*(\d+)\s*;")
_GO_TYPE = re.compile(r"^type\s+(\w+)\s+struct\s*{")
_GO_FIELD = re.compile(r"^\s*(?:(\w+)\s+)?(\S+)\s+`([^`]*)`")


def _parse_proto(path: Path, prefix: str) -> dict[str, list]:
    msgs: dict[str, list] = {}
    cur = None
    for line in path.read_text().splitlines():
        if line.startswith("message "):
            cur = prefix + "." + line.split()[1]
            msgs[cur] = []
        elif line.startswith("}"):
            cur = None
        elif cur and not line.strip().startswith("//"):
            m = _FIELD.match(line)
            if m:
                msgs[cur].append((int(m[4]), m[3], m[1] == "repeated", m[2], None))
                continue
            m = _MAP.match(line)
            if m:
                msgs[cur].append((int(m[4]), m[3], False, m[1], m[2]))
    return msgs


def _parse_go(pkg_dir: Path, prefix: str) -> dict[tuple[str, int], tuple[bool, bool, str]]:
    """(message, number) -> (pointer, omitempty, json name, inline) from the struct tags."""
    out = {}
    for path in sorted(pkg_dir.glob("*.go")):
        if path.name.endswith("_test.go") or path.name.startswith("zz_") or path.name.startswith("generated"):
            continue
        cur = None
        for line in path.read_text().splitlines():
            m = _GO_TYPE.match(line)
            if m:
                cur = prefix + "." + m[1]
                continue
            if line.startswith("}"):
                cur = None
                continue
            if cur is None:
                continue
            m = _GO_FIELD.match(line)
            if not m:
                continue
            tag = m[3]
            pm = re.search(r'protobuf:"\w+,(\d+),', tag)
            if not pm:
                continue
            jm = re.search(r'json:"([^"]*)"', tag)
            jparts = (jm[1] if jm else "").split(",")
            omit = "omitempty" in jparts[1:] or "omitzero" in jparts[1:]
            out[(cur, int(pm[1]))] = (m[2].startswith("*"), omit, jparts[0], "inline" in jparts[1:])
    return out


def _resolve(type_name: str, prefix: str) -> str:
    scalars = {"string", "bytes", "bool", "int32", "int64", "uint32", "uint64", "double", "float"}
    if type_name in scalars:
        return type_name
    type_name = type_name.lstrip(".")
    if type_name.startswith("k8s.io."):
        for pkgs, mod in ((API_PACKAGES, "k8s.io.api."), (MACHINERY_PACKAGES, "k8s.io.apimachinery.")):
            for d, short in pkgs.items():
                if type_name.startswith(mod + d.replace("/", ".") + "."):
                    return short + "." + type_name.rsplit(".", 1)[1]
        raise SystemExit(f"unknown package of {type_name}")
    return prefix + "." + type_name


def main(argv: list[str]) -> int:
    api_dir, machinery_dir = Path(argv[0]), Path(argv[1])
    protos: dict[str, list] = {}
    go: dict = {}
    for base, pkgs in ((api_dir, API_PACKAGES), (machinery_dir, MACHINERY_PACKAGES)):
        for d, prefix in pkgs.items():
            for name, fields in _parse_proto(base / d / "generated.proto", prefix).items():
                protos[name] = [(n, fname, rep, _resolve(t, prefix), _resolve(v, prefix) if v else None)
                                for n, fname, rep, t, v in fields]
            go.update(_parse_go(base / d, prefix))
    seen: set[str] = set()
    todo = list(ROOTS.values())
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in SPECIAL:
            continue
        for _n, _fname, _rep, t, v in protos[name]:
            for x in (t, v):
                if x and "." in x:
                    todo.append(x)
    w = sys.stdout.write
    w('"""Protobuf field tables of the built-in kinds (generated by ``python -m sandbox.protowire_gen``; do not edit).\n\n'
      "MESSAGES: message -> {field number: (JSON name, type, flags)}; type is a scalar (``string``, ``int64``, ...), a\n"
      "message name, or ``map:<key type>:<value type>``. Flags: 1 repeated, 2 Go pointer (a zero value is kept),\n"
      "4 ``omitempty`` (a zero value is dropped), 8 ``json:\",inline\"`` (the message's fields join its parent's).\n"
      'KINDS: (apiVersion, kind) -> message.\n"""\n\n')
    w("MESSAGES: dict[str, dict[int, tuple[str, str, int]]] = {\n")
    for name in sorted(seen):
        if name in SPECIAL:
            continue
        entries = []
        for n, fname, rep, t, v in sorted(protos[name]):
            if (name, n) not in go:
                sys.stderr.write(f"note: no Go field for {name}.{fname}\n")
            ptr, omit, jname, inline = go.get((name, n), (False, True, fname, False))
            if jname and jname != fname:
                sys.stderr.write(f"note: {name}.{fname} is {jname!r} in JSON\n")
            flags = (1 if rep else 0) | (2 if ptr else 0) | (4 if omit else 0) | (8 if inline else 0)
            typ = f"map:{t}:{v}" if v else t
            entries.append(f"{n}: ({(jname or fname)!r}, {typ!r}, {flags})")
        w(f"    {name!r}: {{" + ", ".join(entries) + "},\n")
    w("}\n\nKINDS: dict[tuple[str, str], str] = {\n")
    for key, name in ROOTS.items():
        w(f"    {key!r}: {name!r},\n")
    w("}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

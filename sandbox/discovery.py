"""Legacy discovery documents (/version, /api, /api/v1, /apis, /apis/<g>/<v>).

Only the legacy (APIVersions / APIGroupList / APIResourceList) format is served: kubectl falls back
to it cleanly and the Python DynamicClient speaks nothing else (sandbox/README.md, "What clients expect").
"""

from __future__ import annotations

import re

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0",
    "gitCommit": "sandbox",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23.4",
    "compiler": "gc",
    "platform": "linux/amd64",
}

OBJECT_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
SUBRESOURCE_VERBS = {
    "status": ["get", "patch", "update"],
    "scale": ["get", "patch", "update"],
    "log": ["get"],
}
SUBRESOURCE_KIND = {"scale": ("autoscaling", "v1", "Scale")}

_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple:
    """Sort key implementing Kubernetes version priority (GA > beta > alpha, higher numbers first)."""
    m = _VERSION_RE.match(version)
    if not m:
        return (0, 0, 0, version)
    major, level, minor = int(m.group(1)), m.group(2), int(m.group(3) or 0)
    rank = {None: 3, "beta": 2, "alpha": 1}[level]
    return (rank, major, minor, "")


def subresources_of(rt) -> list[str]:
    subs = set(getattr(rt, "subresources", ()) or ())
    if rt.group == "" and rt.kind == "Pod":
        subs.add("log")
    return sorted(subs)


def groups(registry) -> dict[str, list[str]]:
    """{group: [versions, preferred first]} for the non-core groups."""
    out: dict[str, set[str]] = {}
    for rt in registry.all():
        if rt.group:
            out.setdefault(rt.group, set()).add(rt.version)
    return {g: sorted(vs, key=version_priority, reverse=True) for g, vs in sorted(out.items())}


def api_versions() -> dict:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def api_group_list(registry) -> dict:
    items = []
    for group, versions in groups(registry).items():
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        items.append({"name": group, "versions": gvs, "preferredVersion": gvs[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": items}


def api_group(registry, group: str) -> dict | None:
    versions = groups(registry).get(group)
    if not versions:
        return None
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs, "preferredVersion": gvs[0]}


def resource_list(registry, group: str, version: str) -> dict | None:
    kinds = [rt for rt in registry.all() if rt.group == group and rt.version == version]
    if not kinds:
        return None
    resources = []
    for rt in sorted(kinds, key=lambda r: r.plural):
        entry = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(OBJECT_VERBS),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in subresources_of(rt):
            sub_entry = {
                "name": f"{rt.plural}/{sub}",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": list(SUBRESOURCE_VERBS.get(sub, ["get"])),
            }
            if sub in SUBRESOURCE_KIND:
                g, v, k = SUBRESOURCE_KIND[sub]
                sub_entry.update({"group": g, "version": v, "kind": k})
            if sub == "log":
                sub_entry["kind"] = "Pod"
            resources.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }

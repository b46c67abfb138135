"""Volcano network-topology-aware scheduling: HyperNodes (``topology.volcano.sh/v1alpha1``), simulated minimally.

A HyperNode is one network domain at a ``tier`` (1: the lowest, e.g. a rack or an NVLink domain; higher tiers hold
lower ones). Its ``members`` are nodes or other HyperNodes, each picked by one selector, as upstream's API defines
them: ``exactMatch.name`` (a node's or HyperNode's name), ``regexMatch.pattern`` (a regular expression searched in the
name, Go's ``regexp.MatchString``), ``labelMatch`` (``matchLabels`` / ``matchExpressions`` on a node's labels; nodes
only). A HyperNode's nodes are its node members plus the nodes of its HyperNode members, recursively (a cycle is
cut). The controller writes ``status.nodeCount``.

A Volcano Job's ``spec.networkTopology`` (copied to its PodGroup) asks for ``mode: hard`` (default) or ``soft`` and
``highestTierAllowed`` (default 1): in hard mode the whole gang is placed within the nodes of one HyperNode of at most
that tier (the lowest tier that fits first, then the fullest HyperNode that fits: Volcano's binpack), else nothing is
bound and the PodGroup waits with ``NetworkTopologyUnsatisfied``-style words (``unsatisfied_message``); in soft mode
it tries the same and otherwise is placed anywhere. Nodes in no HyperNode take no hard-mode gang.

Not simulated: HyperNode auto-discovery (UFM, RoCE, label sources), ``highestTierName``, sub-group topology
(``partitionPolicy``), the scoring plugins' weights, and keeping a restarted gang's pods in its first HyperNode.
"""

from __future__ import annotations

import re
from decimal import Decimal

from sandbox.controllers import resources as R
from sandbox.selectors import match_labels

HYPERNODE = ("topology.volcano.sh/v1alpha1", "HyperNode")
DEFAULT_TIER = 1


def _selected(selector: dict, name: str, labels: dict | None) -> bool:
    sel = selector or {}
    if "exactMatch" in sel:
        return (sel.get("exactMatch") or {}).get("name") == name
    if "regexMatch" in sel:
        try:
            return re.search((sel.get("regexMatch") or {}).get("pattern") or "", name) is not None
        except re.error:
            return False
    if "labelMatch" in sel and labels is not None:
        return match_labels(sel.get("labelMatch") or {}, labels)
    return False


def members_of(hypernodes: list[dict], nodes: dict[str, dict]) -> dict[str, set[str]]:
    """HyperNode name -> the names of the nodes it holds (recursively). ``nodes``: name -> labels."""
    by_name = {h["metadata"]["name"]: h for h in hypernodes}
    memo: dict[str, set[str]] = {}

    def resolve(name: str, seen: frozenset[str]) -> set[str]:
        if name in memo:
            return memo[name]
        out: set[str] = set()
        for member in ((by_name[name].get("spec") or {}).get("members") or []):
            selector = member.get("selector") or {}
            if member.get("type") == "Node":
                out |= {n for n, labels in nodes.items() if _selected(selector, n, labels)}
            elif member.get("type") == "HyperNode":
                for child in by_name:
                    if child not in seen and child != name and _selected(selector, child, None):
                        out |= resolve(child, seen | {child})
        memo[name] = out
        return out

    return {name: resolve(name, frozenset({name})) for name in sorted(by_name)}


def tier_of(hypernode: dict) -> int:
    try:
        return int((hypernode.get("spec") or {}).get("tier") or 0)
    except (TypeError, ValueError):
        return 0


def wanted(pg: dict) -> tuple[str, int] | None:
    """(mode, highest tier allowed) of a PodGroup's ``spec.networkTopology``; None when it asks for none."""
    nt = (pg.get("spec") or {}).get("networkTopology")
    if not isinstance(nt, dict):
        return None
    mode = nt.get("mode") or "hard"
    try:
        highest = int(nt["highestTierAllowed"]) if nt.get("highestTierAllowed") is not None else DEFAULT_TIER
    except (TypeError, ValueError):
        highest = DEFAULT_TIER
    return mode, highest


def candidates(hypernodes: list[dict], members: dict[str, set[str]], highest: int) -> list[tuple[int, str, set[str]]]:
    """(tier, name, nodes) of the HyperNodes a gang may be placed in (tier 1..highest, with nodes), lowest tier first."""
    out = [(tier_of(h), h["metadata"]["name"], members.get(h["metadata"]["name"], set())) for h in hypernodes]
    return sorted((t, n, m) for t, n, m in out if 0 < t <= highest and m)


def free_gpus(infos: dict, names: set[str]) -> tuple[Decimal, str]:
    """Free GPUs (any GPU resource) on the nodes ``names``, and the resource's name."""
    total, resource = Decimal(0), "nvidia.com/gpu"
    for n in names:
        ni = infos.get(n)
        if ni is None:
            continue
        for key, value in R.sub(ni.allocatable, ni.requested).items():
            if R.is_gpu_resource(key) and value > 0:
                total += value
                resource = key
    return total, resource


def unsatisfied_message(*, pods: int, gpus: Decimal, highest: int, emptiest: tuple[str, int, Decimal, int] | None,
                        resource: str) -> str:
    """The PodGroup's and pods' words when a hard-mode gang fits in no HyperNode. Parsed by the portal
    (workloads/pending.py: ``network_topology_sentence``)."""
    head = (f"network topology unsatisfied: the gang of {pods} pod(s) needs {R.fmt(resource, gpus)} {resource} within one "
            f"hypernode of tier <= {highest}")
    if emptiest is None:
        return f"{head}; no hypernode of tier <= {highest} holds a node"
    name, tier, free, room = emptiest
    return f"{head}; the emptiest, {name} (tier {tier}), has {R.fmt(resource, free)} free and room for {room} pod(s)"

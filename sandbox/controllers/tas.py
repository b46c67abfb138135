"""Kueue Topology Aware Scheduling (TAS), simulated minimally but with Kueue's own rules and words.

A pod set is placed by topology when its flavor names a ``Topology`` (``ResourceFlavor.spec.topologyName``). Its pod
template may ask ``kueue.x-k8s.io/podset-required-topology: <level label>`` (all pods in one domain of that level,
else it waits) or ``kueue.x-k8s.io/podset-preferred-topology: <level label>`` (one domain of that level if one has
room, else the level above, else spread over the top level); ``podset-unconstrained-topology`` (or no annotation, TAS
implied by a queue of TAS flavors only) places it at the lowest level by LeastFreeCapacity (Kueue's
``TASProfileMixed``, on by default): the node with the least room that holds every pod, else the least roomy nodes
first. What follows Kueue v0.17's ``pkg/cache/scheduler/tas_flavor_snapshot.go``:

* the leaves are the Ready, schedulable nodes that carry every level's label and match the flavor's ``nodeLabels``;
  a leaf is excluded for an untolerated ``NoSchedule``/``NoExecute`` taint (the pod's tolerations and the flavor's),
  for the pod's ``nodeSelector``; its free capacity is its allocatable less the requests of the non-TAS pods bound
  to it and the TAS usage of admitted Workloads' ``topologyAssignment``; its "state" is how many pods fit;
* a domain's state is the sum of its leaves'; at the asked level the domains are sorted by state (most first, then
  by their values) and the best fit is taken: the fitting domain with the least room (``findLevelWithFitDomains``);
  then level by level down, the children of *all* the picked domains are sorted together and taken greedily, the last
  by best fit (``updateCountsToMinimumGeneric``): a spread over two blocks keeps no block's share (Kueue's own
  ``sample-job-preferred.yaml`` on the real control plane showed it: ``tests/sandbox/test_kueue_tas_examples.py``);
* no fit: ``topology "<name>" allows to fit only <n> out of <count> pod(s)`` (``doesn't allow to fit any of``), with
  ``. Total nodes: <n>; excluded: resource "nvidia.com/gpu": 2, taint "...": 1`` when leaves were excluded;
* the assignment lists the hostname level only (the lowest level is ``kubernetes.io/hostname``), in the v1beta2
  compact encoding: one slice, ``universal`` where every value (or pod count) is the same, else ``individual``
  with the common prefix and suffix.

Enforcement (``Kueue._enforce``): the admitted Job's pod template gets the scheduling gate
``kueue.x-k8s.io/topology``; each pod created is un-gated with a ``kubernetes.io/hostname`` node selector for the
next host of the assignment that still has room. A pod with a topology annotation is counted by the assignment, not
again as a non-TAS pod (Kueue's ``utiltas.IsTAS``; Kueue v0.17 puts no label on it: the real control plane showed it).

Not simulated: slices (``podset-slice-*``; the multi-layer annotation is refused as Kueue's webhook does without its
alpha gate, ``sandbox/webhooks.py``), leader/worker pod sets, balanced placement (an alpha gate), topologies whose
lowest level is not the hostname, node replacement on failure, preemption for fragmented capacity.
"""

from __future__ import annotations

from decimal import Decimal

from sandbox.controllers import resources as R
from sandbox.controllers.scheduler import node_ready, pod_is_active, tolerates
from sandbox.selectors import match_labels

KUEUE = "kueue.x-k8s.io/v1beta2"
TOPOLOGY = (KUEUE, "Topology")
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
GATE = "kueue.x-k8s.io/topology"
HOSTNAME = "kubernetes.io/hostname"


def taint_str(t: dict) -> str:
    """corev1.Taint.ToString(): ``key=value:Effect`` (``key:Effect`` without a value)."""
    value = t.get("value") or ""
    return f"{t.get('key')}{'=' + value if value else ''}:{t.get('effect')}"


def request_of(template: dict | None) -> tuple[str, bool] | None:
    """(level label, required) a pod template asks for; ("", False) when it asks nothing (placed anywhere)."""
    ann = ((template or {}).get("metadata") or {}).get("annotations") or {}
    if ann.get(REQUIRED):
        return str(ann[REQUIRED]), True
    if ann.get(PREFERRED):
        return str(ann[PREFERRED]), False
    return "", False


def explicit(template: dict | None) -> bool:
    """Does the pod template ask for TAS itself (workload.IsExplicitlyRequestingTAS: a required, preferred or
    unconstrained topology annotation)?"""
    ann = ((template or {}).get("metadata") or {}).get("annotations") or {}
    return bool(ann.get(REQUIRED) or ann.get(PREFERRED) or str(ann.get(UNCONSTRAINED) or "").lower() == "true")


def flavor_match(*, template: dict | None, flavor: dict, topologies: dict[str, dict], covered: list[str],
                 requested: dict, tas_only: bool) -> str | None:
    """Kueue's checkPodSetAndFlavorMatchForTAS (v0.17 tas_flavorassigner.go): why ``flavor`` cannot serve this pod
    set, or None. A pod set asking for TAS takes no flavor without a topology for a resource it requests; one that
    does not ask (in a ClusterQueue that also holds flavors without one) takes no flavor with a topology. In a
    ClusterQueue of TAS flavors only, TAS is implied."""
    name = flavor["metadata"]["name"]
    topology_name = (flavor.get("spec") or {}).get("topologyName")
    asks = explicit(template)
    if asks or tas_only:
        if not asks:
            return None
        if not topology_name:
            if not set(covered) & {r for r in requested}:
                return None
            return f'Flavor "{name}" does not support TopologyAwareScheduling'
        topology = topologies.get(topology_name)
        if topology is None:
            return f'Flavor "{name}" information missing in TAS cache'
        level, _required = request_of(template)
        if level and level not in [lv.get("nodeLabel") for lv in (topology.get("spec") or {}).get("levels") or []]:
            return f'Flavor "{name}" does not contain the requested level'
        return None
    if topology_name:
        return f'Flavor "{name}" supports only TopologyAwareScheduling'
    return None


def is_tas(pod: dict) -> bool:
    """utiltas.IsTAS: a pod placed by TAS carries a topology annotation (required, preferred or unconstrained); its
    room is counted by its Workload's assignment, not again as a pod on the node."""
    ann = ((pod.get("metadata") or {}).get("annotations") or {})
    return REQUIRED in ann or PREFERRED in ann or UNCONSTRAINED in ann


def count_in(req: dict[str, Decimal], free: dict[str, Decimal]) -> tuple[int, str]:
    """How many pods of ``req`` fit in ``free``, and the limiting resource (Requests.CountInWithLimitingResource)."""
    best, limiting = None, ""
    for r, v in sorted(req.items()):
        if v <= 0:
            continue
        n = int(max(free.get(r, Decimal(0)), Decimal(0)) // v)
        if best is None or n < best:
            best, limiting = n, r
    return (best if best is not None else 1 << 30), limiting


class NodeState:
    """Free capacity per node for TAS: allocatable less non-TAS pods, less admitted TAS assignments."""

    def __init__(self, nodes: list[dict], pods: list[dict], reserved: list[dict], requests):
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.free: dict[str, dict[str, Decimal]] = {
            name: R.parse_list((n.get("status") or {}).get("allocatable")) for name, n in self.nodes.items()}
        self._requests = requests  # pod spec -> Kueue's per-pod requests
        for p in pods:
            if not pod_is_active(p) or is_tas(p):
                continue
            name = p["spec"]["nodeName"]
            if name in self.free:
                self.free[name] = R.sub(self.free[name], R.pod_requests(p.get("spec")))
        for wl in reserved:
            self.add_workload(wl)

    def add_workload(self, wl: dict, sign: int = 1) -> None:
        adm = (wl.get("status") or {}).get("admission") or {}
        podsets = {ps.get("name", "main"): ps for ps in (wl.get("spec") or {}).get("podSets") or []}
        for psa in adm.get("podSetAssignments") or []:
            ta = psa.get("topologyAssignment")
            if not ta or (ta.get("levels") or [None])[-1] != HOSTNAME:
                continue
            per_pod = self._requests(((podsets.get(psa.get("name", "main")) or {}).get("template") or {}).get("spec"))
            for values, count in decode(ta):
                host = values[-1]
                if host in self.free:
                    self.free[host] = R.sub(self.free[host], R.scale(per_pod, count * sign))


def decode(ta: dict) -> list[tuple[list[str], int]]:
    """A v1beta2 TopologyAssignment as [(values per level, pod count)]."""
    out = []
    nlevels = len(ta.get("levels") or [])
    for sl in ta.get("slices") or []:
        n = int(sl.get("domainCount") or 0)
        cols = []
        for lv in (sl.get("valuesPerLevel") or [])[:nlevels]:
            if lv.get("universal") is not None:
                cols.append([str(lv["universal"])] * n)
            else:
                ind = lv.get("individual") or {}
                cols.append([f"{ind.get('prefix') or ''}{root}{ind.get('suffix') or ''}" for root in ind.get("roots") or []])
        pc = sl.get("podCounts") or {}
        counts = [int(pc["universal"])] * n if pc.get("universal") is not None else [int(c) for c in pc.get("individual") or []]
        for i in range(n):
            out.append(([c[i] for c in cols], counts[i] if i < len(counts) else 0))
    return out


def _compact(values: list[str]) -> dict:
    """fillSingleCompactSliceValues: universal when all equal, else individual with common prefix/suffix."""
    prefix = suffix = values[0]
    min_len = max_len = len(values[0])
    for s in values[1:]:
        n = len(s)
        min_len, max_len = min(min_len, n), max(max_len, n)
        prefix, suffix = prefix[:n], suffix[len(suffix) - n:] if n < len(suffix) else suffix
        for i in range(len(prefix)):
            if s[i] != prefix[i]:
                prefix = prefix[:i]
                break
        for i in range(len(suffix)):
            if s[len(s) - 1 - i] != suffix[len(suffix) - 1 - i]:
                suffix = suffix[len(suffix) - i:]
                break
    if len(prefix) == max_len:
        return {"universal": prefix}
    if len(prefix) + len(suffix) > min_len:
        prefix = prefix[:min_len - len(suffix)]
    ind: dict = {}
    if prefix:
        ind["prefix"] = prefix
    if suffix:
        ind["suffix"] = suffix
    ind["roots"] = [s[len(prefix):len(s) - len(suffix)] for s in values]
    return {"individual": ind}


def encode(levels: list[str], domains: list[tuple[list[str], int]]) -> dict:
    """Kueue's v1beta2 single compact slice encoding of [(values, count)] (sorted by values)."""
    domains = sorted(domains)
    if not domains:
        return {"levels": levels, "slices": []}
    counts = [c for _, c in domains]
    sl = {"domainCount": len(domains),
          "valuesPerLevel": [_compact([v[i] for v, _ in domains]) for i in range(len(levels))],
          "podCounts": {"universal": counts[0]} if len(set(counts)) == 1 else {"individual": counts}}
    return {"levels": levels, "slices": [sl]}


class _Domain:
    __slots__ = ("values", "state", "children")

    def __init__(self, values: tuple[str, ...]):
        self.values = values
        self.state = 0
        self.children: list[_Domain] = []


def _sorted(domains: list[_Domain], least_free: bool = False) -> list[_Domain]:
    """Kueue's sortedDomains: BestFit most room first, LeastFreeCapacity least room first; then by level values."""
    return sorted(domains, key=lambda d: (d.state if least_free else -d.state, d.values))


def _best_fit(domains: list[_Domain], needed: int) -> _Domain:
    """findBestFitDomainBy: the first domain with the least room that still holds ``needed``, else the first."""
    best = domains[0]
    for d in domains:
        if needed <= d.state < best.state:
            best = d
    return best


def _update_counts(domains: list[_Domain], count: int, best_fit: bool) -> list[tuple[_Domain, int]]:
    """updateCountsToMinimumGeneric (pods, no leader): ``count`` pods over ``domains`` in their order, the last
    domain by best fit: [(domain, pods)]."""
    out: list[tuple[_Domain, int]] = []
    remaining = count
    for i, candidate in enumerate(domains):
        d = _best_fit(domains[i:], remaining) if best_fit and candidate.state >= remaining else candidate
        if d.state >= remaining:
            out.append((d, remaining))
            return out
        remaining -= d.state
        out.append((d, d.state))
    return out


def assign(*, topology: dict, flavor: dict, template: dict, count: int, per_pod: dict[str, Decimal],
           state: NodeState) -> tuple[dict | None, str]:
    """(topologyAssignment, "") or (None, Kueue's not-fit message) for ``count`` pods of ``template``."""
    name = topology["metadata"]["name"]
    levels = [lv.get("nodeLabel") for lv in (topology.get("spec") or {}).get("levels") or []]
    level_label, required = request_of(template)
    fspec = flavor.get("spec") or {}
    pspec = (template or {}).get("spec") or {}
    tolerations = list(pspec.get("tolerations") or []) + list(fspec.get("tolerations") or [])
    selector = {str(k): str(v) for k, v in (pspec.get("nodeSelector") or {}).items()}
    if level_label and level_label not in levels:
        return None, f"no requested topology level: {level_label}"
    total = 0
    excluded: dict[str, int] = {}
    by_values: dict[tuple[str, ...], _Domain] = {}
    roots: list[_Domain] = []
    for nname, node in sorted(state.nodes.items()):
        labels = (node.get("metadata") or {}).get("labels") or {}
        if not node_ready(node) or (node.get("spec") or {}).get("unschedulable"):
            continue
        if not match_labels({"matchLabels": fspec.get("nodeLabels") or {}}, labels):
            continue
        if any(lv not in labels for lv in levels):
            continue
        total += 1
        taint = next((t for t in (node.get("spec") or {}).get("taints") or []
                      if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t)), None)
        fits, limiting = 0, ""
        if taint is not None:
            key = f"taint {taint_str(taint)!r}".replace("'", '"')
            excluded[key] = excluded.get(key, 0) + 1
        elif any(labels.get(k) != v for k, v in selector.items()):
            excluded["nodeSelector"] = excluded.get("nodeSelector", 0) + 1
        else:
            fits, limiting = count_in(per_pod, state.free.get(nname, {}))
            if fits == 0 and limiting:
                key = f'resource "{limiting}"'
                excluded[key] = excluded.get(key, 0) + 1
        values = tuple(str(labels[lv]) for lv in levels)
        parent = None
        for i in range(1, len(values) + 1):
            d = by_values.get(values[:i])
            if d is None:
                d = by_values[values[:i]] = _Domain(values[:i])
                (parent.children if parent is not None else roots).append(d)
            d.state += fits
            parent = d

    def not_fit(fit: int) -> str:
        msg = (f'topology "{name}" allows to fit only {fit} out of {count} pod(s)' if fit
               else f'topology "{name}" doesn\'t allow to fit any of {count} pod(s)')
        if excluded:
            msg += f". Total nodes: {total}; excluded: " + ", ".join(f"{k}: {v}" for k, v in sorted(excluded.items()))
        return msg

    # Kueue's findTopologyAssignment without slices, leaders or balanced placement (an alpha gate, off in v0.17): an
    # unconstrained pod set (the annotation, or TAS implied by a queue of TAS flavors only) is placed at the lowest
    # level by LeastFreeCapacity (TASProfileMixed, on by default since v0.15), the others by BestFit.
    unconstrained = not level_label
    least_free = unconstrained
    per_level: dict[int, list[_Domain]] = {}
    for v, d in by_values.items():
        per_level.setdefault(len(v) - 1, []).append(d)

    def find_level(idx: int) -> tuple[int, list[_Domain]] | str:
        """findLevelWithFitDomains: the level and the domains that hold the pod set, or the not-fit message."""
        ordered = _sorted(per_level.get(idx) or [], least_free)
        if not ordered:
            return f"no topology domains at level: {levels[idx]}"
        top = ordered[0]
        if not least_free and top.state >= count:
            top = _best_fit(ordered, count)
        if least_free:
            fitting = next((d for d in ordered if d.state >= count), None)
            if fitting is not None:
                return idx, [fitting]
            if required:
                return not_fit(ordered[-1].state)
        if top.state < count:
            if required:
                return not_fit(top.state)
            if idx > 0 and not unconstrained:
                return find_level(idx - 1)  # preferred: the level above
            results, remaining = [], count
            for j, candidate in enumerate(ordered):
                if remaining <= 0:
                    break
                d = _best_fit(ordered[j:], remaining) if not least_free and candidate.state >= remaining else candidate
                results.append(d)
                remaining -= d.state
            if remaining > 0:
                return not_fit(count - remaining)
            return idx, results
        return idx, [top]

    found = find_level(levels.index(level_label) if level_label else len(levels) - 1)
    if isinstance(found, str):
        return None, found
    level, fit = found
    picked = _update_counts(fit, count, not least_free)
    while level < len(levels) - 1:
        # Above the lowest level Kueue takes the children of every picked domain together, sorted, greedily (the
        # last by best fit), without keeping each parent's share: a spread over blocks may use racks unevenly.
        children = [c for d, _n in picked for c in d.children]
        picked = _update_counts(_sorted(children, least_free), count, not least_free)
        level += 1
    lowest = len(levels) - 1 if levels[-1] == HOSTNAME else 0
    return encode(levels[lowest:], [(list(d.values[lowest:]), n) for d, n in picked if n > 0]), ""

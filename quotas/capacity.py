"""Capacity per flavor: what the nodes that count really offer, in the units quotas use.

Units (shared with ``Quota.nominal`` and ``quotas/manifests.py``):

* GPUs, MIG slices, HAMi vGPU slots: a count.
* ``cpu``: cores (``Decimal("0.5")`` = 500m).
* ``memory``: GiB (a ``Quota`` decimal cannot hold bytes of a large node).
* ``nvidia.com/total-gpucores``: percent of a card summed over cards (one L40S = 100).
* ``nvidia.com/total-gpumem``: MiB summed over cards (HAMi's ``gpumem`` unit).

A node counts while it is ready, present and not in the middle of a MIG layout change
(``Node.counts_capacity``). A flavor matches a node when every one of the flavor's node labels is on
the node and, for architecture F, the node is in the flavor's pool. Kueue itself never reads node
capacity (docs/cluster-objects.md, "Capacity"), so this is the number ops compare promises against.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from collections.abc import Iterable
from typing import Any

from portal.labels import POOL_LABEL
from portal.quantities import in_portal_units, parse_quantity

from . import architectures

from .manifests import ClusterRow, offered_kinds, topology_flavor, topology_label, volcano_owned
from .models import Cluster, Flavor, Node

GPU = "nvidia.com/gpu"
TOTAL_GPUCORES = "nvidia.com/total-gpucores"
TOTAL_GPUMEM = "nvidia.com/total-gpumem"
HAMI_NODE_LABEL = ("gpu", "on")  # HAMi's device plugin runs only on nodes labelled gpu=on (docs/cluster-objects.md, "HAMi")


def node_pool_label(node: Node) -> str:
    if node.pool_id is not None and node.pool is not None and node.pool.pool_label:
        return node.pool.pool_label
    return str((node.labels or {}).get(POOL_LABEL, ""))


def flavor_matches(flavor: Flavor, node: Node) -> bool:
    labels = node.labels or {}
    if any(labels.get(key) != str(value) for key, value in (flavor.node_labels or {}).items()):
        return False
    return not (flavor.pool_label and node_pool_label(node) != flavor.pool_label)


def node_offers(flavor: Flavor, node: Node) -> dict[str, Decimal]:
    """What one node offers of each of the flavor's resources (zero when it has none of them)."""
    alloc = node.allocatable or {}
    labels = node.labels or {}
    out: dict[str, Decimal] = {}
    if flavor.kind == Flavor.Kind.CPU:
        out["cpu"] = parse_quantity(alloc.get("cpu"))
        out["memory"] = in_portal_units("memory", alloc.get("memory"))
    elif flavor.kind == Flavor.Kind.WHOLE:
        # A HAMi node advertises vGPU slots as nvidia.com/gpu: never count those as whole GPUs.
        out[GPU] = Decimal(0) if labels.get(HAMI_NODE_LABEL[0]) == HAMI_NODE_LABEL[1] else parse_quantity(alloc.get(GPU))
    elif flavor.kind == Flavor.Kind.MIG:
        resource = flavor.resource_names[0]
        out[resource] = parse_quantity(alloc.get(resource))
    elif flavor.kind == Flavor.Kind.HAMI:
        cards = parse_quantity(labels.get("nvidia.com/gpu.count"))
        card_mib = parse_quantity(labels.get("nvidia.com/gpu.memory"))
        out[GPU] = parse_quantity(alloc.get(GPU))
        out[TOTAL_GPUCORES] = cards * 100
        out[TOTAL_GPUMEM] = cards * card_mib
    return out


def capacity_by_flavor(cluster: Cluster, *, flavors: Iterable[Flavor] | None = None,
                       nodes: Iterable[Node] | None = None) -> dict[tuple[int, str], Decimal]:
    """(flavor id, resource) -> capacity of the cluster's nodes that count, for every active flavor.

    Two queries whatever the size of the cluster, none when the caller hands in the cluster's flavors and its
    nodes (with their pools) it already read. Every (flavor, resource) of an active flavor has an
    entry, zero when no node matches, so callers can tell "no capacity" from "unknown flavor".
    """
    if flavors is None:
        flavors = Flavor.objects.filter(cluster=cluster, active=True)
    flavors = [f for f in flavors if f.active]
    if nodes is None:
        nodes = Node.objects.filter(cluster=cluster).select_related("pool")
    nodes = [n for n in nodes if n.counts_capacity]
    totals: dict[tuple[int, str], Decimal] = {}
    for flavor in flavors:
        for resource in flavor.resource_names:
            totals[(flavor.pk, resource)] = Decimal(0)
        for node in nodes:
            if not flavor_matches(flavor, node):
                continue
            for resource, amount in node_offers(flavor, node).items():
                totals[(flavor.pk, resource)] += amount
    return {key: value.quantize(Decimal("0.001")) for key, value in totals.items()}


# ----------------------------------------------------------------------------------------- free GPUs per rack
@dataclass(frozen=True)
class RackFree:
    """One placed flavor's free whole GPUs: in total, and the most within one rack (what a job that asks for one
    rack can get). ``racks``: (rack, free, capacity), emptiest first."""

    flavor: Flavor
    free: Decimal
    largest: Decimal
    racks: list[tuple[str, Decimal, Decimal]]
    unlabelled: int  # nodes of the flavor without a rack label: Kueue places no pod there by topology

    @property
    def fragmented(self) -> bool:
        return self.largest < self.free

    @property
    def sentence(self) -> str:
        free, largest = fmt_gpus(self.free), fmt_gpus(self.largest)
        if not self.racks:
            return "no node of this flavor carries a rack label"
        if not self.fragmented:
            return f"{free} free, all in one rack"
        return (f"{free} free, at most {largest} in one rack: a job of {fmt_gpus(self.largest + 1)} GPUs or more "
                f"that asks for one rack fits nowhere now")


def fmt_gpus(value: Decimal) -> str:
    return str(value.quantize(Decimal(1)) if value == value.to_integral_value() else value.normalize())


def rack_fragmentation(cluster: Cluster, flavors: Iterable[Flavor], nodes: Iterable[Node],
                       in_use: dict[str, Decimal] | None) -> list[RackFree]:
    """For each flavor placed by topology (``manifests.topology_flavor``): the free whole GPUs of its nodes (the
    inventory's allocatable, less ``in_use``: GPUs held per node name) in total and per rack (the nodes' label of
    the cluster's rack level: ``cloud.provider.com/topology-rack`` with the preset, the one ops named otherwise). Nodes that do not count (not ready, gone) or are cordoned offer
    nothing. No query: the caller hands in what it read."""
    in_use = in_use or {}
    nodes = [n for n in nodes if n.counts_capacity and not n.unschedulable]
    rack_label = topology_label(cluster, "rack")
    out = []
    for flavor in flavors:
        if not (flavor.active and topology_flavor(cluster, flavor)):
            continue
        racks: dict[str, list[Decimal]] = {}
        unlabelled = 0
        for node in nodes:
            if not flavor_matches(flavor, node):
                continue
            rack = str((node.labels or {}).get(rack_label) or "") if rack_label else ""
            if not rack:
                unlabelled += 1
                continue
            gpus = node_offers(flavor, node).get(GPU, Decimal(0))
            free = max(Decimal(0), gpus - in_use.get(node.name, Decimal(0)))
            totals = racks.setdefault(rack, [Decimal(0), Decimal(0)])
            totals[0] += free
            totals[1] += gpus
        rows = sorted(((r, f, c) for r, (f, c) in racks.items()), key=lambda row: (-row[1], row[0]))
        out.append(RackFree(flavor, sum((f for _r, f, _c in rows), Decimal(0)), rows[0][1] if rows else Decimal(0),
                            rows, unlabelled))
    return out


# ----------------------------------------------------------------------------------------- offered vs enforced
KIND_WORDS = {"whole": "whole-GPU", "mig": "MIG", "hami": "HAMi shared vGPU", "cpu": "CPU"}


def _remedy(kind: str) -> str:
    """E.g. "ops apply architecture C, or E or F with MIG flavors switched on" (from the architecture registry)."""
    if kind not in (architectures.MIG, architectures.HAMI):
        return "ops apply an architecture that enforces it"
    always = architectures.where(lambda a: getattr(a, kind) == architectures.ALWAYS)
    switch = architectures.where(lambda a: getattr(a, kind) == architectures.SWITCH)
    parts = [f"architecture {' or '.join(always)}"] if always else []
    if switch:
        parts.append(f"{' or '.join(switch)} with {KIND_WORDS[kind].split()[0]} flavors switched on")
    return "ops apply " + ", or ".join(parts) if parts else "ops apply an architecture that enforces it"


@dataclass(frozen=True)
class Enforcement:
    """Whether the cluster's applied architecture enforces a flavor, and the sentence that says so.

    ``by``: ``kueue`` (a ResourceFlavor and ClusterQueue quota), ``volcano`` (architecture E's offline
    whole GPUs: a Volcano Queue's capability) or ``""`` (nothing: a request for it would wait forever).
    ``remedy``: what would make it usable (empty when it is enforced).
    """

    enforced: bool
    by: str
    reason: str
    remedy: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"enforced": self.enforced, "by": self.by, "reason": self.reason, "remedy": self.remedy}


def flavor_enforcement(cluster: Any, flavor: Any) -> Enforcement:
    """Does ``cluster``'s architecture (as applied by the reconciler) enforce ``flavor``? Pure: no queries.

    ``cluster`` needs ``name``, ``architecture``, ``use_mig`` and ``use_hami`` (a ``Cluster`` or a
    ``ClusterRow``); ``flavor`` needs ``name``, ``kind``, ``pool_label`` and, optionally, ``active``.
    The rule is the renderer's (``manifests.offered_kinds`` and ``manifests.volcano_owned``), so what
    the portal offers and what ``desired_state`` materializes cannot disagree:

    * A and B: whole GPUs (and CPU) only. C adds MIG, D adds HAMi.
    * E and F: whole GPUs, plus MIG when ``use_mig`` and HAMi when ``use_hami``; under E the offline
      pool's whole GPUs are Volcano's (training only; the submit check refuses notebooks and inference).
    * A deactivated flavor is enforced by nothing.

    The models keep one architecture per cluster, not a "selected" and an "applied" one: the cluster
    page records a change as ``reconcile.plan_apply`` applies the reviewed plan, and an API ``PATCH``
    records it and queues the reconcile that applies it (within a minute: the periodic task retries).
    """
    kind = str(flavor.kind)
    arch = str(cluster.architecture)
    entry = architectures.get(arch)
    row = cluster if isinstance(cluster, ClusterRow) else ClusterRow(
        str(cluster.name), arch, bool(cluster.use_mig), bool(cluster.use_hami))
    words = KIND_WORDS.get(kind, kind)
    if getattr(flavor, "active", True) is False:
        return Enforcement(False, "", f"Flavor {flavor.name} is deactivated: nothing on cluster {row.name} enforces it.",
                           "ops activate the flavor again")
    if kind in offered_kinds(row):
        if volcano_owned(row, flavor):
            return Enforcement(True, "volcano", f"Enforced by each project's Volcano Queue on cluster {row.name} "
                                                f"(architecture {arch}, {entry.volcano_pool} pool): "
                                                "gang-scheduled jobs only.")
        return Enforcement(True, "kueue", f"Enforced by Kueue on cluster {row.name} (architecture {arch}).")
    if entry.may_use(kind):  # the architecture has the kind, the cluster's switch is off
        switch = "MIG" if kind == "mig" else "HAMi"
        why = f"cluster {row.name} runs architecture {arch} with {switch} flavors switched off"
    elif entry.offered_kinds() == {architectures.WHOLE, architectures.CPU} and not entry.switchable:
        why = f"cluster {row.name} runs architecture {arch}, which enforces whole GPUs only"
    else:
        why = f"cluster {row.name} runs architecture {arch}, which does not enforce {words} flavors"
    remedy = _remedy(kind)
    reason = (f"{words} flavor {flavor.name} is offered but not enforced: {why}, so Kueue has no ResourceFlavor or "
              f"quota for it and a request would wait forever. It becomes usable when {remedy}.")
    return Enforcement(False, "", reason, remedy)


def is_enforced(flavor: Flavor) -> bool:
    """``flavor_enforcement`` for a ``Flavor`` row (reads ``flavor.cluster``: select_related it in lists)."""
    return flavor_enforcement(flavor.cluster, flavor).enforced

"""Inventory: read the cluster's nodes into ``Node`` and ``NodePool`` rows, and propose flavors from them.

Nodes are grouped into pools by what they offer: GPU model, sharing mode (whole, MIG layout, HAMi)
and the pool label (``gpuportal.dev/pool``, online/offline in architecture F). A node that vanished
from the cluster stays in the database with ``present=False``; a NotReady node with ``ready=False``;
neither counts capacity (``Node.counts_capacity``), and neither does a MIG node whose
``nvidia.com/mig.config.state`` is not ``success``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.labels import GPU_PRODUCT_LABEL as PRODUCT_LABEL
from portal.labels import GPU_SHARING_LABEL, MIG_CONFIG_LABEL, MIG_STATE_LABEL, MIG_STRATEGY_LABEL, MODEL_LABEL, POOL_LABEL
from portal.quantities import parse_quantity

from .mig import MIG_PROFILES, canonical_profile, mig_profiles_for
from .models import Cluster, Flavor, Node, NodePool
from .zones import flavor_facts, flavor_facts_refresh

MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb(?:\.me)?)$")


def model_key(labels: dict[str, str]) -> str:
    """A short GPU model key (``h100-80gb``, ``a100-80gb``, ``l40s``) from a node's labels.

    Prefers an ops-set ``gpuportal.dev/gpu-model`` label (survives SKU-name drift, docs/cluster-objects.md "GPU labels"); else derives it
    from GFD's product name and memory, e.g. ``NVIDIA-A100-SXM4-80GB`` -> ``a100-80gb``.
    """
    if labels.get(MODEL_LABEL):
        return labels[MODEL_LABEL].lower()
    product = labels.get(PRODUCT_LABEL, "").lower()
    if not product:
        return ""
    product = re.sub(r"-mig-.*$", "", product).removeprefix("nvidia-")
    parts = product.split("-")
    name = parts[0]
    memory = next((p for p in parts[1:] if re.fullmatch(r"\d+gb", p)), "")
    if memory:
        return f"{name}-{memory}"
    # No size in the product name (NVIDIA-H200, NVIDIA-B200): use the MIG table's key for the model,
    # the one whose size is nearest to GFD's memory label when there are several.
    known = [k for k in MIG_PROFILES if k == name or k.startswith(name + "-")]
    if len(known) > 1:
        gib = int(parse_quantity(labels.get("nvidia.com/gpu.memory", "0"))) / 1024
        known.sort(key=lambda k: abs(int(re.sub(r"\D", "", k.rsplit("-", 1)[-1]) or 0) - gib))
    return known[0] if known else name


def node_sharing(labels: dict[str, str], allocatable: dict[str, Any]) -> str:
    if labels.get("gpu") == "on" or labels.get(GPU_SHARING_LABEL) == "hami":
        return NodePool.Sharing.HAMI
    if labels.get(MIG_STRATEGY_LABEL) in ("mixed", "single") and labels.get(MIG_CONFIG_LABEL, "all-disabled") != "all-disabled":
        return NodePool.Sharing.MIG
    if labels.get(PRODUCT_LABEL) or parse_quantity(allocatable.get("nvidia.com/gpu")) > 0:
        return NodePool.Sharing.WHOLE
    return NodePool.Sharing.NONE


def node_ready(obj: dict[str, Any]) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def node_conditions(obj: dict[str, Any]) -> list[dict[str, str]]:
    """The node's ``status.conditions`` as the health view shows them (type, status, reason, message)."""
    return [{k: str(c.get(k) or "")[:500] for k in ("type", "status", "reason", "message")}
            for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type")]


@dataclass(frozen=True)
class PoolKey:
    model: str
    sharing: str
    mig_config: str
    pool_label: str

    @property
    def name(self) -> str:
        if self.sharing == NodePool.Sharing.NONE:
            parts = ["cpu"]
        elif self.sharing == NodePool.Sharing.MIG:
            parts = [self.model, "mig", self.mig_config]
        elif self.sharing == NodePool.Sharing.HAMI:
            parts = [self.model, "hami"]
        else:
            parts = [self.model]
        if self.pool_label:
            parts.append(self.pool_label)
        return "-".join(p for p in parts if p)[:100]


def pool_key(labels: dict[str, str], allocatable: dict[str, Any]) -> PoolKey:
    sharing = node_sharing(labels, allocatable)
    return PoolKey(
        model=model_key(labels) if sharing != NodePool.Sharing.NONE else "",
        sharing=sharing,
        mig_config=labels.get(MIG_CONFIG_LABEL, "") if sharing == NodePool.Sharing.MIG else "",
        pool_label=labels.get(POOL_LABEL, ""),
    )


def inventory_sync(cluster: Cluster, *, kube: Any = None) -> dict[str, int]:
    """Read every Node of ``cluster`` into the database. Returns counts (seen, new, gone, not_ready).

    One list call (paginated) to the cluster; a bounded number of queries whatever the node count.
    Raises ``ClusterUnavailable`` (after recording it on the cluster) when the cluster cannot answer.
    """
    from portal.kube import ClusterError, kube_for

    kube = kube or kube_for(cluster)
    try:
        items, _ = kube.list("v1", "Node")
    except ClusterError as exc:
        Cluster.objects.filter(pk=cluster.pk).update(inventory_error=str(exc)[:2000])
        raise
    now = timezone.now()
    with transaction.atomic():
        pools = {p.name: p for p in NodePool.objects.select_for_update().filter(cluster=cluster)}
        existing = {n.name: n for n in Node.objects.filter(cluster=cluster)}
        seen: set[str] = set()
        new_nodes: list[Node] = []
        changed: list[Node] = []
        not_ready = 0
        for obj in items:
            meta = obj.get("metadata") or {}
            name = meta.get("name", "")
            labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
            allocatable = dict((obj.get("status") or {}).get("allocatable") or {})
            key = pool_key(labels, allocatable)
            pool = pools.get(key.name)
            if pool is None:
                pool = pools[key.name] = NodePool.objects.create(
                    cluster=cluster, name=key.name, gpu_product=re.sub(r"-MIG-.*$", "", labels.get(PRODUCT_LABEL, "")),
                    gpu_memory_mib=int(parse_quantity(labels.get("nvidia.com/gpu.memory", "0"))),
                    sharing=key.sharing, mig_config=key.mig_config, pool_label=key.pool_label,
                )
            ready = node_ready(obj)
            not_ready += 0 if ready else 1
            values = {"pool_id": pool.pk, "ready": ready, "present": True, "labels": labels, "allocatable": allocatable,
                      "conditions": node_conditions(obj), "unschedulable": bool((obj.get("spec") or {}).get("unschedulable")),
                      "mig_config_state": labels.get(MIG_STATE_LABEL, "") if key.sharing == NodePool.Sharing.MIG or
                      MIG_CONFIG_LABEL in labels else "", "last_seen_at": now}
            seen.add(name)
            node = existing.get(name)
            if node is None:
                new_nodes.append(Node(cluster=cluster, name=name, **values))
                continue
            for attr, value in values.items():
                setattr(node, attr, value)
            changed.append(node)
        Node.objects.bulk_create(new_nodes)
        if changed:
            Node.objects.bulk_update(changed, ["pool_id", "ready", "present", "labels", "allocatable", "mig_config_state",
                                               "last_seen_at", "conditions", "unschedulable"])
            # uncordoned outside the portal (kubectl, a finished MIG change): the reason given no longer holds
            Node.objects.filter(pk__in=[n.pk for n in changed if not n.unschedulable]).exclude(cordon_reason="").update(
                cordon_reason="")
        gone = [n.pk for name, n in existing.items() if name not in seen and n.present]
        if gone:
            Node.objects.filter(pk__in=gone).update(present=False)
        kueue = {}
        try:
            used = kube.kueue_api(refresh=True) or ""
            kueue = {"kueue_api": used, "kueue_served": ", ".join(kube.kueue_served)}
        except ClusterError:
            pass  # the nodes were read; the next sync asks again
        Cluster.objects.filter(pk=cluster.pk).update(inventory_synced_at=now, inventory_error="", **kueue)
        flavor_facts_refresh(cluster)  # what each flavor's card is (memory, compute capability): docs/federation.md
    return {"seen": len(items), "new": len(new_nodes), "gone": len(gone), "not_ready": not_ready}


def _common_taints(nodes: list[Node], taints_by_node: dict[str, list[dict]]) -> list[dict]:
    if not nodes:
        return []
    first = taints_by_node.get(nodes[0].name, [])
    return [t for t in first if all(t in taints_by_node.get(n.name, []) for n in nodes[1:])]


def hami_share_default(card_mib: int) -> tuple[int, int]:
    """A HAMi flavor's share as discovery proposes it (ops rename or resize it on the flavor's page): a quarter of a
    card, its memory in whole GiB (in MiB, HAMi's ``gpumem`` unit) and 25 % of its cores. Never 0: a pod asking
    ``gpumem: 0`` would get no memory limit at all."""
    return max(1, int(card_mib or 0) // 4 // 1024) * 1024, 25


def flavors_discover(cluster: Cluster, *, taints_by_node: dict[str, list[dict]] | None = None) -> list[Flavor]:
    """Default flavors (unsaved) for the cluster's pools, e.g. ``h100-80gb``, ``a100-80gb-mig-1g.10gb``,
    ``l40s-hami``, ``cpu``. Existing flavor names are skipped.

    Whole GPUs select nodes by ``nvidia.com/gpu.product`` (read off the nodes, never guessed, docs/cluster-objects.md "GPU labels");
    when one model sits in several pools (architecture F) each pool gets its own flavor, named and
    selected with the pool label. MIG flavors are one per profile the pool's layout offers and the
    model's profile table allows; HAMi flavors select ``gpu=on`` (HAMi's node label) and the product.
    Taints every node of the pool carries become the flavor's ``nodeTaints``, with matching
    tolerations so Kueue adds them to admitted pods. ``taints_by_node`` defaults to what the nodes' last
    sync recorded (Node rows keep no taints, so inventory callers pass them from the node objects).
    """
    taints_by_node = taints_by_node or {}
    existing = set(Flavor.objects.filter(cluster=cluster).values_list("name", flat=True))
    pools = list(NodePool.objects.filter(cluster=cluster).prefetch_related("nodes"))
    live = {pool.pk: [n for n in pool.nodes.all() if n.present] for pool in pools}
    models_pools: dict[tuple[str, str], set[str]] = {}
    for pool in pools:
        if live[pool.pk]:
            model = model_key(live[pool.pk][0].labels or {})
            models_pools.setdefault((pool.sharing, model), set()).add(pool.pool_label)
    proposals: list[Flavor] = []
    names: set[str] = set(existing)

    def propose(**kwargs: Any) -> None:
        if kwargs["name"] in names:
            return
        names.add(kwargs["name"])
        flavor = Flavor(cluster=cluster, **kwargs)
        if flavor.kind != Flavor.Kind.CPU:  # the card of the pool being proposed (``labels`` of the loop below)
            flavor.gpu_memory_mib, flavor.compute_capability = flavor_facts(flavor, labels)
        proposals.append(flavor)

    for pool in sorted(pools, key=lambda p: p.name):
        nodes = live[pool.pk]
        if not nodes:
            continue
        labels = nodes[0].labels or {}
        model = model_key(labels)
        split = len(models_pools.get((pool.sharing, model), set())) > 1
        suffix = f"-{pool.pool_label}" if split and pool.pool_label else ""
        taints = [{k: t[k] for k in ("key", "value", "effect") if k in t} for t in _common_taints(nodes, taints_by_node)
                  if t.get("effect") in ("NoSchedule", "NoExecute")]
        tolerations = [{"key": t["key"], "operator": "Exists", "effect": t["effect"]} for t in taints]
        node_labels: dict[str, str] = {}
        if pool.gpu_product:
            node_labels[PRODUCT_LABEL] = pool.gpu_product
        if suffix:
            node_labels[POOL_LABEL] = pool.pool_label
        common = {"gpu_product": pool.gpu_product, "gpu_model": model, "pool_label": pool.pool_label if suffix else "",
                  "taints": taints, "tolerations": tolerations}
        if pool.sharing == NodePool.Sharing.WHOLE:
            propose(name=f"{model}{suffix}", display_name=f"{model.upper()} whole GPU{' (' + pool.pool_label + ')' if suffix else ''}",
                    kind=Flavor.Kind.WHOLE, node_labels=node_labels, order=10, **common)
        elif pool.sharing == NodePool.Sharing.MIG:
            allowed = mig_profiles_for(model)
            profiles = sorted({canonical_profile(m.group(1)) for n in nodes for r in (n.allocatable or {})
                               if (m := MIG_RESOURCE.match(r))})
            for i, profile in enumerate(p for p in profiles if p in allowed):
                propose(name=f"{model}-mig-{profile}{suffix}", display_name=f"{model.upper()} MIG {profile}",
                        kind=Flavor.Kind.MIG, mig_profile=profile, order=20 + i,
                        node_labels={**node_labels, MIG_STRATEGY_LABEL: "mixed"}, **common)
        elif pool.sharing == NodePool.Sharing.HAMI:
            memory_mib, cores = hami_share_default(pool.gpu_memory_mib)
            propose(name=f"{model}-hami{suffix}", display_name=f"{model.upper()} shared (HAMi)", kind=Flavor.Kind.HAMI,
                    node_labels={**node_labels, "gpu": "on"}, order=30, hami_memory_mib=memory_mib,
                    hami_cores_percent=cores, **common)
    propose(name="cpu", display_name="CPU and memory", kind=Flavor.Kind.CPU, order=90)
    return proposals


def node_taints(kube: Any) -> dict[str, list[dict]]:
    """Taints per node name, read live (Node rows keep labels and allocatable only)."""
    items, _ = kube.list("v1", "Node")
    return {(o.get("metadata") or {}).get("name", ""): list((o.get("spec") or {}).get("taints") or []) for o in items}

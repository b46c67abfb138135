"""The ops health view (docs/measured-use.md, "Health"): one inventory of every GPU node across clusters, with what
GPU Feature Discovery says about it, its node conditions, and the XID errors its GPUs raised; and cordoning a node
from the page, with a reason (audited).

* **Inventory** (:func:`inventory`): the ``quotas.Node`` rows that inventory sync keeps (labels, allocatable,
  conditions, ``spec.unschedulable``). GPU facts come from GFD's labels (:func:`gpu_facts`, pure).
* **XID errors** (:func:`xid_errors`): read from Prometheus when the page is read, one grouped instant query for the
  whole fleet, remembered for :data:`XID_CACHE_SECONDS`. Not sampled by beat: an XID belongs to a GPU, not to a
  request (a faulty GPU with nothing on it must be flagged too, and the per-request samples of
  ``insights.measured_take`` cannot see it); dcgm-exporter keeps reporting a GPU's last XID, so a read at any
  moment sees it; and ops read this page rarely, so one fleet-wide query a minute at most costs less than a sample
  stored every 5 minutes. Prometheus down: the inventory still shows, with the reason.
* **Requests on a node** (:func:`requests_on`): the GPU pods on it, read live from the cluster, mapped to requests
  by their request label.
* **Cordon** (:func:`node_cordon_set`): ops only, a reason required to cordon; the node is patched through
  ``portal/kube.py`` and one audit entry ``node.cordon`` / ``node.uncordon`` is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from portal import prometheus_api
from portal.exceptions import Invalid
from portal.kube import ClusterError, kube_for, node_cordon
from quotas.models import Node
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.guards import require_ops
from workloads.models import WorkloadRequest

from .cluster import gpu_pods_on

XID_QUERY = "max by (Hostname, gpu, UUID, modelName) (max_over_time(DCGM_FI_DEV_XID_ERRORS[15m]))"
XID_CACHE_KEY = "health:xid:v1"
XID_CACHE_SECONDS = 60
REASON_MAX = 500
_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb(?:\.me)?)$")

# XIDs people meet most, in NVIDIA's words (the XID catalogue); others show their number only.
XID_WORDS = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double-bit ECC error", 63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapper failure", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
}


def gpu_facts(labels: dict[str, str], allocatable: dict[str, Any]) -> dict[str, Any]:
    """What GPU Feature Discovery's labels say about a node's GPUs (pure): model, count, memory, MIG layout,
    driver and CUDA versions. Both label generations are read (``cuda.driver-version.full``, and the older
    ``cuda.driver.major``/``minor``/``rev``)."""
    def joined(*keys: str) -> str:
        parts = [labels.get(k, "") for k in keys]
        return ".".join(p for p in parts if p) if parts and parts[0] else ""

    driver = labels.get("nvidia.com/cuda.driver-version.full") or joined(
        "nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")
    cuda = labels.get("nvidia.com/cuda.runtime-version.full") or joined(
        "nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")
    slices = {}
    for key, value in (allocatable or {}).items():
        m = _MIG_RESOURCE.match(key)
        if m and str(value) not in ("0", ""):
            slices[m.group(1)] = int(str(value)) if str(value).isdigit() else value
    memory = labels.get("nvidia.com/gpu.memory", "")
    return {
        "product": re.sub(r"-MIG-.*$", "", labels.get("nvidia.com/gpu.product", "")),
        "count": int(labels["nvidia.com/gpu.count"]) if labels.get("nvidia.com/gpu.count", "").isdigit() else None,
        "memory_gib": round(int(memory) / 1024) if memory.isdigit() else None,
        "mig_config": labels.get("nvidia.com/mig.config", "") if labels.get("nvidia.com/mig.config") != "all-disabled" else "",
        "mig_state": labels.get("nvidia.com/mig.config.state", ""),
        "mig_slices": dict(sorted(slices.items())),
        "driver": driver, "cuda": cuda,
    }


@dataclass
class Xid:
    gpu: str
    uuid: str
    model: str
    code: int

    @property
    def words(self) -> str:
        return XID_WORDS.get(self.code, "")


@dataclass
class XidRead:
    # per node name; "<cluster label value>/<node name>" where one Prometheus answers for several clusters
    by_node: dict[str, list[Xid]] = field(default_factory=dict)
    error: str = ""  # why Prometheus could not be read ("" when it answered)
    configured: bool = True
    label: str = ""  # settings.PROMETHEUS_CLUSTER_LABEL when read

    def of(self, node: Node) -> list[Xid]:
        """The XIDs of ``node``'s GPUs: by its name, and its cluster's label value where one Prometheus answers for
        several clusters (a node name may exist in each)."""
        return self.by_node.get(node_key(self.label, node.cluster.prometheus_cluster_value, node.name), [])


def node_key(label: str, cluster_value: str, node: str) -> str:
    return f"{cluster_value}/{node}" if label else node


def xid_query(label: str = "") -> str:
    """:data:`XID_QUERY`, grouped by the cluster label too when one Prometheus answers for several clusters."""
    return XID_QUERY.replace("by (Hostname,", f"by ({label}, Hostname,") if label else XID_QUERY


def xid_errors(*, fresh: bool = False) -> XidRead:
    """The GPUs that raised an XID in the last 15 minutes (or still report their last one), per node name.
    Remembered for a minute (``fresh``: ask again). Never raises: a Prometheus that is down is a sentence."""
    if not prometheus_api.configured():
        return XidRead(configured=False)
    label = str(getattr(settings, "PROMETHEUS_CLUSTER_LABEL", "") or "")
    cache_key = f"{XID_CACHE_KEY}:{label}"
    if not fresh:
        hit = cache.get(cache_key)
        if hit is not None:
            return XidRead(by_node={n: [Xid(**x) for x in xs] for n, xs in hit.items()}, label=label)
    try:
        rows = prometheus_api.query(xid_query(label))
    except prometheus_api.PrometheusUnavailable as e:
        return XidRead(error=str(e))
    by_node: dict[str, list[Xid]] = {}
    for labels, value in rows:
        if value <= 0:
            continue
        node = node_key(label, labels.get(label, ""),
                        labels.get("Hostname") or labels.get("instance", "").rsplit(":", 1)[0])
        by_node.setdefault(node, []).append(Xid(gpu=labels.get("gpu", ""), uuid=labels.get("UUID", ""),
                                                model=labels.get("modelName", ""), code=int(value)))
    for xs in by_node.values():
        xs.sort(key=lambda x: (len(x.gpu), x.gpu))
    cache.set(cache_key, {n: [x.__dict__ for x in xs] for n, xs in by_node.items()}, XID_CACHE_SECONDS)
    return XidRead(by_node=by_node, label=label)


@dataclass
class NodeHealth:
    node: Node
    facts: dict[str, Any]
    xids: list[Xid]
    problems: list[str]  # conditions that are not as they should be, in words

    @property
    def flagged(self) -> bool:
        return bool(self.xids or self.problems)


# A node condition is healthy when Ready is True and every pressure/unavailable condition is False.
def condition_problems(node: Node) -> list[str]:
    out = []
    if not node.present:
        out.append("gone from the cluster")
    for c in node.conditions or []:
        healthy = "True" if c.get("type") == "Ready" else "False"
        if c.get("status") != healthy:
            out.append(f"{c.get('type')}={c.get('status')}" + (f" ({c['reason']})" if c.get("reason") else ""))
    if not node.conditions and not node.ready:
        out.append("Ready=False")
    return out


def inventory(*, actor: Actor, xid: XidRead | None = None) -> tuple[list[NodeHealth], XidRead]:
    """Every GPU node of every cluster (ops only: the caller's page is), flagged ones first."""
    require_ops(actor, "The health view is for platform ops.")
    xid = xid if xid is not None else xid_errors()
    rows = []
    for node in Node.objects.select_related("cluster", "pool").order_by("cluster__name", "name"):
        facts = gpu_facts(node.labels or {}, node.allocatable or {})
        xids = xid.of(node)
        if not (facts["product"] or xids):
            continue  # not a GPU node
        rows.append(NodeHealth(node=node, facts=facts, xids=xids, problems=condition_problems(node)))
    rows.sort(key=lambda r: (not r.xids, not r.flagged, r.node.cluster.name, r.node.name))
    return rows, xid


def node_health(*, actor: Actor, cluster: str, name: str) -> NodeHealth | None:
    require_ops(actor, "The health view is for platform ops.")
    node = Node.objects.select_related("cluster", "pool").filter(cluster__name=cluster, name=name).first()
    if node is None:
        return None
    xid = xid_errors()
    return NodeHealth(node=node, facts=gpu_facts(node.labels or {}, node.allocatable or {}),
                      xids=xid.of(node), problems=condition_problems(node))


@dataclass
class OnNode:
    pods: list[dict[str, Any]]
    requests: list[WorkloadRequest]
    error: str = ""


def requests_on(node: Node) -> OnNode:
    """The requests whose GPU pods run on ``node`` now (read live from its cluster), with their owners."""
    try:
        pods = gpu_pods_on(kube_for(node.cluster), [node.name])
    except ClusterError as e:
        return OnNode(pods=[], requests=[], error=f"The cluster did not answer: {e}")
    ids = {p["request"] for p in pods if p["request"]}
    requests = list(WorkloadRequest.objects.filter(pk__in=ids, cluster_id=node.cluster_id)
                    .select_related("requested_by", "project", "tenant", "flavor").order_by("pk"))
    return OnNode(pods=pods, requests=requests)


def node_cordon_set(*, actor: Actor, node: Node, cordoned: bool, reason: str = "") -> Node:
    """Cordon (with a reason) or uncordon ``node`` in its cluster, and audit it. Ops only."""
    require_ops(actor, "Only platform ops may cordon a node.")
    reason = (reason or "").strip()
    if cordoned and not reason:
        raise Invalid("Say why the node is cordoned: the audit log and other ops read it.", field="reason")
    if len(reason) > REASON_MAX:
        raise Invalid(f"At most {REASON_MAX} characters ({len(reason)} given).", field="reason")
    node_cordon(kube_for(node.cluster), node.name, cordoned=cordoned)  # ClusterError: nothing written here
    before = {"unschedulable": node.unschedulable, "cordon_reason": node.cordon_reason}
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(unschedulable=cordoned, cordon_reason=reason if cordoned else "")
        node.unschedulable, node.cordon_reason = cordoned, (reason if cordoned else "")
        audit_record(actor=actor, action="node.cordon" if cordoned else "node.uncordon", target=node, before=before,
                     after={"unschedulable": cordoned, "cordon_reason": node.cordon_reason, "cluster": node.cluster.name,
                            **({"reason": reason} if reason else {})})
    return node

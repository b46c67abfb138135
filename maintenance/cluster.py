"""The cluster calls of a MIG change, all through ``portal/kube.py``: read the pool's nodes and the GPU pods on
them, cordon, uncordon and set the layout label (a merge patch of the Node: the portal does not own nodes)."""

from __future__ import annotations

from typing import Any

from portal.kube import Kube, node_cordon, node_label
from portal.labels import MIG_CONFIG_LABEL, MIG_STATE_LABEL, REQUEST_LABEL
from portal.quantities import parse_quantity

from .layouts import GPU, MIG_PREFIX

DONE_PHASES = ("Succeeded", "Failed")


def _gpu_resource(name: str) -> bool:
    return name == GPU or name.startswith(MIG_PREFIX)


def nodes_read(kube: Kube, names: list[str]) -> dict[str, dict[str, Any]]:
    """The named nodes as the cluster has them now (missing ones are left out)."""
    wanted = set(names)
    items, _ = kube.list("v1", "Node")
    return {n["metadata"]["name"]: n for n in items if n["metadata"]["name"] in wanted}


def node_layout(obj: dict[str, Any]) -> tuple[str, str]:
    """(the ``nvidia.com/mig.config`` label, the ``nvidia.com/mig.config.state`` label) of a node."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(MIG_CONFIG_LABEL, ""), labels.get(MIG_STATE_LABEL, "")


def node_gpu_resources(obj: dict[str, Any]) -> dict[str, int]:
    """The GPU resources a node advertises as allocatable (zeros left out)."""
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    out = {k: int(parse_quantity(v)) for k, v in alloc.items() if _gpu_resource(k)}
    return {k: v for k, v in out.items() if v}


def gpu_pods_on(kube: Kube, names: list[str]) -> list[dict[str, Any]]:
    """Pods that hold GPUs on the named nodes and have not ended: what blocks a MIG change (mig-parted cannot
    repartition busy GPUs). Each: namespace, name, node, request id (ours) or None (someone else's)."""
    wanted = set(names)
    items, _ = kube.list("v1", "Pod")
    out = []
    for pod in items:
        spec, status, meta = pod.get("spec") or {}, pod.get("status") or {}, pod.get("metadata") or {}
        if spec.get("nodeName") not in wanted or status.get("phase") in DONE_PHASES:
            continue
        containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
        if not any(_gpu_resource(k) for c in containers for part in ("requests", "limits")
                   for k in ((c.get("resources") or {}).get(part) or {})):
            continue
        request = (meta.get("labels") or {}).get(REQUEST_LABEL)
        out.append({"namespace": meta.get("namespace", ""), "name": meta.get("name", ""), "node": spec.get("nodeName"),
                    "request": int(request) if request and request.isdigit() else None})
    return out


def cordon(kube: Kube, names: list[str], *, cordoned: bool = True) -> None:
    for name in names:
        node_cordon(kube, name, cordoned=cordoned)


def set_layout(kube: Kube, names: list[str], layout: str) -> None:
    for name in names:
        node_label(kube, name, {MIG_CONFIG_LABEL: layout})

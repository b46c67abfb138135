"""Kueue's two API versions: the portal renders and reads ``kueue.x-k8s.io/v1beta2``; clusters whose Kueue is older
than v0.15 serve only ``v1beta1``. Pure functions, used by :mod:`portal.kube` when the cluster's discovery says
v1beta2 is not served: objects go down to v1beta1 on the way out and come back up on the way in, so every caller
keeps reading and writing v1beta2.

The renames follow Kueue's own conversion functions (``apis/kueue/v1beta1/*_conversion.go`` of Kueue v0.17), for the
fields the portal writes or reads:

========================  ==========================================  ==========================================
kind                      v1beta2                                     v1beta1
========================  ==========================================  ==========================================
ClusterQueue              ``spec.cohortName``                         ``spec.cohort``
ClusterQueue              ``flavorFungibility.whenCanBorrow``         ``Borrow`` (old name of ``MayStopSearch``)
                          / ``whenCanPreempt: MayStopSearch``         / ``Preempt``
LocalQueue                ``status.flavorsUsage``                     ``status.flavorUsage``
Workload                  ``spec.priorityClassRef`` {group, kind,     ``spec.priorityClassName`` +
                          name}                                       ``spec.priorityClassSource``
Workload                  ``status.accumulatedPastExecutionTime…``    ``…Exexcution…`` (sic)
MultiKueueCluster         ``spec.clusterSource.kubeConfig``           ``spec.kubeConfig``
========================  ==========================================  ==========================================

Everything else (ResourceFlavor, Cohort, WorkloadPriorityClass, ``status.admission``, conditions) is the same in both.
"""

from __future__ import annotations

import copy
from typing import Any

GROUP = "kueue.x-k8s.io"
V1BETA2 = f"{GROUP}/v1beta2"
V1BETA1 = f"{GROUP}/v1beta1"
# Versions the portal can speak, best first.
SUPPORTED = ("v1beta2", "v1beta1")

_WPC = ("kueue.x-k8s.io", "WorkloadPriorityClass", "kueue.x-k8s.io/workloadpriorityclass")
_PC = ("scheduling.k8s.io", "PriorityClass", "scheduling.k8s.io/priorityclass")
_PAST_V2 = "accumulatedPastExecutionTimeSeconds"
_PAST_V1 = "accumulatedPastExexcutionTimeSeconds"


def choose(served: list[str]) -> str | None:
    """The Kueue version the portal uses on a cluster that serves ``served`` (e.g. ["v1beta2", "v1beta1"])."""
    return next((v for v in SUPPORTED if v in served), None)


def _rename(d: dict | None, old: str, new: str) -> None:
    if isinstance(d, dict) and old in d:
        d[new] = d.pop(old)


def down(obj: dict[str, Any]) -> dict[str, Any]:
    """A v1beta2 object (or a partial one: a patch body) as v1beta1."""
    out = copy.deepcopy(obj)
    if out.get("apiVersion") == V1BETA2:
        out["apiVersion"] = V1BETA1
    kind = out.get("kind")
    spec = out.get("spec") if isinstance(out.get("spec"), dict) else None
    status = out.get("status") if isinstance(out.get("status"), dict) else None
    if kind == "ClusterQueue" and spec is not None:
        _rename(spec, "cohortName", "cohort")
        fungibility = spec.get("flavorFungibility")
        if isinstance(fungibility, dict):
            if fungibility.get("whenCanBorrow") == "MayStopSearch":
                fungibility["whenCanBorrow"] = "Borrow"
            if fungibility.get("whenCanPreempt") == "MayStopSearch":
                fungibility["whenCanPreempt"] = "Preempt"
    elif kind == "LocalQueue" and status is not None:
        _rename(status, "flavorsUsage", "flavorUsage")
    elif kind == "Workload":
        ref = spec.pop("priorityClassRef", None) if spec is not None else None
        if isinstance(ref, dict):
            for group, ref_kind, source in (_WPC, _PC):
                if ref.get("group") == group and ref.get("kind") == ref_kind:
                    spec["priorityClassName"] = ref.get("name", "")
                    spec["priorityClassSource"] = source
        _rename(status, _PAST_V2, _PAST_V1)
    elif kind == "MultiKueueCluster" and spec is not None:
        source = spec.pop("clusterSource", None)
        if isinstance(source, dict) and "kubeConfig" in source:
            spec["kubeConfig"] = source["kubeConfig"]
    return out


def up(obj: dict[str, Any]) -> dict[str, Any]:
    """A v1beta1 object as v1beta2 (the inverse of :func:`down`)."""
    out = copy.deepcopy(obj)
    if out.get("apiVersion") == V1BETA1:
        out["apiVersion"] = V1BETA2
    kind = out.get("kind")
    spec = out.get("spec") if isinstance(out.get("spec"), dict) else None
    status = out.get("status") if isinstance(out.get("status"), dict) else None
    if kind == "ClusterQueue" and spec is not None:
        _rename(spec, "cohort", "cohortName")
        fungibility = spec.get("flavorFungibility")
        if isinstance(fungibility, dict):
            if fungibility.get("whenCanBorrow") == "Borrow":
                fungibility["whenCanBorrow"] = "MayStopSearch"
            if fungibility.get("whenCanPreempt") == "Preempt":
                fungibility["whenCanPreempt"] = "MayStopSearch"
        checks = spec.pop("admissionChecks", None)
        if checks and not spec.get("admissionChecksStrategy"):
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": name} for name in checks]}
    elif kind == "LocalQueue" and status is not None:
        _rename(status, "flavorUsage", "flavorsUsage")
    elif kind == "Workload":
        if spec is not None:
            name = spec.pop("priorityClassName", None)
            source = spec.pop("priorityClassSource", None)
            for group, ref_kind, src in (_WPC, _PC):
                if name and source == src:
                    spec["priorityClassRef"] = {"group": group, "kind": ref_kind, "name": name}
        _rename(status, _PAST_V1, _PAST_V2)
    elif kind == "MultiKueueCluster" and spec is not None and "kubeConfig" in spec:
        spec["clusterSource"] = {"kubeConfig": spec.pop("kubeConfig")}
    return out

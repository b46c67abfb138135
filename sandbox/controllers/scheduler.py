"""Pod placement: kube-scheduler (+ HAMi's scheduler extender) for single pods, and the fit logic Volcano's gang
scheduler reuses.

Pure part (no store): :func:`node_infos` builds a :class:`NodeInfo` per node (free resources, taints, HAMi device
usage) from Nodes and the pods bound to them; :func:`filter_node` runs the filters in kube-scheduler's order —
node unschedulable, taints/tolerations, node affinity/selector, resources (``Insufficient <resource>``, ``Too many
pods``), then HAMi's per-device check — and :func:`choose_node` picks a node or returns the ``FailedScheduling``
message (``0/8 nodes are available: 4 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node
affinity/selector.``).

HAMi: pods with ``nvidia.com/gpumem``/``gpumem-percentage``/``gpucores`` (and pods asking ``nvidia.com/gpu`` that land
on a HAMi node) need, per container, ``nvidia.com/gpu`` *distinct* physical cards with enough free memory and cores
and a free split slot. Allocations are written to the pod as HAMi does (annotations ``hami.io/vgpu-node`` and
``hami.io/vgpu-devices-allocated``: ``<uuid>,NVIDIA,<mem MiB>,<cores>:`` per card, ``;`` per container) and read back
from there, so the state survives a restart. Node choice: binpack for HAMi pods (HAMi's default node policy), least
allocated cpu/memory otherwise (kube-scheduler's default scoring); cards are chosen spread (HAMi's default).

:class:`Scheduler` is the controller: every pass it binds pods that are not gated, not bound and whose
``schedulerName`` is ``default-scheduler`` (or empty) or ``hami-scheduler``; pods it cannot place get
``PodScheduled=False reason Unschedulable`` and a ``FailedScheduling`` Warning event (re-emitted at most every 30
simulated seconds while the message stays the same). Volcano's pods are left to :mod:`volcano`.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from sandbox.controllers import resources as R
from sandbox.controllers.common import NODE, POD, condition_true, set_condition
from sandbox.patch import deep_copy
from sandbox.profile import hami_devices

DEFAULT_SCHEDULERS = ("default-scheduler", "", None, "hami-scheduler")
HAMI_NODE_ANNOTATION = "hami.io/vgpu-node"
HAMI_ALLOC_ANNOTATION = "hami.io/vgpu-devices-allocated"
HAMI_TO_ALLOC_ANNOTATION = "hami.io/vgpu-devices-to-allocate"
HAMI_TIME_ANNOTATION = "hami.io/vgpu-time"

MSG_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
MSG_UNSCHEDULABLE = "node(s) were unschedulable"
MSG_TOO_MANY_PODS = "Too many pods"


@dataclass
class Device:
    id: str
    index: int
    count: int
    devmem: int
    devcore: int
    type: str
    used: int = 0
    usedmem: int = 0
    usedcores: int = 0


@dataclass
class NodeInfo:
    name: str
    node: dict
    labels: dict
    taints: list
    ready: bool
    unschedulable: bool
    allocatable: dict
    requested: dict = field(default_factory=dict)
    pods: int = 0
    devices: list = field(default_factory=list)  # HAMi devices (empty: not a HAMi node)

    @property
    def free(self) -> dict:
        return R.sub(self.allocatable, self.requested)

    @property
    def is_hami(self) -> bool:
        return bool(self.devices)

    def clone(self) -> NodeInfo:
        return NodeInfo(self.name, self.node, self.labels, self.taints, self.ready, self.unschedulable,
                        dict(self.allocatable), dict(self.requested), self.pods, [copy.copy(d) for d in self.devices])


# ------------------------------------------------------------------------------------------------ building
def pod_is_active(pod: dict) -> bool:
    """Holds node resources: bound and neither Succeeded nor Failed."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def node_ready(node: dict) -> bool:
    return condition_true(node, "Ready")


def parse_hami_alloc(value: str | None) -> list[list[tuple[str, int, int]]]:
    """``uuid,NVIDIA,mem,cores:uuid,...:;uuid,...:;`` -> per container [(uuid, mem, cores)]."""
    out = []
    for part in (value or "").split(";"):
        if not part.strip():
            continue
        cont = []
        for dev in part.split(":"):
            f = dev.split(",")
            if len(f) >= 4 and f[0]:
                try:
                    cont.append((f[0], int(f[2]), int(f[3])))
                except ValueError:
                    continue
        out.append(cont)
    return out


def format_hami_alloc(alloc: list[list[tuple[str, int, int]]]) -> str:
    return "".join("".join(f"{u},NVIDIA,{m},{c}:" for u, m, c in cont) + ";" for cont in alloc)


def node_infos(nodes: list[dict], pods: list[dict]) -> dict[str, NodeInfo]:
    infos: dict[str, NodeInfo] = {}
    for n in nodes:
        name = n["metadata"]["name"]
        devs = [Device(id=d.get("id", ""), index=int(d.get("index", i)), count=int(d.get("count", 10)),
                       devmem=int(d.get("devmem", 0)), devcore=int(d.get("devcore", 100)), type=str(d.get("type", "")))
                for i, d in enumerate(hami_devices(n)) if d.get("health", True)]
        infos[name] = NodeInfo(
            name=name,
            node=n,
            labels=(n.get("metadata") or {}).get("labels") or {},
            taints=list((n.get("spec") or {}).get("taints") or []),
            ready=node_ready(n),
            unschedulable=bool((n.get("spec") or {}).get("unschedulable")),
            allocatable=R.parse_list((n.get("status") or {}).get("allocatable")),
            devices=devs,
        )
    for p in pods:
        if not pod_is_active(p):
            continue
        ni = infos.get(p["spec"]["nodeName"])
        if ni is None:
            continue
        account(ni, p)
    return infos


def account(ni: NodeInfo, pod: dict, alloc: list | None = None) -> None:
    """Add a pod bound to ``ni`` to its usage (HAMi allocation from ``alloc`` or the pod's annotation)."""
    req = {k: v for k, v in R.pod_requests(pod.get("spec")).items() if not (ni.is_hami and k in R.HAMI_RESOURCES)}
    ni.requested = R.add(ni.requested, req)
    ni.pods += 1
    if ni.devices:
        if alloc is None:
            alloc = parse_hami_alloc(((pod.get("metadata") or {}).get("annotations") or {}).get(HAMI_ALLOC_ANNOTATION))
        by_id = {d.id: d for d in ni.devices}
        for cont in alloc:
            for uid, mem, cores in cont:
                d = by_id.get(uid)
                if d is not None:
                    d.used += 1
                    d.usedmem += mem
                    d.usedcores += cores


# ------------------------------------------------------------------------------------------------ filters
def tolerates(tolerations: list, taint: dict) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def untolerated_taint(pod_spec: dict, ni: NodeInfo) -> dict | None:
    taints = list(ni.taints)
    if not ni.ready:
        taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not tolerates(pod_spec.get("tolerations") or [], taint):
            return taint
    return None


def _match_expr(expr: dict, labels: dict, name: str | None = None) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    val = name if name is not None else labels.get(key)
    present = val is not None if name is not None else key in labels
    if op == "In":
        return present and val in values
    if op == "NotIn":
        return not present or val not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        try:
            a, b = int(val), int(values[0])
        except (TypeError, ValueError, IndexError):
            return False
        return a > b if op == "Gt" else a < b
    return False


def matches_node_selector_terms(terms: list, labels: dict, node_name: str) -> bool:
    """OR of terms; each term ANDs its matchExpressions (labels) and matchFields (metadata.name)."""
    for term in terms or []:
        exprs = term.get("matchExpressions") or []
        fields_ = term.get("matchFields") or []
        if not exprs and not fields_:
            continue  # an empty term matches nothing
        if all(_match_expr(e, labels) for e in exprs) and all(
            _match_expr(f, {}, node_name) for f in fields_ if f.get("key") == "metadata.name"
        ):
            return True
    return False


def matches_affinity(pod_spec: dict, ni: NodeInfo) -> bool:
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if ni.labels.get(k) != str(v):
            return False
    req = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution"))
    return not (req and req.get("nodeSelectorTerms") is not None
                and not matches_node_selector_terms(req.get("nodeSelectorTerms"), ni.labels, ni.name))


def _gputype_ok(pod: dict, dev: Device) -> bool:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    use = [s.strip().lower() for s in (ann.get("nvidia.com/use-gputype") or "").split(",") if s.strip()]
    nouse = [s.strip().lower() for s in (ann.get("nvidia.com/nouse-gputype") or "").split(",") if s.strip()]
    t = dev.type.lower()
    if use and not any(u in t for u in use):
        return False
    if nouse and any(u in t for u in nouse):
        return False
    uuids = [s.strip() for s in (ann.get("nvidia.com/use-gpuuuid") or "").split(",") if s.strip()]
    nouuids = [s.strip() for s in (ann.get("nvidia.com/nouse-gpuuuid") or "").split(",") if s.strip()]
    if uuids and dev.id not in uuids:
        return False
    return not (nouuids and dev.id in nouuids)


def hami_fit(pod: dict, ni: NodeInfo) -> tuple[list | None, str]:
    """Allocate HAMi cards for every container of ``pod`` on ``ni`` (without mutating it).

    Returns (allocation, "") on success, else (None, reason) with one of HAMi's filter reasons."""
    asks = R.hami_container_requests(pod.get("spec"))
    if not asks:
        return [], ""
    if not ni.devices:
        return None, "NodeInsufficientDevice"
    devs = [copy.copy(d) for d in ni.devices]
    alloc = []
    for ask in asks:
        chosen = []
        reasons: Counter = Counter()
        # spread: least used cards first (HAMi's default gpu-scheduler-policy)
        for d in sorted(devs, key=lambda d: (d.used, d.usedmem, d.usedcores, d.index)):
            if len(chosen) == ask["nums"]:
                break
            mem = ask["mem"] if ask["mem"] is not None else d.devmem * int(ask["mem_pct"] or 0) // 100
            if not _gputype_ok(pod, d):
                reasons["CardTypeMismatch"] += 1
            elif d.used >= d.count:
                reasons["NodeInsufficientDevice"] += 1
            elif d.used > 0 and (ask["cores"] >= 100 or d.usedcores >= d.devcore):
                reasons["ExclusiveDeviceAllocateConflict"] += 1
            elif d.usedmem + mem > d.devmem:
                reasons["CardInsufficientMemory"] += 1
            elif d.usedcores + ask["cores"] > d.devcore:
                reasons["CardInsufficientCore"] += 1
            else:
                chosen.append((d, mem))
        if len(chosen) < ask["nums"]:
            if len(devs) < ask["nums"] or not reasons:
                return None, "NodeInsufficientDevice"
            return None, reasons.most_common(1)[0][0]
        cont = []
        for d, mem in chosen:
            d.used += 1
            d.usedmem += mem
            d.usedcores += ask["cores"]
            cont.append((d.id, mem, ask["cores"]))
        alloc.append(cont)
    return alloc, ""


def filter_node(pod: dict, ni: NodeInfo, *, hami: bool = True) -> tuple[list[str], list | None]:
    """kube-scheduler filters in order; returns (failure reasons, HAMi allocation or None).

    Like kube-scheduler, the first failing plugin decides; the resource plugin reports every insufficient resource."""
    spec = pod.get("spec") or {}
    if ni.unschedulable and not tolerates(spec.get("tolerations") or [],
                                          {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
        return [MSG_UNSCHEDULABLE], None
    taint = untolerated_taint(spec, ni)
    if taint is not None:
        return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"], None
    if not matches_affinity(spec, ni):
        return [MSG_AFFINITY], None
    req = R.pod_requests(spec)
    uses_hami = hami and (any(k in R.HAMI_RESOURCES for k in req) or (ni.is_hami and R.GPU in req))
    if hami:
        req = {k: v for k, v in req.items() if k not in R.HAMI_RESOURCES}
    reasons = []
    if ni.pods + 1 > int(ni.allocatable.get("pods", Decimal(110))):
        reasons.append(MSG_TOO_MANY_PODS)
    reasons += [f"Insufficient {r}" for r in R.insufficient(req, ni.free)]
    if reasons:
        return reasons, None
    if uses_hami:
        alloc, why = hami_fit(pod, ni)
        if alloc is None:
            return [why], None
        return [], alloc
    return [], None


def fit_error(total: int, reasons: Counter) -> str:
    parts = sorted(f"{n} {r}" for r, n in reasons.items())
    return f"0/{total} nodes are available: {', '.join(parts)}."


def _score(pod: dict, ni: NodeInfo, alloc) -> tuple:
    if alloc:  # HAMi binpack: most used card memory first
        used = sum(d.usedmem for d in ni.devices)
        return (-used, ni.name)
    fr = []
    for r in ("cpu", "memory"):
        a = ni.allocatable.get(r, Decimal(0))
        fr.append((ni.allocatable.get(r, Decimal(0)) - ni.requested.get(r, Decimal(0))) / a if a else Decimal(0))
    return (-(sum(fr) / len(fr)), ni.name)


def choose_node(pod: dict, infos: dict[str, NodeInfo], *, hami: bool = True) -> tuple[str | None, list | None, str]:
    """(node name, HAMi allocation, "") or (None, None, FailedScheduling message)."""
    reasons: Counter = Counter()
    feasible = []
    for ni in infos.values():
        why, alloc = filter_node(pod, ni, hami=hami)
        if why:
            for r in why:
                reasons[r] += 1
        else:
            feasible.append((ni, alloc))
    if not feasible:
        if not infos:
            return None, None, "no nodes available to schedule pods"
        return None, None, fit_error(len(infos), reasons)
    ni, alloc = min(feasible, key=lambda x: _score(pod, x[0], x[1]))
    return ni.name, alloc, ""


def is_gated(pod: dict) -> bool:
    return bool((pod.get("spec") or {}).get("schedulingGates"))


def pod_priority(pod: dict) -> int:
    try:
        return int((pod.get("spec") or {}).get("priority") or 0)
    except (TypeError, ValueError):
        return 0


# ------------------------------------------------------------------------------------------------ binding
def bind(ctx, pod: dict, node_name: str, alloc: list | None, component: str) -> dict | None:
    """Bind ``pod`` to ``node_name`` (spec.nodeName, PodScheduled=True, HAMi annotations) and emit ``Scheduled``."""
    ns, name = pod["metadata"].get("namespace"), pod["metadata"]["name"]
    new = deep_copy(pod)
    new["spec"]["nodeName"] = node_name
    if alloc:
        ann = new["metadata"].setdefault("annotations", {})
        value = format_hami_alloc(alloc)
        ann[HAMI_NODE_ANNOTATION] = node_name
        ann[HAMI_ALLOC_ANNOTATION] = value
        ann[HAMI_TO_ALLOC_ANNOTATION] = value
        ann[HAMI_TIME_ANNOTATION] = str(int(ctx.now().timestamp()))
        ann["hami.io/bind-phase"] = "success"
    res = bind_object(ctx, new)
    if res is None:
        return None
    status = deep_copy(res.get("status") or {})
    conds = status.setdefault("conditions", [])
    set_condition(conds, "PodScheduled", "True", "", "", ctx.ts(), lastProbeTime=None)
    for c in conds:
        if c.get("type") == "PodScheduled":
            c.pop("reason", None)
            c.pop("message", None)
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", qos_class(res.get("spec") or {}))
    res = ctx.write_status(res, status) or res
    ctx.event(res, "Normal", "Scheduled", f"Successfully assigned {ns}/{name} to {node_name}", component)
    return res


def bind_object(ctx, new: dict) -> dict | None:
    """Write spec.nodeName (the ``binding`` subresource when the store has it, else a plain update)."""
    store = ctx.store
    binder = getattr(store, "bind", None)
    if callable(binder):
        try:
            res = binder(new["metadata"].get("namespace"), new["metadata"]["name"], new["spec"]["nodeName"])
            ctx.writes += 1
            if new["metadata"].get("annotations") != (res.get("metadata") or {}).get("annotations"):
                res["metadata"]["annotations"] = new["metadata"].get("annotations")
                res = ctx.update(res) or res
            return res
        except Exception as exc:  # fall back to a plain update
            ctx._error("bind", POD, new["metadata"]["name"], exc)
    return ctx.update(new)


def qos_class(spec: dict) -> str:
    conts = spec.get("containers") or []
    any_set = False
    guaranteed = bool(conts)
    for c in conts:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and R.q(req[r]) != R.q(lim[r])):
                guaranteed = False
    if guaranteed and any_set:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"


def mark_unschedulable(ctx, pod: dict, message: str, component: str = "default-scheduler") -> None:
    status = deep_copy(pod.get("status") or {})
    status.setdefault("phase", "Pending")
    conds = status.setdefault("conditions", [])
    set_condition(conds, "PodScheduled", "False", "Unschedulable", message, ctx.ts(), lastProbeTime=None)
    status.setdefault("qosClass", qos_class(pod.get("spec") or {}))
    ctx.write_status(pod, status)
    ctx.event(pod, "Warning", "FailedScheduling", message, component, min_interval=30.0)


class Scheduler:
    """kube-scheduler (+ HAMi extender) for every pod not owned by another scheduler."""

    name = "scheduler"

    def __init__(self, ctx):
        self.ctx = ctx

    def reconcile(self) -> None:
        ctx = self.ctx
        pods = ctx.list_items(POD)
        pending = [
            p for p in pods
            if not (p.get("spec") or {}).get("nodeName")
            and (p.get("spec") or {}).get("schedulerName") in DEFAULT_SCHEDULERS
            and not is_gated(p)
            and not (p.get("metadata") or {}).get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") in (None, "", "Pending")
        ]
        if not pending:
            return
        infos = node_infos(ctx.list_items(NODE), pods)
        pending.sort(key=lambda p: (-pod_priority(p), p["metadata"].get("creationTimestamp") or "",
                                    p["metadata"].get("namespace") or "", p["metadata"]["name"]))
        for pod in pending:
            node, alloc, msg = choose_node(pod, infos)
            if node is None:
                mark_unschedulable(ctx, pod, msg)
                continue
            component = "hami-scheduler" if (pod.get("spec") or {}).get("schedulerName") == "hami-scheduler" \
                else "default-scheduler"
            if bind(ctx, pod, node, alloc, component) is not None:
                account(infos[node], pod, alloc or [])

"""Node profiles: which nodes the sandbox cluster has, and how their GPUs look to Kubernetes.

A profile is a YAML file (see ``profiles/demo.yaml``)::

    name: demo
    poolLabel: gpuportal.dev/pool        # label key carrying each group's ``pool`` value
    topologyLabels: {block: cloud.provider.com/topology-block, rack: cloud.provider.com/topology-rack,
                     nvlinkDomain: nvidia.com/gpu.clique}   # the defaults (the labels of Kueue's TAS examples)
    migReconfigureSeconds: 45            # simulated time a MIG layout change takes
    migConfigs:                          # extra named MIG layouts besides the operator's defaults (optional)
      half-1g: [{devices: [0, 1, 2, 3], mig-enabled: true, mig-devices: {1g.10gb: 7}},
                {devices: [4, 5, 6, 7], mig-enabled: false}]
      small-slices: {1g.10gb: 4, 2g.20gb: 1}          # short form: the same layout on every GPU
    nodeGroups:
    - name: h100-offline
      count: 3
      namePrefix: gpu-h100-          # node names: <namePrefix><index>  (index continues across groups sharing a prefix)
      instanceType: p5.48xlarge
      cpu: "192"
      memory: 2Ti
      pods: 110
      pool: offline
      labels: {}                     # extra node labels
      topology:                      # racks and blocks (Kueue TAS; optional)
        block: block-a               # every node of the group
        racks: [rack-a1, rack-a2, rack-a2]   # one per node, in order (or ``rack: rack-a1`` for all)
        nvlinkDomain: node           # GPU nodes: node (default: one HGX board each) | rack | a name
      taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
      gpu:
        model: H100-80GB             # key of GPU_MODELS
        count: 8
        sharing: whole               # whole | mig | hami
        mig: {strategy: mixed, config: all-balanced}     # sharing: mig (config = a layout name or a short-form dict)
        hami: {splitCount: 10, memory: 46068, cores: 100} # sharing: hami (memory MiB per card; default = the card's)

:func:`load_profile` parses a file (``None`` = the shipped demo profile); :func:`build_nodes` turns a profile into
Node objects whose labels and capacity follow the NVIDIA device plugin / GPU Feature Discovery / HAMi conventions
(docs/cluster-objects.md, "NVIDIA GPUs and MIG" and "HAMi"). :func:`mig_layout` resolves a MIG config name for a GPU model and
:func:`gpu_node_state` computes the GPU part of a node's labels and capacity for a given layout — the node
controller uses both for MIG reconfiguration.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import yaml

DEMO_PROFILE = Path(__file__).with_name("profiles") / "demo.yaml"

POOL_LABEL_DEFAULT = "gpuportal.dev/pool"
MODEL_LABEL = "gpuportal.dev/gpu-model"
SHARING_LABEL = "gpuportal.dev/gpu-sharing"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_MANAGER_LABEL = "nvidia.com/gpu.deploy.mig-manager"
HAMI_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
# Topology labels (Kueue TAS): the block and rack labels of Kueue's own TAS examples, and GPU Feature Discovery's
# NVLink clique label. A profile's ``topologyLabels`` names others.
TOPOLOGY_LABELS_DEFAULT = {"block": "cloud.provider.com/topology-block", "rack": "cloud.provider.com/topology-rack",
                           "nvlinkDomain": "nvidia.com/gpu.clique"}
SANDBOX_PREFIX = "sandbox.gpuportal.dev/"

DRIVER = ("570", "172", "08")
CUDA = ("12", "8")

# (compute slices, memory slices, memory MiB, multiprocessors, max count per GPU)
_MIG_80 = {
    "1g.10gb": (1, 1, 9856, 16, 7), "1g.10gb+me": (1, 1, 9856, 16, 1), "1g.20gb": (1, 2, 19968, 16, 4),
    "2g.20gb": (2, 2, 19968, 32, 3), "3g.40gb": (3, 4, 40192, 60, 2), "4g.40gb": (4, 4, 40192, 64, 1),
    "7g.80gb": (7, 8, 80896, 132, 1),
}
_MIG_A100_80 = {k: (g, m, mem, sm * 14 // 16 if g < 7 else 98, n) for k, (g, m, mem, sm, n) in _MIG_80.items()}
_MIG_A100_40 = {
    "1g.5gb": (1, 1, 4864, 14, 7), "1g.5gb+me": (1, 1, 4864, 14, 1), "1g.10gb": (1, 2, 9856, 14, 4),
    "2g.10gb": (2, 2, 9856, 28, 3), "3g.20gb": (3, 4, 19968, 42, 2), "4g.20gb": (4, 4, 19968, 56, 1),
    "7g.40gb": (7, 8, 40192, 98, 1),
}
_MIG_A30 = {
    "1g.6gb": (1, 1, 5836, 14, 4), "1g.6gb+me": (1, 1, 5836, 14, 1), "2g.12gb": (2, 2, 11672, 28, 2),
    "2g.12gb+me": (2, 2, 11672, 28, 1), "4g.24gb": (4, 4, 23344, 56, 1),
}
_MIG_H200 = {
    "1g.18gb": (1, 1, 16384, 16, 7), "1g.18gb+me": (1, 1, 16384, 16, 1), "1g.35gb": (1, 2, 32768, 16, 4),
    "2g.35gb": (2, 2, 32768, 32, 3), "3g.71gb": (3, 4, 69632, 60, 2), "4g.71gb": (4, 4, 69632, 64, 1),
    "7g.141gb": (7, 8, 143360, 132, 1),
}
_MIG_B200 = {
    "1g.23gb": (1, 1, 23040, 18, 7), "1g.23gb+me": (1, 1, 23040, 18, 1), "1g.45gb": (1, 2, 45056, 18, 4),
    "2g.45gb": (2, 2, 45056, 36, 3), "3g.90gb": (3, 4, 90112, 72, 2), "4g.90gb": (4, 4, 90112, 72, 1),
    "7g.180gb": (7, 8, 180224, 148, 1),
}

# model key -> facts GFD would report. ``mig``: profile table (None = not MIG capable); ``balanced``: the operator's
# "all-balanced" layout per GPU; ``slices``: (compute, memory) slices of a whole GPU.
GPU_MODELS: dict[str, dict] = {
    "H100-80GB": {"product": "NVIDIA-H100-80GB-HBM3", "memory": 81559, "family": "hopper", "compute": (9, 0),
                  "mig": _MIG_80, "balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, "slices": (7, 8)},
    "H200-141GB": {"product": "NVIDIA-H200", "memory": 143771, "family": "hopper", "compute": (9, 0),
                   "mig": _MIG_H200, "balanced": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}, "slices": (7, 8)},
    "A100-80GB": {"product": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "family": "ampere", "compute": (8, 0),
                  "mig": _MIG_A100_80, "balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, "slices": (7, 8)},
    "A100-40GB": {"product": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "family": "ampere", "compute": (8, 0),
                  "mig": _MIG_A100_40, "balanced": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}, "slices": (7, 8)},
    "A30-24GB": {"product": "NVIDIA-A30", "memory": 24576, "family": "ampere", "compute": (8, 0),
                 "mig": _MIG_A30, "balanced": {"1g.6gb": 2, "2g.12gb": 1}, "slices": (4, 4)},
    "B200": {"product": "NVIDIA-B200", "memory": 183359, "family": "blackwell", "compute": (10, 0),
             "mig": _MIG_B200, "balanced": {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}, "slices": (7, 8)},
    "L40S": {"product": "NVIDIA-L40S", "memory": 46068, "family": "ada-lovelace", "compute": (8, 9),
             "mig": None, "balanced": None, "slices": None},
    "L4": {"product": "NVIDIA-L4", "memory": 23034, "family": "ada-lovelace", "compute": (8, 9),
           "mig": None, "balanced": None, "slices": None},
}


class ProfileError(ValueError):
    pass


def load_profile(path: str | Path | None = None) -> dict:
    """Parse a profile YAML file (``None`` = the shipped demo profile) and check it."""
    p = Path(path) if path else DEMO_PROFILE
    with open(p, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    validate_profile(data)
    return data


def validate_profile(profile: dict) -> None:
    if not isinstance(profile, dict):
        raise ProfileError("a profile is a mapping")
    groups = profile.get("nodeGroups") or []
    if not isinstance(groups, list):
        raise ProfileError("nodeGroups must be a list")
    for g in groups:
        gname = g.get("name") or "?"
        if int(g.get("count", 1)) < 0:
            raise ProfileError(f"node group {gname}: count must be >= 0")
        topo = g.get("topology")
        if topo is not None:
            if not isinstance(topo, dict):
                raise ProfileError(f"node group {gname}: topology must be a mapping")
            racks = topo.get("racks")
            if racks is not None and (not isinstance(racks, list) or len(racks) != int(g.get("count", 1))):
                raise ProfileError(f"node group {gname}: topology.racks needs one rack per node "
                                   f"({int(g.get('count', 1))})")
        gpu = g.get("gpu")
        if not gpu:
            continue
        model = gpu.get("model")
        if model not in GPU_MODELS:
            raise ProfileError(f"node group {gname}: unknown GPU model {model!r} (known: {', '.join(GPU_MODELS)})")
        sharing = gpu.get("sharing", "whole")
        if sharing not in ("whole", "mig", "hami"):
            raise ProfileError(f"node group {gname}: sharing must be whole, mig or hami")
        if sharing == "mig":
            mig = gpu.get("mig") or {}
            if GPU_MODELS[model]["mig"] is None:
                raise ProfileError(f"node group {gname}: {model} is not MIG capable")
            if (mig.get("strategy") or "mixed") != "mixed":
                raise ProfileError(f"node group {gname}: only the mixed MIG strategy is simulated")
            if mig_layout(model, mig.get("config", "all-balanced"), int(gpu.get("count", 1)), profile) is None:
                raise ProfileError(f"node group {gname}: unknown or invalid MIG config {mig.get('config')!r}")


# --------------------------------------------------------------------------------------------------- MIG layouts
def _short_to_devices(short: dict, ngpu: int) -> list[dict | None]:
    return [dict(short) for _ in range(ngpu)]


def mig_layout(model: str, config, ngpu: int, profile: dict | None = None) -> list[dict | None] | None:
    """Per-GPU MIG layout for a mig-parted config: a list with one entry per GPU, ``None`` = MIG disabled (full GPU),
    else ``{profile: count}``. ``config`` is a name (operator defaults ``all-disabled``, ``all-enabled``,
    ``all-balanced``, ``all-<profile>``, ``all-<profile>.me``, or a key of the profile's ``migConfigs``) or a
    short-form dict. Returns ``None`` when the name is unknown or the layout does not fit the GPU."""
    spec = GPU_MODELS.get(model)
    if spec is None or spec["mig"] is None:
        return None
    table = spec["mig"]
    layout: list[dict | None]
    custom = ((profile or {}).get("migConfigs") or {})
    if isinstance(config, dict):
        layout = _short_to_devices(config, ngpu)
    elif isinstance(config, str) and config in custom:
        entry = custom[config]
        if isinstance(entry, dict):
            layout = _short_to_devices(entry, ngpu)
        elif isinstance(entry, list):
            layout = [None] * ngpu
            for part in entry:
                devs = part.get("devices", "all")
                idxs = range(ngpu) if devs == "all" else [int(i) for i in devs]
                enabled = bool(part.get("mig-enabled", True))
                for i in idxs:
                    if 0 <= i < ngpu:
                        layout[i] = dict(part.get("mig-devices") or {}) if enabled else None
        else:
            return None
    elif config == "all-disabled":
        layout = [None] * ngpu
    elif config == "all-enabled":
        layout = [{} for _ in range(ngpu)]
    elif config == "all-balanced":
        layout = _short_to_devices(spec["balanced"], ngpu)
    elif isinstance(config, str) and config.startswith("all-"):
        prof = config[4:]
        if prof.endswith(".me"):
            prof = prof[:-3] + "+me"
        if prof not in table:
            return None
        layout = _short_to_devices({prof: table[prof][4]}, ngpu)
    else:
        return None
    gmax, mmax = spec["slices"]
    for dev in layout:
        if dev is None:
            continue
        g = m = 0
        for prof, given in dev.items():
            if prof not in table:
                return None
            count = int(given)
            if count < 0 or count > table[prof][4]:
                return None
            g += table[prof][0] * count
            m += table[prof][1] * count
        if g > gmax or m > mmax:
            return None
    return layout


def mig_resource(profile_name: str) -> str:
    """``1g.10gb`` -> ``nvidia.com/mig-1g.10gb``; ``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``."""
    return "nvidia.com/mig-" + profile_name.replace("+", ".")


def _uuid(node: str, idx: int) -> str:
    return "GPU-" + str(uuid.UUID(hashlib.md5(f"{node}/{idx}".encode()).hexdigest()))


def gpu_node_state(node_name: str, gpu: dict, layout: list[dict | None] | None = None) -> tuple[dict, dict, dict]:
    """GPU labels, GPU resources (name -> int) and annotations of a node for its GPU spec (and MIG layout)."""
    model = gpu["model"]
    spec = GPU_MODELS[model]
    n = int(gpu.get("count", 1))
    sharing = gpu.get("sharing", "whole")
    major, minor = spec["compute"]
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": spec["product"],
        "nvidia.com/gpu.memory": str(spec["memory"]),
        "nvidia.com/gpu.count": str(n),
        "nvidia.com/gpu.family": spec["family"],
        "nvidia.com/gpu.compute.major": str(major),
        "nvidia.com/gpu.compute.minor": str(minor),
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "true" if spec["mig"] else "false",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/vgpu.present": "false",
        "nvidia.com/cuda.driver-version.major": DRIVER[0],
        "nvidia.com/cuda.driver-version.minor": DRIVER[1],
        "nvidia.com/cuda.driver-version.revision": DRIVER[2],
        "nvidia.com/cuda.driver-version.full": ".".join(DRIVER),
        "nvidia.com/cuda.runtime-version.major": CUDA[0],
        "nvidia.com/cuda.runtime-version.minor": CUDA[1],
        "nvidia.com/cuda.runtime-version.full": ".".join(CUDA),
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
        "nvidia.com/gpu.deploy.dcgm": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "true",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        MODEL_LABEL: model.lower(),
        SHARING_LABEL: sharing,
    }
    resources: dict[str, int] = {}
    annotations: dict[str, str] = {}
    if sharing == "mig":
        labels[MIG_MANAGER_LABEL] = "true"
        labels["nvidia.com/mig.strategy"] = "mixed"
        layout = layout if layout is not None else mig_layout(model, (gpu.get("mig") or {}).get("config", "all-balanced"), n)
        full = sum(1 for d in layout if d is None)
        counts: dict[str, int] = {}
        for d in layout:
            for prof, c in (d or {}).items():
                counts[prof] = counts.get(prof, 0) + int(c)
        labels["nvidia.com/gpu.count"] = str(full)
        if full:
            resources["nvidia.com/gpu"] = full
        for prof, c in sorted(counts.items()):
            if c <= 0:
                continue
            g, _m, mem, sms, _max = spec["mig"][prof]
            base = mig_resource(prof)
            resources[base] = c
            labels[f"{base}.count"] = str(c)
            labels[f"{base}.memory"] = str(mem)
            labels[f"{base}.multiprocessors"] = str(sms)
            labels[f"{base}.slices.gi"] = str(g)
            labels[f"{base}.slices.ci"] = str(g)
            labels[f"{base}.product"] = f"{spec['product']}-MIG-{prof}"
            labels[f"{base}.replicas"] = "1"
            labels[f"{base}.sharing-strategy"] = "none"
    elif sharing == "hami":
        hami = gpu.get("hami") or {}
        split = int(hami.get("splitCount", 10))
        mem = int(hami.get("memory", spec["memory"]))
        cores = int(hami.get("cores", 100))
        labels["gpu"] = "on"
        resources["nvidia.com/gpu"] = n * split
        devices = [
            {"id": _uuid(node_name, i), "index": i, "count": split, "devmem": mem, "devcore": cores,
             "type": f"NVIDIA-{spec['product'].replace('NVIDIA-', 'NVIDIA ')}", "numa": 0 if i < (n + 1) // 2 else 1,
             "mode": "hami-core", "health": True}
            for i in range(n)
        ]
        annotations[HAMI_REGISTER_ANNOTATION] = json.dumps(devices, separators=(",", ":"))
        annotations["hami.io/node-handshake"] = "Reported"
    else:
        resources["nvidia.com/gpu"] = n
    return labels, resources, annotations


def hami_devices(node: dict) -> list[dict]:
    """The HAMi devices a node registered (parsed ``hami.io/node-nvidia-register``); [] if not a HAMi node."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(HAMI_REGISTER_ANNOTATION)
    if not raw:
        return []
    try:
        devs = json.loads(raw)
    except ValueError:
        return []
    return [d for d in devs if isinstance(d, dict)]


# --------------------------------------------------------------------------------------------------- nodes
def node_names(profile: dict) -> list[tuple[str, dict]]:
    """(node name, its group) for every node of the profile, in profile order."""
    out = []
    seen: dict[str, int] = {}
    for g in profile.get("nodeGroups") or []:
        prefix = g.get("namePrefix") or f"{g.get('name', 'node')}-"
        for _ in range(int(g.get("count", 1))):
            i = seen.get(prefix, 0)
            seen[prefix] = i + 1
            out.append((f"{prefix}{i}", g))
    return out


def topology_labels(profile: dict, group: dict, name: str, index: int) -> dict[str, str]:
    """The block, rack and (GPU nodes) NVLink-domain labels of the ``index``-th node of ``group`` (named ``name``)."""
    topo = group.get("topology")
    if not topo:
        return {}
    keys = {**TOPOLOGY_LABELS_DEFAULT, **(profile.get("topologyLabels") or {})}
    out: dict[str, str] = {}
    racks = topo.get("racks")
    rack = str(racks[index]) if racks else str(topo.get("rack") or "")
    if topo.get("block"):
        out[keys["block"]] = str(topo["block"])
    if rack:
        out[keys["rack"]] = rack
    if group.get("gpu"):
        domain = str(topo.get("nvlinkDomain") or "node")
        out[keys["nvlinkDomain"]] = {"node": name, "rack": rack or name}.get(domain, domain)
    return out


def build_nodes(profile: dict | None, now: str = "1970-01-01T00:00:00Z") -> list[dict]:
    """Node objects (metadata + spec + status) for every node of a profile."""
    if not profile:
        return []
    pool_label = profile.get("poolLabel") or POOL_LABEL_DEFAULT
    kubelet = profile.get("kubeletVersion") or "v1.33.4"
    nodes = []
    in_group: dict[int, int] = {}
    for gi, (name, g) in enumerate(node_names(profile)):
        index = in_group[id(g)] = in_group.get(id(g), -1) + 1
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": str(g.get("instanceType") or g.get("name") or "sandbox"),
            "topology.kubernetes.io/region": str(profile.get("region") or "sandbox-1"),
            "topology.kubernetes.io/zone": str(g.get("zone") or profile.get("zone") or "sandbox-1a"),
            SANDBOX_PREFIX + "node-group": str(g.get("name") or ""),
        }
        if g.get("pool"):
            labels[pool_label] = str(g["pool"])
        annotations = {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        }
        resources: dict[str, int | str] = {}
        gpu = g.get("gpu")
        if gpu:
            glabels, gres, gann = gpu_node_state(name, gpu)
            labels.update(glabels)
            labels["nvidia.com/gpu.machine"] = str(g.get("instanceType") or "sandbox")
            if gpu.get("sharing") == "mig":
                cfg = (gpu.get("mig") or {}).get("config", "all-balanced")
                cfg_name = cfg if isinstance(cfg, str) else "custom"
                labels[MIG_CONFIG_LABEL] = cfg_name
                labels[MIG_STATE_LABEL] = "success"
                annotations[SANDBOX_PREFIX + "mig-config-applied"] = cfg_name
            annotations.update(gann)
            resources.update(gres)
        labels.update(topology_labels(profile, g, name, index))
        labels.update({str(k): str(v) for k, v in (g.get("labels") or {}).items()})
        capacity = {
            "cpu": str(g.get("cpu", "32")),
            "memory": str(g.get("memory", "128Gi")),
            "pods": str(g.get("pods", profile.get("pods", 110))),
            "ephemeral-storage": str(g.get("ephemeralStorage", "1000Gi")),
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
        }
        capacity.update({k: str(v) for k, v in resources.items()})
        ip = f"10.0.{gi // 250}.{gi % 250 + 10}"
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"podCIDR": f"10.244.{gi}.0/24", "podCIDRs": [f"10.244.{gi}.0/24"],
                     "providerID": f"sandbox://{name}"},
            "status": {
                "capacity": capacity,
                "allocatable": dict(capacity),
                "conditions": node_conditions(now),
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "architecture": "amd64", "bootID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name + "/boot")),
                    "containerRuntimeVersion": "containerd://2.0.5", "kernelVersion": "6.8.0-1031-aws",
                    "kubeProxyVersion": kubelet, "kubeletVersion": kubelet,
                    "machineID": hashlib.md5(name.encode()).hexdigest(),
                    "operatingSystem": "linux", "osImage": "Ubuntu 22.04.5 LTS",
                    "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                },
                "phase": "Running",
            },
        }
        taints = [dict(t) for t in (g.get("taints") or [])]
        if taints:
            node["spec"]["taints"] = taints
        nodes.append(node)
    return nodes


def node_conditions(now: str) -> list[dict]:
    def c(t, s, reason, msg):
        return {"type": t, "status": s, "reason": reason, "message": msg,
                "lastHeartbeatTime": now, "lastTransitionTime": now}

    return [
        c("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        c("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        c("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        c("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]


def group_of_node(profile: dict | None, node_name: str) -> dict | None:
    for name, g in node_names(profile or {}):
        if name == node_name:
            return g
    return None

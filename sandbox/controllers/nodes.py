"""Nodes: seeding from the profile, and the NVIDIA MIG manager's reconfiguration flow.

MIG reconfiguration (nodes labelled ``nvidia.com/gpu.deploy.mig-manager=true``, i.e. profile groups with
``sharing: mig``): when the label ``nvidia.com/mig.config`` differs from the layout applied last (kept in the node
annotation ``sandbox.gpuportal.dev/mig-config-applied``),

1. ``nvidia.com/mig.config.state=pending``, the GPU operands are paused
   (``nvidia.com/gpu.deploy.{device-plugin,gpu-feature-discovery,dcgm,dcgm-exporter}=paused-for-mig-change``) and the
   node's GPU capacity/allocatable drops to 0 while the change runs;
2. after ``migReconfigureSeconds`` (profile, default 45) simulated seconds the layout is applied: new
   ``nvidia.com/mig-<profile>`` (and full ``nvidia.com/gpu``) capacity, new GFD labels, state ``success``; or state
   ``failed`` and the previous layout is restored when the name is unknown / does not fit the GPU, or when pods
   using GPUs are still running on the node (mig-parted cannot repartition busy GPUs: drain first).

Changing the label again while ``pending`` restarts the timer with the new value. After ``failed`` nothing happens
until the label changes; setting it back to the applied value turns the state back to ``success``.

Fault knob (sandbox only, for tests and demos of a rollback): a node annotated ``sandbox.gpuportal.dev/mig-fail-next=true``
fails its next layout change as if mig-parted had failed (state ``failed``, the previous layout restored); the
annotation is consumed by that failure, so the change after it (e.g. the rollback) runs normally.
"""

from __future__ import annotations


from sandbox.controllers import resources as R
from sandbox.controllers.common import NODE, POD, SANDBOX
from sandbox.patch import deep_copy
from sandbox.profile import (
    MIG_CONFIG_LABEL,
    MIG_MANAGER_LABEL,
    MIG_STATE_LABEL,
    build_nodes,
    gpu_node_state,
    group_of_node,
    mig_layout,
)

APPLIED = SANDBOX + "mig-config-applied"
REQUESTED_AT = SANDBOX + "mig-config-requested-at"
REQUESTED = SANDBOX + "mig-config-requested"
FAILED = SANDBOX + "mig-config-failed"
FAIL_NEXT = SANDBOX + "mig-fail-next"  # fault knob: fail the next layout change of this node
PAUSED = "paused-for-mig-change"
OPERANDS = ("device-plugin", "gpu-feature-discovery", "dcgm", "dcgm-exporter")


def is_gpu_resource_name(name: str) -> bool:
    return name == R.GPU or name.startswith(R.MIG_PREFIX)


class NodeController:
    name = "nvidia-mig-manager"

    def __init__(self, ctx):
        self.ctx = ctx

    def seed(self) -> None:
        """Create the profile's nodes that do not exist yet."""
        ctx = self.ctx
        for node in build_nodes(ctx.profile, ctx.ts()):
            if ctx.get(NODE, node["metadata"]["name"]) is not None:
                continue
            status = node.get("status")
            created = ctx.create(node)
            if created is not None and created.get("status") != status:
                ctx.write_status(created, status)

    def delay(self) -> float:
        return float((self.ctx.profile or {}).get("migReconfigureSeconds", 45))

    def reconcile(self) -> None:
        ctx = self.ctx
        pods = None
        for node in ctx.list_items(NODE):
            labels = node["metadata"].get("labels") or {}
            if labels.get(MIG_MANAGER_LABEL) != "true":
                continue
            group = group_of_node(ctx.profile, node["metadata"]["name"])
            if not group or not group.get("gpu"):
                continue
            ann = node["metadata"].get("annotations") or {}
            wanted = labels.get(MIG_CONFIG_LABEL)
            applied = ann.get(APPLIED)
            state = labels.get(MIG_STATE_LABEL)
            if not wanted:
                continue
            if state == "pending":
                if ann.get(REQUESTED) != wanted:  # changed again: restart with the new value
                    self._start(node, wanted)
                    continue
                since = ctx.since(ann.get(REQUESTED_AT))
                if since is None or since < self.delay():
                    continue
                if pods is None:
                    pods = ctx.list_items(POD)
                self._finish(node, group, wanted, applied, pods)
            elif wanted != applied:
                if state == "failed" and ann.get(FAILED) == wanted:
                    continue  # failed for this value: wait for a new label value
                self._start(node, wanted)
            elif state == "failed":
                new = deep_copy(node)
                new["metadata"]["labels"][MIG_STATE_LABEL] = "success"
                new["metadata"].setdefault("annotations", {}).pop(FAILED, None)
                ctx.update(new)

    def _start(self, node: dict, wanted: str) -> None:
        ctx = self.ctx
        new = deep_copy(node)
        labels = new["metadata"]["labels"]
        ann = new["metadata"].setdefault("annotations", {})
        labels[MIG_STATE_LABEL] = "pending"
        for op in OPERANDS:
            labels[f"nvidia.com/gpu.deploy.{op}"] = PAUSED
        ann[REQUESTED] = wanted
        ann[REQUESTED_AT] = ctx.ts()
        res = ctx.update(new)
        if res is None:
            return
        status = deep_copy(res.get("status") or {})
        for key in ("capacity", "allocatable"):
            for r in list((status.get(key) or {}).keys()):
                if is_gpu_resource_name(r):
                    status[key][r] = "0"
        ctx.write_status(res, status)
        ctx.event(res, "Normal", "MIGConfigPending", f"MIG configuration change to {wanted!r} requested",
                  self.name, host=res["metadata"]["name"])

    def _finish(self, node: dict, group: dict, wanted: str, applied: str | None, pods: list[dict]) -> None:
        ctx = self.ctx
        name = node["metadata"]["name"]
        gpu = dict(group["gpu"])
        n = int(gpu.get("count", 1))
        layout = mig_layout(gpu["model"], wanted, n, ctx.profile)
        busy = [p for p in pods
                if (p.get("spec") or {}).get("nodeName") == name
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                and any(is_gpu_resource_name(k) for k in R.pod_requests(p.get("spec")))]
        forced = ((node["metadata"].get("annotations") or {}).get(FAIL_NEXT) or "").lower() == "true"
        ok = layout is not None and not busy and not forced
        if ok:
            target, new_state = layout, "success"
        else:
            target = mig_layout(gpu["model"], applied or (gpu.get("mig") or {}).get("config", "all-balanced"), n,
                                ctx.profile)
            if target is None:
                target = mig_layout(gpu["model"], "all-disabled", n, ctx.profile)
            new_state = "failed"
        glabels, gres, _ = gpu_node_state(name, gpu, target)
        new = deep_copy(node)
        labels = new["metadata"]["labels"]
        for k in [k for k in labels if k.startswith(R.MIG_PREFIX)]:
            del labels[k]
        labels.update(glabels)
        labels[MIG_STATE_LABEL] = new_state
        for op in OPERANDS:
            labels[f"nvidia.com/gpu.deploy.{op}"] = "true"
        ann = new["metadata"].setdefault("annotations", {})
        if ok:
            ann[APPLIED] = wanted
            ann.pop(FAILED, None)
        else:
            ann[FAILED] = wanted
        if forced:
            ann.pop(FAIL_NEXT, None)  # consumed: the next change (a rollback) runs normally
        ann.pop(REQUESTED, None)
        ann.pop(REQUESTED_AT, None)
        res = ctx.update(new)
        if res is None:
            return
        status = deep_copy(res.get("status") or {})
        for key in ("capacity", "allocatable"):
            cur = status.setdefault(key, {})
            for r in list(cur):
                if is_gpu_resource_name(r):
                    cur[r] = "0"  # resources that disappear stay advertised at 0, as with the kubelet
            for r, v in gres.items():
                cur[r] = str(v)
        ctx.write_status(res, status)
        if ok:
            ctx.event(res, "Normal", "MIGConfigApplied", f"MIG configuration {wanted!r} applied successfully",
                      self.name, host=name)
        else:
            if forced and layout is not None and not busy:
                why = f"injected failure ({FAIL_NEXT}=true)"
            elif busy and layout is not None:
                why = f"GPUs in use by {len(busy)} pod(s); drain the node first"
            else:
                why = f"unknown or invalid MIG configuration {wanted!r}"
            ctx.event(res, "Warning", "MIGConfigFailed", f"MIG configuration change to {wanted!r} failed: {why}",
                      self.name, host=name)

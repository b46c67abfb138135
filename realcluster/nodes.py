"""Nodes for the real control plane: the sandbox profile's nodes (GPU, MIG and HAMi capacity, pools, taints),
written to the real API server, and the kwok stages that play their kubelets.

kwok (``sigs.k8s.io/kwok``, built in ``kwok/``) keeps every node annotated ``kwok.x-k8s.io/node: fake`` Ready and
moves the pods bound to them through their phases: Running and Ready at once, and a Job's pods Succeeded after the
request's duration, read from the same ``sandbox.gpuportal.dev/duration`` annotation the sandbox honours (a Go
duration such as ``4h``; real time here, where the sandbox's clock can run faster). A pod whose container runs
agnhost's ``pause`` (Kueue's TAS samples) never completes, as on a real kubelet; the sandbox does the same.
"""

from __future__ import annotations

import copy
import datetime as _dt
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
DURATION_ANNOTATION = "sandbox.gpuportal.dev/duration"
PAUSE_ARG = "pause"  # registry.k8s.io/e2e-test-images/agnhost's subcommand that waits for ever


def profile_nodes(profile_path: Path | None = None) -> list[dict]:
    """The profile's Node objects as the sandbox builds them, marked for kwok."""
    import sys

    sys.path.insert(0, str(ROOT))
    from sandbox.profile import build_nodes, load_profile

    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    nodes = build_nodes(load_profile(profile_path or ROOT / "sandbox" / "profiles" / "demo.yaml"), now)
    for node in nodes:
        node["metadata"].setdefault("annotations", {})[KWOK_ANNOTATION] = "fake"
        node["spec"]["providerID"] = f"kwok://{node['metadata']['name']}"
    return nodes


def register(cp, nodes: list[dict]) -> None:
    """Create the nodes and write their status (capacity, conditions, addresses) through the status subresource."""
    for node in nodes:
        meta = {k: v for k, v in node.items() if k != "status"}
        cp.apply(meta)
        status, body = cp._request("PATCH", f"/api/v1/nodes/{node['metadata']['name']}/status",
                                   {"status": node["status"]}, "application/merge-patch+json")
        if status != 200:
            raise RuntimeError(f"node {node['metadata']['name']} status: {status} {body}")
        _untaint_ready(cp, node["metadata"]["name"])


NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _untaint_ready(cp, name: str) -> None:
    """The API server's TaintNodesByCondition admission puts ``node.kubernetes.io/not-ready:NoSchedule`` on every
    new Node; on a cluster the node-lifecycle controller removes it once the node is Ready. That controller is off
    here (kwok keeps the leases), so the Ready node loses it now, as it would there."""
    status, body = cp._request("GET", f"/api/v1/nodes/{name}")
    taints = ((body.get("spec") or {}).get("taints") or []) if status == 200 and isinstance(body, dict) else []
    kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
    if len(kept) == len(taints):
        return
    status, body = cp._request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": kept or None}},
                               "application/merge-patch+json")
    if status != 200:
        raise RuntimeError(f"node {name} taints: {status} {body}")


def kwok_stages() -> list[dict]:
    """kwok's own stage definitions (its module's kustomize/stage), with a Job pod's run time read from the
    portal's duration annotation."""
    import subprocess

    out = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"], cwd=HERE / "kwok",
                         capture_output=True, text=True, check=True, env={**__import__("os").environ,
                                                                         "GOFLAGS": "-mod=mod"})
    stage_root = Path(out.stdout.strip()) / "kustomize" / "stage"
    files = [stage_root / "node" / "fast" / "node-initialize.yaml",
             stage_root / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
             stage_root / "pod" / "general" / "pod-create.yaml",
             stage_root / "pod" / "general" / "pod-init-container-running.yaml",
             stage_root / "pod" / "general" / "pod-init-container-completed.yaml",
             stage_root / "pod" / "general" / "pod-ready.yaml",
             stage_root / "pod" / "general" / "pod-complete.yaml",
             stage_root / "pod" / "general" / "pod-delete.yaml"]
    stages = []
    for path in files:
        for loaded in yaml.safe_load_all(path.read_text()):
            if not loaded:
                continue
            doc = copy.deepcopy(loaded)
            if doc["metadata"]["name"] == "pod-complete":
                # agnhost's ``pause`` (Kueue's samples run it) never exits on a real kubelet: such a pod stays Running
                doc["spec"]["selector"]["matchExpressions"].append(
                    {"key": ".spec.containers.[].args.[0]", "operator": "NotIn", "values": [PAUSE_ARG]})
                doc["spec"]["delay"] = {
                    "durationMilliseconds": 1000,
                    "durationFrom": {"expressionFrom": f'.metadata.annotations["{DURATION_ANNOTATION}"]'},
                }
            stages.append(doc)
    return stages

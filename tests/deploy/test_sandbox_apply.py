"""The sandbox overlay applied with ``kubectl apply -k`` to the sandbox cluster: every object is accepted (the
cluster validates them against the upstream schemas, like a real API server), and the Deployments come up."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sandbox.testing import kubectl

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "deploy/kubernetes/overlays/sandbox"


def _deployments(sb) -> dict[str, dict]:
    out = json.loads(kubectl(sb, "-n", "gpu-portal", "get", "deployments", "-o", "json").stdout)
    return {d["metadata"]["name"]: d for d in out["items"]}


def test_sandbox_overlay_applies_and_its_deployments_become_available(fresh_sandbox):
    applied = kubectl(fresh_sandbox, "apply", "-k", str(OVERLAY), timeout=120).stdout
    for kind in ("poddisruptionbudget.policy/gpu-portal-web", "horizontalpodautoscaler.autoscaling/gpu-portal-web",
                 "ingress.networking.k8s.io/gpu-portal-notebooks", "clusterrole.rbac.authorization.k8s.io/gpu-portal",
                 "clusterrolebinding.rbac.authorization.k8s.io/gpu-portal",
                 "networkpolicy.networking.k8s.io/gpu-portal-default-deny", "job.batch/gpu-portal-migrate"):
        assert f"{kind} created" in applied, applied
    deadline = time.monotonic() + 60
    while True:
        deployments = _deployments(fresh_sandbox)
        available = {name for name, d in deployments.items()
                     if any(c["type"] == "Available" and c["status"] == "True" for c in d.get("status", {}).get("conditions", []))}
        if available == {"gpu-portal-web", "gpu-portal-worker", "gpu-portal-beat"} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert available == {"gpu-portal-web", "gpu-portal-worker", "gpu-portal-beat"}, deployments
    assert all(d["status"]["availableReplicas"] == 1 for d in deployments.values())
    # Applying again changes nothing. (A PodDisruptionBudget's selector has the patch strategy "replace", so
    # client-side apply always sends it and reports "configured", as against a real API server.)
    again = kubectl(fresh_sandbox, "apply", "-k", str(OVERLAY), timeout=120).stdout
    changed = {line.split()[0] for line in again.splitlines() if not line.endswith(" unchanged")}
    assert changed <= {"poddisruptionbudget.policy/gpu-portal-web", "poddisruptionbudget.policy/gpu-portal-worker"}, again


def test_sandbox_refuses_new_kinds_that_break_their_schema(fresh_sandbox):
    bad_pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "x", "namespace": "default"},
               "spec": {"minAvailable": 1, "selector": {"matchLabels": {"a": "b"}}, "maxUnavailabel": 1}}
    out = kubectl(fresh_sandbox, "apply", "--validate=strict", "-f", "-", input=json.dumps(bad_pdb), check=False)
    assert out.returncode != 0 and "maxUnavailabel" in out.stderr, out
    bad_hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x", "namespace": "default"},
               "spec": {"maxReplicas": "many", "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"}}}
    out = kubectl(fresh_sandbox, "apply", "-f", "-", input=json.dumps(bad_hpa), check=False)
    assert out.returncode != 0 and "maxReplicas" in out.stderr, out
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
    kubectl(fresh_sandbox, "apply", "-f", "-", input=json.dumps(role))
    got = json.loads(kubectl(fresh_sandbox, "get", "clusterrole", "reader", "-o", "json").stdout)
    assert "namespace" not in got["metadata"] and got["rules"][0]["verbs"] == ["get"]

"""The Kubernetes label vocabulary is defined once, in portal/labels.py, and everything imports it."""

from __future__ import annotations

import re
from pathlib import Path

from portal import labels
from quotas import manifests as qm
from workloads import manifests as wm

ROOT = Path(__file__).resolve().parent.parent
APPS = ("portal", "tenants", "quotas", "workloads", "billing")
# A module-level constant whose value is one of our label/annotation keys.
DEFINITION = re.compile(r'^\s*[A-Z][A-Z0-9_]*\s*=\s*f?"(gpuportal\.dev/|sandbox\.gpuportal\.dev/|kueue\.x-k8s\.io/(queue-name|priority-class)'
                        r'|app\.kubernetes\.io/)', re.M)


def test_no_label_key_is_defined_outside_portal_labels() -> None:
    found = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if path == ROOT / "portal" / "labels.py" or "migrations" in path.parts:
                continue
            found += [f"{path.relative_to(ROOT)}: {m.group(0).strip()}" for m in DEFINITION.finditer(path.read_text())]
    assert found == []


def test_managed_by_is_the_key_and_manager_the_value_everywhere() -> None:
    assert labels.MANAGED_BY == "app.kubernetes.io/managed-by" and labels.MANAGER == "gpu-portal"
    assert qm.MANAGED_BY == wm.MANAGED_BY == labels.MANAGED_BY
    assert qm.MANAGER == wm.MANAGER == labels.MANAGER
    assert labels.managed_selector() == "app.kubernetes.io/managed-by=gpu-portal"
    assert labels.request_selector(42) == "gpuportal.dev/request=42"

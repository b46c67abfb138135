"""State and status columns move only through a state machine module (``<app>/states.py``, or ``<app>/<machine>_states.py``
when an app has two).

A raw ``.update(status=...)`` or ``.update(state=...)`` skips the compare-and-set, the timeline and
the audit entry; this test finds one anywhere in the product's source.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("portal", "tenants", "quotas", "workloads", "billing", "maintenance")
STATE_FIELDS = {"status", "state"}


def state_updates(source: str) -> list[int]:
    """Line numbers of ``<anything>.update(status=...)`` / ``.update(state=...)`` calls."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and any(kw.arg in STATE_FIELDS for kw in node.keywords)):
            lines.append(node.lineno)
    return lines


def test_the_finder_finds() -> None:
    assert state_updates("Q.objects.filter(pk=1).update(\n  status='x', comment='')") == [1]
    assert state_updates("Q.objects.filter(pk=1).update(state=S.RUNNING)") == [1]
    assert state_updates("d.update(other=1); services.tenant_update(status='x')") == []


def test_only_state_modules_update_a_status() -> None:
    found = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if path.name.endswith("states.py") or "migrations" in path.parts:
                continue
            found += [f"{path.relative_to(ROOT)}:{line}" for line in state_updates(path.read_text())]
    assert found == [], "move these through the app's states.py: " + ", ".join(found)

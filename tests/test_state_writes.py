"""State and status columns move only through a state machine module (``<app>/states.py``, or ``<app>/<machine>_states.py``
when an app has two).

A raw ``.update(status=...)`` or ``.update(state=...)``, an attribute write (``obj.status = ...``,
``obj.status, obj.x = ...``, ``setattr(obj, "status", ...)``) followed by a ``save()``, or a
``bulk_update(objs, ["status", ...])`` skips the compare-and-set, the timeline and the audit entry; this test
finds one anywhere in the product's source. The machines themselves are ``portal.machine.Machine``
declarations (docs/architecture.md, "State machines"). ``self.status = ...`` is left alone: that is a plain
object's own attribute (an HTTP status, a row stand-in), not a model's state column.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("portal", "tenants", "quotas", "workloads", "billing", "maintenance", "insights")
STATE_FIELDS = {"status", "state"}


def state_updates(source: str) -> list[int]:
    """Line numbers of ``<anything>.update(status=...)`` / ``.update(state=...)`` calls."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and any(kw.arg in STATE_FIELDS for kw in node.keywords)):
            lines.append(node.lineno)
    return lines


def _targets(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, (ast.Tuple, ast.List)):
        return [t for element in node.elts for t in _targets(element)]
    return [node]


def _names_a_state_field(node: ast.expr | None) -> bool:
    return isinstance(node, (ast.List, ast.Tuple, ast.Set)) and any(
        isinstance(e, ast.Constant) and e.value in STATE_FIELDS for e in node.elts)


def state_writes(source: str) -> list[int]:
    """Line numbers of ``<obj>.status = ...`` (also in a tuple assignment), ``setattr(<obj>, "status", ...)`` and
    ``<manager>.bulk_update(<objs>, [..."status"...])`` (and ``state``); ``self.<field> = ...`` is not one."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if any(isinstance(t, ast.Attribute) and t.attr in STATE_FIELDS
                       and not (isinstance(t.value, ast.Name) and t.value.id == "self") for t in _targets(target)):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in STATE_FIELDS):
                lines.append(node.lineno)
            elif isinstance(func, ast.Attribute) and func.attr == "bulk_update":
                fields = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "fields"), None)
                if _names_a_state_field(fields):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_the_attribute_finder_finds() -> None:
    assert state_writes("s.status = 'final'\ns.save()") == [1]
    assert state_writes("x = 1\nstatement.status, statement.finalised_at = S.FINAL, now") == [2]
    assert state_writes("setattr(req, 'state', 'running')") == [1]
    assert state_writes("Statement.objects.bulk_update(drafts, ['number', 'status'], batch_size=1000)") == [1]
    assert state_writes("M.objects.bulk_update(rows, fields=('state',))") == [1]
    assert state_writes("self.status = status\nsetattr(obj, name, value)\nM.objects.bulk_update(r, ['total'])") == []
    assert state_writes("row.state_reason = ''\nx.statuses = []") == []


def test_only_state_modules_write_a_status_attribute_or_bulk_update_one() -> None:
    found = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if path.name.endswith("states.py") or "migrations" in path.parts:
                continue
            found += [f"{path.relative_to(ROOT)}:{line}" for line in state_writes(path.read_text())]
    assert found == [], "move these through the app's states.py (a portal.machine.Machine): " + ", ".join(found)


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


def test_every_states_module_declares_a_machine() -> None:
    import importlib

    from portal.machine import Machine

    modules = sorted(p for app in APPS for p in (ROOT / app).rglob("*states.py") if "migrations" not in p.parts)
    assert len(modules) >= 8
    for path in modules:
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        machines = [v for v in vars(module).values() if isinstance(v, Machine)]
        assert machines, f"{path.relative_to(ROOT)} declares no portal.machine.Machine"

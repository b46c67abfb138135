"""docs/extending.md cannot drift from the code: every extension slot in portal/extensions.py is in its table with
the slot's failure policy and the function registered for it, and every slot is registered from an
``AppConfig.ready()`` (never by a side effect of importing some module); every module that connects a signal
receiver is named in the signals table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from django.apps import apps

from portal import extensions
from portal.extensions import Slot

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "extending.md").read_text()
PRODUCT = ("portal", "tenants", "quotas", "workloads", "billing", "insights", "maintenance")
SIGNALS = {"post_save", "post_delete", "pre_save", "pre_delete", "m2m_changed", "request_started", "request_finished",
           "task_prerun", "task_postrun", "worker_process_shutdown", "worker_ready", "worker_init"}


def _slots() -> dict[str, Slot]:
    return {name: value for name, value in vars(extensions).items() if isinstance(value, Slot)}


def _slot_rows() -> dict[str, list[str]]:
    """The slot table's rows by slot name (first column), cells stripped."""
    lines = DOC.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| slot | policy |"))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    return rows


def _ready_registrations() -> dict[str, list[str]]:
    """Slot name -> the apps.py files whose ``ready()`` calls ``<slot>.register(...)``."""
    found: dict[str, list[str]] = {}
    for config in apps.get_app_configs():
        path = Path(config.module.__file__).parent / "apps.py"
        if not path.is_file() or ROOT not in path.parents:
            continue
        tree = ast.parse(path.read_text())
        for ready in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "ready"):
            for call in (n for n in ast.walk(ready) if isinstance(n, ast.Call)):
                func = call.func
                if isinstance(func, ast.Attribute) and func.attr == "register":
                    target = func.value
                    name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
                    if name:
                        found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_there_are_slots_to_check() -> None:
    assert {"submission_guard", "reserved_name", "namespace_check", "cost_estimator"} <= set(_slots())


def test_every_slot_is_in_the_table_with_its_policy_and_its_function() -> None:
    slots, rows = _slots(), _slot_rows()
    assert set(rows) == set(slots), f"docs/extending.md's slot table lists {sorted(rows)}; the code has {sorted(slots)}"
    for name, slot in slots.items():
        cells = rows[name]
        assert cells[1] == slot.policy, f"{name}: the table says {cells[1]!r}, the slot is {slot.policy!r}"
        fn = slot.provider
        assert fn is not None, f"{name}: nothing is registered for it"
        assert f"{fn.__module__}:{fn.__name__}" in cells[2], f"{name}: the table does not name {fn.__module__}:{fn.__name__}"


def test_every_slot_is_registered_from_an_app_config_ready() -> None:
    registered = _ready_registrations()
    for name in _slots():
        assert registered.get(name), f"no AppConfig.ready() registers the {name} slot"
        cells = _slot_rows()[name]
        assert any(path in cells[2] for path in registered[name]), f"{name}: the table does not name {registered[name]}"


def test_every_module_connecting_a_signal_is_in_the_signals_table() -> None:
    section = DOC[DOC.index("## Every slot, signal and registry"):]
    for app in PRODUCT:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text())
            for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
                func = call.func
                if not (isinstance(func, ast.Attribute) and func.attr == "connect"):
                    continue
                sender = func.value
                signal = sender.id if isinstance(sender, ast.Name) else getattr(sender, "attr", "")
                if signal not in SIGNALS:
                    continue
                rel = path.relative_to(ROOT)
                dotted = re.sub(r"/", ".", str(rel.with_suffix("")))
                assert str(rel) in section or dotted in section, (
                    f"{rel} connects {signal} but docs/extending.md's signals table does not name it")

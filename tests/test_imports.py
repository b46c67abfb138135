"""Apps import only downward: portal ← tenants ← quotas ← workloads ← billing ← maintenance ← insights.

A lower app never imports a higher one (tenants never imports quotas, workloads or billing; quotas
never workloads or billing; workloads never billing), and ``portal`` (the shared kit and the project
settings) imports none of them: it names them only as strings (INSTALLED_APPS, URL includes, Celery
autodiscovery). The product never imports ``sandbox`` (the test cluster); only tests do. Imports
inside functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["portal", "tenants", "quotas", "workloads", "billing", "maintenance", "insights"]
RANK = {app: n for n, app in enumerate(LAYERS)}


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``; ``package`` resolves relative ones."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def violations() -> list[str]:
    found = []
    for app in LAYERS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT)
            package = ".".join(relative.with_suffix("").parts[:-1])
            for line, module in imported_modules(path.read_text(), package):
                top = module.split(".")[0]
                if top == "sandbox":
                    found.append(f"{relative}:{line} imports {module} (only tests may use the sandbox)")
                elif top in RANK and RANK[top] > RANK[app]:
                    found.append(f"{relative}:{line} imports {module} (upward: {app} sits below {top})")
    return found


def test_the_finder_resolves_relative_imports() -> None:
    source = "from . import services\nfrom ..models import X\nimport billing.models\nfrom tenants.audit import a"
    assert imported_modules(source, "quotas.api") == [
        (1, "quotas.api"), (2, "quotas.models"), (3, "billing.models"), (4, "tenants.audit")]


def test_apps_import_only_downward_and_never_the_sandbox() -> None:
    found = violations()
    assert found == [], "\n".join(found)


def module_graph() -> dict[str, set[str]]:
    """Product module -> the product modules it imports (``from x import y`` counts ``x.y`` when that is a module)."""
    files = {}
    for app in LAYERS:
        for path in sorted((ROOT / app).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            files[name] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and ast.unparse(block.test).endswith("TYPE_CHECKING") for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in typing_only:  # type hints only: never imported at run time
                continue
            if isinstance(node, ast.ImportFrom):
                base = imported_modules(ast.unparse(node), package)[0][1]
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        if path.name == "__init__.py" and "iter_modules(__path__)" in path.read_text():
            # A registry that discovers its modules (``workloads/kinds/``) imports every one of them.
            targets |= {other for other in files if other.rpartition(".")[0] == name}
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each set of modules that import one another, directly or around a loop (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_loop() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_counts_a_registry_discovering_its_modules() -> None:
    graph = module_graph()
    assert {"workloads.kinds.notebook", "workloads.kinds.batch_inference"} <= graph["workloads.kinds"]
    # The kinds render with the building blocks of workloads.manifests, which never asks the registry back.
    assert "workloads.manifests" in graph["workloads.kinds.training"]
    assert not {m for m in graph["workloads.manifests"] if m.startswith("workloads.kinds")}


def test_no_module_import_cycles_even_through_imports_inside_functions() -> None:
    """Services queue tasks by name (``portal.events.enqueue``), so tasks → services never loops back."""
    found = cycles(module_graph())
    assert found == [], found

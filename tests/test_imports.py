"""Apps import only downward: portal ← tenants ← quotas ← workloads ← billing.

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
LAYERS = ["portal", "tenants", "quotas", "workloads", "billing"]
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

"""Structure figures for the product code: files, lines, largest functions, imports between apps, and
the markers of drift the structure work removed (view ORM reads, copied guards, raw status updates,
after-commit calls, noqa markers, and how many files name a template kind or an architecture letter).

    .venv/bin/python tests/bench/structure.py            # the working tree
    .venv/bin/python tests/bench/structure.py --rev REV  # any commit, read through git (nothing checked out)

It reads source only; nothing is imported or run.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

APPS = ("portal", "tenants", "quotas", "workloads", "billing", "maintenance", "insights")
ORDER = {app: i for i, app in enumerate(APPS)}
ROOT = Path(__file__).resolve().parents[2]


def sources(rev: str | None) -> dict[str, str]:
    """Product Python files (no migrations, no tests) -> text, from the tree or from a commit."""
    if rev:
        names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split()
    else:
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")]
    out = {}
    for name in names:
        parts = name.split("/")
        if not name.endswith(".py") or parts[0] not in APPS or "migrations" in parts:
            continue
        if rev:
            out[name] = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True,
                                       capture_output=True, text=True).stdout
        else:
            out[name] = (ROOT / name).read_text()
    return out


def imports_of(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Module-level import cycles (strongly connected components with more than one module)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def module_imports(name: str, tree: ast.AST, modules: set[str], every: bool = False, package: bool = False) -> set[str]:
    """Imports of product modules: top-level ones (import time), or ``every`` one, inside functions too (never those
    under ``if TYPE_CHECKING``). ``package``: ``name`` is a package's ``__init__`` (relative imports start there), and
    one that discovers its modules (``pkgutil.iter_modules(__path__)``, the kinds registry) imports them all."""
    found = set()
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test).endswith("TYPE_CHECKING") for n in ast.walk(block)}
    parts = name.split(".") + ([""] if package else [])
    for node in (ast.walk(tree) if every else tree.body):
        if id(node) in typing_only:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            targets = [module] + [f"{module}.{a.name}" for a in node.names]
        for t in targets:
            if t in modules:
                found.add(t)
    if package and every and "iter_modules(__path__)" in ast.unparse(tree):
        found |= {m for m in modules if m.rpartition(".")[0] == name}
    return found - {name}


def kind_names(files: dict[str, str]) -> set[str]:
    """The template kinds' names, read from the ``register(Kind(name=...))`` calls in ``workloads/kinds/``."""
    names = set()
    for path, text in files.items():
        if path.startswith("workloads/kinds/"):
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Kind":
                    names |= {k.value.value for k in node.keywords if k.arg == "name" and isinstance(k.value, ast.Constant)}
    return names


def names_a_kind(text: str, names: set[str]) -> bool:
    """A string equal to a kind's name, or ``TemplateKind.X`` (the rule of tests/test_structure.py)."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            return True
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "TemplateKind"
                and node.attr.lower() in names):
            return True
    return False


def report(rev: str | None) -> dict:
    files = sources(rev)
    per_app = Counter(n.split("/")[0] for n in files)
    lines = Counter()
    functions = []
    edges = defaultdict(set)
    modules = {n[:-3].replace("/", ".").removesuffix(".__init__"): n for n in files}
    mod_graph, deferred_graph = {}, {}
    for name, text in files.items():
        app = name.split("/")[0]
        lines[app] += text.count("\n")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{name}:{node.name}"))
        for other in imports_of(tree):
            if other in APPS and other != app:
                edges[app].add(other)
        mod = name[:-3].replace("/", ".").removesuffix(".__init__")
        package = name.endswith("/__init__.py")
        mod_graph[mod] = module_imports(mod, tree, set(modules), package=package)
        deferred_graph[mod] = module_imports(mod, tree, set(modules), every=True, package=package)
    upward = sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs if ORDER[b] > ORDER[a])
    view_files = [n for n in files if re.search(r"(views|ops_views|namespace_views)\.py$", n)]
    guard_defs = Counter()
    for text in files.values():
        for g in re.findall(r"^def (_ops_only|_require_ops|actor_of|_admin_tenant)\b", text, re.M):
            guard_defs[g] += 1
    kinds = kind_names(files) or {"notebook", "training", "inference"}  # an older commit: the three built-in ones
    kind_files = [n for n, t in files.items() if names_a_kind(t, kinds)]
    letter_files = [n for n, t in files.items()
                    if re.search(r"""(==|!=|\bin)\s*\(?\s*["'][A-F]["']""", t)]
    return {
        "files": dict(per_app), "files_total": len(files), "lines": dict(lines), "lines_total": sum(lines.values()),
        "largest": sorted(functions, reverse=True)[:10],
        "edges": {a: sorted(bs) for a, bs in sorted(edges.items())}, "upward": upward,
        "cycles": cycles(mod_graph), "deferred_cycles": cycles(deferred_graph),
        "view_orm_reads": sum(len(re.findall(r"\.objects\.(?!none\(\))", files[n])) for n in view_files),
        "raw_status_updates": sum(len(re.findall(r"\.update\(\s*status\s*=", t)) for n, t in files.items()
                                  if not n.endswith("states.py")),
        "on_commit_calls": sum(len(re.findall(r"transaction\.on_commit\(", t)) for t in files.values()),
        "noqa": sum(t.count("# noqa") for t in files.values()),
        "copied_guards": {g: c for g, c in guard_defs.items()},
        "files_naming_a_kind": len(kind_files),
        "files_naming_a_kind_outside_kinds": sorted(n for n in kind_files if not n.startswith("workloads/kinds/")),
        "files_with_architecture_letter_checks": len(letter_files),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="a commit to read instead of the working tree")
    r = report(parser.parse_args().rev)
    print(f"product files: {r['files_total']} ({', '.join(f'{a} {n}' for a, n in r['files'].items())})")
    print(f"product lines: {r['lines_total']}")
    print("largest functions (lines):")
    for n, where in r["largest"]:
        print(f"  {n:4d}  {where}")
    print("imports between apps:")
    for a, bs in r["edges"].items():
        print(f"  {a} -> {', '.join(bs)}")
    print(f"upward imports: {len(r['upward'])} {r['upward'] or ''}")
    print(f"module import cycles (import time): {len(r['cycles'])}")
    for c in r["cycles"]:
        print(f"  {' <-> '.join(c)}")
    print(f"module import cycles (counting imports inside functions): {len(r['deferred_cycles'])}")
    for c in r["deferred_cycles"]:
        print(f"  {len(c)} modules: {', '.join(c[:8])}{' ...' if len(c) > 8 else ''}")
    for key in ("view_orm_reads", "raw_status_updates", "on_commit_calls", "noqa",
                "files_naming_a_kind", "files_with_architecture_letter_checks"):
        print(f"{key.replace('_', ' ')}: {r[key]}")
    print(f"  outside workloads/kinds/: {len(r['files_naming_a_kind_outside_kinds'])} "
          f"{r['files_naming_a_kind_outside_kinds']}")
    print(f"guard definitions: {r['copied_guards']}")


if __name__ == "__main__":
    main()

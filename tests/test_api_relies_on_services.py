"""The API relies on the services' refusals: a view does not ask again a predicate its service already enforces
(``require(policy.may_...)`` at the top of the service; ``portal.api.exception_handler`` answers 403). A second copy
of the rule is a second place to forget when the rule changes. The status codes stay those of the service, which
tests/billing/test_prices.py, tests/quotas/test_api.py and tests/workloads/test_api.py check."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (API module, the service functions its views call, the predicate each service enforces itself)
CASES = [
    ("billing/api/views.py", "billing.services", ["price_create", "price_update", "price_delete", "discount_create",
                                                  "discount_delete"], "may_manage_prices"),
    ("workloads/api/views.py", "workloads.catalogue_services", ["template_create", "template_update", "image_create",
                                                      "image_update"], "may_manage_catalogue"),
    ("quotas/api/views.py", "quotas.services", ["cluster_create", "cluster_update", "cluster_sync", "flavor_create",
                                                "flavor_update"], "may_manage_capacity"),
]


def _calls(tree: ast.AST) -> list[str]:
    return [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Call)]


@pytest.mark.parametrize(("path", "module", "services", "predicate"), CASES, ids=[c[0] for c in CASES])
def test_api_views_do_not_repeat_their_services_checks(path: str, module: str, services: list[str], predicate: str) -> None:
    import importlib

    service_module = importlib.import_module(module)
    for name in services:  # the service does enforce it: the view may rely on it
        assert f"policy.{predicate}(actor)" in inspect.getsource(getattr(service_module, name)), name
    tree = ast.parse((ROOT / path).read_text())
    repeated = [call for call in _calls(tree) if predicate in call or call.startswith("_require_ops(")
                and any(word in call for word in ("register", "change clusters", "define", "change flavors",
                                                  "deactivate", "sync"))]
    assert repeated == [], f"{path} asks again what its services refuse: {repeated}"

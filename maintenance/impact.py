"""What a MIG change would do, computed before anyone approves it (docs/mig-changes.md, "Impact").

Pure functions: rows in, plain dicts out, no queries and no cluster calls (``services.py`` reads what they
need and stores their answer on the change as its ``impact`` snapshot, the numbers the approver saw):

* ``simulate_nodes``: the pool's nodes as they will look under the new layout (GPU resources replaced);
* ``capacity_rows``: capacity per flavor and resource before and after (``quotas.capacity``'s own rules);
* ``quota_plan``: the tenant and project quotas that would no longer fit, and what they become: every
  tenant promise of a (flavor, resource) is cut in proportion so that the promises fit the new capacity
  (with the cluster's overcommit), rounded down to whole units; a tenant's projects are cut the same way
  when they exceed the tenant's new promise. Nothing grows.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from quotas.capacity import capacity_by_flavor
from quotas.models import Cluster, Flavor, Node

from .layouts import GPU, MIG_PREFIX, layout_resources

ZERO = Decimal(0)
MIG_CONFIG_LABEL = "nvidia.com/mig.config"


def _is_gpu_resource(name: str) -> bool:
    return name == GPU or name.startswith(MIG_PREFIX)


def simulate_nodes(nodes: list[Node], *, model: str, layout: str, gpus: int) -> list[Node]:
    """Copies of ``nodes`` (unsaved) with the GPU resources ``layout`` gives them, counted as settled."""
    offered = layout_resources(model, layout, gpus)
    out = []
    for node in nodes:
        twin = copy.copy(node)
        allocatable = {k: v for k, v in (node.allocatable or {}).items() if not _is_gpu_resource(k)}
        allocatable.update({k: str(v) for k, v in offered.items()})
        twin.allocatable = allocatable
        twin.labels = {**(node.labels or {}), MIG_CONFIG_LABEL: layout}
        twin.mig_config_state = "success"
        twin.ready, twin.present = True, True
        out.append(twin)
    return out


def capacity_rows(cluster: Cluster, flavors: list[Flavor], nodes: list[Node], pool_nodes: set[str],
                  simulated: list[Node]) -> list[dict[str, Any]]:
    """Capacity of each active flavor and resource before and after, for the flavors the pool's nodes serve now
    or will serve (other flavors do not change). ``nodes``: every node of the cluster, as read now."""
    others = [n for n in nodes if n.name not in pool_nodes]
    pool_now = [n for n in nodes if n.name in pool_nodes]
    before = capacity_by_flavor(cluster, flavors=flavors, nodes=nodes)
    after = capacity_by_flavor(cluster, flavors=flavors, nodes=others + simulated)
    pool_before = capacity_by_flavor(cluster, flavors=flavors, nodes=pool_now)
    pool_after = capacity_by_flavor(cluster, flavors=flavors, nodes=simulated)
    rows = []
    for flavor in flavors:
        if not flavor.active:
            continue
        for resource in flavor.resource_names:
            key = (flavor.pk, resource)
            if not pool_before.get(key) and not pool_after.get(key):
                continue
            b, a = before.get(key, ZERO), after.get(key, ZERO)
            if a == b and not resource.startswith("nvidia.com/"):
                continue  # CPU and memory on the pool's nodes do not change with the layout
            rows.append({"flavor": flavor.name, "flavor_id": flavor.pk, "resource": resource,
                         "before": str(b), "after": str(a), "change": str(a - b)})
    return rows


def missing_flavors(flavors: list[Flavor], *, model: str, layout: str, gpus: int) -> list[str]:
    """GPU resources the new layout offers that no active flavor of the cluster covers (a flavor is created for
    each when the change runs, from what the inventory then discovers)."""
    covered = {r for f in flavors if f.active for r in f.resource_names}
    return sorted(r for r in layout_resources(model, layout, gpus) if r.startswith(MIG_PREFIX) and r not in covered)


def _floor(value: Decimal) -> Decimal:
    return value.quantize(Decimal(1), rounding=ROUND_FLOOR)


def quota_plan(capacity: list[dict[str, Any]], quotas: list[dict[str, Any]], *, overcommit_percent: int) -> dict[str, Any]:
    """The quotas that no longer fit the new capacity, and what each would become.

    ``capacity``: ``capacity_rows``; ``quotas``: one dict per quota row of the cluster (``id``, ``tenant``,
    ``tenant_id``, ``project`` (slug or None), ``flavor``, ``flavor_id``, ``resource``, ``nominal``).
    Returns ``{"over": [...], "changes": [...]}``: per (flavor, resource) that no longer fits, what is promised
    and allowed; per quota row that must shrink, its nominal now and after (tenants first, then projects: the
    order is reversed when applied, projects shrink before their tenant)."""
    allowed: dict[tuple[int, str], Decimal] = {}
    for row in capacity:
        cap = Decimal(row["after"])
        allowed[(row["flavor_id"], row["resource"])] = (cap * (100 + overcommit_percent) / 100).quantize(
            Decimal("0.001"), rounding=ROUND_FLOOR)
    tenants: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    projects: dict[tuple[int, str, int], list[dict[str, Any]]] = defaultdict(list)
    for q in quotas:
        key = (q["flavor_id"], q["resource"])
        if key not in allowed:
            continue
        if q["project"] is None:
            tenants[key].append(q)
        else:
            projects[(q["flavor_id"], q["resource"], q["tenant_id"])].append(q)
    over, changes = [], []
    for key, rows in sorted(tenants.items()):
        promised = sum((Decimal(q["nominal"]) for q in rows), ZERO)
        limit = allowed[key]
        if promised <= limit:
            continue
        over.append({"flavor": rows[0]["flavor"], "flavor_id": key[0], "resource": key[1], "promised": str(promised),
                     "allowed": str(limit)})
        for q in sorted(rows, key=lambda r: r["tenant"]):
            nominal = Decimal(q["nominal"])
            new = _floor(nominal * limit / promised) if promised else ZERO
            if new >= nominal:
                continue
            changes.append({**_row(q), "nominal": str(nominal), "new_nominal": str(new)})
            kids = projects.get((key[0], key[1], q["tenant_id"]), [])
            assigned = sum((Decimal(p["nominal"]) for p in kids), ZERO)
            if assigned <= new:
                continue
            for p in sorted(kids, key=lambda r: r["project"]):
                p_nominal = Decimal(p["nominal"])
                p_new = _floor(p_nominal * new / assigned) if assigned else ZERO
                if p_new < p_nominal:
                    changes.append({**_row(p), "nominal": str(p_nominal), "new_nominal": str(p_new)})
    return {"over": over, "changes": changes}


def _row(q: dict[str, Any]) -> dict[str, Any]:
    return {"id": q["id"], "tenant": q["tenant"], "project": q["project"], "flavor": q["flavor"],
            "flavor_id": q["flavor_id"], "resource": q["resource"]}


def impact_build(*, cluster: Cluster, flavors: list[Flavor], nodes: list[Node], pool_nodes: list[str], model: str,
                 gpus: int, from_layout: str, to_layout: str, quotas: list[dict[str, Any]],
                 running: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole snapshot shown before approval and stored on the change."""
    names = set(pool_nodes)
    simulated = simulate_nodes([n for n in nodes if n.name in names], model=model, layout=to_layout, gpus=gpus)
    capacity = capacity_rows(cluster, flavors, nodes, names, simulated)
    return {
        "nodes": sorted(names),
        "per_node_before": layout_resources(model, from_layout, gpus),
        "per_node_after": layout_resources(model, to_layout, gpus),
        "capacity": capacity,
        "new_flavors": missing_flavors(flavors, model=model, layout=to_layout, gpus=gpus),
        "quotas": quota_plan(capacity, quotas, overcommit_percent=cluster.overcommit_percent),
        "running": running,
    }

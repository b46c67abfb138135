"""Portal pages for capacity, flavors and quotas: this module holds the capacity page and what every quotas page
shares (the ops frame, error display, charts, the cluster and project a page names); the page groups have their own
modules: ``cluster_views`` (one cluster: settings, plan and apply, objects), ``flavor_views`` (flavors),
``quota_views`` (tenant and project quotas, quota requests), ``namespace_views``, ``spill_views``. Reads start
from ``quotas.selectors`` (and the tenancy selectors for who sees which tenant or project); writes go through
``quotas.services``; plans and applies through ``quotas.reconcile``.

Who sees what, as on the tenancy pages: ops pages (capacity, clusters, flavors) are a 404 for
everyone else; a tenant's quota split is for its tenant admins (404 for outsiders, 403 for members
who can see the tenant); a project's quota page is for everyone who sees the project (404 otherwise).
Service refusals are shown on the form that caused them, with the service's numbers ("4 over");
nothing is written then.

Numbers people compare are also charts: the views hand ``static/js/charts.js`` a small JSON spec
(``json_script``); every chart's numbers are in a table next to it, so the page reads without JavaScript.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import django_filters as filters
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.extensions import gpus_in_use_by_node
from portal.quantities import fmt
from portal.ui import Pager, filtered
from tenants import selectors as tenancy
from tenants.access import Actor
from tenants.filters import TenantSlugOrName, tenant_search_widget
from tenants.forms import add_service_error
from tenants.guards import ops_only as _ops_only
from tenants.models import Project
from tenants.ui import page

from . import selectors, services
from .capacity import flavor_enforcement, flavor_matches, node_offers, rack_fragmentation
from .exceptions import QuotaExceeded
from .filters import QuotaFilter
from .forms import (
    TenantQuotaForm,
)
from .models import Cluster, Flavor, Node, NodePool

log = logging.getLogger(__name__)
ZERO = Decimal(0)
GPU_KINDS = (Flavor.Kind.WHOLE, Flavor.Kind.MIG, Flavor.Kind.HAMI)
# Chart colours (match static/css/portal.css): capacity, promised, in use, over, free, borrowed.
COLOURS = {
    "capacity": "#94a3b8", "promised": "#2f5bd3", "used": "#1f7a3d", "over": "#b42318",
    "free": "#c9d6f6", "borrowed": "#d97706", "unassigned": "#cbd5e1", "warning": "#d97706",
}
PALETTE = ["#2f5bd3", "#1f7a3d", "#7c3aed", "#0e7490", "#b45309", "#be185d", "#4d7c0f", "#475569"]
SERVICE_FIELDS = {"flavor": "target", "resource": "target", "amount": "amount", "until": "until", "reason": "reason",
                  "nominal": "nominal", "borrowing_limit": "borrowing_limit", "lending_limit": "lending_limit",
                  "tenant": "tenant", "project": "project", "comment": "comment",
                  "share_memory_gib": "share_memory_gib", "share_cores_percent": "share_cores_percent"}


# Helpers ---------------------------------------------------------------------------------------


def _ops_page(request: HttpRequest, template: str, context: dict[str, Any], *, status: int = 200) -> HttpResponse:
    context["ops_capacity_section"] = True  # base.html: highlight "Capacity", not "Ops"
    return page(request, template, context, status=status)


def _show_error(form: forms.Form, exc: PortalError | ValidationError) -> None:
    """A service refusal on the form: a broken quota invariant reads as "Not saved: ... (4 over)"."""
    if isinstance(exc, QuotaExceeded):
        form.add_error(None, f"Not saved: {exc.message}.")
    else:
        add_service_error(form, exc, SERVICE_FIELDS)


def _error_text(exc: Exception) -> str:
    if isinstance(exc, PortalError):
        return exc.message
    if isinstance(exc, ValidationError):
        return "; ".join(exc.messages)
    return str(exc)


def _num(value: Any) -> float:
    return float(value or 0)


def _safe_next(request: HttpRequest, default: str) -> str:
    back = request.POST.get("next", "")
    return back if back.startswith("/") and not back.startswith("//") else default


def bar_chart(*, title: str, labels: list[str], datasets: list[dict[str, Any]], stacked: bool = False,
              notes: list[str] | None = None, unit: str = "") -> dict[str, Any]:
    """The JSON ``static/js/charts.js`` renders: Chart.js data without functions."""
    return {"type": "bar", "title": title, "labels": labels, "datasets": datasets, "stacked": stacked,
            "notes": notes or [], "unit": unit}


def dataset(label: str, values: list[Any], colour: str, stack: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"label": label, "data": [_num(v) for v in values], "color": colour}
    if stack:
        data["stack"] = stack
    return data


def _visible_project(actor: Actor, slug: str) -> Project:
    project = tenancy.project_seen_by(actor=actor, slug=slug)
    if project is None:
        raise Http404("No Project matches the given query.")
    return project


def _filters_of(form: forms.Form, request: HttpRequest) -> SimpleNamespace:
    """A plain form dressed as a FilterSet for ``quotas/_filters.html``."""
    return SimpleNamespace(form=form, is_active=any(request.GET.get(name) for name in form.fields))


# Capacity (ops) ---------------------------------------------------------------------------------


class NodeFilter(filters.FilterSet):
    """Nodes on the capacity page; lives with its only page."""

    STATES = [("problem", "Any problem"), ("notready", "NotReady"), ("vanished", "Vanished"),
              ("mig", "MIG change pending"), ("ok", "Counting")]

    node = filters.CharFilter(field_name="name", lookup_expr="icontains", label="Node name contains")
    pool = filters.CharFilter(field_name="pool__name", label="Pool")
    state = filters.ChoiceFilter(choices=STATES, method="filter_state", label="State")

    class Meta:
        model = Node
        fields = ["node", "pool", "state"]

    def filter_state(self, queryset, name, value):
        mig_pending = ~Q(mig_config_state__in=["", "success"])
        return queryset.filter({
            "problem": Q(ready=False) | Q(present=False) | mig_pending,
            "notready": Q(ready=False, present=True),
            "vanished": Q(present=False),
            "mig": Q(present=True) & mig_pending,
            "ok": Q(ready=True, present=True, mig_config_state__in=["", "success"]),
        }[value])


def node_flags(node: Node) -> list[tuple[str, str]]:
    """(css modifier, text) for what keeps a node from counting."""
    flags = []
    if not node.present:
        flags.append(("vanished", "Vanished"))
    elif not node.ready:
        flags.append(("notready", "NotReady"))
    if node.mig_config_state not in ("", "success"):
        flags.append(("mig", f"MIG change {node.mig_config_state}"))
    return flags


def _flavor_rows(cluster: Cluster, flavors: dict[int, Flavor], nodes: list[Node],
                 sums: dict[tuple[int, str], dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for row in selectors.overcommit_for(cluster=cluster, flavors=list(flavors.values()), nodes=nodes, sums=sums):
        extra = sums.get((row["flavor_id"], row["resource"]), {})
        flavor = flavors[row["flavor_id"]]
        rows.append(row | {
            "flavor_obj": flavor,
            "enforcement": flavor_enforcement(cluster, flavor),
            "primary": row["resource"] == flavor.primary_resource,
            "assigned": extra.get("assigned") or ZERO,
            "used": extra.get("used") or ZERO,
            "over_allowed": max(row["promised"] - row["allowed"], ZERO),
        })
    return rows


def _flavor_chart(cluster: Cluster, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    # Only what the architecture enforces is charted: a flavor nothing enforces has no capacity to promise.
    shown = [r for r in rows if r["primary"] and r["flavor_obj"].kind in GPU_KINDS and r["enforcement"].enforced]
    if not shown:
        return None
    notes = []
    for r in shown:
        if r["over"] > 0:
            percent = "no capacity at all" if r["percent_over"] is None else f"{r['percent_over']}%"
            notes.append(f"OVERCOMMITTED: {fmt(r['over'])} over capacity ({percent})")
        else:
            notes.append(f"{fmt(r['capacity'] - r['promised'])} not yet promised")
    # Promises are one bar in two parts: what fits the capacity, and the overcommit on top, in red.
    return bar_chart(
        title=f"Capacity, promised and in use per flavor on {cluster.name}",
        labels=[f"{r['flavor']} ({r['resource'].removeprefix('nvidia.com/')})" for r in shown],
        datasets=[
            dataset("Capacity", [r["capacity"] for r in shown], COLOURS["capacity"], stack="capacity"),
            dataset("Promised to tenants", [min(r["promised"], r["capacity"]) for r in shown], COLOURS["promised"], stack="promised"),
            dataset("Promised over capacity (overcommit)", [r["over"] for r in shown], COLOURS["over"], stack="promised"),
            dataset("In use", [r["used"] for r in shown], COLOURS["used"], stack="used"),
        ],
        stacked=True,
        notes=notes,
    )


def _pool_rows(cluster: Cluster, pool_list: list[NodePool], flavors: dict[int, Flavor],
               flavor_rows: list[dict[str, Any]], nodes: list[Node]) -> list[dict[str, Any]]:
    """Per node pool: its nodes by state, and what it offers of each flavor (counting, and lost to
    nodes that do not count), next to the flavor's totals. Promises are per flavor, not per pool."""
    by_flavor = {(r["flavor_id"], r["resource"]): r for r in flavor_rows}
    pools: dict[int | None, dict[str, Any]] = {}
    for pool in pool_list:
        pools[pool.pk] = {"pool": pool, "nodes": 0, "counting": 0, "notready": 0, "vanished": 0, "mig": 0,
                          "offers": defaultdict(lambda: [ZERO, ZERO])}
    gpu_flavors = [f for f in flavors.values() if f.kind in GPU_KINDS]
    for node in nodes:
        entry = pools.setdefault(node.pool_id, {"pool": None, "nodes": 0, "counting": 0, "notready": 0, "vanished": 0,
                                                "mig": 0, "offers": defaultdict(lambda: [ZERO, ZERO])})
        entry["nodes"] += 1
        counts = node.counts_capacity
        if counts:
            entry["counting"] += 1
        for css, _text in node_flags(node):
            entry[css] += 1
        for flavor in gpu_flavors:
            if not flavor_matches(flavor, node):
                continue
            amount = node_offers(flavor, node).get(flavor.primary_resource, ZERO)
            if amount:
                entry["offers"][flavor.pk][0 if counts else 1] += amount
    out = []
    for entry in pools.values():
        offers = []
        for flavor_id, (counting, lost) in sorted(entry["offers"].items(), key=lambda kv: (flavors[kv[0]].order, flavors[kv[0]].name)):
            flavor = flavors[flavor_id]
            totals = by_flavor.get((flavor_id, flavor.primary_resource), {})
            offers.append({"flavor": flavor, "resource": flavor.primary_resource, "counting": counting, "lost": lost,
                           "capacity": totals.get("capacity", ZERO), "promised": totals.get("promised", ZERO),
                           "used": totals.get("used", ZERO)})
        out.append(entry | {"offers": offers})
    return out


def _pool_chart(cluster: Cluster, pools: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not any(p["nodes"] for p in pools):
        return None
    labels = [p["pool"].name if p["pool"] else "(no pool)" for p in pools]
    return bar_chart(
        title=f"Nodes per pool on {cluster.name}",
        labels=labels,
        datasets=[
            dataset("Counting", [p["counting"] for p in pools], COLOURS["used"], stack="nodes"),
            dataset("NotReady", [p["notready"] for p in pools], COLOURS["warning"], stack="nodes"),
            dataset("Vanished", [p["vanished"] for p in pools], COLOURS["over"], stack="nodes"),
            dataset("MIG change pending", [p["mig"] for p in pools], COLOURS["capacity"], stack="nodes"),
        ],
        stacked=True,
        unit="nodes",
    )


def _cluster_from_query(request: HttpRequest, actor: Actor) -> tuple[list[Cluster], Cluster | None]:
    clusters = selectors.capacity_clusters()  # ops pages only: every cluster
    name = request.GET.get("cluster")
    if not clusters:
        return clusters, None
    if not name:
        return clusters, clusters[0]
    cluster = next((c for c in clusters if c.name == name), None)
    if cluster is None:
        raise Http404("No such cluster.")
    return clusters, cluster


NODE_HIDDEN = ("pods", "ephemeral-storage")  # allocatable resources the node table leaves out


def _capacity_page(request: HttpRequest, actor: Actor, clusters: list[Cluster], cluster: Cluster | None, *,
                   form: TenantQuotaForm | None = None) -> HttpResponse:
    context: dict[str, Any] = {"tab": "capacity", "clusters": clusters, "cluster": cluster}
    if cluster is None:
        return _ops_page(request, "quotas/capacity.html", context)
    # Read once, used for everything below: the flavors, the nodes (capacity, pools, the node table), the
    # quota sums (promised, assigned, in use). docs/performance.md: each page at most ten queries.
    # Kept queries (``portal.compiled``): the page is for ops, who see every flavor (``selectors.flavors_for``).
    flavors = {f.pk: f for f in selectors.capacity_flavors(cluster=cluster)}
    all_nodes = selectors.capacity_nodes(cluster=cluster)
    sums = selectors.quota_sums_for(cluster=cluster)  # the tenants' and the projects' sums: one query
    flavor_rows = _flavor_rows(cluster, flavors, all_nodes, sums)
    # A pool no node is in any more (a MIG change moved them to the new layout's pool) is not shown, nor offered
    # in the node filter.
    with_nodes = {node.pool_id for node in all_nodes}
    pool_list = [p for p in selectors.capacity_pools(cluster=cluster) if p.pk in with_nodes]
    pools = _pool_rows(cluster, pool_list, flavors, flavor_rows, all_nodes)

    nodes = selectors.nodes_for(cluster=cluster).order_by("present", "ready", "name")
    node_filter = filtered(NodeFilter, request, nodes, selects={"pool": [(p.name, p.name) for p in pool_list]})
    if node_filter.is_active:  # which of the nodes already read match: one query for their ids
        node_filter.form.is_valid()
        matching = set(node_filter.qs.values_list("pk", flat=True)) if not node_filter.form.errors else set()
        shown_nodes = [n for n in all_nodes if n.pk in matching]
    else:
        shown_nodes = all_nodes
    node_pager = Pager(request, shown_nodes, param="nodes_page")
    # What each row shows, worked out here rather than by loops and comparisons in the template.
    node_rows = [(node, node_flags(node), [(k, v) for k, v in (node.allocatable or {}).items() if k not in NODE_HIDDEN])
                 for node in node_pager]

    promises = selectors.tenant_promises_for(cluster=cluster)
    quota_filter = filtered(QuotaFilter, request, promises, hide=("project", "cluster", "flavor", "level"),
                            selects={"flavor_name": [(f.name, f.name) for f in flavors.values()]})
    quota_filter.filters["tenant"] = TenantSlugOrName(field_name="tenant")
    tenant_search_widget(quota_filter.form.fields["tenant"], list_id="tenant-options")
    # Unfiltered, the sums above counted the rows: the pager need not.
    known = None if quota_filter.is_active else sum(r["tenant_rows"] for r in sums.values())
    quota_pager = Pager(request, quota_filter.qs, param="quotas_page", count=known,
                        first=None if quota_filter.is_active else lambda: selectors.tenant_promises_first(cluster=cluster, flavors=flavors))
    quota_items = list(quota_pager)
    checks = selectors.quota_confirmations(quota_items)
    not_enforced = [(f, flavor_enforcement(cluster, f)) for f in flavors.values()]
    context |= {
        "flavor_rows": flavor_rows,
        "not_enforced": [(f, e) for f, e in not_enforced if not e.enforced],
        "overcommitted": [r for r in flavor_rows if r["over"] > 0],
        "flavor_chart": _flavor_chart(cluster, flavor_rows),
        "pools": pools,
        "pool_chart": _pool_chart(cluster, pools),
        # Placed flavors only (a cluster with a topology): free GPUs in total vs. within one rack.
        "rack_free": rack_fragmentation(cluster, flavors.values(), all_nodes, gpus_in_use_by_node.call(cluster))
                     if cluster.topology else [],
        "node_filter": node_filter,
        "node_pager": node_pager,
        "node_rows": node_rows,
        "quota_filter": quota_filter,
        "quota_pager": quota_pager,
        "quota_rows": [(q, checks[q.pk]) for q in quota_items],
        "usage_readings": [{"usage_read_at": cluster.reconciled_at}],
        "keep": [("cluster", cluster.name)],
        "form": form or TenantQuotaForm(flavors=[f for f, e in not_enforced if e.enforced]),
    }
    tenant_search_widget(context["form"].fields["tenant"], list_id="tenant-options")
    return _ops_page(request, "quotas/capacity.html", context)


@login_required
def capacity(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    clusters, cluster = _cluster_from_query(request, actor)
    return _capacity_page(request, actor, clusters, cluster)


@login_required
@require_POST
def tenant_quota_set(request: HttpRequest) -> HttpResponse:
    """Ops set what a tenant is promised; the cluster invariant (capacity plus overcommit) is the service's."""
    actor = _ops_only(request)
    clusters, cluster = _cluster_from_query(request, actor)
    if cluster is None:
        raise Http404("No cluster yet.")
    flavors = selectors.flavors_for(actor=actor).filter(selectors.enforced_flavor_q(), cluster=cluster)
    form = TenantQuotaForm(request.POST, tenants=tenancy.tenants_for(actor=actor).order_by("name"), flavors=flavors)
    if form.is_valid():
        flavor, resource = form.cleaned_target()
        tenant = form.cleaned_tenant()
        try:
            row = services.quota_set(actor=actor, tenant=tenant, flavor=flavor, resource=resource, nominal=form.cleaned_data["nominal"])
        except (PortalError, ValidationError) as exc:
            _show_error(form, exc)
        else:
            messages.success(request, f"{tenant.name} is now promised {fmt(row.nominal)} × {resource} of {flavor.name}.")
            return redirect(reverse("ops-capacity") + f"?cluster={cluster.name}")
    return _capacity_page(request, actor, clusters, cluster, form=form)


# Clusters (ops): the one a page names (the pages themselves: cluster_views.py) ------------------------


def _ops_cluster(actor: Actor, name: str) -> Cluster:
    return get_object_or_404(selectors.clusters_for(actor=actor), name=name)



"""Portal pages for capacity, flavors and quotas. Reads start from ``quotas.selectors`` (and the
tenancy selectors for who sees which tenant or project); writes go through ``quotas.services``;
plans and applies through ``quotas.reconcile``.

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
from django.db.models import F, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal import bulk, extensions
from portal.exceptions import PortalError
from portal.inputs import is_id
from portal.quantities import fmt
from portal.ui import Pager, filtered
from tenants import selectors as tenancy
from tenants.access import Actor
from tenants.guards import ops_only as _ops_only
from tenants.guards import tenant_to_change as _admin_tenant
from tenants.filters import TenantSlugOrName, tenant_search_widget
from tenants.forms import add_service_error
from tenants.models import Project, Tenant
from tenants.ui import page

from . import architecture as architecture_service
from . import reconcile, selectors, services
from .capacity import flavor_enforcement, flavor_matches, node_offers
from .exceptions import NothingToApply, PlanChanged, QuotaExceeded
from .filters import FlavorFilter, QuotaFilter, QuotaRequestFilter
from .forms import (
    ArchitectureForm,
    ClusterCreateForm,
    ClusterSettingsForm,
    DecisionForm,
    FlavorForm,
    ProjectQuotaForm,
    QuotaRequestForm,
    TenantQuotaForm,
    target_key,
)
from .models import AppliedObject, Architecture, Cluster, Flavor, Node, NodePool, QuotaRequest

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
    return get_object_or_404(tenancy.projects_for(actor=actor).select_related("tenant"), slug=slug)


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
    clusters = list(selectors.clusters_for(actor=actor).order_by("name"))
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
    flavors = {f.pk: f for f in selectors.flavors_for(actor=actor).filter(cluster=cluster, active=True)}
    for flavor in flavors.values():
        flavor.cluster = cluster
    all_nodes = list(selectors.nodes_for(cluster=cluster).order_by("present", "ready", "name"))
    sums = selectors.quota_sums_for(cluster=cluster)  # the tenants' and the projects' sums: one query
    flavor_rows = _flavor_rows(cluster, flavors, all_nodes, sums)
    # A pool no node is in any more (a MIG change moved them to the new layout's pool) is not shown, nor offered
    # in the node filter.
    with_nodes = {node.pool_id for node in all_nodes}
    pool_list = [p for p in selectors.node_pools_for(cluster=cluster) if p.pk in with_nodes]
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
    quota_pager = Pager(request, quota_filter.qs, param="quotas_page", count=known)
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


# Clusters (ops): settings, plan and apply, export, applied objects ---------------------------------


@login_required
def cluster_new(request: HttpRequest) -> HttpResponse:
    """Register a cluster, as ``POST /api/v1/clusters/`` does; its first sync and reconcile follow."""
    actor = _ops_only(request)
    form = ClusterCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            cluster = services.cluster_create(actor=actor, **form.cleaned_data)
        except (PortalError, ValidationError) as exc:
            _show_error(form, exc)
        else:
            messages.success(request, f"Cluster {cluster.name} registered. Its inventory sync and first reconcile are queued.")
            return redirect(reverse("ops-capacity") + f"?cluster={cluster.name}")
    return _ops_page(request, "quotas/cluster_new.html", {"tab": "cluster-new", "form": form})


def _ops_cluster(actor: Actor, name: str) -> Cluster:
    return get_object_or_404(selectors.clusters_for(actor=actor), name=name)


plan_fingerprint = reconcile.plan_fingerprint


def _plan_for(cluster: Cluster, architecture: str) -> tuple[reconcile.Plan | None, str | None]:
    try:
        return architecture_service.plan_for(cluster, architecture), None
    except Exception as exc:
        log.warning("plan for cluster %s failed: %s", cluster.name, exc)
        return None, _error_text(exc) or exc.__class__.__name__


def diff_lines(diff: str) -> list[tuple[str, str]]:
    """A unified diff as (css class, line) for colouring."""
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            css = "file"
        elif line.startswith("@@"):
            css = "hunk"
        elif line.startswith("+"):
            css = "add"
        elif line.startswith("-"):
            css = "del"
        else:
            css = "ctx"
        out.append((css, line))
    return out


class PlanFilterForm(forms.Form):
    action = forms.ChoiceField(required=False, label="Action", choices=[
        ("", "Any"), ("create", "Create"), ("change", "Change"), ("delete", "Delete")])
    owner = forms.CharField(required=False, label="Tenant slug")


def _cluster_page(request: HttpRequest, actor: Actor, cluster: Cluster, *, architecture: str | None = None,
                  settings_form: ClusterSettingsForm | None = None) -> HttpResponse:
    architecture = architecture or cluster.architecture
    plan, plan_error = _plan_for(cluster, architecture)
    filter_form = PlanFilterForm(request.GET or None)
    items: list[Any] = []
    if plan is not None:
        items = plan.items
        if filter_form.is_valid():
            action, owner = filter_form.cleaned_data["action"], filter_form.cleaned_data["owner"]
            if action:
                items = [i for i in items if (i.action == "replace" and action == "change") or i.action == action]
            if owner:
                items = [i for i in items if i.tenant == owner]
    pager = Pager(request, items, param="plan_page")  # type: ignore[arg-type]
    context = {
        "tab": "plan",
        "cluster": cluster,
        "architecture": architecture,
        "architecture_label": Architecture(architecture).label,
        "changing_architecture": architecture != cluster.architecture,
        "arch_form": ArchitectureForm(initial={"architecture": architecture}),
        "settings_form": settings_form or ClusterSettingsForm.for_cluster(cluster),
        "plan": plan,
        "plan_error": plan_error,
        "fingerprint": plan_fingerprint(plan) if plan is not None else "",
        "plan_filter": _filters_of(filter_form, request),
        "keep": [("architecture", architecture)],
        "pager": pager,
        "plan_items": [(item, diff_lines(item.diff)) for item in pager],
        "tenants": tenancy.tenants_for(actor=actor).order_by("name").values_list("slug", "name"),
        "errors_count": selectors.applied_objects_for(actor=actor, cluster=cluster).exclude(error="").count(),
        "change": selectors.architecture_change_latest(cluster),
        "policies": list(reconcile.POLICIES.items()),
        "plan_workloads": [e | {"effects": [(p, reconcile.impact_text(e, p)) for p in reconcile.POLICIES]}
                           for e in (plan.impact or [])] if plan is not None else [],
    }
    return _ops_page(request, "quotas/cluster_detail.html", context)


@login_required
def cluster_detail(request: HttpRequest, name: str) -> HttpResponse:
    actor = _ops_only(request)
    cluster = _ops_cluster(actor, name)
    form = ArchitectureForm(request.GET)
    architecture = form.cleaned_data["architecture"] if "architecture" in request.GET and form.is_valid() else None
    return _cluster_page(request, actor, cluster, architecture=architecture)


@login_required
@require_POST
def cluster_settings(request: HttpRequest, name: str) -> HttpResponse:
    actor = _ops_only(request)
    cluster = _ops_cluster(actor, name)
    form = ClusterSettingsForm.for_cluster(cluster, request.POST)
    if form.is_valid():
        try:
            services.cluster_update(actor=actor, cluster=cluster, **form.cleaned_data)
        except (PortalError, ValidationError) as exc:
            _show_error(form, exc)
        else:
            messages.success(request, f"Settings of {cluster.name} saved.")
            return redirect("ops-cluster", name=cluster.name)
    cluster.refresh_from_db()
    return _cluster_page(request, actor, cluster, settings_form=form)


@login_required
@require_POST
def cluster_sync(request: HttpRequest, name: str) -> HttpResponse:
    """Queue an inventory sync and a reconcile of one cluster now (instead of waiting for beat)."""
    actor = _ops_only(request)
    cluster = _ops_cluster(actor, name)
    services.cluster_sync(actor=actor, cluster=cluster)
    messages.success(request, f"Inventory sync and reconcile of {cluster.name} queued; refresh in a moment.")
    return redirect(f"{reverse('ops-capacity')}?cluster={cluster.name}")


@login_required
@require_POST
def cluster_apply(request: HttpRequest, name: str) -> HttpResponse:
    """Start applying the plan the person reviewed (``quotas.architecture``); a worker applies it."""
    actor = _ops_only(request)
    cluster = _ops_cluster(actor, name)
    form = ArchitectureForm(request.POST)
    url = reverse("ops-cluster", kwargs={"name": cluster.name})
    if not form.is_valid():
        messages.error(request, "Choose one of the reference architectures.")
        return redirect(url)
    architecture = form.cleaned_data["architecture"]
    if architecture != cluster.architecture:
        url += f"?architecture={architecture}"
    try:
        architecture_service.architecture_change_start(actor=actor, cluster=cluster, architecture=architecture,
                                                       fingerprint=request.POST.get("fingerprint", ""),
                                                       policy=request.POST.get("policy", reconcile.DRAIN))
    except NothingToApply as exc:
        messages.info(request, exc.message)
        return redirect(url)
    except PlanChanged:
        messages.warning(request, "Nothing was applied: the plan changed since you reviewed it. Review the new plan below.")
        return redirect(url)
    except PortalError as exc:
        messages.error(request, f"Nothing was applied: {exc.message}")
        return redirect(url)
    except Exception as exc:
        messages.error(request, f"Nothing was applied: the plan could not be made ({_error_text(exc) or exc.__class__.__name__}).")
        return redirect(url)
    messages.success(request, f"Applying the plan to {cluster.name} (architecture {architecture}); its progress is shown below.")
    return redirect(reverse("ops-cluster", kwargs={"name": cluster.name}))


@login_required
def cluster_change_progress(request: HttpRequest, name: str) -> HttpResponse:
    """The latest architecture change of a cluster (the fragment the cluster page polls while it runs)."""
    actor = _ops_only(request)
    cluster = _ops_cluster(actor, name)
    return render(request, "quotas/_architecture_change.html",
                  {"cluster": cluster, "change": selectors.architecture_change_latest(cluster)})


@login_required
def cluster_export(request: HttpRequest, name: str) -> HttpResponse:
    """The desired state as YAML (the cluster's, or one tenant's), as a download for review in Git."""
    actor = _ops_only(request)
    cluster = _ops_cluster(actor, name)
    slug = request.GET.get("tenant") or None
    tenant = get_object_or_404(tenancy.tenants_for(actor=actor), slug=slug) if slug else None
    text = reconcile.export_yaml(cluster, tenant)
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    filename = f"{cluster.name}-{tenant.slug}.yaml" if tenant else f"{cluster.name}.yaml"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


class AppliedObjectFilter(filters.FilterSet):
    """What the materializer applied to one cluster; lives with its only page."""

    kind = filters.CharFilter(label="Kind")
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant")
    name = filters.CharFilter(lookup_expr="icontains", label="Name contains")
    errors = filters.BooleanFilter(method="filter_errors", label="Only errors")

    class Meta:
        model = AppliedObject
        fields = ["kind", "tenant", "name", "errors"]

    def filter_errors(self, queryset, name, value):
        if value is None:
            return queryset
        return queryset.exclude(error="") if value else queryset.filter(error="")


@login_required
def cluster_objects(request: HttpRequest, name: str) -> HttpResponse:
    actor = _ops_only(request)
    cluster = _ops_cluster(actor, name)
    applied = selectors.applied_objects_for(actor=actor, cluster=cluster)
    rows = applied.select_related("tenant", "project").order_by(F("error_at").desc(nulls_last=True), "kind", "namespace", "name")
    kinds = applied.order_by("kind").values_list("kind", flat=True).distinct()
    tenants = tenancy.tenants_for(actor=actor).order_by("name").values_list("slug", "name")
    filterset = filtered(AppliedObjectFilter, request, rows, selects={"kind": [(k, k) for k in kinds], "tenant": list(tenants)})
    context = {"tab": "objects", "cluster": cluster, "filterset": filterset, "pager": Pager(request, filterset.qs),
               "errors_count": rows.exclude(error="").count()}
    return _ops_page(request, "quotas/cluster_objects.html", context)


# Flavors (ops) -------------------------------------------------------------------------------------


def _flavor_list(request: HttpRequest, actor: Actor, *, form: FlavorForm | None = None) -> HttpResponse:
    flavors = selectors.flavors_for(actor=actor).order_by("cluster__name", "order", "name")
    clusters = list(selectors.clusters_for(actor=actor).order_by("name"))
    filterset = filtered(FlavorFilter, request, flavors, selects={"cluster": [(c.name, c.name) for c in clusters]})
    pager = Pager(request, filterset.qs)
    context = {"tab": "flavors", "filterset": filterset, "pager": pager,
               "flavor_rows": [(f, flavor_enforcement(f.cluster, f)) for f in pager],
               "form": form or FlavorForm(clusters=clusters), "has_clusters": bool(clusters)}
    return _ops_page(request, "quotas/flavor_list.html", context)


@login_required
def flavor_list(request: HttpRequest) -> HttpResponse:
    return _flavor_list(request, _ops_only(request))


@login_required
@require_POST
def flavor_create(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    form = FlavorForm(request.POST, clusters=selectors.clusters_for(actor=actor).order_by("name"))
    if form.is_valid():
        try:
            flavor = services.flavor_create(actor=actor, **form.service_kwargs())
        except (PortalError, ValidationError) as exc:
            _show_error(form, exc)
        else:
            messages.success(request, f"Flavor {flavor.name} created on {flavor.cluster.name}. The next reconcile adds its ResourceFlavor.")
            return redirect("ops-flavors")
    return _flavor_list(request, actor, form=form)


def _flavor(actor: Actor, pk: int) -> Flavor:
    return get_object_or_404(selectors.flavors_for(actor=actor), pk=pk)


@login_required
def flavor_detail(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _ops_only(request)
    flavor = _flavor(actor, pk)
    form = FlavorForm(clusters=[flavor.cluster], flavor=flavor)
    if request.method == "POST":
        form = FlavorForm(request.POST, clusters=[flavor.cluster], flavor=flavor)
        if form.is_valid():
            try:
                flavor = services.flavor_update(actor=actor, flavor=flavor, **form.service_kwargs())
            except (PortalError, ValidationError) as exc:
                _show_error(form, exc)
            else:
                messages.success(request, f"Flavor {flavor.name} saved.")
                return redirect("ops-flavor", pk=flavor.pk)
    quotas = selectors.flavor_quota_count(flavor=flavor)
    return _ops_page(request, "quotas/flavor_detail.html", {"tab": "flavors", "flavor": flavor, "form": form, "quota_rows": quotas,
                                                            "enforcement": flavor_enforcement(flavor.cluster, flavor)})


@login_required
@require_POST
def flavor_active(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _ops_only(request)
    flavor = _flavor(actor, pk)
    active = request.POST.get("active") == "true"
    try:
        flavor = services.flavor_update(actor=actor, flavor=flavor, active=active)
    except (PortalError, ValidationError) as exc:
        messages.error(request, _error_text(exc))
    else:
        what = "offered again" if active else "no longer offered: the next reconcile removes its ResourceFlavor"
        messages.success(request, f"Flavor {flavor.name} is {what}.")
    return redirect("ops-flavor", pk=flavor.pk)


# Tenant quota split (tenant admins, ops) ---------------------------------------------------------


def _tenant_quotas(request: HttpRequest, actor: Actor, tenant: Tenant, *, form: ProjectQuotaForm | None = None) -> HttpResponse:
    tenant_rows = list(selectors.tenant_quotas_for(tenant=tenant))
    project_rows = selectors.project_quotas_for(tenant=tenant)
    split: dict[tuple[int, str], dict[str, Decimal]] = defaultdict(lambda: {"assigned": ZERO, "used": ZERO})
    by_project: dict[tuple[int, str], dict[str, Decimal]] = defaultdict(dict)
    # The same query tells when the in-use figures were read (the oldest of the rows' clusters' readings).
    readings: set[Any] = set()
    for row in project_rows.values("project__slug", "flavor_id", "resource", "nominal", "used",
                                   "flavor__cluster__reconciled_at"):
        key = (row["flavor_id"], row["resource"])
        split[key]["assigned"] += row["nominal"]
        split[key]["used"] += row["used"]
        by_project[key][row["project__slug"]] = row["nominal"]
        readings.add(row["flavor__cluster__reconciled_at"])
    summary = []
    for row in tenant_rows:
        s = split[(row.flavor_id, row.resource)]
        summary.append({"row": row, "assigned": s["assigned"], "unassigned": row.nominal - s["assigned"], "used": s["used"]})

    projects = list(tenancy.projects_for(actor=actor).filter(tenant=tenant).order_by("name"))
    rows = project_rows.order_by("project__name", "flavor__order", "flavor__name", "resource")
    flavors = [s["row"].flavor for s in summary]
    unique_flavors = list({f.pk: f for f in flavors}.values())
    filterset = filtered(QuotaFilter, request, rows, hide=("tenant", "cluster", "flavor", "level"),
                         selects={"project": [(p.slug, p.name) for p in projects],
                                  "flavor_name": [(f.name, f.name) for f in unique_flavors]})
    pager = Pager(request, filterset.qs)
    page_rows = list(pager)
    # What the cluster confirmed, for the tenant's rows and the page's project rows: one query for both.
    checks = selectors.quota_confirmations(tenant_rows + page_rows)
    for s in summary:
        s["check"] = checks[s["row"].pk]
    charted = [s for s in summary if s["row"].flavor.kind in GPU_KINDS and s["row"].resource == s["row"].flavor.primary_resource
               and s["check"]["enforced"]]
    chart = None
    if charted:
        datasets = [
            dataset(p.name, [by_project[(s["row"].flavor_id, s["row"].resource)].get(p.slug, ZERO) for s in charted],
                    PALETTE[i % len(PALETTE)], stack="split")
            for i, p in enumerate(projects)
        ]
        datasets.append(dataset("Unassigned", [max(s["unassigned"], ZERO) for s in charted], COLOURS["unassigned"], stack="split"))
        chart = bar_chart(title=f"How {tenant.name} splits its quota across projects",
                          labels=[f"{s['row'].flavor.name} ({s['row'].resource.removeprefix('nvidia.com/')})" for s in charted],
                          datasets=datasets, stacked=True,
                          notes=[f"tenant quota {fmt(s['row'].nominal)}, in use {fmt(s['used'])}" for s in charted])

    if form is None:
        initial: dict[str, Any] = {}
        edit = request.GET.get("edit")
        if is_id(edit):
            editing = project_rows.filter(pk=int(edit)).first()
            if editing is not None:
                initial = {"project": editing.project.slug, "target": target_key(editing.flavor, editing.resource),
                           "nominal": fmt(editing.nominal),
                           "borrowing_limit": None if editing.borrowing_limit is None else fmt(editing.borrowing_limit),
                           "lending_limit": None if editing.lending_limit is None else fmt(editing.lending_limit)}
        offered = [f for f in unique_flavors if tenant_checks_enforced(summary, f)]
        form = ProjectQuotaForm(projects=[p for p in projects if p.is_active], flavors=offered, initial=initial)
    context = {"tenant": tenant, "tab": "quotas", "summary": summary,
               "chart": chart, "filterset": filterset, "pager": pager, "form": form,
               "project_rows": [(q, checks[q.pk]) for q in page_rows],
               "usage_readings": [{"flavor__cluster__reconciled_at": at} for at in readings],
               "not_enforced": [s for s in summary if not s["check"]["enforced"]],
               "quota_notices": extensions.quota_notices.call(tenant=tenant) or []}
    return page(request, "quotas/tenant_quotas.html", context)


def tenant_checks_enforced(summary: list[dict[str, Any]], flavor: Flavor) -> bool:
    return next((s["check"]["enforced"] for s in summary if s["row"].flavor_id == flavor.pk), False)


@login_required
def tenant_quotas(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    return _tenant_quotas(request, actor, _admin_tenant(actor, slug))


@login_required
@require_POST
def project_quota_set(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    projects = tenancy.projects_for(actor=actor).filter(tenant=tenant).order_by("name")
    flavors = selectors.flavors_promised_to(tenant=tenant)
    form = ProjectQuotaForm(request.POST, projects=projects, flavors=flavors)
    if form.is_valid():
        flavor, resource = form.cleaned_target()
        project = form.cleaned_project()
        data = form.cleaned_data
        try:
            row = services.quota_set(actor=actor, project=project, flavor=flavor, resource=resource, nominal=data["nominal"],
                                     borrowing_limit=data["borrowing_limit"], lending_limit=data["lending_limit"])
        except (PortalError, ValidationError) as exc:
            _show_error(form, exc)
        else:
            messages.success(request, f"{project.name} now has {fmt(row.nominal)} × {resource} of {flavor.name}.")
            return redirect("tenant-quotas", slug=tenant.slug)
    return _tenant_quotas(request, actor, tenant, form=form)


# Project quota (members) -------------------------------------------------------------------------


def _usage_chart(project: Project, rows: list[dict[str, Any]], flavors: dict[int, Flavor]) -> dict[str, Any] | None:
    shown = [r for r in rows if flavors[r["flavor_id"]].kind in GPU_KINDS and r["resource"] == flavors[r["flavor_id"]].primary_resource
             and r["enforced"]]
    if not shown:
        return None
    return bar_chart(
        title=f"{project.name}: quota in use, borrowed and free",
        labels=[f"{r['flavor']} ({r['resource'].removeprefix('nvidia.com/')})" for r in shown],
        datasets=[
            dataset("In use (own quota)", [max(r["used"] - r["borrowed"], ZERO) for r in shown], COLOURS["used"], stack="q"),
            dataset("Borrowed", [r["borrowed"] for r in shown], COLOURS["borrowed"], stack="q"),
            dataset("Free", [r["free"] for r in shown], COLOURS["free"], stack="q"),
        ],
        stacked=True,
        notes=[f"nominal quota {fmt(r['nominal'])}" for r in shown],
    )


def _listed(requests: QuerySet[QuotaRequest]) -> QuerySet[QuotaRequest]:
    """Quota requests as their cards and table rows read them: their own shown columns, no join (the related rows
    come after the page, ``_shown``)."""
    return selectors.quota_requests_listed(requests)


def _shown(*pages: Any) -> None:
    """Put the related rows the cards, table rows and request lines show on the rows of ``pages`` (Pagers or lists
    of quota requests): one query for them all (``selectors.with_shown_related``)."""
    selectors.with_shown_related([r for rows in pages for r in rows])


def _project_quota(request: HttpRequest, actor: Actor, project: Project, *, form: QuotaRequestForm | None = None) -> HttpResponse:
    tenant = project.tenant
    row_flavors: dict[int, Flavor] = {}
    rows = selectors.project_quota_summary(project=project, flavors=row_flavors)
    requests = _listed(selectors.quota_requests_for(actor=actor)).filter(project=project).order_by("-created_at")
    filterset = filtered(QuotaRequestFilter, request, requests, hide=("tenant", "project", "flavor", "inbox", "approver"))
    pager = Pager(request, filterset.qs)
    _shown(pager)
    flavors = selectors.flavors_for(actor=actor).filter(selectors.enforced_flavor_q()).order_by("cluster__name", "order", "name")
    context = {
        "project": project, "tenant": tenant, "rows": rows, "chart": _usage_chart(project, rows, row_flavors),
        "form": form or QuotaRequestForm(flavors=flavors, initial={"target": request.GET.get("target", "")}),
        "filterset": filterset, "pager": pager,
        "not_enforced": [r for r in rows if not r["enforced"]],
        "drifting": [r for r in rows if r["drift"]],
        "quota_notices": extensions.quota_notices.call(tenant=tenant, project=project) or [],
    }
    return page(request, "quotas/project_quota.html", context)


@login_required
def project_quota(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    return _project_quota(request, actor, _visible_project(actor, slug))


@login_required
@require_POST
def quota_request_create(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    project = _visible_project(actor, slug)
    form = QuotaRequestForm(request.POST, flavors=selectors.flavors_for(actor=actor).filter(selectors.enforced_flavor_q()))
    if form.is_valid():
        flavor, resource = form.cleaned_target()
        data = form.cleaned_data
        try:
            created = services.quota_request_create(actor=actor, project=project, flavor=flavor, resource=resource,
                                                    amount=data["amount"], reason=data["reason"], until=data["until"],
                                                    share_memory_gib=data.get("share_memory_gib"),
                                                    share_cores_percent=data.get("share_cores_percent"))
        except (PortalError, ValidationError) as exc:
            _show_error(form, exc)
        else:
            total = f" ({created.share_totals} in all)" if created.is_share else ""
            messages.success(request, f"Request #{created.pk} sent: {created.what}{total}. "
                                      f"It waits for {created.get_approver_display().lower()} approval.")
            return redirect("project-quota", slug=project.slug)
    return _project_quota(request, actor, project, form=form)


# Quota requests: mine and the approver's inbox ---------------------------------------------------


def _item_context(item: QuotaRequest, *, error: str | None = None, note: str | None = None,
                  form: DecisionForm | None = None, next_url: str | None = None) -> dict[str, Any]:
    """The card's context; the card asks the predicates who may decide or withdraw (``{% may %}``)."""
    current = selectors.quotas_asked_for([item]).get(item.pk)
    return {"r": item, "current": current, "error": error, "note": note, "form": form, "next_url": next_url}


def _all_requests(request: HttpRequest, actor: Actor) -> dict[str, Any]:
    visible = _listed(selectors.quota_requests_for(actor=actor)).order_by("-created_at")
    filterset = filtered(QuotaRequestFilter, request, visible, hide=("inbox", "flavor"), selects={
        "project": list(tenancy.projects_for(actor=actor).order_by("name").values_list("slug", "name")),
    })
    # Tenants may be thousands: typed (slug or name), with suggestions as one types (the page's datalist).
    filterset.filters["tenant"] = TenantSlugOrName(field_name="project__tenant")
    tenant_search_widget(filterset.form.fields["tenant"], list_id="tenant-options")
    return {"filterset": filterset, "pager": Pager(request, filterset.qs)}


@login_required
def quota_requests(request: HttpRequest) -> HttpResponse:
    actor = Actor.from_request(request)
    inbox_qs = _listed(selectors.quota_requests_for(actor=actor, inbox=True)).order_by("created_at")
    if request.htmx and request.htmx.target == "all":
        # A decision was made in place on this page (event ``approvals-changed``): the table of every request
        # and the inbox's count follow it; the decided card itself was already replaced.
        context = _all_requests(request, actor) | {"inbox_count": inbox_qs.count(), "oob": True}
        _shown(context["pager"])
        return render(request, "quotas/_request_table.html", context)
    inbox = Pager(request, selectors.with_quota_now(inbox_qs), param="inbox_page")
    inbox_items = list(inbox)
    table = _all_requests(request, actor)
    _shown(inbox_items, table["pager"])
    context = {"inbox": inbox, "inbox_items": [(r, selectors.quota_now(r)) for r in inbox_items],
               "inbox_count": inbox.page.paginator.count, "bulk_form": DecisionForm(prefix="bulk")}
    return page(request, "quotas/request_list.html", context | table)


def _quota_kind(actor: Actor, decision: str, comment: str) -> bulk.Kind:
    call = services.quota_request_approve if decision == "approve" else services.quota_request_reject
    return bulk.Kind(
        find=lambda pk: selectors.quota_requests_for(actor=actor).filter(pk=pk).first(),
        decide=lambda item: call(actor=actor, request=item, comment=comment),
        describe=lambda item: (item.status, f"#{item.pk}"),
    )


@login_required
@require_POST
def quota_requests_bulk(request: HttpRequest) -> HttpResponse:
    """Approve or reject the ticked quota requests with one comment (required to reject); each through
    ``services.quota_request_approve``/``reject`` in its own transaction, under the same locks and limits as one
    decision: those that no longer fit (or were decided meanwhile) are reported one by one, the others are done."""
    actor = Actor.from_request(request)
    form = DecisionForm(request.POST, prefix="bulk")
    ids = [int(v) for v in request.POST.getlist("quota_requests") if is_id(v)]
    error = ""
    if not form.is_valid():
        error = "Choose Approve selected or Reject selected."
    elif not ids:
        error = "Tick at least one request."
    elif len(ids) > bulk.MAX_ITEMS:
        error = f"At most {bulk.MAX_ITEMS} at once."
    elif form.cleaned_data["decision"] == "reject" and not form.cleaned_data["comment"].strip():
        error = "Say why they are rejected, so the requesters know what to do."
    if error:
        messages.error(request, error)
        return redirect(_safe_next(request, reverse("quota-requests")))
    decision, comment = form.cleaned_data["decision"], form.cleaned_data["comment"].strip()
    outcome = bulk.decide_each(decision=decision, items=[("quota_request", pk) for pk in ids],
                               kinds={"quota_request": _quota_kind(actor, decision, comment)})
    verb = "Approved" if decision == "approve" else "Rejected"
    if outcome.done:
        messages.success(request, f"{verb} {len(outcome.done)}: " + ", ".join(r.label for r in outcome.done) + ".")
    for failed in outcome.failed:
        messages.error(request, f"#{failed.id}: not {verb.lower()}. {failed.error}")
    return redirect(_safe_next(request, reverse("quota-requests")))


def _visible_request(actor: Actor, pk: int) -> QuotaRequest:
    return get_object_or_404(selectors.quota_requests_for(actor=actor), pk=pk)


@login_required
def quota_request_detail(request: HttpRequest, pk: int) -> HttpResponse:
    actor = Actor.from_request(request)
    item = _visible_request(actor, pk)
    return page(request, "quotas/request_detail.html", _item_context(item) | {"detail": True})


def _answer(request: HttpRequest, actor: Actor, item: QuotaRequest, *, error: str | None, done: str,
            form: DecisionForm | None = None) -> HttpResponse:
    """htmx: the request's card, updated, and the event ``approvals-changed`` after a change (the navigation's
    counts and the list of every request refresh themselves). Plain POST: back where it came from, with a message."""
    if request.htmx:
        item = _visible_request(actor, item.pk)
        back = _safe_next(request, reverse("quota-requests"))
        response = render(request, "quotas/_request_card.html",
                          _item_context(item, error=error, note=None if error else done, form=form, next_url=back),
                          using="jinja2")
        if not error:
            response["HX-Trigger"] = "approvals-changed"
        return response
    if error:
        messages.error(request, error)
    else:
        messages.success(request, done)
    return redirect(_safe_next(request, reverse("quota-requests")))


@login_required
@require_POST
def quota_request_decide(request: HttpRequest, pk: int) -> HttpResponse:
    actor = Actor.from_request(request)
    item = _visible_request(actor, pk)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _answer(request, actor, item, error="Choose Approve or Reject.", done="", form=form)
    decision, comment = form.cleaned_data["decision"], form.cleaned_data["comment"]
    try:
        if decision == "approve":
            item = services.quota_request_approve(actor=actor, request=item, comment=comment)
            if item.is_share:
                done = (f"Request #{item.pk} approved: {item.project.name} has {fmt(item.amount)} more shares of "
                        f"{item.flavor} · {item.share_size} ({item.share_totals}).")
            else:
                done = (f"Request #{item.pk} approved: {item.project.name} has {fmt(item.amount)} more "
                        f"× {item.resource} of {item.flavor.name}.")
        else:
            item = services.quota_request_reject(actor=actor, request=item, comment=comment)
            done = f"Request #{item.pk} rejected."
    except (PortalError, ValidationError) as exc:
        return _answer(request, actor, item, error=_error_text(exc), done="", form=form)
    return _answer(request, actor, item, error=None, done=done)


@login_required
@require_POST
def quota_request_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    actor = Actor.from_request(request)
    item = _visible_request(actor, pk)
    try:
        item = services.quota_request_cancel(actor=actor, request=item)
    except (PortalError, ValidationError) as exc:
        return _answer(request, actor, item, error=_error_text(exc), done="")
    return _answer(request, actor, item, error=None, done=f"Request #{item.pk} cancelled.")


"""Ops pages for one cluster: register it, its settings and architecture, the plan (a diff) and apply, the sync,
the export and the objects the portal applied there. Shared helpers live in ``quotas.views``."""

from __future__ import annotations

import logging
from typing import Any

import django_filters as filters
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import F
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.ui import Pager, filtered
from tenants import selectors as tenancy
from tenants.access import Actor
from tenants.guards import ops_only as _ops_only

from . import architecture as architecture_service
from . import reconcile, selectors, services
from .exceptions import NothingToApply, PlanChanged
from .forms import ArchitectureForm, ClusterCreateForm, ClusterSettingsForm
from .models import AppliedObject, Architecture, Cluster
from .views import _error_text, _filters_of, _ops_cluster, _ops_page, _show_error

log = logging.getLogger(__name__)


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
        "fingerprint": reconcile.plan_fingerprint(plan) if plan is not None else "",
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

"""The ops "Zones" page: one inventory across clusters (GPU model, driver and CUDA version, health, failure domain,
free/used/promised per zone), the spill-over counts and GPU-hours by source and target model, and draining a
cluster (a reason is required; audited). A 404 for everyone but platform ops. See docs/federation.md."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from quotas.models import Cluster
from quotas.zones import cluster_drain, cluster_undrain, zone_inventory
from tenants.guards import ops_only as _ops_only
from tenants.ui import page

from . import routing


@login_required
def zones(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    return page(request, "workloads/zones.html", {
        "zones": zone_inventory(actor=actor), "spills": routing.spill_summary(), "tab": "zones"})


@login_required
@require_POST
def zone_drain(request: HttpRequest, name: str) -> HttpResponse:
    actor = _ops_only(request)
    cluster = get_object_or_404(Cluster, name=name)
    try:
        if request.POST.get("undrain"):
            cluster_undrain(actor=actor, cluster=cluster)
            messages.success(request, f"{cluster.name} takes new work again.")
        else:
            cluster_drain(actor=actor, cluster=cluster, reason=request.POST.get("reason", ""))
            messages.success(request, f"{cluster.name} is drained: its pending work moves elsewhere, running work finishes.")
    except PortalError as exc:
        messages.error(request, getattr(exc, "message", str(exc)))
    return redirect("ops-zones")

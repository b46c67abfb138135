"""The ops "Zones" page: one inventory across clusters (GPU model, driver and CUDA version, health, failure domain,
free/used/promised per zone), the spill-over counts and GPU-hours by source and target model, draining a
cluster (a reason is required; audited), and the demo's zone fault ("Take down" / "Bring up", sandbox clusters only;
audited). A 404 for everyone but platform ops. See docs/federation.md."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from quotas.models import Cluster
from quotas.zones import cluster_drain, cluster_undrain, zone_fault_set, zone_fault_states, zone_inventory
from tenants.guards import ops_only as _ops_only
from tenants.ui import page

from . import routing


def _zones_page(request: HttpRequest, actor, *, status: int = 200, fault_error: str = "") -> HttpResponse:
    inventory = zone_inventory(actor=actor)
    faults = zone_fault_states([z.cluster for z in inventory])
    for z in inventory:
        z.fault_down = faults.get(z.cluster.pk)  # None: not a sandbox (no button)
    response = page(request, "workloads/zones.html", {
        "zones": inventory, "spills": routing.spill_summary(), "tab": "zones", "fault_error": fault_error})
    response.status_code = status
    return response


@login_required
def zones(request: HttpRequest) -> HttpResponse:
    return _zones_page(request, _ops_only(request))


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


@login_required
@require_POST
def zone_fault(request: HttpRequest, name: str) -> HttpResponse:
    """"Take down" / "Bring up" a sandbox zone (the same service as ``manage.py zone_fault``). A real cluster is
    refused with a 400 and the page says why; nothing changes."""
    actor = _ops_only(request)
    cluster = get_object_or_404(Cluster, name=name)
    action = request.POST.get("action", "")
    if action not in ("down", "up"):
        return _zones_page(request, actor, status=400, fault_error=f"{cluster.name}: say down or up.")
    try:
        zone_fault_set(actor=actor, cluster=cluster, down=action == "down")
    except PortalError as exc:
        return _zones_page(request, actor, status=400, fault_error=getattr(exc, "message", str(exc)))
    if action == "down":
        messages.success(request, f"{cluster.name} (zone {cluster.zone_name}) is down: every API call is answered 503. "
                                  f"Within a follower cycle it shows unhealthy; its pending work moves after the "
                                  f"re-dispatch delay.")
    else:
        messages.success(request, f"{cluster.name} (zone {cluster.zone_name}) answers again.")
    return redirect("ops-zones")

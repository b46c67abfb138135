"""Pages for MIG changes (``/ops/mig-changes/``): the list, a new proposal (with a preview of its impact), a
change's page with the impact shown before approval, the decision buttons and the window's live progress (htmx
polls ``progress/`` while it runs, as the cluster page does for an architecture change).

Ops see every change; tenant admins see their tenant's proposals (403 for everyone else on the list, 404 for a
change they may not see). Reads start from ``maintenance.selectors``; writes go through ``maintenance.services``.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.ui import Pager, filtered
from tenants.access import Actor
from tenants.forms import add_service_error
from tenants.ui import page

from . import policy, selectors, services
from .filters import MigChangeFilter
from .forms import DecisionForm, MigChangeForm
from .models import MigChange

LABELS = {"status": "Status", "cluster": "Cluster", "pool": "Pool contains", "tenant": "Proposed by tenant"}
LIVE = ("approved", "running", "rolling_back")


def _actor(request: HttpRequest) -> Actor:
    actor = Actor.from_request(request)
    if not policy.may_view_mig_changes(actor):
        raise PermissionDenied("MIG changes are for platform ops and tenant admins.")
    return actor


def _change(actor: Actor, pk: int) -> MigChange:
    change = selectors.mig_changes_for(actor=actor).filter(pk=pk).first()
    if change is None:
        raise Http404("No such MIG change.")
    return change


@login_required
def mig_change_list(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    filterset = filtered(MigChangeFilter, request, selectors.mig_changes_for(actor=actor), labels=LABELS)
    return page(request, "maintenance/list.html", {"tab": "mig-changes", "filterset": filterset,
                                                   "ops_capacity_section": actor.is_ops,
                                                   "pager": Pager(request, filterset.qs)})


@login_required
def mig_change_new(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    pools = selectors.mig_pools_for(actor=actor)
    tenants = [] if actor.is_ops else list(selectors.admin_tenants_for(actor=actor))
    form = MigChangeForm(request.POST or None, pools=pools, tenants=tenants if len(tenants) > 1 else None)
    impact = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        pool = form.pools[data["pool"]]
        tenant = next((t for t in tenants if t.slug == data.get("tenant")), None)
        try:
            if "preview" in request.POST:
                impact = selectors.impact_for(
                    services.impact_preview(cluster=pool.cluster, pool=pool, to_layout=data["to_layout"]), actor=actor)
            else:
                change = services.mig_change_propose(
                    actor=actor, pool=pool, to_layout=data["to_layout"], window_start=data["window_start"],
                    deadline=data["deadline"], reason=data["reason"], tenant=tenant)
                messages.success(request, f"MIG change #{change.pk} proposed; it waits for an ops approval.")
                return redirect("mig-change", pk=change.pk)
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
    return page(request, "maintenance/new.html", {"tab": "mig-changes", "form": form, "impact": impact,
                                                  "ops_capacity_section": actor.is_ops,
                                                  "layouts": form.layouts})


@login_required
def mig_change_detail(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _actor(request)
    change = _change(actor, pk)
    return page(request, "maintenance/detail.html", {
        "tab": "mig-changes", "change": change, "steps": selectors.mig_change_steps(change), "form": DecisionForm(),
        "impact": selectors.impact_for(change.impact, actor=actor),
        "live": change.status in LIVE, "ops_capacity_section": actor.is_ops,  # base.html: under "Capacity"
    })


@login_required
def mig_change_progress(request: HttpRequest, pk: int) -> HttpResponse:
    """The progress fragment the change's page polls while the window runs."""
    actor = _actor(request)
    change = _change(actor, pk)
    return render(request, "maintenance/_progress.html", {"change": change, "steps": selectors.mig_change_steps(change),
                                                          "live": change.status in LIVE})


@login_required
@require_POST
def mig_change_decide(request: HttpRequest, pk: int, decision: str) -> HttpResponse:
    actor = _actor(request)
    change = _change(actor, pk)
    form = DecisionForm(request.POST)
    comment = form.cleaned_data["comment"] if form.is_valid() else ""
    try:
        if decision == "approve":
            services.mig_change_approve(actor=actor, change=change, comment=comment)
            messages.success(request, "Approved: the change runs when its window opens.")
        elif decision == "reject":
            services.mig_change_reject(actor=actor, change=change, comment=comment)
            messages.success(request, "Rejected.")
        elif decision == "cancel":
            services.mig_change_cancel(actor=actor, change=change, reason=comment)
            messages.success(request, "Cancelled.")
        else:
            raise Http404("No such decision.")
    except PortalError as exc:
        messages.error(request, exc.message)
    return redirect("mig-change", pk=change.pk)

"""Ops pages for flavors: the list, creating one, its detail and (de)activating it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.ui import Pager, filtered
from tenants.access import Actor
from tenants.guards import ops_only as _ops_only

from . import selectors, services
from .capacity import flavor_enforcement
from .filters import FlavorFilter
from .forms import FlavorForm
from .models import Flavor
from .views import _error_text, _ops_page, _show_error


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

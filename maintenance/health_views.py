"""The ops health view (``/ops/health/``): every GPU node across clusters with its GFD facts, conditions and XID
errors; a node's page lists the requests on it and cordons or uncordons it with a reason. Ops only: a 404 for
everyone else. Reads and the cordon go through ``maintenance.health``."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect

from portal.exceptions import PortalError
from portal.kube import ClusterError
from tenants.forms import add_service_error
from tenants.guards import ops_only
from tenants.ui import page

from . import health


class CordonForm(forms.Form):
    reason = forms.CharField(required=False, max_length=health.REASON_MAX, widget=forms.Textarea(attrs={"rows": 2}),
                             help_text="Why (required to cordon): kept on the node and in the audit log.")


@login_required
def health_list(request: HttpRequest) -> HttpResponse:
    actor = ops_only(request)
    rows, xid = health.inventory(actor=actor)
    flagged = [r for r in rows if r.xids]
    on = {r.node.pk: health.requests_on(r.node) for r in flagged}
    return page(request, "maintenance/health.html", {
        "tab": "health", "rows": rows, "xid": xid, "flagged": [(r, on[r.node.pk]) for r in flagged],
        "xid_count": sum(len(r.xids) for r in rows), "ops_capacity_section": True,
    })


@login_required
def health_node(request: HttpRequest, cluster: str, name: str) -> HttpResponse:
    actor = ops_only(request)
    row = health.node_health(actor=actor, cluster=cluster, name=name)
    if row is None:
        raise Http404("No such node.")
    form = CordonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        cordoned = request.POST.get("action") == "cordon"
        try:
            health.node_cordon_set(actor=actor, node=row.node, cordoned=cordoned, reason=form.cleaned_data["reason"])
        except PortalError as exc:
            add_service_error(form, exc)
        except ClusterError as exc:
            form.add_error(None, f"The cluster refused: {exc}. Nothing changed.")
        else:
            messages.success(request, f"{row.node.name} is {'cordoned' if cordoned else 'schedulable again'}.")
            return redirect("ops-health-node", cluster=cluster, name=name)
    return page(request, "maintenance/health_node.html", {
        "tab": "health", "row": row, "on": health.requests_on(row.node), "form": form, "ops_capacity_section": True,
    }, status=400 if form.errors else 200)

"""A project's spill-over policy page (``/projects/<slug>/spill-over/``; docs/federation.md): whether its work may
spill over to another GPU model when its own is full, to which models, and whether a spilled request waits for an
approver. Everyone who sees the project reads it (404 otherwise); its admins, its tenant's admins and ops change it
(``quotas.zones.spill_policy_set``, audited ``project.spill_policy``); anyone else is refused (403)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect

from portal.exceptions import PortalError
from tenants import selectors as tenancy
from tenants.access import Actor
from tenants.forms import add_service_error
from tenants.policy import may_change_project
from tenants.ui import page

from .zones import gpu_models, spill_policy_of, spill_policy_set


class SpillPolicyForm(forms.Form):
    allowed = forms.BooleanField(label="Allow spill-over", required=False,
                                 help_text="A job that consents may run on another GPU model when its own is full.")
    target_models = forms.MultipleChoiceField(
        label="To these models", required=False, widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: any model a job accepts.")
    needs_approval = forms.BooleanField(label="A request that spills over waits for an approver", required=False)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["target_models"].choices = [(m, m) for m in gpu_models()]


@login_required
def spill_policy(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    project = get_object_or_404(tenancy.projects_for(actor=actor).select_related("tenant"), slug=slug)
    may_change = may_change_project(actor, project)
    row = spill_policy_of(project)
    initial = {"allowed": row.allowed, "target_models": list(row.target_models or []), "needs_approval": row.needs_approval}
    form = SpillPolicyForm(initial=initial)
    if request.method == "POST":
        if not may_change:
            raise PermissionDenied("Only the project's admins, its tenant's admins and ops set its spill-over policy.")
        form = SpillPolicyForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                spill_policy_set(actor=actor, project=project, allowed=data["allowed"],
                                 target_models=data["target_models"], needs_approval=data["needs_approval"])
            except (PortalError, ValidationError) as exc:
                add_service_error(form, exc)
            else:
                messages.success(request, f"Spill-over policy of {project.name} saved.")
                return redirect("project-spill-policy", slug=project.slug)
    return page(request, "quotas/spill_policy.html", {"project": project, "tenant": project.tenant, "policy": row,
                                                       "form": form, "may_change": may_change})

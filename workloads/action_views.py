"""What a request's page does to it: cancel, stop, restart, delete, extend, ask for more time or more replicas,
decide or withdraw those asks, and scale."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal.exceptions import NotAllowed, PortalError
from tenants.access import Actor
from tenants.forms import add_service_error

from . import extensions, policy, selectors, services
from .approval_views import _changed
from .forms import DecisionForm, ExtendForm, ExtensionAskForm, ScaleAskForm, ScaleForm
from .models import ExtensionRequest
from .views import _actor, _detail_page, _error_text, _visible_request, state_actions


def _act(request: HttpRequest, pk: int, call: Any, done: str) -> HttpResponse:
    actor = _actor(request)
    req = _visible_request(actor, pk)
    try:
        req = call(actor, req)
    except (PortalError, ValidationError) as exc:
        messages.error(request, _error_text(exc))
    else:
        messages.success(request, done.format(req=req))
    return redirect("request-detail", pk=pk)


@login_required
@require_POST
def request_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, lambda a, r: services.request_cancel(actor=a, request=r), "Request {req.name} cancelled.")


@login_required
@require_POST
def request_stop(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, lambda a, r: services.request_stop(actor=a, request=r), "Request {req.name} stopped.")


@login_required
@require_POST
def request_restart(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, lambda a, r: services.request_restart(actor=a, request=r),
                "Request {req.name} restarts: it goes back to the cluster under its original approval.")


@login_required
@require_POST
def request_delete(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, lambda a, r: services.request_delete(actor=a, request=r),
                "Request {req.name} deleted: its cluster objects and volumes are removed. Its record stays.")


@login_required
@require_POST
def request_extend(request: HttpRequest, pk: int) -> HttpResponse:
    form = ExtendForm(request.POST, prefix="extend")
    if not form.is_valid():
        messages.error(request, "Extend by a whole number of hours (at least 1).")
        return redirect("request-detail", pk=pk)
    hours = form.cleaned_data["hours"]
    actor = _actor(request)
    req = _visible_request(actor, pk)
    try:
        req = services.request_extend(actor=actor, request=req, hours=hours)
    except (PortalError, ValidationError) as exc:
        messages.error(request, _error_text(exc))
        if (isinstance(exc, NotAllowed) and state_actions(req)["ask_extension"]
                and policy.may_ask_extension(actor, req) and not policy.may_decide(actor, req.project)):
            # Past the automatic limit: the form to ask the approvers, with these hours filled in.
            return redirect(f"{reverse('request-detail', args=[pk])}?ask={hours}#ask-extension")
    else:
        messages.success(request, f"Request {req.name} now runs for up to {req.duration_hours} hours.")
    return redirect("request-detail", pk=pk)


@login_required
@require_POST
def request_extension_ask(request: HttpRequest, pk: int) -> HttpResponse:
    """The requester asks the approvers for more hours (an extension request)."""
    actor = _actor(request)
    req = _visible_request(actor, pk)
    form = ExtensionAskForm(request.POST, prefix="ask")
    if form.is_valid():
        try:
            ext = extensions.extension_request_create(actor=actor, request=req, hours=form.cleaned_data["hours"],
                                                      reason=form.cleaned_data["reason"])
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Asked for {ext.hours} more hours. The project's approvers decide; "
                                      "you get an email when they do.")
            return redirect("request-detail", pk=pk)
    return _detail_page(request, actor, req, status=400, ask_form=form)


@login_required
@require_POST
def request_scale_ask(request: HttpRequest, pk: int) -> HttpResponse:
    """The requester asks the approvers to scale an inference service up (a scale request)."""
    actor = _actor(request)
    req = _visible_request(actor, pk)
    form = ScaleAskForm(request.POST, prefix="askscale")
    if form.is_valid():
        try:
            ext = extensions.scale_request_create(actor=actor, request=req, replicas=form.cleaned_data["replicas"],
                                                  reason=form.cleaned_data["reason"])
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Asked to scale to {ext.replicas} replicas. The project's approvers decide; "
                                      "you get an email when they do.")
            return redirect("request-detail", pk=pk)
    return _detail_page(request, actor, req, status=400, scale_ask_form=form)


def _visible_extension(actor: Actor, pk: int) -> ExtensionRequest:
    return get_object_or_404(selectors.extension_requests_for(actor=actor), pk=pk)


@login_required
@require_POST
def extension_decide(request: HttpRequest, pk: int) -> HttpResponse:
    """Approve or reject an extension request: from the inbox (htmx: the decided row) or the request's page."""
    actor = _actor(request)
    ext = _visible_extension(actor, pk)
    form = DecisionForm(request.POST, prefix=f"extension-{ext.pk}")
    decision = request.POST.get("decision")
    error = ""
    if decision not in ("approve", "reject") or not form.is_valid():
        error = "Choose approve or reject; a reason has at most 1000 characters."
    else:
        call = extensions.extension_request_approve if decision == "approve" else extensions.extension_request_reject
        try:
            ext = call(actor=actor, extension=ext, comment=form.cleaned_data["comment"])
        except (PortalError, ValidationError) as exc:
            error = _error_text(exc)
            if getattr(exc, "field", None) == "comment":
                form.add_error("comment", error)
    asked = f"to {ext.replicas} replicas" if ext.is_scale else f"by {ext.hours} h"
    done = "" if error else (f"{'Scaling' if ext.is_scale else 'Extension'} of {ext.request.name} {asked} "
                             f"{ext.get_status_display().lower()}.")
    if request.htmx:
        ext = _visible_extension(actor, ext.pk)
        response = render(request, "workloads/_extension_row.html",
                          {"ext": ext, "form": form if error else DecisionForm(prefix=f"extension-{ext.pk}"),
                           "error": error, "done": done}, using="jinja2")
        return _changed(response) if done else response
    if form.has_error("comment"):
        req = _visible_request(actor, ext.request_id)
        return _detail_page(request, actor, req, status=400, extension_forms={ext.pk: form})
    if error:
        messages.error(request, error)
    else:
        messages.success(request, done + " The requester is told.")
    if request.POST.get("next") == "inbox":
        return redirect("approvals")
    return redirect("request-detail", pk=ext.request_id)


@login_required
@require_POST
def extension_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _actor(request)
    ext = _visible_extension(actor, pk)
    try:
        ext = extensions.extension_request_cancel(actor=actor, extension=ext)
    except (PortalError, ValidationError) as exc:
        messages.error(request, _error_text(exc))
    else:
        messages.success(request, f"Your request for {ext.asked} withdrawn.")
    return redirect("request-detail", pk=ext.request_id)


@login_required
@require_POST
def request_scale(request: HttpRequest, pk: int) -> HttpResponse:
    form = ScaleForm(request.POST, prefix="scale")
    if not form.is_valid():
        messages.error(request, "Choose between 1 and 64 replicas.")
        return redirect("request-detail", pk=pk)
    replicas = form.cleaned_data["replicas"]
    actor = _actor(request)
    req = _visible_request(actor, pk)
    try:
        req = services.request_scale(actor=actor, request=req, replicas=replicas)
    except (PortalError, ValidationError) as exc:
        messages.error(request, _error_text(exc))
        if (isinstance(exc, NotAllowed) and state_actions(req)["ask_scale"]
                and policy.may_ask_extension(actor, req) and not policy.may_decide(actor, req.project)):
            # A scale-up the approval rule does not grant: the form to ask the approvers, with this size filled in.
            return redirect(f"{reverse('request-detail', args=[pk])}?scale={replicas}#ask-scale")
    else:
        messages.success(request, f"Request {req.name} now has {req.replicas} replicas.")
    return redirect("request-detail", pk=pk)

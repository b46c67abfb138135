"""The request page's "Share" section: share one request with a named colleague of its tenant, list its shares,
stop sharing (``workloads.sharing``; the API's twin is ``workloads/api/sharing.py``)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from portal.exceptions import NotAllowed, PortalError
from tenants.forms import add_service_error

from . import sharing
from .forms import ShareForm
from .views import _actor, _detail_page, _visible_request


def _refused(exc: PortalError) -> None:
    if isinstance(exc, NotAllowed):
        raise PermissionDenied(exc.message)


@login_required
@require_POST
def request_share(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _actor(request)
    req = _visible_request(actor, pk)
    form = ShareForm(request.POST, prefix="share")
    if form.is_valid():
        try:
            shared = sharing.request_share(actor=actor, request=req, user=form.cleaned_data["user"],
                                           level=form.cleaned_data["level"])
        except PortalError as exc:
            _refused(exc)
            add_service_error(form, exc)
        else:
            messages.success(request, f"Shared with {shared['user'].get_username()} "
                                      f"({sharing.LEVEL_LABELS[shared['level']].lower()}).")
            return redirect("request-detail", pk=pk)
    return _detail_page(request, actor, req, status=400, share_form=form)


@login_required
@require_POST
def request_unshare(request: HttpRequest, pk: int, username: str) -> HttpResponse:
    actor = _actor(request)
    req = _visible_request(actor, pk)
    try:
        stopped = sharing.request_unshare(actor=actor, request=req, user=username)
    except PortalError as exc:
        _refused(exc)
        raise
    if stopped:
        messages.success(request, f"No longer shared with {username}.")
    else:
        messages.info(request, f"The request was not shared with {username}.")
    return redirect("request-detail", pk=pk)

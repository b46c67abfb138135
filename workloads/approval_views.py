"""The approvals inbox: its page and rows, bulk decisions, the waiting badge and one decision."""

from __future__ import annotations

import copy
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.forms.renderers import get_default_renderer
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.inputs import is_id
from portal.ui import PAGE_SIZE, Pager
from tenants.access import Actor
from tenants.policy import asked
from tenants.ui import page

from . import approvals as approvals_flow
from . import policy, selectors, services
from .forms import BulkDecisionForm, DecisionForm
from .models import WorkloadRequest
from .views import (
    ROW_RELATED,
    S,
    _actor,
    _detail_page,
    _error_text,
    _request_filters,
    _visible_request,
)

INBOX_EXTENSION_COLUMNS = (
    "hours", "replicas", "status", "reason", "comment", "created_at", "requested_by__username", "request__name",
    "request__state", "request__gpus", "request__replicas", "request__duration_hours", "request__flavor__name", "request__flavor__display_name",
    "request__template__name",
    "request__template__max_duration_hours", "request__project__name", "request__project__tenant__name",
)

# The columns the inbox's rows read (``workloads/_approval_row.html``, ``approval_context``, the cost estimate;
# ``_extension_row.html``), not the 115-126 of the joined tables: the ORM compiled and built every one of them per call.
# A column left out would be read one query per row: tests/workloads/test_inbox_columns.py counts them.
# A flavor's columns that its name (``str``), its resources and the cost estimate read: not its labels, taints and
# tolerations (JSON, decoded per row) nor its pool, order and cluster.
FLAVOR_SHOWN = tuple(f"flavor__{name}" for name in ("name", "display_name", "kind", "mig_profile", "gpu_model", "gpu_product",
                                                   "hami_memory_mib", "hami_cores_percent"))
INBOX_COLUMNS = (
    "name", "state", "created_at", "gpus", "replicas", "cpu", "memory_gib", "share_memory_mib", "share_cores_percent",
    "parameters", "duration_hours", "pending_reason", "project__name", "tenant__name", "template__name", "template__kind", *FLAVOR_SHOWN,
    "requested_by__username",
)


# The related rows the inbox's rows show (joined), for its requests and its extension requests.
INBOX_RELATED = (*ROW_RELATED, "tenant", "requested_by")
INBOX_EXTENSION_RELATED = ("request__project__tenant", "request__template", "request__flavor", "requested_by")


_FRESH: dict[Any, DecisionForm] = {}  # form renderer -> an unbound DecisionForm


def _fresh_form(prefix: str) -> DecisionForm:
    """``DecisionForm(prefix=prefix)``, unbound: a shallow copy of one form built once (per form renderer), sharing
    its fields (a form deep-copies its fields when built, once per row of the inbox; an unbound form's rendering
    never changes them)."""
    renderer = get_default_renderer()
    fresh = _FRESH.get(renderer)
    if fresh is None:
        fresh = _FRESH[renderer] = DecisionForm()
    form = copy.copy(fresh)
    form.prefix, form._bound_fields_cache, form._errors = prefix, {}, None
    return form


def _inbox_row(req: WorkloadRequest, form: DecisionForm | None = None) -> dict[str, Any]:
    """A row of the inbox (the Jinja2 template ``workloads/_approval_row.html``): the request, its context, its
    decision form."""
    if form is None:
        form = _fresh_form(f"decide-{req.pk}")
    return {"req": req, "info": selectors.approval_context(req), "form": form}


def _changed(response: HttpResponse) -> HttpResponse:
    """Tell the page that something in an inbox was decided: the navigation's counts (and lists that show
    decisions) refresh themselves (htmx event ``approvals-changed``)."""
    response["HX-Trigger"] = "approvals-changed"
    return response


def _approvals_page(request: HttpRequest, actor: Actor, *, bulk_form: BulkDecisionForm | None = None,
                    selected: dict[str, set[str]] | None = None, outcome: Any = None, status: int = 200) -> HttpResponse:
    approvable = selectors.approvable_projects(actor=actor)  # the project filter's choices
    inbox = selectors.approvals_inbox_rows(actor=actor).select_related(*INBOX_RELATED).only(*INBOX_COLUMNS)
    filterset = _request_filters(
        request, inbox, hide=("state", "phase", "tenant", "mine", "requested_by", "created_after", "created_before",
                              "template", "flavor", "priority"),
        selects={"project": [(slug, name) for _, slug, name in approvable]},
    )

    def first(extensions: bool, related: tuple[str, ...], columns: tuple[str, ...]) -> Any:
        """The first page unfiltered, from a kept query (``selectors.inbox_first_page``); None: the filters' own.
        No extension request waits for the approver (their kept counts, the navigation's): none is read."""
        if extensions and not selectors.approvals_waiting_counts_kept(actor=actor).get("extensions", 1):
            return list
        if extensions or not filterset.is_active:
            return lambda: selectors.inbox_first_page(actor=actor, extensions=extensions, related=related,
                                                      columns=columns, limit=PAGE_SIZE + 1)
        return None

    pager = Pager(request, filterset.qs, first=first(False, INBOX_RELATED, INBOX_COLUMNS))
    rows = [_inbox_row(req) for req in selectors.with_approval_context(list(pager))]
    extension_pager = Pager(request, selectors.inbox_extension_rows(actor=actor).select_related(*INBOX_EXTENSION_RELATED)
                            .only(*INBOX_EXTENSION_COLUMNS), param="extensions_page",
                            first=first(True, INBOX_EXTENSION_RELATED, INBOX_EXTENSION_COLUMNS))
    extension_rows = [{"ext": ext, "form": _fresh_form(f"extension-{ext.pk}")} for ext in extension_pager]
    selected = selected or {}
    return page(request, "workloads/approvals.html", {
        "filterset": filterset, "pager": pager, "rows": rows, "extension_pager": extension_pager,
        "extension_rows": extension_rows, "bulk_form": bulk_form or BulkDecisionForm(prefix="bulk"),
        "selected_requests": selected.get("requests", set()), "selected_extensions": selected.get("extension_requests", set()),
        "outcome": outcome,
    }, status=status)


@login_required
def approvals(request: HttpRequest) -> HttpResponse:
    """The approver's inbox: requests and extension requests waiting for them, oldest first, each with its
    context; decided one by one (htmx, in place) or several at once (checkboxes and one reason)."""
    actor = _actor(request)
    if not asked(request, policy.may_decide_somewhere):  # the navigation asks too: once for both
        raise Http404("No such page.")  # only approvers have an inbox
    return _approvals_page(request, actor)


def _ids(values: list[str]) -> list[int]:
    return [int(v) for v in values if is_id(v)]


@login_required
@require_POST
def approvals_bulk(request: HttpRequest) -> HttpResponse:
    """Approve or reject the checked requests and extension requests, one reason for all; each goes through
    the single decision's service. The page says per item what was done and what was refused, and why."""
    actor = _actor(request)
    if not asked(request, policy.may_decide_somewhere):
        raise Http404("No such page.")
    form = BulkDecisionForm(request.POST, prefix="bulk")
    decision = request.POST.get("decision")
    chosen = {"requests": request.POST.getlist("requests"), "extension_requests": request.POST.getlist("extension_requests")}
    items = [("request", pk) for pk in _ids(chosen["requests"])] + [
        ("extension_request", pk) for pk in _ids(chosen["extension_requests"])]
    selected = {key: set(values) for key, values in chosen.items()}
    valid = form.is_valid()
    if valid and decision not in approvals_flow.DECISIONS:
        form.add_error(None, "Choose Approve selected or Reject selected.")
    if not form.is_valid():
        return _approvals_page(request, actor, bulk_form=form, selected=selected, status=400)
    try:
        outcome = approvals_flow.decide_many(actor=actor, items=items, decision=decision,
                                             comment=form.cleaned_data["comment"])
    except PortalError as exc:
        form.add_error("comment" if exc.field == "comment" else None, exc.message)
        return _approvals_page(request, actor, bulk_form=form, selected=selected, status=400)
    verb = "Approved" if decision == "approve" else "Rejected"
    if outcome.done:
        messages.success(request, f"{verb} {len(outcome.done)}: " + ", ".join(r.label for r in outcome.done)
                         + ". The requesters are told.")
    for failed in outcome.failed:
        messages.error(request, f"{failed.label or f'{failed.kind} {failed.id}'}: not {verb.lower()}. {failed.error}")
    return redirect("approvals")


@login_required
def approvals_waiting(request: HttpRequest) -> HttpResponse:
    """The navigation's counts of what waits for the user, as out-of-band swaps (refreshed by ``approvals-changed``)."""
    return render(request, "workloads/_nav_counts.html", {"oob": True})


@login_required
@require_POST
def request_decide(request: HttpRequest, pk: int) -> HttpResponse:
    """Approve, or reject with a reason: from the inbox (htmx: the decided row) or the detail page. A rejection
    without a reason is a form error next to the reason's field; nothing is decided then."""
    actor = _actor(request)
    req = _visible_request(actor, pk)
    form = DecisionForm(request.POST, prefix=f"decide-{req.pk}")
    decision = request.POST.get("decision")
    error = ""
    if decision not in ("approve", "reject") or not form.is_valid():
        error = "Choose approve or reject; a reason has at most 1000 characters."
    else:
        call = services.request_approve if decision == "approve" else services.request_reject
        try:
            req = call(actor=actor, request=req, comment=form.cleaned_data["comment"])
        except (PortalError, ValidationError) as exc:
            error = _error_text(exc)
            if getattr(exc, "field", None) == "comment":
                form.add_error("comment", error)
    done = f"{req.name} {'approved' if req.state != S.REJECTED else 'rejected'}." if not error else ""
    if done and getattr(req, "approval_note", ""):
        done = f"{done} {req.approval_note}"  # re-routed at approval, or approved where it is (and why)
    if request.htmx:
        row = _inbox_row(req, form if error else None) | {"error": "" if form.has_error("comment") else error,
                                                           "done": done}
        response = render(request, "workloads/_approval_row.html", row, using="jinja2")
        return _changed(response) if done else response
    if form.has_error("comment"):
        req = _visible_request(actor, pk)
        return _detail_page(request, actor, req, status=400, decision_form=form)
    if error:
        messages.error(request, error)
    else:
        messages.success(request, done + (" The requester is told." if done else ""))
    back = request.POST.get("next", "")
    if back == "inbox":
        return redirect("approvals")
    return redirect("request-detail", pk=req.pk)

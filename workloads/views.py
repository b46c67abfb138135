"""Portal pages for requests. Reads start from ``workloads.selectors``; writes go through ``workloads.services``.

A request the user cannot see is a 404, exactly as in the API; the ops list is a 404 for everyone
but ops. Service refusals (``PortalError``, ``ValidationError``) are shown on the form that caused
them, next to the field they name; nothing is written then.

Live status: the list and the detail page poll a partial of themselves with htmx every few seconds
while something on them can still change, and stop polling once everything shown has ended. Without
JavaScript the pages simply show the state as of the last load. Lifecycle actions are plain POSTs
answered with a redirect and a message; the inbox's approve/reject answer htmx with the decided row.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from portal.exceptions import PortalError
from portal.extensions import cost_so_far, rightsizing
from portal.ui import Pager, filtered
from tenants.access import Actor
from tenants.filters import TenantSlugOrName, tenant_search_widget
from tenants.policy import asked
from tenants.ui import page

from . import extensions, kinds, policy, preemption, selectors, sharing
from .filters import RequestFilter
from .forms import (
    DecisionForm,
    ExtendForm,
    ExtensionAskForm,
    ScaleAskForm,
    ScaleForm,
    ShareForm,
)
from .models import ExtensionRequest, RequestState, WorkloadRequest
from .pending import request_placement, request_queue_line
from .status import dispatched_worker
from .shared import shares_held
from .states import ACTIVE, CANCELLABLE, FINAL

S = RequestState
POLL_SECONDS = 3

# Shorter labels than the FilterSet's own (which the API schema uses).
FILTER_LABELS = {
    "state": "State",
    "phase": "Phase",
    "tenant": "Tenant",
    "project": "Project",
    "template": "Template",
    "kind": "Kind",
    "flavor": "Flavor",
    "requested_by": "Requested by",
    "q": "Name contains",
    "priority": "Priority",
}


def _actor(request: HttpRequest) -> Actor:
    return Actor.from_request(request)


def _error_text(exc: PortalError | ValidationError) -> str:
    if isinstance(exc, PortalError):
        return exc.message
    return " ".join(exc.messages)


def _request_filters(
    request: HttpRequest, queryset: QuerySet[WorkloadRequest], *, hide: tuple[str, ...], selects: dict[str, list[tuple[str, str]]]
) -> Any:
    filterset = filtered(RequestFilter, request, queryset, hide=hide, selects=selects, labels=FILTER_LABELS)
    form = filterset.form
    if "state" in form.fields:
        # The API takes several states; on a page one at a time is what people pick.
        form.fields["state"].widget = OneOf(choices=[("", "Any")] + list(RequestState.choices))
    return filterset


class OneOf(forms.Select):
    """A drop-down feeding a multiple-choice filter: its one value as a list (none: no filter)."""

    def value_from_datadict(self, data: Any, files: Any, name: str) -> list[str]:
        value = data.get(name)
        return [value] if value else []


# The related rows a request list shows (templates/workloads/_request_rows.html), and nothing else: each join
# on top of the visibility subquery costs the database planner more than running the query (docs/performance.md).
ROW_RELATED = ("project", "template", "flavor")


def _rows(queryset: QuerySet[WorkloadRequest], *also: str) -> QuerySet[WorkloadRequest]:
    return queryset.select_related(None).select_related(*ROW_RELATED, *also)


# The columns a request list's rows read (templates/jinja2/workloads/_request_list_rows.html and ``_polling``), not
# every column of the request and of its project, template, flavor and user: their JSON (a request's parameters and
# cluster status, a template's form, a flavor's labels and taints) was decoded and a full instance built per row, a
# fifth of the page. A column left out would be read one query per row: tests/workloads/test_list_columns.py.
LIST_COLUMNS = ("name", "state", "created_at", "gpus", "replicas", "project__name")
LIST_JOINED = ("template__name", "flavor__name", "flavor__display_name")  # the ops list prefetches these two instead


def _polling(rows: Any) -> bool:
    """Whether a list still needs polling: something on it can still change by itself."""
    return any(req.state not in FINAL for req in rows)


# My requests ------------------------------------------------------------------------------------


SCOPES = {"mine": "Mine", "projects": "All in my projects", "shared": "Shared with me"}
COUNT_MOST = 1000


@login_required
def request_list(request: HttpRequest) -> HttpResponse:
    """The user's requests (or every request in their projects), newest first, with live state."""
    actor = _actor(request)
    scope = request.GET.get("scope") if request.GET.get("scope") in SCOPES else "mine"
    visible = selectors.requests_for(actor=actor).order_by("-created_at", "-id")
    if scope == "mine":
        visible = _rows(visible.filter(requested_by=request.user)).only(*LIST_COLUMNS, *LIST_JOINED)
    elif scope == "shared":  # shared with the user by a colleague (workloads/sharing.py)
        visible = _rows(visible.filter(pk__in=sorted(shares_held(actor))), "requested_by").only(
            *LIST_COLUMNS, *LIST_JOINED, "requested_by__username")
    else:
        visible = _rows(visible, "requested_by").only(*LIST_COLUMNS, *LIST_JOINED, "requested_by__username")
    projects = selectors.visible_project_choices(actor=actor)
    hide = ("tenant", "mine", "created_after", "created_before", "template", "flavor", "priority")
    filterset = _request_filters(
        request, visible, hide=hide + (("requested_by",) if scope == "mine" else ()), selects={"project": projects}
    )
    # A user's requests grow with history: counted up to COUNT_MOST (then "1,000+"), at the same cost at any size.
    pager = Pager(request, filterset.qs, most=COUNT_MOST)
    context = {
        "filterset": filterset, "pager": pager, "scope": scope, "scopes": SCOPES, "poll": _polling(pager),
        "poll_seconds": POLL_SECONDS,
    }
    if request.htmx and request.htmx.target == "request-rows":
        return render(request, "workloads/_request_rows.html", context)
    return page(request, "workloads/request_list.html", context)


# New request ------------------------------------------------------------------------------------


# Request detail ---------------------------------------------------------------------------------


def _visible_request(actor: Actor, pk: int) -> WorkloadRequest:
    return get_object_or_404(selectors.requests_for(actor=actor), pk=pk)


def _logs_request(actor: Actor, pk: int) -> WorkloadRequest:
    """A request whose logs ``actor`` may read (``policy.may_read_logs``): 404 unseen, 403 shared to view only."""
    req = _visible_request(actor, pk)
    if not policy.may_read_logs(actor, req):
        raise PermissionDenied("This request was shared with you to view, not to read its logs.")
    return req


def state_actions(req: WorkloadRequest) -> dict[str, bool]:
    """Which lifecycle buttons the request's state allows. Who may press them the page asks the predicates
    (``workloads.may_decide``, ``workloads.may_act_on``); the services decide again on POST."""
    state = req.state
    writable = req.project.is_active and req.tenant.is_active
    return {
        "decide": state in (S.SUBMITTED, S.PENDING_APPROVAL),
        # Submit again from this one, while its template is offered (the page asks ``may_submit_request``).
        "clone": writable and selectors.live_template(req.template.slug) is not None,
        "cancel": state in CANCELLABLE,
        "stop": state in (ACTIVE - CANCELLABLE),
        "restart": state in (S.STOPPED, S.FAILED) and writable,
        "extend": state not in FINAL and writable and req.duration_hours < req.template.max_duration_hours,
        # Asking the approvers for more time: the page also asks ``may_ask_extension`` and not ``may_decide``
        # (an approver extends directly).
        "ask_extension": (state in extensions.EXTENDABLE and writable
                          and req.duration_hours < req.template.max_duration_hours),
        "scale": state not in FINAL and kinds.get(req.template.kind).scalable,
        # Asking the approvers for more replicas (a scale request): likewise for the requester, not an approver.
        "ask_scale": state in extensions.SCALABLE and writable and kinds.get(req.template.kind).scalable,
        "delete": state not in (S.REJECTED, S.CANCELLED),
    }


def cluster_facts(req: WorkloadRequest) -> dict[str, Any]:
    """What the status follower last stored about the request's objects, arranged for the page."""
    status = req.cluster_status or {}
    objects = status.get("objects") or {}
    pods, workloads, others = [], [], []
    for key, summary in sorted(objects.items()):
        kind, _, name = key.partition("/")
        if kind == "pod":
            sched = summary.get("sched") or []
            pods.append({"name": name, "phase": summary.get("phase", ""),
                         "scheduled": sched[0] if sched else "", "reason": sched[1] if len(sched) > 1 else "",
                         "message": sched[2] if len(sched) > 2 else ""})
        elif kind == "workload":
            conditions = [{"type": t, "status": v[0], "reason": v[1], "message": v[2]} for t, v in (summary.get("c") or {}).items()]
            workloads.append({"name": name, "conditions": conditions, "queue": summary.get("cq", "")})
        else:
            others.append({"kind": key, "summary": {k: v for k, v in summary.items() if k != "c"},
                           "conditions": [{"type": t, "status": v[0], "reason": v[1], "message": v[2]}
                                          for t, v in (summary.get("c") or {}).items()]})
    warnings = [{"reason": w[0], "message": w[1]} for w in status.get("warnings") or [] if isinstance(w, list) and len(w) == 2]
    # "any": whether the box has something to say; objects the follower knows but without a word about them
    # (a workload with no conditions yet, a summary with no fields) do not open an empty box.
    said = (pods or warnings or any(w["conditions"] for w in workloads)
            or any(o["summary"] or o["conditions"] for o in others))
    return {"pods": pods, "workloads": workloads, "others": others, "warnings": warnings, "any": bool(said)}


def request_dispatch(req: WorkloadRequest) -> dict[str, str] | None:
    """Kueue MultiKueue (docs/federation.md): on a manager cluster, the worker its Workload was dispatched to (the
    Workload's ``status.clusterName``, as the status follower last read it) in a sentence; None on other clusters."""
    objects = (req.cluster_status or {}).get("objects") or {}
    workloads = [v for k, v in sorted(objects.items()) if k.startswith("workload/")]
    worker = dispatched_worker(req.cluster_status) or ""
    # the cluster is read only when its Workload says something MultiKueue-like (no query on the common page)
    if not (worker or any(w.get("checks") for w in workloads)) or req.cluster.role != "manager":
        return None
    manager = req.cluster.name
    if worker:
        verb = "Ran" if req.state in FINAL else "Runs"
        return {"worker": worker, "text": f"{verb} on worker {worker}, dispatched by MultiKueue on {manager}."}
    if req.state in FINAL:
        return {"worker": "", "text": f"Sent to the MultiKueue manager {manager}; no worker ran it."}
    said = next((c[2] for w in workloads for c in w.get("checks") or [] if len(c) == 3 and c[2]), "")
    return {"worker": "", "text": f"MultiKueue on {manager} dispatches it to a worker once one admits it"
                                  + (f" ({said})" if said else "") + "."}


def notebook_access(actor: Actor, req: WorkloadRequest) -> dict[str, Any] | None:
    """What the page says about opening a notebook (a kind served through the portal's proxy: ``Kind.proxied``):
    None for other kinds and for people who may not open it."""
    if not kinds.get(req.template.kind).proxied or not selectors.notebook_may_open(actor=actor, request=req):
        return None
    from django.conf import settings

    from .manifests import notebook_access_url

    url = notebook_access_url(request_id=req.pk, ide=str((req.parameters or {}).get("ide") or "jupyterlab"),
                              base_url=getattr(settings, "PORTAL_NOTEBOOK_BASE_URL", ""))
    if req.state == S.RUNNING:
        status = "running"
    elif req.state == S.STOPPED:
        status = "stopped"
    elif req.state in FINAL:
        status = "ended"
    else:
        status = "starting"
    return {"url": url, "status": status, "mine": req.requested_by_id == getattr(actor.user, "pk", None)}


def _queue_name(req: WorkloadRequest) -> str:
    """The ClusterQueue the status follower saw the request's Kueue workload in ("" before it saw one)."""
    objects = (req.cluster_status or {}).get("objects") or {}
    return next((str(v.get("cq")) for k, v in sorted(objects.items()) if k.startswith("workload/") and v.get("cq")), "")


def _detail_context(actor: Actor, req: WorkloadRequest) -> dict[str, Any]:
    # Preemptions in plain words, naming the preemptor only where the reader may see it (workloads/preemption.py).
    timeline = preemption.timeline_explained(req, selectors.request_timeline(req), actor=actor)
    notice = preemption.latest_notice(req, timeline)
    cluster = cluster_facts(req)
    for workload in cluster["workloads"]:
        for condition in workload["conditions"]:
            condition["message"] = preemption.redacted(condition["message"], shown=False)
    return {
        "req": req,
        "pending": selectors.request_pending_reason(req),
        "placed": request_placement(req),  # Kueue TAS: which rack or block its pods were placed in
        "dispatch": request_dispatch(req),  # Kueue MultiKueue: the worker it runs on
        "queue_line": request_queue_line(req, queue=_queue_name(req)),
        "timeline": timeline,
        "preemption": notice,
        "actions": state_actions(req),
        "cluster": cluster,
        "proxy": notebook_access(actor, req),
        "serving": kinds.get(req.template.kind).serving,  # its endpoint page (workloads/endpoint_views.py)
        "stop_note": kinds.get(req.template.kind).stop_note,
        "poll": req.state not in FINAL,
        "poll_seconds": POLL_SECONDS,
        "final": req.state in FINAL,
        "cost_so_far": cost_so_far.display(req),  # billing's, through portal.extensions (None: no price list)
        "rightsizing": rightsizing.call(req),  # measured use (insights), None without samples
    }


def _extension_rows(actor: Actor, req: WorkloadRequest, bound: dict[int, DecisionForm] | None = None) -> list[dict[str, Any]]:
    """The request's extension requests, newest first, each with what ``actor`` may do with it (``bound``: a
    decision form sent back with its errors)."""
    rows = []
    decider = policy.may_decide(actor, req.project)
    for ext in req.extension_requests.select_related("requested_by", "decided_by").order_by("-created_at", "-id"):
        pending = ext.status == ExtensionRequest.Status.PENDING
        rows.append({"ext": ext, "decide": pending and decider,
                     "cancel": pending and actor.user is not None and ext.requested_by_id == actor.user.pk,
                     "form": (bound or {}).get(ext.pk) or DecisionForm(prefix=f"extension-{ext.pk}")})
    return rows


def _detail_page(request: HttpRequest, actor: Actor, req: WorkloadRequest, *, status: int = 200,
                 decision_form: DecisionForm | None = None, ask_form: ExtensionAskForm | None = None,
                 extension_forms: dict[int, DecisionForm] | None = None,
                 scale_ask_form: ScaleAskForm | None = None, share_form: Any = None) -> HttpResponse:
    context = _detail_context(actor, req)
    if asked(request, policy.may_share_request, req):  # the "Share" section (share_views.py)
        context |= {"shares": sharing.shares_of(req), "share_form": share_form or ShareForm(prefix="share")}
    extension_rows = _extension_rows(actor, req, extension_forms)
    ask = request.GET.get("ask", "")
    scale = request.GET.get("scale", "")
    context |= {
        "decision_form": decision_form or DecisionForm(prefix=f"decide-{req.pk}"),
        "extend_form": ExtendForm(prefix="extend"),
        "ask_form": ask_form or ExtensionAskForm(prefix="ask", initial={"hours": int(ask)} if ask.isdecimal() else None),
        "scale_form": ScaleForm(prefix="scale", initial={"replicas": req.replicas}),
        "scale_ask_form": scale_ask_form or ScaleAskForm(
            prefix="askscale", initial={"replicas": int(scale) if scale.isdecimal() else req.replicas + 1}),
        "extensions": extension_rows,
        # One extension request (and one scale request) waits at a time: the form to ask comes back once it is decided.
        "extension_pending": any(row["ext"].status == ExtensionRequest.Status.PENDING and not row["ext"].is_scale
                                 for row in extension_rows),
        "scale_asked": any(row["ext"].is_scale for row in extension_rows),
        "scale_pending": any(row["ext"].status == ExtensionRequest.Status.PENDING and row["ext"].is_scale
                             for row in extension_rows),
    }
    return page(request, "workloads/request_detail.html", context, status=status)


@login_required
def request_detail(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _actor(request)
    req = _visible_request(actor, pk)
    if request.htmx and request.htmx.target == "request-live":
        return render(request, "workloads/_request_live.html", _detail_context(actor, req))
    return _detail_page(request, actor, req)


# Logs -------------------------------------------------------------------------------------------------------------


# Notebooks: the portal's proxy and the ingress's auth check ------------------------------------------------------


# Lifecycle actions ------------------------------------------------------------------------------


# Approvals --------------------------------------------------------------------------------------


# Ops: all requests ------------------------------------------------------------------------------


@login_required
def ops_requests(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    if not actor.is_ops:
        raise Http404("No such page.")  # ops pages don't exist for anyone else
    # Five joins took PostgreSQL 13-26 ms to plan (0.4 to run) over every request: the template and the flavor of
    # the page's rows come from the names kept with the catalogue instead (``selectors.attach_template_and_flavor``).
    everything = (
        selectors.requests_for(actor=actor).order_by("-created_at", "-id")
        .select_related(None).select_related("project", "tenant", "requested_by")
        .only(*LIST_COLUMNS, "template", "flavor", "tenant__name", "requested_by__username")
    )
    flavors, templates = selectors.flavor_and_template_choices(actor=actor)
    filterset = _request_filters(
        request, everything, hide=("mine", "created_after", "created_before", "priority"),
        selects={"flavor": flavors, "template": templates},
    )
    # Tenants are too many for a drop-down: a text field (slug or name; submitting filters without JavaScript)
    # whose suggestions come from the tenant search as one types (htmx fills the datalist).
    filterset.filters["tenant"] = TenantSlugOrName(field_name="tenant")
    tenant_search_widget(filterset.form.fields["tenant"], list_id="tenant-options")
    # Every request of every tenant: counted up to COUNT_MOST past the page (then "1,000+"), as the request list.
    pager = Pager(request, filterset.qs, most=COUNT_MOST)
    selectors.attach_template_and_flavor(pager.page.object_list)  # their names, kept with the catalogue
    return page(request, "workloads/ops_requests.html", {"filterset": filterset, "pager": pager})

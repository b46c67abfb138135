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
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.inputs import is_id
from quotas.models import Flavor
from tenants.access import Actor, has_perm
from tenants.selectors import projects_for, projects_where
from tenants.views import Pager, filtered, page, tenant_choices

from . import selectors, services
from .filters import RequestFilter
from .forms import DecisionForm, ExtendForm, RequestForm, ScaleForm
from .models import RequestState, ServiceTemplate, TemplateKind, WorkloadRequest
from .states import ACTIVE, CANCELLABLE, FINAL

S = RequestState
POLL_SECONDS = 3
LOG_LINES = 200

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


def _polling(rows: Any) -> bool:
    """Whether a list still needs polling: something on it can still change by itself."""
    return any(req.state not in FINAL for req in rows)


def _state_of(req: WorkloadRequest) -> dict[str, Any]:
    return {"status": req.state, "label": req.get_state_display()}


# My requests ------------------------------------------------------------------------------------


SCOPES = {"mine": "Mine", "projects": "All in my projects"}


@login_required
def request_list(request: HttpRequest) -> HttpResponse:
    """The user's requests (or every request in their projects), newest first, with live state."""
    actor = _actor(request)
    scope = request.GET.get("scope") if request.GET.get("scope") in SCOPES else "mine"
    visible = selectors.requests_for(actor=actor).order_by("-created_at", "-id")
    if scope == "mine":
        visible = visible.filter(requested_by=request.user)
    projects = list(projects_for(actor=actor).order_by("name").values_list("slug", "name"))
    hide = ("tenant", "mine", "created_after", "created_before", "template", "flavor", "priority")
    filterset = _request_filters(
        request, visible, hide=hide + (("requested_by",) if scope == "mine" else ()), selects={"project": projects}
    )
    pager = Pager(request, filterset.qs)
    context = {
        "filterset": filterset, "pager": pager, "scope": scope, "scopes": SCOPES, "poll": _polling(pager),
        "poll_seconds": POLL_SECONDS, "can_submit": projects_where(actor=actor, perm="submit_project").exists(),
    }
    if request.htmx and request.htmx.target == "request-rows":
        return render(request, "workloads/_request_rows.html", context)
    return page(request, "workloads/request_list.html", context)


# New request ------------------------------------------------------------------------------------


def _submittable(actor: Actor) -> QuerySet[Any]:
    return projects_where(actor=actor, perm="submit_project").filter(status="active", tenant__status="active").order_by("tenant__name", "name")


def _template_from(actor: Actor, key: str | None) -> ServiceTemplate | None:
    if not key:
        return None
    templates = selectors.templates_for(actor=actor).filter(active=True)
    if is_id(key):
        return templates.filter(pk=int(key)).first()
    return templates.filter(slug=key).order_by("-version").first()


def _request_form(actor: Actor, template: ServiceTemplate, data: Any = None, initial: dict[str, Any] | None = None) -> RequestForm:
    flavors = template.allowed_flavors.filter(active=True).order_by("order", "name")
    return RequestForm(
        data, initial=initial or {}, template=template, projects=_submittable(actor),
        images=selectors.images_for(actor=actor).filter(active=True), flavors=flavors,
    )


def _cost_estimate(form: RequestForm) -> str | None:
    """The estimated cost of what the form asks for. None until billing has a price list."""
    return None


@login_required
def request_new(request: HttpRequest) -> HttpResponse:
    """Step one: pick a template. Step two (``?template=``): the form generated from its schema."""
    actor = _actor(request)
    projects = _submittable(actor)
    project_slug = request.GET.get("project") or request.POST.get("project") or ""
    template = _template_from(actor, request.GET.get("template"))
    context: dict[str, Any] = {"project_slug": project_slug, "has_projects": projects.exists()}
    if template is None:
        context["templates"] = selectors.templates_for(actor=actor).filter(active=True).order_by("kind", "slug", "-version")
        context["unknown_template"] = bool(request.GET.get("template"))
        return page(request, "workloads/request_new.html", context)

    if request.method == "POST":
        form = _request_form(actor, template, request.POST)
        if form.is_valid():
            try:
                req = services.request_submit(actor=actor, template=template, **form.submit_values())
            except (PortalError, ValidationError) as exc:
                form.add_service_error(exc)
            else:
                if getattr(req, "replayed", False):
                    messages.info(request, f"This form was already sent: here is request {req.name}.")
                elif req.state == S.PENDING_APPROVAL:
                    messages.success(request, f"Request {req.name} submitted. It waits for a project admin's approval.")
                else:
                    messages.success(request, f"Request {req.name} submitted and {req.get_state_display().lower()}.")
                return redirect("request-detail", pk=req.pk)
    else:
        form = _request_form(actor, template, initial={"project": project_slug} if project_slug else None)
    context |= {"template": template, "form": form, "cost_estimate": _cost_estimate(form)}
    return page(request, "workloads/request_form.html", context)


# Request detail ---------------------------------------------------------------------------------


def _visible_request(actor: Actor, pk: int) -> WorkloadRequest:
    return get_object_or_404(selectors.requests_for(actor=actor), pk=pk)


def _can_act(actor: Actor, req: WorkloadRequest) -> bool:
    """The requester (while they may still submit there) or an approver: the services' own rule."""
    if has_perm(actor, "approve_project", req.project):
        return True
    return req.requested_by_id == getattr(actor.user, "pk", None) and has_perm(actor, "submit_project", req.project)


def allowed_actions(actor: Actor, req: WorkloadRequest) -> dict[str, bool]:
    """Which lifecycle buttons to show. The services decide again on POST; this only hides what would be refused."""
    state = req.state
    can_decide = state in (S.SUBMITTED, S.PENDING_APPROVAL) and has_perm(actor, "approve_project", req.project)
    if not _can_act(actor, req):
        return {"decide": can_decide}
    writable = req.project.is_active and req.tenant.is_active
    return {
        "decide": can_decide,
        "cancel": state in CANCELLABLE,
        "stop": state in (ACTIVE - CANCELLABLE),
        "restart": state in (S.STOPPED, S.FAILED) and writable,
        "extend": state not in FINAL and writable and req.duration_hours < req.template.max_duration_hours,
        "scale": state not in FINAL and req.template.kind == TemplateKind.INFERENCE,
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
    return {"pods": pods, "workloads": workloads, "others": others, "warnings": warnings,
            "any": bool(pods or workloads or others or warnings)}


def _detail_context(actor: Actor, req: WorkloadRequest) -> dict[str, Any]:
    return {
        "req": req,
        "pending": selectors.request_pending_reason(req),
        "timeline": selectors.request_timeline(req),
        "actions": allowed_actions(actor, req),
        "cluster": cluster_facts(req),
        "poll": req.state not in FINAL,
        "poll_seconds": POLL_SECONDS,
        "final": req.state in FINAL,
    }


def _notebook_access(actor: Actor, req: WorkloadRequest) -> str:
    """A running notebook's URL with its token, for the requester and the project's approvers only."""
    if req.template.kind != "notebook" or req.state != RequestState.RUNNING:
        return ""
    if req.requested_by_id != actor.user.pk and not has_perm(actor, "approve_project", req.project):
        return ""
    from django.conf import settings

    from .manifests import notebook_access_url
    from .materialize import notebook_token

    return notebook_access_url(
        namespace=req.project.namespace, name=req.k8s_name, ide=str((req.parameters or {}).get("ide") or "jupyterlab"),
        token=notebook_token(req), base_url=getattr(settings, "PORTAL_NOTEBOOK_BASE_URL", ""),
    )


@login_required
def request_detail(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _actor(request)
    req = _visible_request(actor, pk)
    context = _detail_context(actor, req)
    if request.htmx and request.htmx.target == "request-live":
        return render(request, "workloads/_request_live.html", context)
    context |= {
        "access_url": _notebook_access(actor, req),
        "decision_form": DecisionForm(prefix=f"decide-{req.pk}"),
        "extend_form": ExtendForm(prefix="extend"),
        "scale_form": ScaleForm(prefix="scale", initial={"replicas": req.replicas}),
        "is_requester": req.requested_by_id == request.user.pk,
    }
    return page(request, "workloads/request_detail.html", context)


@login_required
def request_logs(request: HttpRequest, pk: int) -> HttpResponse:
    """The request's pods and their last log lines, read from the cluster when asked (loaded lazily)."""
    actor = _actor(request)
    req = _visible_request(actor, pk)
    pods: list[dict[str, Any]] = []
    error = ""
    try:
        pods = _pod_logs(req)
    except Exception as exc:  # noqa: BLE001 - a cluster that cannot answer must not break the page
        error = f"The cluster did not answer: {exc}"
    context = {"req": req, "pods": pods, "error": error}
    if request.htmx:
        return render(request, "workloads/_request_logs.html", context)
    return page(request, "workloads/request_logs_page.html", context)


def _pod_logs(req: WorkloadRequest) -> list[dict[str, Any]]:
    """Pods of the request (by our request label) with their log tails, when the cluster client can read logs."""
    if not (req.cluster.kubeconfig_encrypted or req.cluster.kubeconfig_path):
        return []
    from portal.kube import kube_for

    from .manifests import REQUEST_LABEL

    kube = kube_for(req.cluster)
    items, _ = kube.list("v1", "Pod", req.project.namespace, label_selector=f"{REQUEST_LABEL}={req.pk}")
    pods = []
    for pod in sorted(items, key=lambda p: p["metadata"]["name"]):
        name = pod["metadata"]["name"]
        text = kube.pod_log(req.project.namespace, name, tail_lines=LOG_LINES)
        pods.append({"name": name, "phase": (pod.get("status") or {}).get("phase", ""),
                     "node": (pod.get("spec") or {}).get("nodeName", ""), "log": text})
    return pods


# Lifecycle actions ------------------------------------------------------------------------------


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
    return _act(request, pk, lambda a, r: services.request_extend(actor=a, request=r, hours=hours),
                "Request {req.name} now runs for up to {req.duration_hours} hours.")


@login_required
@require_POST
def request_scale(request: HttpRequest, pk: int) -> HttpResponse:
    form = ScaleForm(request.POST, prefix="scale")
    if not form.is_valid():
        messages.error(request, "Choose between 1 and 64 replicas.")
        return redirect("request-detail", pk=pk)
    replicas = form.cleaned_data["replicas"]
    return _act(request, pk, lambda a, r: services.request_scale(actor=a, request=r, replicas=replicas),
                "Request {req.name} now has {req.replicas} replicas.")


# Approvals --------------------------------------------------------------------------------------


def _is_approver(actor: Actor) -> bool:
    return projects_where(actor=actor, perm="approve_project").exists()


def _inbox_row(req: WorkloadRequest) -> dict[str, Any]:
    return {"req": req, "info": selectors.approval_context(req), "form": DecisionForm(prefix=f"decide-{req.pk}")}


@login_required
def approvals(request: HttpRequest) -> HttpResponse:
    """The approver's inbox: requests waiting for them, oldest first, each with its context."""
    actor = _actor(request)
    if not _is_approver(actor):
        raise Http404("No such page.")  # only approvers have an inbox
    inbox = selectors.approvals_inbox_for(actor=actor)
    filterset = _request_filters(
        request, inbox, hide=("state", "phase", "tenant", "mine", "requested_by", "created_after", "created_before",
                              "template", "flavor", "priority"),
        selects={"project": list(projects_where(actor=actor, perm="approve_project").order_by("name").values_list("slug", "name"))},
    )
    pager = Pager(request, filterset.qs)
    rows = [_inbox_row(req) for req in pager]
    return page(request, "workloads/approvals.html", {"filterset": filterset, "pager": pager, "rows": rows})


@login_required
@require_POST
def request_decide(request: HttpRequest, pk: int) -> HttpResponse:
    """Approve or reject with a comment: from the inbox (htmx: the decided row) or the detail page."""
    actor = _actor(request)
    req = _visible_request(actor, pk)
    form = DecisionForm(request.POST, prefix=f"decide-{req.pk}")
    decision = request.POST.get("decision")
    error = ""
    if decision not in ("approve", "reject") or not form.is_valid():
        error = "Choose approve or reject; a comment has at most 1000 characters."
    else:
        call = services.request_approve if decision == "approve" else services.request_reject
        try:
            req = call(actor=actor, request=req, comment=form.cleaned_data["comment"])
        except (PortalError, ValidationError) as exc:
            error = _error_text(exc)
    done = f"{req.name} {'approved' if req.state != S.REJECTED else 'rejected'}." if not error else ""
    if request.htmx:
        row = _inbox_row(req) | {"error": error, "done": done}
        return render(request, "workloads/_approval_row.html", row)
    if error:
        messages.error(request, error)
    else:
        messages.success(request, done + (" The requester is told." if done else ""))
    back = request.POST.get("next", "")
    if back == "inbox":
        return redirect("approvals")
    return redirect("request-detail", pk=req.pk)


# Ops: all requests ------------------------------------------------------------------------------


@login_required
def ops_requests(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    if not actor.is_ops:
        raise Http404("No such page.")  # ops pages don't exist for anyone else
    everything = selectors.requests_for(actor=actor).order_by("-created_at", "-id")
    flavors = list(Flavor.objects.order_by("name").values_list("name", "name").distinct())
    templates = list(ServiceTemplate.objects.order_by("slug").values_list("slug", "slug").distinct())
    filterset = _request_filters(
        request, everything, hide=("mine", "created_after", "created_before", "priority"),
        selects={"tenant": tenant_choices(), "flavor": flavors, "template": templates},
    )
    pager = Pager(request, filterset.qs)
    return page(request, "workloads/ops_requests.html", {"filterset": filterset, "pager": pager})

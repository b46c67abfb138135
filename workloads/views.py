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

import re
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from portal.exceptions import NotAllowed, PortalError
from portal.extensions import budget_remaining, cost_estimator, cost_so_far, rightsizing
from portal.forms import once_claim, once_initial, once_replay, once_sent
from portal.inputs import is_id
from portal.ui import Pager, filtered
from tenants.access import Actor
from tenants.filters import TenantSlugOrName, tenant_search_widget
from tenants.forms import add_service_error
from tenants.policy import asked
from tenants.selectors import projects_for, projects_where
from tenants.ui import page

from . import approvals as approvals_flow
from . import extensions, kinds, policy, preemption, selectors, services, sharing
from .filters import RequestFilter
from .forms import (BulkDecisionForm, DecisionForm, ExtendForm, ExtensionAskForm, RequestForm, ScaleAskForm, ScaleForm,
                    ShareForm)
from .models import ExtensionRequest, RequestState, ServiceTemplate, WorkloadRequest
from .pending import request_placement, request_queue_line
from .shared import shares_held
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


# The related rows a request list shows (templates/workloads/_request_rows.html), and nothing else: each join
# on top of the visibility subquery costs the database planner more than running the query (docs/performance.md).
ROW_RELATED = ("project", "template", "flavor")


def _rows(queryset: QuerySet[WorkloadRequest], *also: str) -> QuerySet[WorkloadRequest]:
    return queryset.select_related(None).select_related(*ROW_RELATED, *also)


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
        visible = _rows(visible.filter(requested_by=request.user))
    elif scope == "shared":  # shared with the user by a colleague (workloads/sharing.py)
        visible = _rows(visible.filter(pk__in=sorted(shares_held(actor))), "requested_by")
    else:
        visible = _rows(visible, "requested_by")
    projects = list(projects_for(actor=actor).order_by("name").values_list("slug", "name"))
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


def _submittable(actor: Actor) -> QuerySet[Any]:
    return projects_where(actor=actor, perm="submit_project").filter(status="active", tenant__status="active").order_by("tenant__name", "name")


def _template_from(actor: Actor, key: str | None, projects: list[Any] | None) -> ServiceTemplate | None:
    """The template ``?template=`` names (slug or id) in the catalogue the projects can use (``catalogue_for``,
    as the catalogue page shows it): never a retired version, nor one these projects have no flavor for."""
    if not key:
        return None
    templates = selectors.catalogue_for(actor=actor, projects=projects)
    if is_id(key):
        return templates.filter(pk=int(key)).first()
    return templates.filter(slug=key).order_by("-version").first()


def _request_form(actor: Actor, template: ServiceTemplate, data: Any = None, initial: dict[str, Any] | None = None,
                  *, projects: list[Any] | None = None) -> RequestForm:
    # ``flavors``: every active one the template allows (so a stale or forged choice is refused with its reason);
    # offered: those the projects can use (``template_flavors_for``).
    flavors = template.allowed_flavors.filter(active=True).select_related("cluster").order_by("order", "name")
    form = RequestForm(
        data, initial=initial or {}, template=template, projects=_submittable(actor),
        images=selectors.images_for(actor=actor).filter(active=True), flavors=flavors,
        offered=selectors.template_flavors_for(template=template, projects=projects),
    )
    _offer_volumes(actor, form)
    return form


VOLUME_FIELD = "param_data_volume"
VOLUME_LIST = "data-volume-options"


def _offer_volumes(actor: Actor, form: RequestForm) -> None:
    """A data volume is picked from the volumes one may mount (one's own and the projects' shared ones, in the
    projects of the form), suggested as one types and listed under the field; the service still decides."""
    field = form.fields.get(VOLUME_FIELD)
    if field is None:
        return
    mine = Q(owner__isnull=True) | Q(owner=actor.user) if actor.user is not None else Q(owner__isnull=True)
    volumes = list(selectors.volumes_for(actor=actor).filter(mine, project__in=[p.pk for p in form.projects.values()])
                   .order_by("project__name", "name")[:50])
    form.data_volumes = volumes
    field.widget.attrs.update({"list": VOLUME_LIST, "autocomplete": "off"})
    if volumes:
        listed = ", ".join(f"{v.name} ({v.project.name}, {'shared' if v.owner_id is None else 'yours'})" for v in volumes)
        field.help_text = f"{field.help_text} You may mount: {listed}."
    else:
        field.help_text = (f"{field.help_text} You have no volume to mount yet: a notebook's home volume is yours, and a "
                           "project admin can share one.")


def _cost_estimate(form: RequestForm) -> str | None:
    """The estimated cost of what the form asks for ("12.50 EUR"), from the estimator billing registers
    (``portal.extensions``); None while there is none."""
    if not cost_estimator.active:
        return None
    return cost_estimator.display(form.asked_for())


@login_required
def request_new(request: HttpRequest) -> HttpResponse:
    """Step one: pick a template. Step two (``?template=``): the form generated from its schema.

    Both steps offer what ``selectors.catalogue_for`` / ``template_flavors_for`` offer for the projects in view:
    the one chosen with ``?project=`` (on GET), else every project the user may submit in. Without any such
    project the catalogue is shown as it is, to read (nothing can be submitted)."""
    actor = _actor(request)
    projects = list(_submittable(actor))
    project_slug = request.GET.get("project") or request.POST.get("project") or ""
    chosen = [p for p in projects if p.slug == project_slug]
    # A POST keeps every project in view: the form's values must come back, with the service's reason.
    in_view = (chosen if chosen and request.method != "POST" else projects) or None
    template = _template_from(actor, request.GET.get("template"), in_view)
    context: dict[str, Any] = {"project_slug": project_slug, "has_projects": bool(projects)}
    if not projects:  # a viewer is told that his role only reads, not to ask to become a member of what he is in
        context["read_only_projects"] = list(projects_where(actor=actor, perm="view_project").filter(
            status="active", tenant__status="active").order_by("tenant__name", "name")[:5])
    if template is None:
        context["presets"] = selectors.presets_for(actor=actor).filter(
            project__in=[p.pk for p in in_view or []]).order_by("project__name", "name")
        templates = list(selectors.catalogue_for(actor=actor, projects=in_view).order_by("kind", "slug", "-version"))
        for t in templates:
            t.offered_flavors = selectors.template_flavors_for(template=t, projects=in_view)
        context["templates"] = templates
        context["unknown_template"] = bool(request.GET.get("template"))
        return page(request, "workloads/request_new.html", context)

    started_from = ""
    if request.method == "POST" and request.POST.get("action") == "save-preset":
        form = _request_form(actor, template, request.POST, projects=in_view)
        saved = _preset_save(request, actor, template, form)
        if saved is not None:
            return saved
        once = None
    elif request.method == "POST":
        form = _request_form(actor, template, request.POST, projects=in_view)
        # The form's one-time token (its idempotency key): a replay of the same form is answered with
        # the request it made, before anything is checked again (portal/forms.py).
        once = once_claim(request, form)
        if not once.first:
            replayed = once_replay(request, form, once)
            if replayed is not None:
                return replayed
        elif form.is_valid():
            try:
                req = services.request_submit(actor=actor, template=template, **form.submit_values())
            except (PortalError, ValidationError) as exc:
                form.add_service_error(exc)
            else:
                # A name made up by the service is said, never silent.
                named = "" if form.cleaned_data.get("name") else f" No name was given: it is called {req.name}."
                if getattr(req, "replayed", False):
                    messages.info(request, f"This form was already sent: here is request {req.name}.")
                elif req.state == S.PENDING_APPROVAL:
                    messages.success(request, f"Request {req.name} submitted. It waits for a project admin's approval."
                                     + named)
                else:
                    messages.success(request, f"Request {req.name} submitted and {req.get_state_display().lower()}."
                                     + named)
                url = reverse("request-detail", kwargs={"pk": req.pk})
                once.done(url, f"This form was already sent: here is request {req.name}.")
                return redirect(url)
        if once is not None and once.first:
            once.release()
    else:
        initial = ({"project": project_slug} if project_slug else {}) | once_initial(request, RequestForm)
        form = _request_form(actor, template, initial=initial, projects=in_view)
        context["form_sent"] = once_sent(request, form)
        started_from, dropped = _start_from(request, actor, template, form)
        if dropped:
            messages.warning(request, "Not carried over: " + "; ".join(dropped) + ".")
    presets = selectors.presets_for(actor=actor).filter(template_slug=template.slug, project__in=[p.pk for p in projects])
    context |= {"form": form, "started_from": started_from, "presets": presets.order_by("project__name", "name")}
    context |= _estimate_context(form, template)
    return page(request, "workloads/request_form.html", context)


@login_required
@require_POST
def request_estimate(request: HttpRequest) -> HttpResponse:
    """htmx: the form's cost estimate (and budget line) for the values it holds now, sent on every change. Writes
    nothing; the figure is the one the API's ``cost_estimate`` gives the request once submitted."""
    actor = _actor(request)
    projects = list(_submittable(actor))
    template = _template_from(actor, request.GET.get("template"), projects or None)
    if template is None:
        raise Http404("No such template.")
    form = _request_form(actor, template, request.POST, projects=projects or None)
    form.is_valid()  # what is valid counts; a field with an error gives no estimate rather than a stale one
    return render(request, "workloads/_cost_estimate.html", _estimate_context(form, template))


def _estimate_context(form: RequestForm, template: ServiceTemplate) -> dict[str, Any]:
    asked = form.asked_for()
    missing = [form.fields[name].label or name for name in ("gpus", "duration_hours", "cpu", "memory_gib")
               if name in form.fields and getattr(asked, name) in (None, "")]
    return {"template": template, "cost_estimate": None if missing else _cost_estimate(form), "billing": cost_estimator.active,
            "budget_left": budget_remaining.call(asked), "estimate_missing": missing}


def _start_from(request: HttpRequest, actor: Actor, template: ServiceTemplate, form: RequestForm) -> tuple[str, list[str]]:
    """``?clone=<request id>`` or ``?preset=<preset id>``: fill the form from that request's values or that preset
    (a request or preset the user cannot see is a 404). Returns a line for the page and what was dropped."""
    clone, preset_id = request.GET.get("clone"), request.GET.get("preset")
    if clone:
        if not is_id(clone):
            raise Http404("No such request.")
        req = _visible_request(actor, int(clone))
        values = selectors.request_values(req)
        suggested = rightsizing.call(req) if request.GET.get("suggest") == "1" else None
        if suggested is not None and suggested.values:  # "Clone with the suggestion": the measured size instead
            values.update(suggested.values)
        dropped = form.prefill(values, project=req.project.slug)
        changed = f" The template changed since (v{req.template.version} → v{template.version}): check the settings." \
            if req.template_id != template.pk else ""
        return f"Starting from request {req.name}: change what you need, then submit.{changed}", dropped
    if preset_id:
        if not is_id(preset_id):
            raise Http404("No such preset.")
        preset = get_object_or_404(selectors.presets_for(actor=actor), pk=int(preset_id))
        dropped = form.prefill(preset.values, project=preset.project.slug)
        # The names typed before "Save as preset" stay: the preset's, and the request's (``?name=``).
        form.initial["preset_name"] = preset.name
        if request.GET.get("name"):
            form.initial["name"] = request.GET["name"][:40]
        return f"Starting from your preset “{preset.name}” ({preset.project.name}).", dropped
    return "", []


def _preset_save(request: HttpRequest, actor: Actor, template: ServiceTemplate, form: RequestForm) -> HttpResponse | None:
    """"Save as preset": the form's values under its preset name. A redirect to the form started from the
    preset, or None (the form shows why)."""
    if not form.is_valid():
        return None
    name = form.cleaned_data.get("preset_name") or ""
    if not name.strip():
        form.add_error("preset_name", "Name the preset.")
        return None
    project = form.projects[form.cleaned_data["project"]]
    try:
        preset, created = services.preset_save(actor=actor, project=project, template_slug=template.slug, name=name,
                                               values=form.preset_values())
    except (PortalError, ValidationError) as exc:
        form.add_error("preset_name" if getattr(exc, "field", "") in ("name", "template") else None, _error_text(exc))
        return None
    messages.success(request, f"Preset “{preset.name}” {'saved' if created else 'updated'} for {project.name}.")
    query = {"template": template.slug, "project": project.slug, "preset": preset.pk}
    if form.cleaned_data.get("name"):  # the request's name typed so far is kept for the Submit that follows
        query["name"] = form.cleaned_data["name"]
    return redirect(f"{reverse('request-new')}?{urlencode(query)}")


@login_required
@require_POST
def request_preset_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """Delete one of your presets (another's is a 404), then back to where the button was."""
    actor = _actor(request)
    preset = get_object_or_404(selectors.presets_for(actor=actor), pk=pk)
    services.preset_delete(actor=actor, preset=preset)
    messages.success(request, f"Preset “{preset.name}” deleted.")
    back = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        back = reverse("request-new")
    return redirect(back)


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

LOG_TAILS = (100, 200, 1000, 5000)
FOLLOW_SECONDS = 2


def _tail(request: HttpRequest) -> int:
    try:
        value = int(request.GET.get("tail") or LOG_LINES)
    except ValueError:
        return LOG_LINES
    return min(max(value, 1), max(LOG_TAILS))


def _cursor(pod: selectors.PodLog) -> str:
    """Where following a pod's log resumes: the last line's cluster time and how many lines carry exactly that time
    (``sinceTime`` is inclusive and times repeat, so those lines are skipped when they come again)."""
    lines = pod.lines or []
    if not lines or not lines[-1].at:
        return ""
    last = lines[-1].at
    same = 0
    for line in reversed(lines):
        if line.at != last:
            break
        same += 1
    return f"{last}|{same}"


def _after(lines: list[selectors.LogLine], cursor: str) -> list[selectors.LogLine]:
    """The lines of a ``sinceTime`` answer that are new after ``cursor`` (see ``_cursor``)."""
    last, _, seen = cursor.partition("|")
    last = selectors.log_time_key(last)
    skip = int(seen) if seen.isdigit() else 0
    out = []
    for line in lines:
        key = selectors.log_time_key(line.at)
        if line.at and key < last:
            continue
        if line.at and key == last and skip > 0:
            skip -= 1
            continue
        out.append(line)
    return out


def _logs_context(req: WorkloadRequest, tail: int) -> dict[str, Any]:
    pods: list[selectors.PodLog] = []
    error = ""
    try:
        pods = selectors.logs_for(req, tail=tail)
    except Exception as exc:
        error = f"The cluster did not answer: {exc}"
    follow = [{"name": p.name, "cursor": _cursor(p)} for p in pods if p.lines is not None]
    return {"req": req, "pods": pods, "error": error, "tail": tail, "tails": LOG_TAILS,
            "follow": follow if req.state not in FINAL else [], "follow_seconds": FOLLOW_SECONDS,
            "poll": req.state not in FINAL,
            "pod_names": ",".join(p.name for p in pods if p.lines is not None)}


@login_required
def request_logs(request: HttpRequest, pk: int) -> HttpResponse:
    """The request's pods and the last lines of their logs (cluster time), read from the cluster when asked.

    The full page follows running pods: a poller asks ``request-logs-follow`` every few seconds for the lines
    after the last one shown and appends them. ``?tail=N`` picks how many lines to start with."""
    actor = _actor(request)
    req = _logs_request(actor, pk)
    context = _logs_context(req, _tail(request))
    if request.htmx:
        return render(request, "workloads/_request_logs.html", context)
    return page(request, "workloads/request_logs_page.html", context)


@login_required
def request_logs_follow(request: HttpRequest, pk: int) -> HttpResponse:
    """htmx: the log lines that came after each pod's cursor (``?c=<pod>|<time>|<n>``, one per pod) and the next
    poller. When the pods with a log are no longer those on the page (``?pods=``), the whole log section is sent
    again."""
    actor = _actor(request)
    req = _logs_request(actor, pk)
    cursors = {}
    for value in request.GET.getlist("c"):
        name, _, rest = value.partition("|")
        cursors[name] = rest
    shown = [n for n in (request.GET.get("pods") or "").split(",") if n]
    # Ask from the whole second of each cursor (what every API server takes); ``_after`` drops what was shown.
    since = {name: rest.partition("|")[0].partition(".")[0].rstrip("Z") + "Z" for name, rest in cursors.items() if rest}
    try:
        pods = selectors.logs_for(req, tail=max(LOG_TAILS), since=since)
    except Exception as exc:
        follow = [{"name": name, "cursor": rest} for name, rest in cursors.items()]
        return render(request, "workloads/_log_follow.html", {"req": req, "follow": follow, "new": [],
                                                             "pod_names": ",".join(shown), "error": str(exc),
                                                             "follow_seconds": FOLLOW_SECONDS * 3, "poll": True,
                                                             "tail": _tail(request)})
    if sorted(p.name for p in pods if p.lines is not None) != sorted(shown):
        response = render(request, "workloads/_request_logs.html", _logs_context(req, _tail(request)))
        response["HX-Retarget"] = "#request-logs"
        response["HX-Reswap"] = "innerHTML"
        return response
    new, follow = [], []
    for pod in pods:
        if pod.lines is None:
            continue
        cursor = cursors.get(pod.name, "")
        fresh = _after(pod.lines, cursor) if cursor else pod.lines
        if fresh:
            new.append({"name": pod.name, "lines": fresh})
        follow.append({"name": pod.name, "cursor": _cursor(selectors.PodLog(pod.name, lines=fresh)) if fresh else cursor})
    return render(request, "workloads/_log_follow.html", {
        "req": req, "new": new, "follow": follow, "pod_names": ",".join(shown), "follow_seconds": FOLLOW_SECONDS,
        "poll": req.state not in FINAL, "tail": _tail(request),
    })


@login_required
def request_logs_download(request: HttpRequest, pk: int) -> HttpResponse:
    """The whole log of one pod (``?pod=``) or of every pod of the request, as a plain-text attachment.
    Each line starts with the cluster's timestamp (cluster time, UTC)."""
    actor = _actor(request)
    req = _logs_request(actor, pk)
    wanted = request.GET.get("pod") or None
    try:
        pods = selectors.logs_for(req, tail=None, pod=wanted)
    except Exception as exc:
        return HttpResponse(f"The cluster did not answer: {exc}\n", status=502, content_type="text/plain; charset=utf-8")
    if wanted and not pods:
        raise Http404("No such pod.")
    if wanted:
        body = pods[0].text
    else:
        body = "".join(f"==> {p.name} <==\n{p.text}\n" for p in pods)
    response = HttpResponse(body, content_type="text/plain; charset=utf-8")
    filename = f"{req.k8s_name}-{wanted}.log" if wanted else f"{req.k8s_name}.log"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


# Notebooks: the portal's proxy and the ingress's auth check ------------------------------------------------------

NOTEBOOK_PATH = re.compile(r"^/notebooks/(\d+)(/|$)")
# Request headers a notebook gets from the browser; everything else (the portal's own cookies and credentials
# included) stays here.
FORWARD_HEADERS = ("Accept", "Accept-Language", "Content-Type", "X-XSRFToken", "X-Requested-With", "If-None-Match",
                   "If-Modified-Since", "User-Agent")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def _notebook_cookies(request: HttpRequest) -> str:
    """The browser's cookies minus the portal's own (the session must never reach a notebook)."""
    from django.conf import settings

    own = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, settings.LANGUAGE_COOKIE_NAME}
    return "; ".join(f"{k}={v}" for k, v in request.COOKIES.items() if k not in own)


def _same_origin(request: HttpRequest, host: str | None = None, scheme: str | None = None) -> bool:
    """Unsafe methods must come from the portal's own pages: the notebook trusts its token and skips its own
    XSRF check, so a cross-site form must not get through the portal with the user's session."""
    from urllib.parse import urlsplit

    host = host or request.get_host()
    origin = request.headers.get("Origin") or ""
    if origin and origin != "null":
        parts = urlsplit(origin)
        return parts.netloc == host and (scheme is None or parts.scheme == scheme)
    if origin == "null":
        return False
    referer = request.headers.get("Referer") or ""
    if referer:
        return urlsplit(referer).netloc == host
    return request.headers.get("Sec-Fetch-Site", "same-origin") in ("same-origin", "none")


def _notebook_page(request: HttpRequest, req: WorkloadRequest | None, status: int, title: str, text: str) -> HttpResponse:
    response = render(request, "workloads/notebook_unavailable.html",
                      {"req": req, "title": title, "text": text}, status=status)
    response["Cache-Control"] = "no-store"
    return response


def _notebook_upstream_path(req: WorkloadRequest, rest: str) -> str:
    from .manifests import notebook_path

    if str((req.parameters or {}).get("ide") or "jupyterlab") == "vscode":
        return rest  # code-server serves at its root behind a prefix-stripping proxy
    return notebook_path(req.pk).lstrip("/") + rest


def _unproxied(body: bytes, prefix: str) -> bytes:
    """Undo the API server's service-proxy link rewriting (it prefixes absolute links in HTML with its own path)."""
    return body.replace(prefix.encode(), b"/") if prefix.encode() in body else body


def _notebook_path_refusal(request: HttpRequest, rest: str) -> str | None:
    """Why the path after ``/notebooks/<id>/`` may not be forwarded (``portal.urlpaths.refusal``): checked as the
    server decoded it and, where the server keeps it (gunicorn's ``RAW_URI``, ``REQUEST_URI``), as it was sent."""
    from portal.urlpaths import refusal

    raw = request.META.get("RAW_URI") or request.META.get("REQUEST_URI") or ""
    return refusal(rest, decoded=True) or (refusal(raw.split("?", 1)[0], decoded=False) if raw else None)


@csrf_exempt
def notebook_proxy(request: HttpRequest, pk: int, rest: str = "") -> HttpResponse:
    """``/notebooks/<id>/...``: the demo's way into a notebook, through the Kubernetes API's service proxy.

    Each request is authorised here (``selectors.notebook_may_open``: a 404 for requests the user cannot see, a 403
    for someone else's notebook), counts as activity for idle culling, and reaches the notebook with its token added
    on the way (never in the browser's URL). Plain HTTP only: the development server cannot carry WebSockets;
    production routes ``/notebooks/`` through an ingress that asks ``notebook_auth`` (docs/notebooks.md)."""
    from portal.kube import ClusterError, kube_for, service_proxy
    from portal.urlpaths import PathRefused

    from .materialize import notebook_token

    if not request.user.is_authenticated:
        if request.method in SAFE_METHODS:
            from django.contrib.auth.views import redirect_to_login

            return redirect_to_login(request.get_full_path())
        return HttpResponse("Sign in to the portal first.", status=401, content_type="text/plain; charset=utf-8")
    actor = _actor(request)
    req = _visible_request(actor, pk)
    if not kinds.get(req.template.kind).proxied:
        raise Http404("No such notebook.")
    if not selectors.notebook_may_open(actor=actor, request=req):
        return _notebook_page(request, req, 403, "Not your notebook",
                              "Only the person who requested this notebook can open it"
                              + (", and the project's approvers." if req.project.notebooks_open_to_approvers else "."))
    if req.state != S.RUNNING:
        if req.state in FINAL:
            return _notebook_page(request, req, 503, "This notebook is stopped",
                                  f"Notebook {req.name} is {req.get_state_display().lower()}"
                                  + (f": {req.state_reason}" if req.state_reason else ".")
                                  + (" Its home volume is kept: restart it from the request page." if req.state == S.STOPPED else ""))
        return _notebook_page(request, req, 503, "This notebook is not running yet",
                              f"Notebook {req.name} is {req.get_state_display().lower()}. This page works once it runs.")
    if request.method not in SAFE_METHODS and not _same_origin(request):
        return HttpResponse("Cross-site requests to a notebook are refused.", status=403,
                            content_type="text/plain; charset=utf-8")
    why = _notebook_path_refusal(request, rest)
    if why:
        return HttpResponse(f"This path is refused: it has {why}.", status=400, content_type="text/plain; charset=utf-8")
    services.notebook_activity_record(request_id=req.pk)

    headers = {name: request.headers[name] for name in FORWARD_HEADERS if name in request.headers}
    cookies = _notebook_cookies(request)
    if cookies:
        headers["Cookie"] = cookies
    # The API server authenticates with Authorization and removes it before proxying: the token goes in the query.
    query = [(k, v) for k, values in request.GET.lists() if k != "token" for v in values]
    query.append(("token", notebook_token(req)))
    port = "http"
    try:
        answer = service_proxy(kube_for(req.cluster), req.project.namespace, req.k8s_name, port,
                               _notebook_upstream_path(req, rest), method=request.method or "GET", query=query,
                               headers=headers, body=request.body or None)
    except PathRefused as exc:  # never reached after _notebook_path_refusal; the last guard before the cluster
        return HttpResponse(f"This path is refused: {exc}", status=400, content_type="text/plain; charset=utf-8")
    except ClusterError as exc:
        return _notebook_page(request, req, 502, "The cluster did not answer", f"Try again in a moment. ({exc})")
    if answer.status in (404, 503) and "json" in answer.header("Content-Type"):
        # The API server's own answer (not the notebook's): no Service, or no ready pod behind it.
        import json

        try:
            status_body = json.loads(answer.body)
        except ValueError:
            status_body = {}
        if isinstance(status_body, dict) and status_body.get("kind") == "Status":
            return _notebook_page(request, req, 503, "The notebook is not reachable right now",
                                  "Its pod is not ready (starting, restarting or moving). This page works again once "
                                  f"it is. The cluster says: {status_body.get('message', '')}")
    prefix = f"/api/v1/namespaces/{req.project.namespace}/services/{req.k8s_name}:{port}/proxy/"
    body = answer.body
    if "html" in answer.header("Content-Type"):
        body = _unproxied(body, prefix)
    response = HttpResponse(body, status=answer.status)
    for name, value in answer.headers:
        lower = name.lower()
        if lower == "set-cookie":
            from http.cookies import SimpleCookie

            jar: SimpleCookie = SimpleCookie()
            jar.load(value)
            for key, morsel in jar.items():
                response.cookies[key] = morsel
        elif lower == "location":
            response["Location"] = value.replace(prefix, "/")
        elif lower not in ("date", "server", "cache-control", "audit-id", "x-kubernetes-pf-flowschema-uid",
                           "x-kubernetes-pf-prioritylevel-uid"):
            response[name] = value
    response["Cache-Control"] = answer.header("Cache-Control") or "private, no-cache"
    return response


@csrf_exempt
def notebook_auth(request: HttpRequest) -> HttpResponse:
    """``/notebooks/auth/``: the ingress asks before every request to ``/notebooks/<id>/...`` (nginx
    ``auth_request``, ingress-nginx ``auth-url``, Traefik ``forwardAuth``, Envoy ``ext_authz``).

    The original path comes in ``X-Original-URI`` (nginx) or ``X-Forwarded-Uri`` (Traefik), the session in the
    browser's cookie. 200 (with ``Authorization: token ...`` for the notebook and ``X-Auth-Request-User``) when the
    user may open that notebook, 401 when nobody is signed in, 403 otherwise (also for notebooks the user cannot see:
    an auth check answers nothing else). An unsafe method (``X-Original-Method``/``X-Forwarded-Method``) must come
    from the same origin."""
    from .materialize import notebook_token

    def deny(status: int, why: str) -> HttpResponse:
        response = HttpResponse(why, status=status, content_type="text/plain; charset=utf-8")
        response["Cache-Control"] = "no-store"
        return response

    from portal.urlpaths import refusal

    uri = request.headers.get("X-Original-URI") or request.headers.get("X-Forwarded-Uri") or ""
    if not request.user.is_authenticated:
        return deny(401, "Sign in to the portal first.")
    path = uri.split("?", 1)[0].split("#", 1)[0]
    why = refusal(path, decoded=False)
    if why:  # /notebooks/2/../390/lab is not notebook 2's, whatever the proxy behind would make of it
        return deny(403, f"This path is refused: it has {why}.")
    match = NOTEBOOK_PATH.match(path)
    if not match:
        return deny(403, "Not a notebook path.")
    actor = _actor(request)
    req = selectors.requests_for(actor=actor).filter(pk=int(match.group(1))).first()
    if req is None or not selectors.notebook_may_open(actor=actor, request=req):
        return deny(403, "You may not open this notebook.")
    method = (request.headers.get("X-Original-Method") or request.headers.get("X-Forwarded-Method") or "GET").upper()
    from urllib.parse import urlsplit

    original = urlsplit(request.headers.get("X-Original-URL") or "")  # ingress-nginx: scheme://host/path
    host = request.headers.get("X-Forwarded-Host") or original.netloc or None
    scheme = request.headers.get("X-Forwarded-Proto") or original.scheme or None
    if method not in SAFE_METHODS and not _same_origin(request, host=host, scheme=scheme):
        return deny(403, "Cross-site requests to a notebook are refused.")
    services.notebook_activity_record(request_id=req.pk)
    response = HttpResponse(b"", status=200, content_type="text/plain")
    response["Authorization"] = f"token {notebook_token(req)}"
    response["X-Auth-Request-User"] = request.user.get_username()
    response["Cache-Control"] = "no-store"
    return response


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
                           "error": error, "done": done})
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


# Approvals --------------------------------------------------------------------------------------


# A flavor's columns that its name (``str``), its resources and the cost estimate read: not its labels, taints and
# tolerations (JSON, decoded per row) nor its pool, order and cluster.
FLAVOR_SHOWN = tuple(f"flavor__{name}" for name in ("name", "display_name", "kind", "mig_profile", "gpu_model", "gpu_product",
                                                   "hami_memory_mib", "hami_cores_percent"))
# The columns the inbox's rows read (``workloads/_approval_row.html``, ``approval_context``, the cost estimate;
# ``_extension_row.html``), not the 115-126 of the joined tables: the ORM compiled and built every one of them per call.
# A column left out would be read one query per row: tests/workloads/test_inbox_columns.py counts them.
INBOX_COLUMNS = (
    "name", "state", "created_at", "gpus", "replicas", "cpu", "memory_gib", "share_memory_mib", "share_cores_percent",
    "parameters", "duration_hours", "pending_reason", "project__name", "tenant__name", "template__name", "template__kind", *FLAVOR_SHOWN,
    "requested_by__username",
)
INBOX_EXTENSION_COLUMNS = (
    "hours", "replicas", "status", "reason", "comment", "created_at", "requested_by__username", "request__name",
    "request__state", "request__gpus", "request__replicas", "request__duration_hours", "request__flavor__name", "request__flavor__display_name",
    "request__template__name",
    "request__template__max_duration_hours", "request__project__name", "request__project__tenant__name",
)


def _inbox_row(req: WorkloadRequest, form: DecisionForm | None = None) -> dict[str, Any]:
    """A row of the inbox (the Jinja2 template ``workloads/_approval_row.html``): the request, its context, its
    decision form."""
    if form is None:
        form = DecisionForm(prefix=f"decide-{req.pk}")
    return {"req": req, "info": selectors.approval_context(req), "form": form}


def _changed(response: HttpResponse) -> HttpResponse:
    """Tell the page that something in an inbox was decided: the navigation's counts (and lists that show
    decisions) refresh themselves (htmx event ``approvals-changed``)."""
    response["HX-Trigger"] = "approvals-changed"
    return response


def _approvals_page(request: HttpRequest, actor: Actor, *, bulk_form: BulkDecisionForm | None = None,
                    selected: dict[str, set[str]] | None = None, outcome: Any = None, status: int = 200) -> HttpResponse:
    approvable = selectors.approvable_projects(actor=actor)  # the project filter's choices
    inbox = _rows(selectors.approvals_inbox_for(actor=actor, context=False), "tenant", "requested_by").only(*INBOX_COLUMNS)
    filterset = _request_filters(
        request, inbox, hide=("state", "phase", "tenant", "mine", "requested_by", "created_after", "created_before",
                              "template", "flavor", "priority"),
        selects={"project": [(slug, name) for _, slug, name in approvable]},
    )
    pager = Pager(request, filterset.qs)
    rows = [_inbox_row(req) for req in selectors.with_approval_context(list(pager))]
    extension_pager = Pager(request, selectors.extension_requests_for(actor=actor, inbox=True).only(*INBOX_EXTENSION_COLUMNS),
                            param="extensions_page")
    extension_rows = [{"ext": ext, "form": DecisionForm(prefix=f"extension-{ext.pk}")} for ext in extension_pager]
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


# Ops: all requests ------------------------------------------------------------------------------


@login_required
def ops_requests(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    if not actor.is_ops:
        raise Http404("No such page.")  # ops pages don't exist for anyone else
    # Five joins took PostgreSQL 13-26 ms to plan (0.4 to run) over every request: the template and the flavor of
    # the page's rows come in two small queries instead (``WHERE id IN``, planned in microseconds).
    everything = (
        selectors.requests_for(actor=actor).order_by("-created_at", "-id")
        .select_related(None).select_related("project", "tenant", "requested_by")
        .prefetch_related("template", "flavor")
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
    return page(request, "workloads/ops_requests.html", {"filterset": filterset, "pager": pager})

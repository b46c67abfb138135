"""The request form: choosing a template and a project, the live cost estimate, starting from a request (clone) or a
preset, saving and deleting presets, and the submission itself. Shared helpers live in ``workloads.views``."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.extensions import budget_remaining, cost_estimator, rightsizing
from portal.forms import once_claim, once_initial, once_replay, once_sent
from portal.inputs import is_id
from tenants.access import Actor
from tenants.selectors import projects_where
from tenants.ui import page

from . import selectors, services
from .forms import RequestForm
from .models import ServiceTemplate
from .views import S, _actor, _error_text, _visible_request

VOLUME_LIST = "data-volume-options"

VOLUME_FIELD = "param_data_volume"


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

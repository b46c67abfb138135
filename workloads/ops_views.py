"""Ops pages for the catalogue: service templates (with their versions) and the curated image list.

Like every ops page, a 404 for everyone but platform ops. Reads start from ``workloads.selectors``;
writes go through the services the API uses (``template_create``/``template_update``,
``image_create``/``image_update``), whose refusals are shown on the form; nothing is written then.

Editing a template version that requests already use makes the next version, as the API does
(``template_update`` refuses such a change; a POST with the same slug creates version N+1), so
old requests keep their meaning.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect

from portal.exceptions import ConflictError, PortalError
from portal.ui import Pager, filtered
from tenants.access import Actor
from tenants.forms import add_service_error
from tenants.guards import ops_only as _ops_only
from tenants.ui import page

from . import catalogue_services, selectors
from .filters import ImageFilter, TemplateFilter
from .models import Image
from .ops_forms import ImageForm, TemplateForm

LABELS = {"kind": "Kind", "slug": "Slug", "active": "Active", "q": "Reference contains"}


# Templates ------------------------------------------------------------------------------------------


@login_required
def template_list(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    templates = selectors.template_list_for(actor=actor).order_by("kind", "slug", "-version")
    filterset = filtered(TemplateFilter, request, templates, hide=("flavor",), labels=LABELS)
    return page(request, "workloads/ops_templates.html", {
        "tab": "templates", "filterset": filterset, "pager": Pager(request, filterset.qs),
    })


@login_required
def template_new(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    form = TemplateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            template = catalogue_services.template_create(actor=actor, **form.service_kwargs())
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Template {template.slug} v{template.version} created.")
            return redirect("ops-template", pk=template.pk)
    return page(request, "workloads/ops_template_form.html", {"tab": "templates", "form": form, "template": None})


@login_required
def template_detail(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _ops_only(request)
    template = get_object_or_404(selectors.templates_for(actor=actor), pk=pk)
    form = TemplateForm(request.POST or None, template=template)
    if request.method == "POST" and form.is_valid():
        values = form.service_kwargs()
        try:
            try:
                saved = catalogue_services.template_update(actor=actor, template=template, **values)
                done = f"Template {saved.slug} v{saved.version} saved."
            except ConflictError:
                # Requests use this version: the change becomes the next version, as in the API.
                saved = catalogue_services.template_create(actor=actor, kind=template.kind, slug=template.slug, **values)
                done = (f"Requests use {template.slug} v{template.version}, so the change is saved as v{saved.version}; "
                        f"v{template.version} stays as it was.")
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, done)
            return redirect("ops-template", pk=saved.pk)
    versions = selectors.template_versions_for(template=template)
    return page(request, "workloads/ops_template_form.html", {
        "tab": "templates", "form": form, "template": template, "versions": versions,
        "in_use": template.requests.exists(),
    })


# Images ---------------------------------------------------------------------------------------------


@login_required
def image_list(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    images = selectors.images_for(actor=actor).order_by("name", "reference")
    filterset = filtered(ImageFilter, request, images, labels=LABELS)
    return page(request, "workloads/ops_images.html", {"tab": "images", "filterset": filterset, "pager": Pager(request, filterset.qs)})


def _image_form_page(request: HttpRequest, actor: Actor, image: Image | None) -> HttpResponse:
    form = ImageForm(request.POST or None, image=image)
    if request.method == "POST" and form.is_valid():
        try:
            if image is None:
                saved = catalogue_services.image_create(actor=actor, **form.cleaned_data)
            else:
                saved = catalogue_services.image_update(actor=actor, image=image, **form.cleaned_data)
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Image {saved.name} ({saved.reference}) {'added' if image is None else 'saved'}.")
            return redirect("ops-images")
    context: dict[str, Any] = {"tab": "images", "form": form, "image": image}
    return page(request, "workloads/ops_image_form.html", context)


@login_required
def image_new(request: HttpRequest) -> HttpResponse:
    return _image_form_page(request, _ops_only(request), None)


@login_required
def image_detail(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _ops_only(request)
    return _image_form_page(request, actor, get_object_or_404(selectors.images_for(actor=actor), pk=pk))

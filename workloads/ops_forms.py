"""Ops forms for the catalogue: service templates and the curated image list. They shape and check
input; the views hand the cleaned data to ``workloads.services`` (``template_create``/``template_update``,
``image_create``/``image_update``), whose refusals are shown on these forms.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django import forms

from portal.forms import DecimalField, IntegerField
from portal.inputs import JsonRefused, json_loads
from quotas.models import Flavor

from .models import Image, ServiceTemplate, TemplateKind
from .schema import schema_errors

SCHEMA_EXAMPLE = '{"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}'


class FlavorChoices(forms.ModelMultipleChoiceField):
    def label_from_instance(self, obj: Flavor) -> str:
        return f"{obj.cluster.name} · {obj.display_name or obj.name}"


def _count(label: str, *, required: bool = True, help_text: str = "") -> forms.IntegerField:
    return IntegerField(label=label, min_value=0, required=required, help_text=help_text)


def _cores(label: str) -> forms.DecimalField:
    return DecimalField(label=label, min_value=Decimal(0), max_digits=6, decimal_places=2)


class TemplateForm(forms.Form):
    """Create a template, or edit a version. On edit, kind and slug are fixed (requests and rules name them)."""

    kind = forms.ChoiceField(choices=TemplateKind.choices)
    slug = forms.CharField(max_length=50, help_text="Lower-case letters, digits and '-'. Requests and approval rules name it.")
    name = forms.CharField(max_length=100)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    parameters_schema = forms.CharField(
        required=False, label="Parameters (JSON Schema)", widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false"}),
        help_text=f"A JSON Schema (2020-12) of an object; the request form is generated from it. Empty: no parameters. "
                  f"e.g. {SCHEMA_EXAMPLE}",
    )
    allowed_flavors = FlavorChoices(
        queryset=Flavor.objects.none(), required=False, label="Allowed flavors",
        widget=forms.SelectMultiple(attrs={"size": 6}), help_text="None chosen: any active flavor.",
    )
    default_gpus = _count("Default GPUs")
    max_gpus = _count("Max GPUs")
    default_cpu = _cores("Default CPU (cores)")
    max_cpu = _cores("Max CPU (cores)")
    default_memory_gib = _count("Default memory (GiB)")
    max_memory_gib = _count("Max memory (GiB)")
    max_duration_hours = _count("Max duration (hours)")
    idle_timeout_minutes = _count("Idle timeout (minutes)", required=False, help_text="Notebooks: stop after this long idle. Empty: never.")
    idle_gpu_percent = forms.FloatField(
        label="Idle below (% GPU utilisation)", required=False, min_value=0, max_value=100,
        help_text="A running request whose measured GPU utilisation stays below this counts as idle. Empty: the "
                  "platform's default (MEASURED_IDLE_PERCENT).")
    active = forms.BooleanField(required=False, initial=True, label="Active (offered in the catalogue)")

    FIXED = ("kind", "slug")
    VALUES = ("name", "description", "default_gpus", "max_gpus", "default_cpu", "max_cpu", "default_memory_gib",
              "max_memory_gib", "max_duration_hours", "idle_timeout_minutes", "idle_gpu_percent", "active")

    def __init__(self, *args: Any, template: ServiceTemplate | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "template")
        self.template = template
        if template is not None and "initial" not in kwargs:
            initial = {name: getattr(template, name) for name in (*self.FIXED, *self.VALUES)}
            initial["parameters_schema"] = json.dumps(template.parameters_schema, indent=2)
            initial["allowed_flavors"] = [f.pk for f in template.allowed_flavors.all()]
            kwargs["initial"] = initial
        elif "initial" not in kwargs:
            kwargs["initial"] = {name: ServiceTemplate._meta.get_field(name).get_default() for name in self.VALUES}
        super().__init__(*args, **kwargs)
        flavors = Flavor.objects.filter(active=True)
        if template is not None:  # a retired flavor the version still allows stays choosable
            flavors = flavors | Flavor.objects.filter(pk__in=template.allowed_flavors.values("pk"))
        self.fields["allowed_flavors"].queryset = flavors.select_related("cluster").order_by("cluster__name", "order", "name").distinct()
        if template is not None:
            for name in self.FIXED:
                self.fields[name].disabled = True
                self.fields[name].help_text = "Fixed: requests and approval rules name it."

    def clean_slug(self) -> str:
        slug = self.cleaned_data["slug"]
        if self.template is None and ServiceTemplate.objects.filter(slug=slug).exists():
            raise forms.ValidationError("A template with this slug exists; edit it to make a new version.")
        return slug

    def clean_parameters_schema(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("parameters_schema") or "").strip()
        if not text:
            return {"type": "object", "properties": {}}
        try:
            schema = json_loads(text)
        except JsonRefused as refused:
            raise forms.ValidationError(refused.detail) from None
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from None
        problems = schema_errors(schema)  # Draft202012Validator.check_schema, and an object at the top
        if problems:
            raise forms.ValidationError(problems)
        return schema

    def service_kwargs(self) -> dict[str, Any]:
        """What ``template_create`` takes; without kind and slug, what ``template_update`` takes."""
        data = {name: self.cleaned_data[name] for name in self.VALUES}
        data["parameters_schema"] = self.cleaned_data["parameters_schema"]
        data["allowed_flavors"] = list(self.cleaned_data["allowed_flavors"])
        if self.template is None:
            data |= {name: self.cleaned_data[name] for name in self.FIXED}
        return data


class ImageForm(forms.Form):
    """Add or change a curated image."""

    name = forms.CharField(max_length=100)
    reference = forms.CharField(max_length=300, help_text="registry/repo:tag or registry/repo@sha256:digest")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    kinds = forms.MultipleChoiceField(choices=TemplateKind.choices, widget=forms.CheckboxSelectMultiple,
                                      label="Template kinds that may use it")
    active = forms.BooleanField(required=False, initial=True, label="Active (offered on the request form)")

    def __init__(self, *args: Any, image: Image | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "image")
        if image is not None and "initial" not in kwargs:
            kwargs["initial"] = {name: getattr(image, name) for name in self.base_fields}
        super().__init__(*args, **kwargs)

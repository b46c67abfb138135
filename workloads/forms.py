"""Portal forms for requests. They shape input; ``workloads.services`` checks it and decides.

The new-request form is built per template: fixed fields (project, flavor, image, GPUs, duration...)
plus one field per parameter of the template's JSON Schema, described by ``schema.form_fields()``.
The form only converts text to the schema's types (a number, a list, a mapping); every rule —
required, minimum, enum, pattern — is checked by the service against the same schema as the API,
and its errors (``parameters.<name>``, ``gpus``...) are put back next to the field they name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from portal.exceptions import IdempotencyKeyReused, PortalError
from portal.forms import DecimalField, FloatField, IntegerField, OneTimeFormMixin
from portal.quantities import fmt
from quotas import manifests as quota_manifests
from quotas.capacity import flavor_enforcement
from quotas.models import Flavor, SpillPolicy
from tenants.forms import add_service_error
from tenants.models import Project

from . import kinds, routing
from .models import REQUEST_TOPOLOGIES, Image, Priority, ServiceTemplate
from .schema import PREFIX, form_fields
from .submission_checks import DEFAULT_DURATION_HOURS, MAX_REPLICAS

PARAM = "param_"
CUSTOM_IMAGE = "__custom__"


def _lines(value: str) -> list[str]:
    return [line.strip() for line in (value or "").splitlines() if line.strip()]


class ListField(forms.CharField):
    """A JSON Schema array, one item per line; items converted to the schema's item type."""

    widget = forms.Textarea(attrs={"rows": 3})

    def __init__(self, *args: Any, item_type: str = "string", **kwargs: Any) -> None:
        self.item_type = item_type
        super().__init__(*args, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        return "\n".join(str(v) for v in value) if isinstance(value, list) else value

    def to_python(self, value: Any) -> list[Any] | None:
        text = super().to_python(value)
        if not text:
            return None
        if text.strip().startswith("["):
            return self._from_json(text.strip())
        items: list[Any] = []
        for number, line in enumerate(_lines(text), start=1):
            try:
                items.append(_convert(line, self.item_type))
            except (ValueError, ArithmeticError):
                raise ValidationError(f"Line {number}: “{line}” is not a {self.item_type}.") from None
        return items

    def _from_json(self, text: str) -> list[Any]:
        """A JSON list pasted as the README and the API write it (``["--epochs", "3"]``): its items, each
        converted as a line would be. Anything else that starts with ``[`` is refused with the reason."""
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise ValidationError(f"This starts like a JSON list but is not valid JSON ({exc.msg}, character "
                                  f"{exc.pos + 1}). Write one item per line, or a JSON list such as "
                                  '["--epochs", "3"].') from None
        if not isinstance(parsed, list):
            raise ValidationError("Write one item per line, or a JSON list such as [\"--epochs\", \"3\"].")
        items: list[Any] = []
        for number, item in enumerate(parsed, start=1):
            if isinstance(item, (list, dict)) or item is None:
                raise ValidationError(f"Item {number} of the JSON list is not a {self.item_type}: "
                                      f"{json.dumps(item)}.")
            try:
                items.append(item if self.item_type == "string" and isinstance(item, str)
                             else _convert(item if isinstance(item, str) else json.dumps(item), self.item_type))
            except (ValueError, ArithmeticError):
                raise ValidationError(f"Item {number} of the JSON list, {json.dumps(item)}, is not a "
                                      f"{self.item_type}.") from None
        return items


class MappingField(forms.CharField):
    """A JSON Schema object of strings, one ``NAME=value`` per line."""

    widget = forms.Textarea(attrs={"rows": 3})

    def prepare_value(self, value: Any) -> Any:
        return "\n".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else value

    def to_python(self, value: Any) -> dict[str, str] | None:
        text = super().to_python(value)
        if not text:
            return None
        out: dict[str, str] = {}
        for number, line in enumerate(_lines(text), start=1):
            name, sep, rest = line.partition("=")
            if not sep or not name.strip():
                raise ValidationError(f"Line {number}: write NAME=value.")
            out[name.strip()] = rest.strip()
        return out


def _convert(text: str, kind: str) -> Any:
    if kind == "integer":
        return int(text)
    if kind == "number":
        return float(Decimal(text))
    if kind == "boolean":
        return text.lower() in ("1", "true", "yes", "on")
    return text


def _hint_attrs(spec: dict[str, Any]) -> dict[str, Any]:
    """HTML hints (the form is ``novalidate``: the service has the last word)."""
    attrs: dict[str, Any] = {}
    for key, attr in (("minimum", "min"), ("maximum", "max"), ("max_length", "maxlength")):
        if spec.get(key) is not None:
            attrs[attr] = spec[key]
    return attrs


def _bounds(spec: dict[str, Any]) -> str:
    """A number's bounds, said in the help (number fields are text inputs: no min/max for the browser)."""
    if spec["widget"] not in ("integer", "number"):
        return ""
    low, high = spec.get("minimum"), spec.get("maximum")
    if low is not None and high is not None:
        return f"From {low} to {high}."
    if low is not None:
        return f"At least {low}."
    return f"At most {high}." if high is not None else ""


def parameter_field(spec: dict[str, Any]) -> forms.Field:
    """A form field for one parameter. Never ``required`` here: the schema says what is missing."""
    common: dict[str, Any] = {
        "label": spec["label"] + ("" if spec["required"] else " (optional)") if spec["widget"] != "checkbox" else spec["label"],
        "required": False,
        "help_text": " ".join(filter(None, [spec.get("description") or "", _bounds(spec)])),
        "initial": spec.get("default"),
    }
    widget = spec["widget"]
    if widget == "select":
        values = list(spec.get("enum") or [])
        by_text = {str(v): v for v in values}
        choices = [(str(v), str(v)) for v in values]
        if not spec["required"] and spec.get("default") is None:
            choices = [("", "—")] + choices
        common["initial"] = None if spec.get("default") is None else str(spec["default"])
        return forms.TypedChoiceField(choices=choices, coerce=lambda text: by_text.get(text, text), empty_value=None, **common)
    if widget == "checkbox":
        return forms.BooleanField(**common)
    if widget in {"integer", "number"}:
        field = IntegerField(**common) if widget == "integer" else FloatField(**common)
        # The schema's maximum, for "too large (at most ...)"; the schema itself is checked by the service.
        field.max_value = spec.get("maximum")
        return field
    if widget == "list":
        item_type = (spec.get("items") or {}).get("type", "string")
        common["help_text"] = " ".join(filter(None, [common["help_text"], "One per line, or a JSON list."]))
        return ListField(item_type=item_type, **common)
    if widget == "mapping":
        common["help_text"] = " ".join(filter(None, [common["help_text"], "One NAME=value per line."]))
        return MappingField(**common)
    attrs = _hint_attrs(spec)
    if (spec.get("max_length") or 0) > 300:
        return forms.CharField(widget=forms.Textarea(attrs={"rows": 2, **attrs}), strip=True, **common)
    return forms.CharField(widget=forms.TextInput(attrs=attrs), strip=True, **common)


class RequestForm(OneTimeFormMixin, forms.Form):
    """A new request from one template. ``parameter_names`` are the generated fields, in schema order.

    Its one-time token is the request's idempotency key (``once_field``): a replayed form is answered
    from the form token (portal/forms.py) and, should that be forgotten, by the service's key."""

    once_field = "idempotency_key"

    project = forms.ChoiceField(help_text="Where it runs and whose quota it uses.")
    name = forms.CharField(
        max_length=40, required=False,
        help_text="Optional. Lower-case letters, digits and '-'; a name is made up when empty.",
    )
    flavor = forms.ChoiceField(label="GPU flavor")
    # HAMi flavors only (the page shows them for those): the flavor's preset share of a card, or a size of one's own.
    share_preset = forms.TypedChoiceField(
        label="HAMi share of a card", required=False, coerce=lambda value: value == "true", empty_value=None,
        choices=[("true", "The flavor's preset"), ("false", "A size of my own")], initial="true",
        widget=forms.RadioSelect(attrs={"data-hami-only": ""}))
    share_memory_gib = DecimalField(
        label="Share: GPU memory (GiB)", required=False, max_digits=8, decimal_places=3,
        widget=forms.NumberInput(attrs={"data-hami-only": "own", "step": "any"}))
    share_cores_percent = IntegerField(
        label="Share: % of the card's cores", required=False,
        widget=forms.NumberInput(attrs={"data-hami-only": "own"}),
        help_text="1 to 100. Either one alone: the preset's other half.")
    gpus = IntegerField(label="GPUs", min_value=0, help_text="Per replica or worker.")
    replicas = IntegerField(min_value=1, max_value=MAX_REPLICAS, initial=1, help_text="Copies of the service behind its address.")
    image = forms.ChoiceField()
    custom_image = forms.CharField(
        max_length=300, required=False, label="Custom image",
        help_text="registry/repo:tag or @sha256:digest. Only in projects allowed to use their own images.",
    )
    duration_hours = IntegerField(label="Duration (hours)", min_value=1)
    priority = forms.ChoiceField(choices=Priority.choices)
    # Distributed training on a flavor placed by topology only (``_topology_field``): Kueue TAS's rack or block.
    topology = forms.ChoiceField(
        label="Placement", required=False,
        choices=REQUEST_TOPOLOGIES)
    # Federation (``_model_fields``; docs/federation.md): what the image needs, the models it accepts after the
    # flavor's own, in order, and consent to spill over (offered only where a project's policy allows it).
    min_gpu_memory_gib = IntegerField(
        label="Minimum GPU memory (GiB)", required=False, min_value=1, max_value=4096,
        help_text="Per GPU, what the image needs. Models with less are not offered, and not run on.")
    min_compute_capability = forms.CharField(
        label="Minimum CUDA compute capability", required=False, max_length=5,
        help_text="What the image is built for, such as 8.0 (A100) or 9.0 (H100).")
    accept_model_2 = forms.ChoiceField(label="Also accepts (2nd choice)", required=False)
    accept_model_3 = forms.ChoiceField(label="Also accepts (3rd choice)", required=False)
    spill_consent = forms.BooleanField(
        label="It may spill over to an accepted model when its own is full", required=False)
    cpu = DecimalField(label="CPUs", max_digits=6, decimal_places=2, min_value=Decimal("0.01"))
    memory_gib = IntegerField(label="Memory (GiB)", min_value=1)
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=200, required=False)
    # "Save as preset" (not part of a submission): the name to keep the form's values under.
    preset_name = forms.CharField(
        max_length=60, required=False, label="Preset",
        help_text="What to call these values, to start from them next time (yours only, in this project).",
    )

    # Fields grouped for the page: what, resources, then the generated parameters.
    GENERAL = ("project", "name", "image", "custom_image")
    RESOURCES = ("flavor", "share_preset", "share_memory_gib", "share_cores_percent", "gpus", "replicas", "cpu",
                 "memory_gib", "duration_hours", "priority", "topology")
    MODELS = ("min_gpu_memory_gib", "min_compute_capability", "accept_model_2", "accept_model_3", "spill_consent")
    ACCEPTED = ("accept_model_2", "accept_model_3")

    def __init__(
        self,
        *args: Any,
        template: ServiceTemplate,
        projects: Iterable[Project],
        images: Iterable[Image],
        flavors: Iterable[Flavor],
        offered: Iterable[Flavor] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.template = template
        self.projects = {p.slug: p for p in projects}
        # Only what the cluster's architecture enforces is offered; the rest is refused with the reason.
        # ``offered`` (workloads.selectors.template_flavors_for) narrows the choice to the flavors the
        # projects in view have quota for; another allowed one is refused with that reason.
        offered_ids = None if offered is None else {f.pk for f in offered}
        self.flavors: dict[str, Flavor] = {}
        self.refused_flavors: dict[str, str] = {}
        for f in flavors:
            enforcement = flavor_enforcement(f.cluster, f)
            if not enforcement.enforced:
                self.refused_flavors[str(f.pk)] = enforcement.reason
            elif offered_ids is not None and f.pk not in offered_ids:
                self.refused_flavors[str(f.pk)] = (f"{f} cannot be used here: no project you may submit to has quota "
                                                   f"for it. Ask for quota or choose another flavor.")
            else:
                self.flavors[str(f.pk)] = f
        fields = self.fields
        fields["project"].choices = [(slug, f"{p.name} ({p.tenant.name})") for slug, p in self.projects.items()]
        fields["flavor"].choices = [(pk, f.offered_label) for pk, f in self.flavors.items()]  # HAMi: with its share
        self._share_fields(fields)
        self._topology_field(fields)
        self._model_fields(fields, flavors)
        curated = [i for i in images if template.kind in (i.kinds or [])]
        fields["image"].choices = [(i.reference, f"{i.name} — {i.reference}") for i in curated] + [
            (CUSTOM_IMAGE, "Custom image…")
        ]
        # The templates' limits, for "too large (at most ...)"; the service checks them (and says so).
        fields["gpus"].max_value = template.max_gpus
        fields["cpu"].max_value = template.max_cpu
        fields["memory_gib"].max_value = template.max_memory_gib
        fields["duration_hours"].max_value = template.max_duration_hours
        fields["gpus"].help_text = f"Per replica or worker; at most {template.max_gpus}."
        fields["cpu"].help_text = f"Per replica; at most {fmt(template.max_cpu)}."
        fields["memory_gib"].help_text = f"Per replica; at most {template.max_memory_gib}."
        fields["duration_hours"].help_text = f"At most {template.max_duration_hours} hours; it stops then."
        if kinds.get(template.kind).replicas != "free":
            # Notebooks have one replica; training workers come from the parameters (workers, distributed).
            del fields["replicas"]
        if kinds.get(template.kind).priority_fixed:  # inference: the online class only (docs/inference.md)
            fixed = kinds.get(template.kind).default_priority
            fields["priority"].choices = [c for c in Priority.choices if c[0] == fixed]
            fields["priority"].help_text = "Always this for this kind: the online class, never preempted by batch work."
        self.initial.update({
            "gpus": template.default_gpus,
            "cpu": template.default_cpu,
            "memory_gib": template.default_memory_gib,
            "duration_hours": min(DEFAULT_DURATION_HOURS, template.max_duration_hours),
            "priority": kinds.get(template.kind).default_priority,
            "image": curated[0].reference if curated else CUSTOM_IMAGE,
        })
        self.parameter_specs = form_fields(template.parameters_schema)
        self.parameter_names: list[str] = []
        for spec in self.parameter_specs:
            name = PARAM + spec["name"]
            fields[name] = parameter_field(spec)
            self.parameter_names.append(name)

    def _share_fields(self, fields: dict[str, forms.Field]) -> None:
        """The HAMi share fields, when a HAMi flavor is offered (else none). The flavor select names the HAMi
        choices (``data-hami-flavors``): the page's script shows the share fields for those only, and the size
        fields for "a size of my own" only (portal.js)."""
        hami = [pk for pk, f in self.flavors.items() if f.kind == Flavor.Kind.HAMI]
        if not hami:
            for name in ("share_preset", "share_memory_gib", "share_cores_percent"):
                del fields[name]
            return
        fields["flavor"].widget.attrs["data-hami-flavors"] = " ".join(hami)
        presets = "; ".join(f"{self.flavors[pk]}: {self.flavors[pk].share}" for pk in hami)
        fields["share_preset"].help_text = f"Each vGPU gets this much of one card. Presets: {presets}."
        fields["share_memory_gib"].help_text = "More than 0, at most one card's memory."

    def _topology_field(self, fields: dict[str, forms.Field]) -> None:
        """Placement by rack or block, offered only where it can work (the service's ``_check_topology`` says the
        same): a distributed training template and a flavor of a cluster with racks and blocks among the offered."""
        kind = kinds.get(self.template.kind)
        placed = [f for f in self.flavors.values() if quota_manifests.placed_by_topology(f.cluster, f)]
        if not (kind.gang and kind.replicas == "workers" and placed):
            del fields["topology"]
            return
        names = ", ".join(str(f) for f in placed)
        # Only the placements whose level one of those clusters has (an NVLink domain where ops named that level).
        fields["topology"].choices = [(value, words) for value, words in REQUEST_TOPOLOGIES  # type: ignore[attr-defined]
                                      if any(quota_manifests.placement_offered(f.cluster, value) for f in placed)]
        fields["topology"].help_text = (f"Distributed jobs of 2 or more workers on {names}: every worker in one rack, "
                                        f"block or NVLink domain (it waits until one has room), or one if there is room.")

    def _model_fields(self, fields: dict[str, forms.Field], flavors: Iterable[Flavor]) -> None:
        """The GPU models a job accepts after its flavor's own, offered only where they run an image with the
        needs declared so far (``routing.models_satisfying``; a bound form reads them from its data), and consent
        to spill over, offered only when a project of the form has a spill-over policy that allows it."""
        # Whole GPUs only: routing spills between flavors of one kind, and MIG slices and HAMi shares go where asked.
        self.gpu_flavors = [f for f in flavors if f.gpu_model and f.kind == Flavor.Kind.WHOLE]
        if len({f.gpu_model for f in self.gpu_flavors}) < 2:
            for name in self.MODELS:
                del fields[name]
            return
        self.models_offered = routing.models_satisfying(self.gpu_flavors, self._declared_needs())
        cards = {}
        for f in self.gpu_flavors:
            facts = [f"{fmt(Decimal(f.gpu_memory_mib) / 1024)} GiB" if f.gpu_memory_mib else "",
                     f"cc {f.compute_capability}" if f.compute_capability else ""]
            cards.setdefault(f.gpu_model, ", ".join(x for x in facts if x))
        choices = [("", "None")] + [(m, f"{m} ({cards[m]})" if cards.get(m) else m) for m in self.models_offered]
        # Every whole-GPU model with its cards' facts, for static/js/models.js to re-filter the lists as the needs
        # are typed (the same rule as routing.incompatibility: a model stays if one of its cards runs the needs).
        facts: dict[str, list[list[Any]]] = {}
        for f in self.gpu_flavors:
            facts.setdefault(f.gpu_model, []).append([f.gpu_memory_mib or 0, f.compute_capability or ""])
        every = json.dumps([{"value": m, "label": f"{m} ({cards[m]})" if cards.get(m) else m, "cards": facts[m]}
                            for m in sorted(facts)])
        for name in self.ACCEPTED:
            fields[name].choices = choices
            fields[name].widget.attrs["data-models"] = every
        fields["accept_model_2"].help_text = ("If its flavor's model is full, it may run on these, in this order (only "
                                              "with consent below). Only models that run the image's needs are offered.")
        self.spill_policies = {p.project_id: p for p in SpillPolicy.objects.filter(
            project__in=[p.pk for p in self.projects.values()], allowed=True)}
        if not self.spill_policies:
            del fields["spill_consent"]
            return
        allowed = [f"{p.slug}: {', '.join(self.spill_policies[p.pk].target_models) or 'any model'}"
                   + (" (needs approval)" if self.spill_policies[p.pk].needs_approval else "")
                   for p in self.projects.values() if p.pk in self.spill_policies]
        fields["spill_consent"].help_text = ("Spill-over is an extra, not the normal path: without it the job waits "
                                             "for its own model. Allowed in " + "; ".join(allowed) + ".")

    def _declared_needs(self) -> routing.Needs:
        """What the image needs as sent so far (a bound form's data; nothing on a fresh form), leniently: a
        malformed value filters nothing here (``clean`` says what is wrong with it)."""
        if not self.is_bound:
            return routing.Needs()
        try:
            return routing.needs_parse(min_gpu_memory_gib=self.data.get(self.add_prefix("min_gpu_memory_gib")),
                                       min_compute_capability=self.data.get(self.add_prefix("min_compute_capability")))
        except ValidationError:
            return routing.Needs()

    # -- groups for the template -------------------------------------------------------------------
    def _group(self, names: Iterable[str]) -> list[forms.BoundField]:
        return [self[name] for name in names if name in self.fields]

    @property
    def general_fields(self) -> list[forms.BoundField]:
        return self._group(self.GENERAL)

    @property
    def resource_fields(self) -> list[forms.BoundField]:
        return self._group(self.RESOURCES)

    @property
    def parameter_fields(self) -> list[forms.BoundField]:
        return self._group(self.parameter_names)

    @property
    def model_fields(self) -> list[forms.BoundField]:
        return self._group(self.MODELS)

    def asked_for(self) -> SimpleNamespace:
        """What the form asks for so far, shaped like a request (for a cost estimate): the valid values
        sent, else the initial ones; the first project and flavor offered when none is chosen yet."""
        data = getattr(self, "cleaned_data", {}) if self.is_bound else None

        def value(name: str) -> Any:
            if data is not None:
                return data.get(name)
            field = self.fields.get(name)
            return self.initial.get(name, field.initial if field is not None else None)

        project = self.projects.get(str(value("project") or "")) or next(iter(self.projects.values()), None)
        flavor = self.flavors.get(str(value("flavor") or "")) or next(iter(self.flavors.values()), None)
        # The parameters too (a distributed job's workers, a notebook's home size), as the API's estimate reads them.
        if data is not None:
            parameters = self.parameters()
        else:
            parameters = {spec["name"]: value(PARAM + spec["name"]) for spec in self.parameter_specs
                          if value(PARAM + spec["name"]) is not None}
        return SimpleNamespace(
            tenant=project.tenant if project is not None else None, project=project, template=self.template,
            flavor=flavor, gpus=value("gpus"), replicas=value("replicas") or 1, cpu=value("cpu"),
            memory_gib=value("memory_gib"), duration_hours=value("duration_hours"), priority=value("priority"),
            parameters=parameters, hami_share=self._asked_share(flavor, value),
        )

    @staticmethod
    def _asked_share(flavor: Flavor | None, value: Any) -> tuple[int, int] | None:
        """The HAMi share asked so far as (MiB, cores %), as the service takes it: the preset, or the size given
        (either half alone: the preset's other half); None for other kinds."""
        if flavor is None or flavor.kind != Flavor.Kind.HAMI:
            return None
        memory_mib, cores_percent = flavor.hami_memory_mib, flavor.hami_cores_percent
        if value("share_preset") is not True:
            gib, cores = value("share_memory_gib"), value("share_cores_percent")
            if gib not in (None, ""):
                memory_mib = int(Decimal(str(gib)) * 1024)
            if cores not in (None, ""):
                cores_percent = int(cores)
        return memory_mib, cores_percent

    # -- cleaned data for the service --------------------------------------------------------------
    def clean(self) -> dict[str, Any]:
        data = super().clean()
        refused = self.refused_flavors.get(str(self.data.get(self.add_prefix("flavor"), "")))
        if refused:  # a forged or stale choice: say why, not "select a valid choice"
            self._errors.pop("flavor", None)
            self.add_error("flavor", refused)
        if data.get("image") == CUSTOM_IMAGE and not (data.get("custom_image") or "").strip():
            self.add_error("custom_image", "Name the image, or pick one from the list.")
        if "accept_model_2" in self.fields:
            self._clean_models(data)
        return data

    def _clean_models(self, data: dict[str, Any]) -> None:
        """The accepted models and consent: a model that cannot run the image is refused with why (not "select a
        valid choice"); consent needs a model to spill to and a project whose policy allows it."""
        try:
            self.needs = routing.needs_parse(min_gpu_memory_gib=data.get("min_gpu_memory_gib"),
                                             min_compute_capability=data.get("min_compute_capability"))
        except ValidationError as exc:
            add_service_error(self, exc)
            return
        for name in self.ACCEPTED:
            sent = (self.data.get(self.add_prefix(name)) or "").strip()
            if sent and sent not in self.models_offered:
                refused = [routing.incompatibility(f, self.needs) for f in self.gpu_flavors if f.gpu_model == sent]
                if refused and all(refused):
                    self._errors.pop(name, None)
                    self.add_error(name, f"Not offered: {refused[0]}")
        flavor = self.flavors.get(str(data.get("flavor") or ""))
        later = [m for m in (data.get(n) for n in self.ACCEPTED) if m and (flavor is None or m != flavor.gpu_model)]
        if not data.get("spill_consent"):
            return
        if not later:
            self.add_error("accept_model_2", "Name a model it may spill over to, or leave spill-over unticked.")
            return
        project = self.projects.get(str(data.get("project") or ""))
        spill = self.spill_policies.get(project.pk) if project is not None else None
        if project is not None and spill is None:
            self.add_error("spill_consent", f"Project {project.slug} does not allow spill-over: its work waits for "
                                            f"its own model. Its admins can allow it.")
        elif spill is not None and not any(spill.admits(m) for m in later):
            self.add_error("accept_model_2", f"Project {project.slug} allows spill-over only to "
                                             f"{', '.join(spill.target_models)}.")

    def parameters(self) -> dict[str, Any]:
        """The parameters as the API takes them: empty optional fields left out, so defaults apply."""
        out: dict[str, Any] = {}
        for spec, name in zip(self.parameter_specs, self.parameter_names, strict=True):
            value = self.cleaned_data.get(name)
            if spec["widget"] == "checkbox":
                out[spec["name"]] = bool(value)
            elif value is not None and value != "":
                out[spec["name"]] = value
        return out

    def submit_values(self) -> dict[str, Any]:
        """Keyword arguments for ``services.request_submit`` (without actor and template)."""
        data = self.cleaned_data
        image = data["custom_image"].strip() if data["image"] == CUSTOM_IMAGE else data["image"]
        values: dict[str, Any] = {
            "project": self.projects[data["project"]],
            "flavor": self.flavors[data["flavor"]],
            "image": image,
            "gpus": data["gpus"],
            "cpu": data["cpu"],
            "memory_gib": data["memory_gib"],
            "duration_hours": data["duration_hours"],
            "priority": data["priority"],
            "name": data.get("name") or "",
            "parameters": self.parameters(),
            "idempotency_key": data.get("idempotency_key") or "",
        }
        if "replicas" in self.fields:
            values["replicas"] = data["replicas"]
        if data.get("topology"):
            values["topology"] = data["topology"]
        if "accept_model_2" in self.fields:
            needs = getattr(self, "needs", routing.Needs())
            later = [data.get(n) for n in self.ACCEPTED if data.get(n)]
            first = values["flavor"].gpu_model
            accepted = tuple(dict.fromkeys([first, *later])) if later and first else ()
            values["needs"] = routing.Needs(accepted, needs.min_gpu_memory_gib, needs.min_compute_capability,
                                            bool(data.get("spill_consent")) and bool(accepted))
        # A share size goes with any flavor (the service refuses one for a flavor that is not HAMi); the preset
        # choice only with a HAMi flavor (without the page's script the radio is sent whatever the flavor).
        for key in ("share_memory_gib", "share_cores_percent"):
            if data.get(key) is not None:
                values[key] = data[key]
        if data.get("share_preset") is not None and values["flavor"].kind == Flavor.Kind.HAMI:
            values["share_preset"] = data["share_preset"]
        return values

    def preset_values(self) -> dict[str, Any]:
        """What a preset keeps of a valid form (``workloads.selectors.PRESET_KEYS``): the submission without
        the request's name and key."""
        values = self.submit_values()
        kept = {key: values[key] for key in ("image", "gpus", "replicas", "cpu", "memory_gib", "duration_hours",
                                             "priority", "parameters", "topology") if key in values}
        kept["flavor"] = values["flavor"].name
        return kept

    # -- starting from saved values: a preset, or a request to submit again ---------------------------
    def prefill(self, values: dict[str, Any], *, project: str = "") -> list[str]:
        """Start an unbound form from ``values`` (``selectors.request_values`` / a preset's values). Returns what
        could not be carried over (a flavor no longer offered here, a setting the template no longer has)."""
        dropped: list[str] = []
        initial: dict[str, Any] = {}
        if project and project in self.projects:
            initial["project"] = project
        flavor = values.get("flavor")
        if flavor:
            match = next((pk for pk, f in self.flavors.items() if f.name == flavor), None)
            if match is None:
                dropped.append(f"flavor {flavor} (not offered here now)")
            else:
                initial["flavor"] = match
        image = values.get("image")
        if image:
            curated = {value for value, _label in self.fields["image"].choices}
            initial |= {"image": image} if image in curated else {"image": CUSTOM_IMAGE, "custom_image": image}
        for key in ("gpus", "cpu", "memory_gib", "duration_hours", "priority", "replicas", "topology"):
            if key in values and key in self.fields:
                initial[key] = values[key]
        specs = {spec["name"]: spec for spec in self.parameter_specs}
        for key, value in (values.get("parameters") or {}).items():
            spec = specs.get(key)
            if spec is None:
                dropped.append(f"setting {key} (the template has no such setting now)")
                continue
            initial[PARAM + key] = str(value) if spec["widget"] == "select" and value is not None else value
        self.initial.update(initial)
        return dropped

    # -- the service's refusals, next to their fields ---------------------------------------------
    def field_for(self, key: str | None) -> str | None:
        """The form field that shows a service error keyed ``key`` (``parameters.args.0`` → ``param_args``)."""
        if not key:
            return None
        if key.startswith(PREFIX + "."):
            name = PARAM + key.split(".")[1]
            return name if name in self.fields else None
        if key == "image" and self.data.get("image") == CUSTOM_IMAGE:
            return "custom_image"
        if key == "accepted_models" and "accept_model_2" in self.fields:
            return "accept_model_2"
        return key if key in self.fields else None

    def add_service_error(self, exc: PortalError | ValidationError) -> None:
        if isinstance(exc, IdempotencyKeyReused):
            # Sent before with other values (the back button, then edits): a new key, so that sending
            # the form again submits these values as a new request.
            self.once_renew()
            self.add_error(None, "This form was already sent with other values. Send it again to submit these "
                                 "values as a new request.")
            return
        if isinstance(exc, PortalError):
            keys = [exc.field]
        elif hasattr(exc, "error_dict"):
            keys = list(exc.error_dict)
        else:
            keys = []
        # Keys the form has no field for (``replicas`` on a training form, ``cluster``) go on top.
        mapping = {key: self.field_for(key) or "__all__" for key in keys if key}
        add_service_error(self, exc, mapping)


class DecisionForm(forms.Form):
    comment = forms.CharField(
        max_length=1000, required=False, widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Required to reject: say why, the requester sees it. Optional to approve.",
    )


class BulkDecisionForm(forms.Form):
    """One reason for every selected item (required to reject); the items are the inbox's checkboxes."""

    comment = forms.CharField(
        max_length=1000, required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Reason for the selected",
        help_text="Required to reject: every requester sees it. Optional to approve.",
    )


class ExtendForm(forms.Form):
    hours = IntegerField(min_value=1, max_value=24 * 366, initial=4, label="More hours")


class ExtensionAskForm(forms.Form):
    """Asking the approvers for more hours than the approval rule grants."""

    hours = IntegerField(min_value=1, max_value=24 * 366, initial=4, label="More hours")
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Why",
                             help_text="The project's approvers decide on it; you are told what they decide.")


class ScaleAskForm(forms.Form):
    """Asking the approvers to scale an inference service up, where the approval rule does not grant it."""

    replicas = IntegerField(min_value=1, max_value=MAX_REPLICAS, label="Replicas wanted")
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), label="Why",
                             help_text="The project's approvers decide on it; you are told what they decide.")


class ScaleForm(forms.Form):
    replicas = IntegerField(min_value=1, max_value=MAX_REPLICAS, label="Replicas")


class ShareForm(forms.Form):
    """The request page's "Share" section (``workloads/share_views.py``)."""

    user = forms.CharField(label="Colleague", max_length=254,
                           help_text="Their username or email address; they must belong to this request's tenant.")
    level = forms.ChoiceField(label="They may", choices=[("view", "View"),
                                                         ("operate", "View and operate (logs, notebook)")],
                              initial="view")

"""The page form that proposes a MIG change. It shapes input; ``services.mig_change_propose`` checks the rules (a
layout the pool's GPU model allows, the window) and its refusals are shown next to their fields."""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils import timezone

from quotas.inventory import model_key

from .layouts import layout_names

DATETIME_FORMATS = ["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"]


def _when(**kwargs: Any) -> forms.DateTimeField:
    return forms.DateTimeField(input_formats=DATETIME_FORMATS, widget=forms.DateTimeInput(
        attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"), **kwargs)


class MigChangeForm(forms.Form):
    pool = forms.ChoiceField(label="Node pool", help_text="MIG pools (ops: every one; tenant admins: the ones your tenant uses).")
    to_layout = forms.ChoiceField(label="New layout",
                                  help_text="The mig-parted layouts of the pool's GPU model (by model; the change "
                                            "checks the pool's).")
    window_start = _when(label="Window starts", help_text="The nodes are cordoned then (UTC).")
    deadline = _when(label="Deadline for running work",
                     help_text="What still runs on the nodes then is stopped; its owners are told (UTC).")
    reason = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 3}))
    tenant = forms.ChoiceField(required=False, label="On behalf of tenant")

    def __init__(self, *args: Any, pools: list[Any], tenants: list[Any] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "mig")
        now = timezone.now().replace(second=0, microsecond=0)
        kwargs.setdefault("initial", {"window_start": now, "deadline": now + timezone.timedelta(hours=2)})
        super().__init__(*args, **kwargs)
        self.pools = {str(p.pk): p for p in pools}
        self.fields["pool"].choices = [(str(p.pk), f"{p.cluster.name} / {p.name} ({p.mig_config})") for p in pools]
        self.layouts = sorted({name for p in pools for name in layout_names(_model_of(p))})
        # A choice of valid layouts, grouped by GPU model (a layout of another model is still refused by the service).
        models = sorted({_model_of(p) for p in pools})
        groups = [(m, [(name, name) for name in layout_names(m)]) for m in models]
        self.fields["to_layout"].choices = [("", "—")] + [g for g in groups if g[1]]
        if tenants:
            self.fields["tenant"].choices = [("", "—")] + [(t.slug, t.name) for t in tenants]
        else:
            del self.fields["tenant"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        start, deadline = data.get("window_start"), data.get("deadline")
        if start and deadline and deadline < start:
            self.add_error("deadline", "The deadline for running work cannot be before the window starts.")
        return data


def _model_of(pool: Any) -> str:
    return model_key({"nvidia.com/gpu.product": pool.gpu_product or ""})


class DecisionForm(forms.Form):
    comment = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2}))

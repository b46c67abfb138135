"""The metric pages' filter form (GET): period (a preset or from/to, whole UTC days), breakdown, time bucket and
what to look at. Its errors show next to its fields; the API checks the same things (``api/views.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms

from quotas.models import Cluster, Flavor
from tenants.models import Project, Tenant

from . import selectors
from .registry import BUCKETS, GROUPS

PRESET_CHOICES = [("", "Custom (from / to)")] + [(str(d), f"Last {d} days") for d in selectors.PRESETS]


class FlavorChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Flavor) -> str:
        return f"{obj.cluster.name} / {obj.name}"


class ProjectChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Project) -> str:
        return f"{obj.tenant.slug} / {obj.slug}"


class MetricFilterForm(forms.Form):
    preset = forms.ChoiceField(choices=PRESET_CHOICES, required=False, label="Period")
    start = forms.DateField(required=False, label="From (UTC day)", widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, label="To (UTC day, included)", widget=forms.DateInput(attrs={"type": "date"}))
    group_by = forms.ChoiceField(choices=[(g, g.capitalize()) for g in GROUPS], required=False, label="Group by")
    bucket = forms.ChoiceField(choices=[(b, b.capitalize()) for b in BUCKETS], required=False, label="Bucket")
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.none(), to_field_name="name", required=False)
    flavor = FlavorChoiceField(queryset=Flavor.objects.none(), required=False)
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), to_field_name="slug", required=False)
    project = ProjectChoiceField(queryset=Project.objects.none(), to_field_name="slug", required=False)

    def __init__(self, data: Any, *, actor: Any, tenants: list[Tenant] | None, default_group: str = "tenant") -> None:
        """``tenants``: the tenants in view (``None``: all, ops); one tenant hides the tenant filter.

        What the query leaves out is filled with the defaults it stands for (the last 7 days, the page's breakdown,
        daily buckets), so the form shows what the page computed rather than each list's first choice."""
        data = data.copy()
        if not any(data.get(name) for name in ("preset", "start", "end")):
            data["preset"] = str(selectors.DEFAULT_DAYS)
        for name, default in (("group_by", default_group), ("bucket", "day")):
            if not data.get(name):
                data[name] = default
        super().__init__(data)
        self.default_group = default_group
        self.fields["cluster"].queryset = selectors.metric_clusters_for(actor=actor)
        self.fields["flavor"].queryset = selectors.metric_flavors_for(actor=actor)
        self.fields["project"].queryset = selectors.metric_projects_for(tenants=tenants)
        if tenants is None:
            self.fields["tenant"].queryset = selectors.metric_tenants_for(actor=actor).order_by("slug")
        else:
            del self.fields["tenant"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        preset, start, end = data.get("preset"), data.get("start"), data.get("end")
        if preset:
            data["start_at"], data["end_at"] = selectors.last_days(int(preset))
        elif start or end:
            if not (start and end):
                self.add_error("start" if not start else "end", "Give both days, or pick a preset.")
                return data
            data["start_at"] = datetime(start.year, start.month, start.day, tzinfo=UTC)
            data["end_at"] = datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1)
        else:
            data["start_at"], data["end_at"] = selectors.last_days()
        if "start_at" in data:
            problems = selectors.period_problems(data["start_at"], data["end_at"], data.get("bucket") or "day")
            for field, messages in problems.items():
                for message in messages:
                    self.add_error(field, message.replace("after the start", "on or after the first day"))
        project, tenant = data.get("project"), data.get("tenant")
        if project is not None and tenant is not None and project.tenant_id != tenant.pk:
            self.add_error("project", "The project is not in this tenant.")
        flavor, cluster = data.get("flavor"), data.get("cluster")
        if flavor is not None and cluster is not None and flavor.cluster_id != cluster.pk:
            self.add_error("flavor", "The flavor is not on this cluster.")
        return data

    def filters(self, *, tenant: Tenant | None = None) -> selectors.Filters:
        """The validated filters (call after ``is_valid()``); ``tenant``: the page's own tenant."""
        d = self.cleaned_data
        return selectors.Filters(
            start=d["start_at"], end=d["end_at"], group_by=d.get("group_by") or self.default_group,
            bucket=d.get("bucket") or "day", cluster=d.get("cluster"), flavor=d.get("flavor"),
            tenant=tenant or d.get("tenant"), project=d.get("project"),
        )

    def period_label(self) -> str:
        d = self.cleaned_data
        return f"{d['start_at']:%Y-%m-%d} to {d['end_at'] - timedelta(days=1):%Y-%m-%d} (UTC)"

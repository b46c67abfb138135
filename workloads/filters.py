"""FilterSets shared by the API lists and the portal list pages."""

from __future__ import annotations

import django_filters as filters
from django.db.models import Q

from portal.inputs import (
    BooleanFilter,
    FilterSet,
    IsoDateTimeFilter,
    MultipleChoiceFilter,
)
from tenants.access import Actor, scope_of

from .models import (
    ExtensionRequest,
    Image,
    Priority,
    RequestPreset,
    RequestState,
    ServiceTemplate,
    TemplateKind,
    WorkloadRequest,
)
from .states import ACTIVE, FINAL, WAITING


class RequestFilter(FilterSet):
    state = MultipleChoiceFilter(choices=RequestState.choices, help_text="Repeat for several: ?state=queued&state=running")
    phase = filters.ChoiceFilter(
        method="filter_phase",
        choices=[("waiting", "Waiting"), ("active", "Active"), ("final", "Finished")],
        label="waiting (not yet running), active (holds capacity) or final",
    )
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    project = filters.CharFilter(field_name="project__slug", label="Project slug")
    template = filters.CharFilter(field_name="template__slug", label="Template slug")
    kind = filters.ChoiceFilter(field_name="template__kind", choices=TemplateKind.choices)
    flavor = filters.CharFilter(field_name="flavor__name", label="Flavor name")
    priority = filters.ChoiceFilter(choices=Priority.choices)
    requested_by = filters.CharFilter(field_name="requested_by__username", label="Username of the requester")
    mine = BooleanFilter(method="filter_mine", label="Only my requests")
    created_after = IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    q = filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name contains")

    class Meta:
        model = WorkloadRequest
        fields = ["state", "tenant", "project", "template", "kind", "flavor", "priority", "requested_by"]

    def filter_phase(self, queryset, name, value):
        states = {"waiting": WAITING, "active": ACTIVE, "final": FINAL}[value]
        return queryset.filter(state__in=list(states))

    def filter_mine(self, queryset, name, value):
        user = getattr(self.request, "user", None)
        if user is None or not user.is_authenticated:
            return queryset.none() if value else queryset
        return queryset.filter(requested_by=user) if value else queryset.exclude(requested_by=user)


class TemplateFilter(FilterSet):
    kind = filters.ChoiceFilter(choices=TemplateKind.choices)
    flavor = filters.CharFilter(field_name="allowed_flavors__name", label="Allows this flavor", distinct=True)

    class Meta:
        model = ServiceTemplate
        fields = ["kind", "slug", "active"]


class ImageFilter(FilterSet):
    kind = filters.ChoiceFilter(method="filter_kind", choices=TemplateKind.choices, label="Usable by this template kind")
    q = filters.CharFilter(field_name="reference", lookup_expr="icontains", label="Reference contains")

    class Meta:
        model = Image
        fields = ["active"]

    def filter_kind(self, queryset, name, value):
        # JSON containment is not portable (SQLite); the image list is short, so filter by id.
        return queryset.filter(pk__in=[image.pk for image in queryset if value in (image.kinds or [])])


class ExtensionRequestFilter(FilterSet):
    status = filters.ChoiceFilter(choices=ExtensionRequest.Status.choices)
    request = filters.NumberFilter(field_name="request_id", label="Request id")
    project = filters.CharFilter(field_name="request__project__slug", label="Project slug")
    tenant = filters.CharFilter(field_name="request__project__tenant__slug", label="Tenant slug")
    mine = BooleanFilter(method="filter_mine", label="Only my own extension requests")
    inbox = BooleanFilter(method="filter_inbox", label="Only pending ones I may decide")

    class Meta:
        model = ExtensionRequest
        fields = ["status", "request", "project", "tenant", "mine", "inbox"]

    def filter_mine(self, queryset, name, value):
        user = getattr(self.request, "user", None)
        if user is None or not user.is_authenticated:
            return queryset.none() if value else queryset
        return queryset.filter(requested_by=user) if value else queryset.exclude(requested_by=user)

    def filter_inbox(self, queryset, name, value):
        # The rule of ``selectors.extension_requests_for(inbox=True)`` (which imports this module): pending, in a
        # project where the actor may approve.
        if self.request is None:
            return queryset
        approvable = scope_of(Actor.from_request(self.request)).in_projects("request__project", "approve_project")
        inbox = Q(approvable, status=ExtensionRequest.Status.PENDING)
        return queryset.filter(inbox) if value else queryset.exclude(inbox)


class PresetFilter(FilterSet):
    project = filters.CharFilter(field_name="project__slug", label="Project slug")
    template = filters.CharFilter(field_name="template_slug", label="Template slug")

    class Meta:
        model = RequestPreset
        fields = ["project", "template"]

"""FilterSets shared by the API lists and the portal list pages."""

from typing import Any

import django_filters as filters
from django import forms
from django.db.models import Q
from django.urls import reverse

from portal.inputs import BooleanFilter, FilterSet, IsoDateTimeFilter

from .models import ApiToken, AuditEntry, GroupMapping, Invitation, Membership, Project, Role, Tenant


class TenantFilter(FilterSet):
    q = filters.CharFilter(method="search", label="Name or slug contains")

    class Meta:
        model = Tenant
        fields = ["status", "slug"]

    def search(self, queryset, name, value):
        return queryset.filter(name__icontains=value) | queryset.filter(slug__icontains=value)


class TenantSlugOrName(filters.CharFilter):
    """A page's tenant filter typed by hand: the tenant's slug, or its name in any case. ``field_name`` is the
    path to the tenant (``tenant``, ``project__tenant``)."""

    def filter(self, qs: Any, value: Any) -> Any:
        value = (value or "").strip()
        if not value:
            return qs
        path = self.field_name
        return qs.filter(Q(**{f"{path}__slug": value}) | Q(**{f"{path}__name__iexact": value}))


# How many tenants the search answers with (GET /search/tenants/): a few to pick from, never the whole list.
TENANT_SEARCH_LIMIT = 20


def tenant_search_widget(field: forms.Field, *, list_id: str) -> None:
    """Turn a tenant filter field into a text input whose suggestions (``<datalist id=list_id>``, which the
    page holds) come from the tenant search as one types (htmx). Without JavaScript it is a text field:
    a slug or a name typed and submitted filters all the same (``TenantSlugOrName``)."""
    field.widget = forms.TextInput(attrs={
        "list": list_id, "autocomplete": "off", "placeholder": "Slug or name", "spellcheck": "false",
        "hx-get": reverse("tenant-search"), "hx-trigger": "input changed delay:250ms, focus once",
        "hx-target": f"#{list_id}", "hx-swap": "innerHTML", "hx-sync": "this:replace",
    })


class GroupMappingFilter(FilterSet):
    q = filters.CharFilter(field_name="group", lookup_expr="icontains", label="Group contains")
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")

    class Meta:
        model = GroupMapping
        fields = ["match", "role"]


class ProjectFilter(FilterSet):
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    q = filters.CharFilter(method="search", label="Name or slug contains")

    class Meta:
        model = Project
        fields = ["status", "tenant", "slug"]

    def search(self, queryset, name, value):
        return queryset.filter(name__icontains=value) | queryset.filter(slug__icontains=value)


class MembershipFilter(FilterSet):
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    project = filters.CharFilter(field_name="project__slug", label="Project slug")
    user = filters.CharFilter(field_name="user__username", label="Username")
    role = filters.ChoiceFilter(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["tenant", "project", "user", "role"]


class InvitationFilter(FilterSet):
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    project = filters.CharFilter(field_name="project__slug", label="Project slug")
    email = filters.CharFilter(lookup_expr="iexact")
    status = filters.ChoiceFilter(choices=Invitation.Status.choices)

    class Meta:
        model = Invitation
        fields = ["tenant", "project", "email", "status"]


class TokenFilter(FilterSet):
    project = filters.CharFilter(field_name="project__slug", label="Project slug")
    active = BooleanFilter(method="filter_active", label="Not revoked and not expired")

    class Meta:
        model = ApiToken
        fields = ["project", "scope"]

    def filter_active(self, queryset, name, value):
        from django.utils import timezone

        live = queryset.filter(revoked_at__isnull=True, expires_at__gt=timezone.now())
        return live if value else queryset.exclude(pk__in=live.values("pk"))


class AuditEntryFilter(FilterSet):
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    project = filters.CharFilter(field_name="project__slug", label="Project slug")
    action = filters.CharFilter(lookup_expr="startswith")
    actor = filters.CharFilter(field_name="actor_label", lookup_expr="icontains")
    since = IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEntry
        fields = ["tenant", "project", "action", "actor", "target_type"]

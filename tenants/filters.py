"""FilterSets shared by the API lists and the portal list pages."""

import django_filters as filters

from portal.inputs import BooleanFilter, FilterSet, IsoDateTimeFilter

from .models import ApiToken, AuditEntry, Invitation, Membership, Project, Role, Tenant


class TenantFilter(FilterSet):
    q = filters.CharFilter(method="search", label="Name or slug contains")

    class Meta:
        model = Tenant
        fields = ["status", "slug"]

    def search(self, queryset, name, value):
        return queryset.filter(name__icontains=value) | queryset.filter(slug__icontains=value)


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

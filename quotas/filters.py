"""FilterSets shared by the API lists and the portal list pages."""

import django_filters as filters

from portal.inputs import BooleanFilter, FilterSet
from tenants.access import Actor

from .models import Architecture, Cluster, Flavor, Quota, QuotaRequest


class ClusterFilter(FilterSet):
    architecture = filters.ChoiceFilter(choices=Architecture.choices)

    class Meta:
        model = Cluster
        fields = ["name", "architecture"]


class FlavorFilter(FilterSet):
    cluster = filters.CharFilter(field_name="cluster__name", label="Cluster name")
    kind = filters.ChoiceFilter(choices=Flavor.Kind.choices)
    gpu_model = filters.CharFilter()

    class Meta:
        model = Flavor
        fields = ["cluster", "name", "kind", "gpu_model", "pool_label", "active"]


class QuotaFilter(FilterSet):
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    project = filters.CharFilter(field_name="project__slug", label="Project slug")
    cluster = filters.CharFilter(field_name="flavor__cluster__name", label="Cluster name")
    flavor = filters.NumberFilter(field_name="flavor_id", label="Flavor id")
    flavor_name = filters.CharFilter(field_name="flavor__name", label="Flavor name")
    level = filters.ChoiceFilter(
        choices=[("tenant", "Tenant rows"), ("project", "Project rows")], method="filter_level", label="Tenant or project rows"
    )

    class Meta:
        model = Quota
        fields = ["tenant", "project", "cluster", "flavor", "flavor_name", "resource", "level"]

    def filter_level(self, queryset, name, value):
        return queryset.filter(project__isnull=(value == "tenant"))


class QuotaRequestFilter(FilterSet):
    tenant = filters.CharFilter(field_name="project__tenant__slug", label="Tenant slug")
    project = filters.CharFilter(field_name="project__slug", label="Project slug")
    flavor = filters.NumberFilter(field_name="flavor_id", label="Flavor id")
    status = filters.ChoiceFilter(choices=QuotaRequest.Status.choices)
    approver = filters.ChoiceFilter(choices=QuotaRequest.Approver.choices)
    mine = BooleanFilter(method="filter_mine", label="Only my own requests")
    inbox = BooleanFilter(method="filter_inbox", label="Only pending requests I may decide")

    class Meta:
        model = QuotaRequest
        fields = ["tenant", "project", "flavor", "status", "approver", "mine", "inbox"]

    def filter_mine(self, queryset, name, value):
        user = getattr(self.request, "user", None)
        if user is None or not value:
            return queryset
        return queryset.filter(requested_by=user)

    def filter_inbox(self, queryset, name, value):
        from .selectors import quota_requests_for

        if not value or self.request is None:
            return queryset
        return queryset.filter(pk__in=quota_requests_for(actor=Actor.from_request(self.request), inbox=True).values("pk"))

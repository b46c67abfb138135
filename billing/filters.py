"""FilterSets shared by the billing API lists and the ops pages."""

from __future__ import annotations

import django_filters as filters
from drf_spectacular.utils import extend_schema_field

from portal.inputs import BooleanFilter, FilterSet, IsoDateTimeFilter

from .models import Discount, Price, Statement, Unit, UsageInterval


class PriceFilter(FilterSet):
    unit = filters.ChoiceFilter(choices=Unit.choices)
    key = filters.CharFilter(field_name="key", lookup_expr="iexact", label="GPU model or MIG profile")
    effective_after = IsoDateTimeFilter(field_name="effective_from", lookup_expr="gte", label="Effective from, at or after")
    effective_before = IsoDateTimeFilter(field_name="effective_from", lookup_expr="lt", label="Effective from, before")

    class Meta:
        model = Price
        fields = ["unit", "key", "currency"]


class DiscountFilter(FilterSet):
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")

    class Meta:
        model = Discount
        fields = ["tenant"]


class UsageFilter(FilterSet):
    request = filters.NumberFilter(field_name="request_id", label="Request id")
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    project = filters.CharFilter(field_name="project__slug", label="Project slug")
    unit = filters.ChoiceFilter(choices=Unit.choices)
    open = BooleanFilter(field_name="ended_at", lookup_expr="isnull", label="Only open (still running) intervals")
    started_after = IsoDateTimeFilter(field_name="started_at", lookup_expr="gte")
    started_before = IsoDateTimeFilter(field_name="started_at", lookup_expr="lt")

    class Meta:
        model = UsageInterval
        fields = ["request", "tenant", "project", "unit", "open"]


@extend_schema_field({"type": "string", "pattern": r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])$", "example": "2026-03"})
class MonthFilter(filters.CharFilter):
    """A month as ``YYYY-MM``; the schema says so, so clients (and fuzzers) know what is valid."""


class StatementFilter(FilterSet):
    month = MonthFilter(method="filter_month", label="Month (YYYY-MM)")
    tenant = filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    status = filters.ChoiceFilter(choices=Statement.Status.choices)

    class Meta:
        model = Statement
        fields = ["month", "tenant", "status"]

    def filter_month(self, queryset, name, value):
        from .statements import parse_month

        return queryset.filter(month=parse_month(value))

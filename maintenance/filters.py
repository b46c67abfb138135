"""The MIG change list's filters, shared by ``/api/v1/mig-changes/`` and ``/ops/mig-changes/``."""

from __future__ import annotations

import django_filters as filters

from portal.inputs import FilterSet

from .models import MigChange


class MigChangeFilter(FilterSet):
    status = filters.ChoiceFilter(choices=MigChange.Status.choices)
    cluster = filters.CharFilter(field_name="cluster__name", label="Cluster name")
    pool = filters.CharFilter(field_name="pool_name", lookup_expr="icontains", label="Pool name contains")
    tenant = filters.CharFilter(field_name="tenant__slug", label="Proposing tenant (slug)")

    class Meta:
        model = MigChange
        fields = ["status", "cluster", "pool", "tenant"]

"""Django admin for platform ops: read-mostly, like the tenancy admin. Changes go through services
(actions below); the admin's own add/change/delete would skip the invariants, the audit log and
the reconcile. The kubeconfig is never shown."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.admin import OpsReadOnlyAdmin

from . import services
from .models import AppliedObject, Cluster, Flavor, Node, NodePool, Quota, QuotaRequest


@admin.register(Cluster)
class ClusterAdmin(OpsReadOnlyAdmin):
    fields = ["name", "architecture", "use_mig", "use_hami", "volcano_capacity_plugin", "overcommit_percent", "topology",
              "topology_levels",
              "kubeconfig_path", "inventory_synced_at", "inventory_error", "reconciled_at", "created_at"]
    list_display = ["name", "architecture", "use_mig", "use_hami", "overcommit_percent", "topology", "inventory_synced_at",
                    "reconciled_at"]
    list_filter = ["architecture", "topology"]
    search_fields = ["name"]


@admin.register(NodePool)
class NodePoolAdmin(OpsReadOnlyAdmin):
    list_display = ["name", "cluster", "gpu_product", "sharing", "mig_config", "pool_label"]
    list_filter = ["cluster", "sharing", "pool_label"]
    list_select_related = ["cluster"]


@admin.register(Node)
class NodeAdmin(OpsReadOnlyAdmin):
    list_display = ["name", "cluster", "pool", "ready", "present", "mig_config_state", "last_seen_at"]
    list_filter = ["cluster", "ready", "present"]
    search_fields = ["name"]
    list_select_related = ["cluster", "pool"]


@admin.register(Flavor)
class FlavorAdmin(OpsReadOnlyAdmin):
    list_display = ["name", "cluster", "kind", "gpu_model", "mig_profile", "pool_label", "order", "active"]
    list_filter = ["cluster", "kind", "active"]
    search_fields = ["name", "display_name", "gpu_product"]
    list_select_related = ["cluster"]
    actions = ["deactivate"]

    @admin.action(description="Deactivate the selected flavors")
    def deactivate(self, request: HttpRequest, queryset: QuerySet[Flavor]) -> None:
        self._each(request, queryset, "flavor(s) deactivated", lambda actor, f: services.flavor_deactivate(actor=actor, flavor=f))


@admin.register(Quota)
class QuotaAdmin(OpsReadOnlyAdmin):
    list_display = ["tenant", "project", "flavor", "resource", "nominal", "borrowing_limit", "lending_limit", "used", "borrowed"]
    list_filter = ["tenant", "flavor__cluster", "flavor"]
    search_fields = ["tenant__slug", "project__slug", "flavor__name", "resource"]
    list_select_related = ["tenant", "project", "flavor"]


@admin.register(QuotaRequest)
class QuotaRequestAdmin(OpsReadOnlyAdmin):
    list_display = ["id", "project", "flavor", "resource", "amount", "until", "status", "approver", "requested_by", "decided_by", "created_at"]
    list_filter = ["status", "approver", "project__tenant"]
    search_fields = ["project__slug", "reason", "requested_by__username"]
    list_select_related = ["project__tenant", "flavor", "requested_by", "decided_by"]
    actions = ["approve"]

    @admin.action(description="Approve the selected requests (no comment)")
    def approve(self, request: HttpRequest, queryset: QuerySet[QuotaRequest]) -> None:
        self._each(request, queryset, "request(s) approved",
                   lambda actor, r: services.quota_request_approve(actor=actor, request=r, comment="Approved in the admin."))


@admin.register(AppliedObject)
class AppliedObjectAdmin(OpsReadOnlyAdmin):
    list_display = ["kind", "namespace", "name", "cluster", "applied_at", "error_at"]
    list_filter = ["cluster", "kind"]
    search_fields = ["name", "namespace", "error"]
    list_select_related = ["cluster"]

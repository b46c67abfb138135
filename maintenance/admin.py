"""Django admin for platform ops: MIG changes and their step logs, read-only (README, "Django admin"). Ops propose,
approve and follow changes on ``/ops/mig-changes/``; here a proposed or approved change can be cancelled through the
service (the same rules and audit entry as the page's button)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.access import is_ops
from tenants.admin import OpsReadOnlyAdmin

from . import services
from .models import MigChange, MigChangeStep


class MigChangeStepInline(admin.TabularInline):
    model = MigChangeStep
    fields = ["seq", "at", "step", "outcome", "message"]
    readonly_fields = fields
    ordering = ["seq", "id"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_ops(request.user)


@admin.register(MigChange)
class MigChangeAdmin(OpsReadOnlyAdmin):
    list_display = ["id", "cluster", "pool_name", "from_layout", "to_layout", "status", "step", "progress", "tenant",
                    "proposed_by", "window_start"]
    list_filter = ["status", "cluster"]
    search_fields = ["pool_name", "to_layout", "reason"]
    list_select_related = ["cluster", "tenant", "proposed_by"]
    exclude = ["impact"]
    inlines = [MigChangeStepInline]
    actions = ["cancel"]

    @admin.action(description="Cancel the selected changes (before they run)")
    def cancel(self, request: HttpRequest, queryset: QuerySet[MigChange]) -> None:
        self._each(request, queryset, "MIG change(s) cancelled",
                   lambda actor, c: services.mig_change_cancel(actor=actor, change=c, reason="from the admin"))

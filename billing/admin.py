"""Django admin for platform ops: billing's tables, read-only (README, "Django admin"). Prices and discounts are set on
``/ops/prices/``, budgets by tenant admins, statements by the monthly task; their services check, lock the month and
audit, which the admin's own add/change/delete would skip."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from tenants.access import is_ops
from tenants.admin import OpsReadOnlyAdmin

from .models import (BillingPeriod, BillingProfile, Budget, BudgetAlert, Discount, Price, Statement, StatementLine,
                     UsageInterval)


@admin.register(Price)
class PriceAdmin(OpsReadOnlyAdmin):
    list_display = ["unit", "key", "amount", "currency", "effective_from", "note", "created_by"]
    list_filter = ["unit", "currency"]
    search_fields = ["key", "note"]
    list_select_related = ["created_by"]


@admin.register(Discount)
class DiscountAdmin(OpsReadOnlyAdmin):
    list_display = ["tenant", "percent", "effective_from", "note"]
    list_filter = ["tenant"]
    list_select_related = ["tenant"]


@admin.register(BillingPeriod)
class BillingPeriodAdmin(OpsReadOnlyAdmin):
    list_display = ["month", "finalised_at", "finalised_by"]


@admin.register(BillingProfile)
class BillingProfileAdmin(OpsReadOnlyAdmin):
    list_display = ["tenant", "mode", "updated_at"]
    list_filter = ["mode"]
    list_select_related = ["tenant"]


@admin.register(Budget)
class BudgetAdmin(OpsReadOnlyAdmin):
    list_display = ["tenant", "project", "amount", "refuse_when_spent", "updated_at"]
    list_filter = ["tenant", "refuse_when_spent"]
    list_select_related = ["tenant", "project"]


@admin.register(BudgetAlert)
class BudgetAlertAdmin(OpsReadOnlyAdmin):
    list_display = ["budget", "month", "threshold", "spent", "sent_at"]
    list_select_related = ["budget__tenant"]


class StatementLineInline(admin.TabularInline):
    model = StatementLine
    fields = ["project_slug", "unit", "key", "period_start", "period_end", "quantity", "unit_price", "gross",
              "discount_percent", "amount"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_ops(request.user)


@admin.register(Statement)
class StatementAdmin(OpsReadOnlyAdmin):
    list_display = ["number", "tenant", "month", "status", "total", "currency", "generated_at", "finalised_at"]
    list_filter = ["status", "month", "tenant"]
    search_fields = ["number", "tenant__slug"]
    list_select_related = ["tenant"]
    inlines = [StatementLineInline]


@admin.register(UsageInterval)
class UsageIntervalAdmin(OpsReadOnlyAdmin):
    list_display = ["request", "tenant", "project", "unit", "key", "quantity", "started_at", "ended_at", "end_reason"]
    list_filter = ["unit", "end_reason", "tenant"]
    search_fields = ["run_key", "object_name"]
    list_select_related = ["request", "tenant", "project"]
    date_hierarchy = "started_at"

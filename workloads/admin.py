"""Django admin for platform ops. The catalogue (templates, images, approval rules) is edited here
with the services' checks and an audit entry; requests are read-only, changed only by actions that
call the services (approve, reject, stop, cancel)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.access import Actor, is_ops
from tenants.admin import OpsReadOnlyAdmin
from tenants.audit import audit_record, snapshot

from . import services
from .models import ApprovalRule, Image, RequestEvent, ServiceTemplate, WorkloadRequest
from .schema import schema_errors


class OpsAdmin(OpsReadOnlyAdmin):
    """Visible to platform ops only, who may also add and change here (never delete); saves are audited."""

    audit_fields: list[str] = []
    audit_name = ""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_ops(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_ops(request.user)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        before = snapshot(type(obj).objects.get(pk=obj.pk), self.audit_fields) if change else None
        super().save_model(request, obj, form, change)
        audit_record(
            actor=Actor.from_request(request), action=f"{self.audit_name}.{'update' if change else 'create'}",
            target=obj, before=before, after=snapshot(obj, self.audit_fields),
        )


class TemplateForm(forms.ModelForm):
    class Meta:
        model = ServiceTemplate
        fields = "__all__"

    def clean_parameters_schema(self) -> Any:
        schema = self.cleaned_data.get("parameters_schema")
        problems = schema_errors(schema)
        if problems:
            raise ValidationError(problems)
        return schema

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        template = self.instance
        if template.pk and template.requests.exists():
            changed = set(self.changed_data) - services.TEMPLATE_COSMETIC
            if changed:
                raise ValidationError(
                    f"Requests use this version; changing {', '.join(sorted(changed))} needs a new version (same slug, next version)."
                )
        return data


@admin.register(ServiceTemplate)
class ServiceTemplateAdmin(OpsAdmin):
    form = TemplateForm
    audit_fields = services.TEMPLATE_FIELDS
    audit_name = "template"
    list_display = ["name", "kind", "slug", "version", "max_gpus", "max_duration_hours", "active"]
    list_filter = ["kind", "active"]
    search_fields = ["name", "slug", "description"]
    filter_horizontal = ["allowed_flavors"]


class ImageForm(forms.ModelForm):
    class Meta:
        model = Image
        fields = "__all__"

    def clean_kinds(self) -> Any:
        kinds = self.cleaned_data.get("kinds")
        probe = Image(kinds=kinds)
        try:
            services._check_image_kinds(probe)
        except ValidationError as exc:
            raise ValidationError(exc.message_dict["kinds"]) from None
        return kinds


@admin.register(Image)
class ImageAdmin(OpsAdmin):
    form = ImageForm
    audit_fields = services.IMAGE_FIELDS
    audit_name = "image"
    list_display = ["name", "reference", "kinds", "active"]
    list_filter = ["active"]
    search_fields = ["name", "reference", "description"]


@admin.register(ApprovalRule)
class ApprovalRuleAdmin(OpsAdmin):
    audit_fields = services.RULE_FIELDS
    audit_name = "approval_rule"
    list_display = ["__str__", "project", "template_slug", "auto_approve_max_gpus", "auto_approve_max_hours", "require_admin_for_inference"]
    list_filter = ["require_admin_for_inference"]
    search_fields = ["project__slug", "template_slug"]
    list_select_related = ["project"]


class RequestEventInline(admin.TabularInline):
    model = RequestEvent
    fields = ["at", "from_state", "to_state", "actor_label", "message"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WorkloadRequest)
class WorkloadRequestAdmin(OpsReadOnlyAdmin):
    list_display = ["id", "name", "project", "template", "flavor", "gpus", "replicas", "state", "requested_by", "created_at"]
    list_filter = ["state", "template__kind", "priority", "project__tenant"]
    search_fields = ["name", "project__slug", "requested_by__username", "image"]
    list_select_related = ["project", "template", "flavor", "requested_by"]
    date_hierarchy = "created_at"
    inlines = [RequestEventInline]
    actions = ["approve", "reject", "stop", "cancel"]

    @admin.action(description="Approve")
    def approve(self, request: HttpRequest, queryset: QuerySet[WorkloadRequest]) -> None:
        self._each(request, queryset, "request(s) approved", lambda a, r: services.request_approve(actor=a, request=r, comment="from the admin"))

    @admin.action(description="Reject")
    def reject(self, request: HttpRequest, queryset: QuerySet[WorkloadRequest]) -> None:
        self._each(request, queryset, "request(s) rejected", lambda a, r: services.request_reject(actor=a, request=r, comment="from the admin"))

    @admin.action(description="Stop")
    def stop(self, request: HttpRequest, queryset: QuerySet[WorkloadRequest]) -> None:
        self._each(request, queryset, "request(s) stopped", lambda a, r: services.request_stop(actor=a, request=r))

    @admin.action(description="Cancel")
    def cancel(self, request: HttpRequest, queryset: QuerySet[WorkloadRequest]) -> None:
        self._each(request, queryset, "request(s) cancelled", lambda a, r: services.request_cancel(actor=a, request=r))

"""Django admin for platform ops. The catalogue (templates, images, approval rules) is edited here
through the services (their checks, versioning and audit entry); requests are read-only, changed only by actions that
call the services (approve, reject, stop, cancel)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.exceptions import PortalError
from tenants.access import Actor, is_ops
from tenants.admin import OpsReadOnlyAdmin

from . import catalogue_services, services
from .models import ApprovalRule, Image, RequestEvent, ServiceTemplate, WorkloadRequest


class ServiceForm(forms.ModelForm):
    """An admin form whose save is a service call: the service runs last in validation (after the
    model's own checks), so its refusals show as form errors; the admin then only shows what it saved."""

    actor: Actor | None = None  # bound per request by ``OpsAdmin.get_form``
    saved: Any = None

    def service_save(self, actor: Actor, data: dict[str, Any], changed: set[str]) -> Any:
        raise NotImplementedError

    def _post_clean(self) -> None:
        super()._post_clean()
        if self.errors or self.actor is None:
            return
        try:
            with transaction.atomic():
                self.saved = self.service_save(self.actor, dict(self.cleaned_data), set(self.changed_data))
        except PortalError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        except ValidationError as exc:
            errors = exc.message_dict if hasattr(exc, "error_dict") else {None: exc.messages}
            for field, messages in errors.items():
                self.add_error(field if field in self.fields else None, messages)


class OpsAdmin(OpsReadOnlyAdmin):
    """Visible to platform ops only, who may also add and change here (never delete). Saves go
    through the app's services (``ServiceForm``), which check, version and audit them."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_ops(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_ops(request.user)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"actor": Actor.from_request(request)})

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        # The service saved it during validation; show the admin the row as saved (a new version's pk).
        obj.pk = form.saved.pk
        obj._state.adding = False
        obj.refresh_from_db()

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Many-to-many fields (a template's flavors) were set by the service."""


def _fields(data: dict[str, Any], names: Any) -> dict[str, Any]:
    return {name: data[name] for name in names if name in data}


class TemplateForm(ServiceForm):
    class Meta:
        model = ServiceTemplate
        fields = "__all__"

    def validate_unique(self) -> None:
        """(slug, version) is the service's to number: a new template of a known slug is its next version."""

    def validate_constraints(self) -> None:
        """As ``validate_unique``: the service checks the saved version's constraints."""

    def service_save(self, actor: Actor, data: dict[str, Any], changed: set[str]) -> Any:
        flavors = data.pop("allowed_flavors", None)
        if self.instance.pk is None:
            data.pop("version", None)  # the service numbers versions: last of the slug + 1
            return catalogue_services.template_create(actor=actor, allowed_flavors=flavors or (), **data)
        return catalogue_services.template_update(actor=actor, template=self.instance,
                                        allowed_flavors=flavors if "allowed_flavors" in changed else None,
                                        **_fields(data, changed - {"allowed_flavors"}))


@admin.register(ServiceTemplate)
class ServiceTemplateAdmin(OpsAdmin):
    form = TemplateForm
    list_display = ["name", "kind", "slug", "version", "max_gpus", "max_duration_hours", "active"]
    list_filter = ["kind", "active"]
    search_fields = ["name", "slug", "description"]
    filter_horizontal = ["allowed_flavors"]


class ImageForm(ServiceForm):
    class Meta:
        model = Image
        fields = "__all__"

    def service_save(self, actor: Actor, data: dict[str, Any], changed: set[str]) -> Any:
        if self.instance.pk is None:
            return catalogue_services.image_create(actor=actor, **data)
        return catalogue_services.image_update(actor=actor, image=self.instance, **_fields(data, changed))


@admin.register(Image)
class ImageAdmin(OpsAdmin):
    form = ImageForm
    list_display = ["name", "reference", "kinds", "active"]
    list_filter = ["active"]
    search_fields = ["name", "reference", "description"]


class ApprovalRuleForm(ServiceForm):
    class Meta:
        model = ApprovalRule
        fields = "__all__"

    def service_save(self, actor: Actor, data: dict[str, Any], changed: set[str]) -> Any:
        if self.instance.pk is None:
            return catalogue_services.approval_rule_create(actor=actor, **data)
        return catalogue_services.approval_rule_update(actor=actor, rule=self.instance, **_fields(data, changed))


@admin.register(ApprovalRule)
class ApprovalRuleAdmin(OpsAdmin):
    form = ApprovalRuleForm
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

"""Django admin for platform ops: read-mostly. Every change goes through a service (actions below);
the admin's own add/change/delete would skip the rules, the audit log and the permission sync.

Ops create tenants, projects and memberships on the portal's own pages (/ops/, /tenants/<slug>/).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.exceptions import PortalError

from . import services
from .access import Actor, is_ops
from .forms import ThrottledAdminAuthenticationForm
from .models import ApiToken, AuditEntry, Invitation, Membership, Project, Tenant

# The admin's sign-in explains a throttled attempt like the portal's (the throttle is in the backend).
admin.site.login_form = ThrottledAdminAuthenticationForm


class OpsReadOnlyAdmin(admin.ModelAdmin):
    """Visible to platform ops only; no add, change or delete."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_ops(request.user)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_ops(request.user)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _each(self, request: HttpRequest, queryset: QuerySet[Any], done: str, call: Any) -> None:
        """Run ``call(actor, obj)`` for every selected row, reporting successes and refusals."""
        actor = Actor.from_request(request)
        count = 0
        for obj in queryset:
            try:
                call(actor, obj)
                count += 1
            except (PortalError, ValidationError) as exc:
                text = getattr(exc, "message", None) or "; ".join(exc.messages)
                self.message_user(request, f"{obj}: {text}", messages.ERROR)
        if count:
            self.message_user(request, f"{count} {done}.", messages.SUCCESS)


@admin.register(Tenant)
class TenantAdmin(OpsReadOnlyAdmin):
    list_display = ["name", "slug", "status", "cost_centre", "contact_email", "created_at"]
    list_filter = ["status"]
    search_fields = ["name", "slug", "cost_centre"]
    actions = ["suspend", "activate"]

    @admin.action(description="Suspend (read-only for its users)")
    def suspend(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self._each(request, queryset, "tenant(s) suspended",
                   lambda actor, t: services.tenant_update(actor=actor, tenant=t, status=Tenant.Status.SUSPENDED))

    @admin.action(description="Activate")
    def activate(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self._each(request, queryset, "tenant(s) activated",
                   lambda actor, t: services.tenant_update(actor=actor, tenant=t, status=Tenant.Status.ACTIVE))


@admin.register(Project)
class ProjectAdmin(OpsReadOnlyAdmin):
    list_display = ["name", "slug", "tenant", "status", "created_at"]
    list_filter = ["status", "tenant"]
    search_fields = ["name", "slug", "description"]
    list_select_related = ["tenant"]
    actions = ["archive", "restore"]

    @admin.action(description="Archive")
    def archive(self, request: HttpRequest, queryset: QuerySet[Project]) -> None:
        self._each(request, queryset, "project(s) archived",
                   lambda actor, p: services.project_update(actor=actor, project=p, status=Project.Status.ARCHIVED))

    @admin.action(description="Restore")
    def restore(self, request: HttpRequest, queryset: QuerySet[Project]) -> None:
        self._each(request, queryset, "project(s) restored",
                   lambda actor, p: services.project_update(actor=actor, project=p, status=Project.Status.ACTIVE))


@admin.register(Membership)
class MembershipAdmin(OpsReadOnlyAdmin):
    list_display = ["user", "role", "tenant", "project", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "user__email", "project__slug", "tenant__slug"]
    list_select_related = ["user", "tenant", "project"]
    actions = ["remove"]

    @admin.action(description="Remove the selected memberships")
    def remove(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        self._each(request, queryset, "membership(s) removed",
                   lambda actor, m: services.membership_delete(actor=actor, membership=m))


@admin.register(ApiToken)
class ApiTokenAdmin(OpsReadOnlyAdmin):
    # Never the secret hash: it is as good as a password for offline guessing.
    fields = ["name", "prefix", "project", "user", "scope", "created_at", "expires_at", "last_used_at", "revoked_at"]
    list_display = ["name", "prefix", "project", "user", "scope", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["scope", "project__tenant"]
    search_fields = ["name", "prefix", "user__username", "project__slug"]
    list_select_related = ["project__tenant", "user"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        self._each(request, queryset, "token(s) revoked", lambda actor, t: services.token_revoke(actor=actor, token=t))


@admin.register(Invitation)
class InvitationAdmin(OpsReadOnlyAdmin):
    # Never the secret's hash.
    fields = ["email", "tenant", "project", "role", "status", "invited_by", "created_at", "sent_at", "send_count",
              "expires_at", "accepted_by", "accepted_at", "revoked_at"]
    list_display = ["email", "tenant", "project", "role", "status", "sent_at", "expires_at", "accepted_by"]
    list_filter = ["status", "role", "tenant"]
    search_fields = ["email", "tenant__slug", "project__slug"]
    list_select_related = ["tenant", "project", "accepted_by"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected invitations")
    def revoke(self, request: HttpRequest, queryset: QuerySet[Invitation]) -> None:
        self._each(request, queryset, "invitation(s) revoked",
                   lambda actor, i: services.invitation_revoke(actor=actor, invitation=i))


@admin.register(AuditEntry)
class AuditEntryAdmin(OpsReadOnlyAdmin):
    list_display = ["created_at", "actor_label", "action", "target_repr", "tenant", "project", "client_address"]
    list_filter = ["action", "tenant"]
    search_fields = ["actor_label", "action", "target_repr"]
    date_hierarchy = "created_at"
    list_select_related = ["tenant", "project"]
    actions = None

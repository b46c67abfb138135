"""Django admin for platform ops: read-mostly. Every change goes through a service (actions below);
the admin's own add/change/delete would skip the rules, the audit log and the permission sync.

What ops do here (README, "Django admin"): look at every table the portal keeps (users, tenants, quotas, requests,
billing, MIG changes, identity) and act on selected rows through the services' actions. Ops create tenants,
projects and memberships on the portal's own pages (/ops/, /tenants/<slug>/); the catalogue is edited here.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.exceptions import PortalError

from . import services
from .access import Actor, is_ops
from .forms import ThrottledAdminAuthenticationForm
from . import identity
from .models import (ApiToken, AuditEntry, GroupMapping, Invitation, LoginSettings, Membership, OidcIdentity, Project,
                     Tenant)

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


# Users: Django's own UserAdmin needs the auth.* model permissions, which ops (staff in the "ops" group) do not hold,
# so /admin/auth/user/ was a 403. Ops read users here and make or unmake ops through the service; passwords,
# names and memberships are changed on the portal's pages (and by the person), never here. Groups: the only one
# that matters is "ops", which the actions below keep.
User = get_user_model()
for _model in (User, Group):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)


class MembershipInline(admin.TabularInline):
    model = Membership
    fk_name = "user"
    fields = ["tenant", "project", "role", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_ops(request.user)


@admin.register(User)
class UserAdmin(OpsReadOnlyAdmin):
    # Never the password hash.
    fields = ["username", "email", "first_name", "last_name", "is_active", "is_staff", "is_superuser", "last_login",
              "date_joined"]
    list_display = ["username", "email", "is_active", "platform_ops", "last_login", "date_joined"]
    list_filter = ["is_active", "is_staff", "is_superuser"]
    search_fields = ["username", "email", "first_name", "last_name"]
    inlines = [MembershipInline]
    actions = ["make_ops", "remove_ops"]

    @admin.display(boolean=True, description="Platform ops")
    def platform_ops(self, user: Any) -> bool:
        return is_ops(user)

    @admin.action(description="Make platform ops")
    def make_ops(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, "user(s) made ops", lambda actor, u: services.ops_user_ensure(actor=actor, user=u))

    @admin.action(description="Remove from platform ops")
    def remove_ops(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, "user(s) no longer ops", lambda actor, u: services.ops_user_remove(actor=actor, user=u))


# Identity (single sign-on): the group mappings and the login settings are edited on /ops/identity/; here they are
# read, a mapping can be removed, and each person's link to the identity provider is shown.
@admin.register(GroupMapping)
class GroupMappingAdmin(OpsReadOnlyAdmin):
    list_display = ["group", "match", "tenant", "project", "role", "created_at"]
    list_filter = ["role", "match", "tenant"]
    search_fields = ["group"]
    list_select_related = ["tenant", "project"]
    actions = ["remove"]

    @admin.action(description="Remove the selected group mappings")
    def remove(self, request: HttpRequest, queryset: QuerySet[GroupMapping]) -> None:
        self._each(request, queryset, "group mapping(s) removed",
                   lambda actor, m: identity.group_mapping_delete(actor=actor, mapping=m))


@admin.register(LoginSettings)
class LoginSettingsAdmin(OpsReadOnlyAdmin):
    pass


@admin.register(OidcIdentity)
class OidcIdentityAdmin(OpsReadOnlyAdmin):
    list_display = ["user", "issuer", "subject", "email", "last_login_at"]
    search_fields = ["user__username", "subject", "issuer"]
    list_select_related = ["user"]

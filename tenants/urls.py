from django.contrib.auth import views as auth_views
from django.urls import path

from . import oidc, views

urlpatterns = [
    path("", views.home, name="home"),
    # Accounts
    path("accounts/login/", views.LoginView.as_view(), name="login"),
    path("accounts/logout/", oidc.PortalLogoutView.as_view(), name="logout"),
    # Single sign-on (tenants/oidc.py): on when OIDC_ISSUER and OIDC_CLIENT_ID are set
    path("oidc/login/", oidc.SignInView.as_view(), name="oidc-login"),
    path("oidc/callback/", oidc.CallbackView.as_view(), name="oidc-callback"),
    path("accounts/password/", views.PasswordChangeView.as_view(), name="password_change"),
    path("accounts/password/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    # Projects
    path("projects/<slug:slug>/", views.project_detail, name="project-detail"),
    path("projects/<slug:slug>/tokens/", views.token_create, name="token-create"),
    path("projects/<slug:slug>/tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("projects/<slug:slug>/status/", views.project_status, name="project-status"),
    path("projects/<slug:slug>/idle/", views.project_idle, name="project-idle"),
    # Tenant admin
    path("search/tenants/", views.tenant_search, name="tenant-search"),
    path("tenants/", views.tenant_list, name="tenant-list"),
    path("tenants/<slug:slug>/", views.tenant_detail, name="tenant-detail"),
    path("tenants/<slug:slug>/details/", views.tenant_details, name="tenant-details"),
    path("tenants/<slug:slug>/projects/", views.project_create, name="project-create"),
    path("tenants/<slug:slug>/members/", views.tenant_members, name="tenant-members"),
    path("tenants/<slug:slug>/members/add/", views.member_add, name="member-add"),
    path("tenants/<slug:slug>/members/<int:pk>/role/", views.member_role, name="member-role"),
    path("tenants/<slug:slug>/members/<int:pk>/remove/", views.member_remove, name="member-remove"),
    path("tenants/<slug:slug>/invitations/", views.invitation_create, name="invitation-create"),
    path("tenants/<slug:slug>/invitations/<int:pk>/resend/", views.invitation_resend, name="invitation-resend"),
    path("tenants/<slug:slug>/invitations/<int:pk>/revoke/", views.invitation_revoke, name="invitation-revoke"),
    # An invitation's link (no sign-in needed: newcomers sign up there)
    path("invitations/<str:secret>/", views.invitation_accept, name="invitation-accept"),
    path("invitations/<str:secret>/sso/", oidc.invitation_sign_in, name="invitation-sso"),
    path("tenants/<slug:slug>/audit/", views.tenant_audit, name="tenant-audit"),
    # Platform ops
    path("ops/", views.ops_home, name="ops-home"),
    path("ops/tenants/", views.ops_tenants, name="ops-tenants"),
    path("ops/tenants/new/", views.ops_tenant_create, name="ops-tenant-create"),
    path("ops/tenants/<slug:slug>/status/", views.ops_tenant_status, name="ops-tenant-status"),
    path("ops/projects/", views.ops_projects, name="ops-projects"),
    path("ops/users/", views.ops_users, name="ops-users"),
    path("ops/users/<int:pk>/ops/", views.ops_user_ops, name="ops-user-ops"),
    path("ops/audit/", views.ops_audit, name="ops-audit"),
    path("ops/identity/", views.ops_identity, name="ops-identity"),
    path("ops/identity/mappings/<int:pk>/delete/", views.ops_identity_mapping_delete, name="ops-identity-mapping-delete"),
]

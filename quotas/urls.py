"""Portal pages for capacity, flavors and quotas; mounted at the root next to ``tenants.urls``."""

from django.urls import path

from . import cluster_views, flavor_views, namespace_views, quota_views, spill_views, views

urlpatterns = [
    # Platform ops
    path("ops/capacity/", views.capacity, name="ops-capacity"),
    path("ops/capacity/tenant-quota/", views.tenant_quota_set, name="ops-tenant-quota"),
    path("ops/clusters/new/", cluster_views.cluster_new, name="ops-cluster-new"),
    path("ops/clusters/<str:name>/", cluster_views.cluster_detail, name="ops-cluster"),
    path("ops/clusters/<str:name>/settings/", cluster_views.cluster_settings, name="ops-cluster-settings"),
    path("ops/clusters/<str:name>/apply/", cluster_views.cluster_apply, name="ops-cluster-apply"),
    path("ops/clusters/<str:name>/change/", cluster_views.cluster_change_progress, name="ops-cluster-change"),
    path("ops/clusters/<str:name>/sync/", cluster_views.cluster_sync, name="ops-cluster-sync"),
    path("ops/clusters/<str:name>/export.yaml", cluster_views.cluster_export, name="ops-cluster-export"),
    path("ops/clusters/<str:name>/objects/", cluster_views.cluster_objects, name="ops-cluster-objects"),
    path("ops/clusters/<str:name>/namespaces/<slug:slug>/", namespace_views.namespace_detail, name="ops-namespace"),
    path("ops/clusters/<str:name>/namespaces/<slug:slug>/adopt/", namespace_views.namespace_adopt, name="ops-namespace-adopt"),
    path("ops/clusters/<str:name>/namespaces/<slug:slug>/delete/", namespace_views.namespace_delete, name="ops-namespace-delete"),
    path("ops/flavors/", flavor_views.flavor_list, name="ops-flavors"),
    path("ops/flavors/new/", flavor_views.flavor_create, name="ops-flavor-create"),
    path("ops/flavors/<int:pk>/", flavor_views.flavor_detail, name="ops-flavor"),
    path("ops/flavors/<int:pk>/active/", flavor_views.flavor_active, name="ops-flavor-active"),
    # Tenant admins: split the tenant's quota across its projects
    path("tenants/<slug:slug>/quotas/", quota_views.tenant_quotas, name="tenant-quotas"),
    path("tenants/<slug:slug>/quotas/set/", quota_views.project_quota_set, name="tenant-quota-set"),
    # Project members: the project's quota, and asking for more
    path("projects/<slug:slug>/quota/", quota_views.project_quota, name="project-quota"),
    path("projects/<slug:slug>/quota/request/", quota_views.quota_request_create, name="project-quota-request"),
    path("projects/<slug:slug>/spill-over/", spill_views.spill_policy, name="project-spill-policy"),
    # Quota requests: mine and the approver's inbox
    path("quota-requests/", quota_views.quota_requests, name="quota-requests"),
    path("quota-requests/bulk/", quota_views.quota_requests_bulk, name="quota-requests-bulk"),
    path("quota-requests/<int:pk>/", quota_views.quota_request_detail, name="quota-request"),
    path("quota-requests/<int:pk>/decide/", quota_views.quota_request_decide, name="quota-request-decide"),
    path("quota-requests/<int:pk>/cancel/", quota_views.quota_request_cancel, name="quota-request-cancel"),
]

from django.urls import path

from . import reclaimable_views, views

# "report/" before "<key>/": a metric is never called "report".
urlpatterns = [
    path("ops/metrics/", views.ops_metrics, name="ops-metrics"),
    path("ops/metrics/report/", views.ops_report, name="ops-metrics-report"),
    path("ops/metrics/<slug:key>/", views.ops_metric, name="ops-metric"),
    path("tenants/<slug:slug>/metrics/", views.tenant_metrics, name="tenant-metrics"),
    path("tenants/<slug:slug>/metrics/report/", views.tenant_report, name="tenant-metrics-report"),
    path("tenants/<slug:slug>/metrics/<slug:key>/", views.tenant_metric, name="tenant-metric"),
    path("ops/reclaimable/", reclaimable_views.ops_reclaimable, name="ops-reclaimable"),
    path("ops/reclaimable/<slug:slug>/", reclaimable_views.ops_reclaimable_tenant, name="ops-reclaimable-tenant"),
    path("tenants/<slug:slug>/reclaimable/", reclaimable_views.tenant_reclaimable, name="tenant-reclaimable"),
]

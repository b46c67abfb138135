from django.urls import path

from ..reclaimable_views import ReclaimableTenantView, ReclaimableView
from .views import MetricListView, MetricView

urlpatterns = [
    path("metrics/", MetricListView.as_view(), name="metrics"),
    path("metrics/<slug:key>/", MetricView.as_view(), name="metric"),
    path("reclaimable/", ReclaimableView.as_view(), name="reclaimable"),
    path("reclaimable/<slug:tenant>/", ReclaimableTenantView.as_view(), name="reclaimable-tenant"),
]

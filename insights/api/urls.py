from django.urls import path

from .views import MetricListView, MetricView

urlpatterns = [
    path("metrics/", MetricListView.as_view(), name="metrics"),
    path("metrics/<slug:key>/", MetricView.as_view(), name="metric"),
]

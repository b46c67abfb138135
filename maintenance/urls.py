from django.urls import path

from . import health_views, views

urlpatterns = [
    path("ops/mig-changes/", views.mig_change_list, name="mig-changes"),
    path("ops/mig-changes/new/", views.mig_change_new, name="mig-change-new"),
    path("ops/mig-changes/<int:pk>/", views.mig_change_detail, name="mig-change"),
    path("ops/mig-changes/<int:pk>/progress/", views.mig_change_progress, name="mig-change-progress"),
    path("ops/mig-changes/<int:pk>/<str:decision>/", views.mig_change_decide, name="mig-change-decide"),
    path("ops/health/", health_views.health_list, name="ops-health"),
    path("ops/health/<str:cluster>/<str:name>/", health_views.health_node, name="ops-health-node"),
]

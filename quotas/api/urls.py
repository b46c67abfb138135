"""Mounted under /api/v1/ next to the tenancy API (namespace ``quotas-api``)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from .namespaces import NamespaceAdoptView, NamespaceDeleteView, NamespaceView
from .spill import SpillPolicyView
from .views import ClusterViewSet, FlavorViewSet, ProjectQuotaView, QuotaRequestViewSet, QuotaViewSet

router = SimpleRouter()
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("flavors", FlavorViewSet, basename="flavor")
router.register("quotas", QuotaViewSet, basename="quota")
router.register("quota-requests", QuotaRequestViewSet, basename="quotarequest")

urlpatterns = [
    path("projects/<str:slug>/quota/", ProjectQuotaView.as_view(), name="project-quota"),
    path("projects/<str:slug>/spill-policy/", SpillPolicyView.as_view(), name="project-spill-policy"),
    path("clusters/<str:cluster>/projects/<str:slug>/namespace/", NamespaceView.as_view(), name="project-namespace"),
    path("clusters/<str:cluster>/projects/<str:slug>/namespace/adopt/", NamespaceAdoptView.as_view(), name="project-namespace-adopt"),
    path("clusters/<str:cluster>/projects/<str:slug>/namespace/delete/", NamespaceDeleteView.as_view(), name="project-namespace-delete"),
    *router.urls,
]

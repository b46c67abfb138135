from rest_framework.routers import SimpleRouter

from .views import MigChangeViewSet

# SimpleRouter: the API root at /api/v1/ belongs to the tenancy router.
router = SimpleRouter()
router.register("mig-changes", MigChangeViewSet, basename="mig-change")

urlpatterns = [*router.urls]

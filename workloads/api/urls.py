from rest_framework.routers import SimpleRouter

from .views import (
    ApprovalInboxViewSet,
    ApprovalRuleViewSet,
    ExtensionRequestViewSet,
    ImageViewSet,
    PresetViewSet,
    RequestViewSet,
    TemplateViewSet,
    VolumeViewSet,
)

# SimpleRouter: the API root at /api/v1/ belongs to the tenancy router.
router = SimpleRouter()
router.register("templates", TemplateViewSet, basename="template")
router.register("images", ImageViewSet, basename="image")
router.register("approval-rules", ApprovalRuleViewSet, basename="approval-rule")
router.register("requests", RequestViewSet, basename="request")
router.register("approvals", ApprovalInboxViewSet, basename="approval")
router.register("extension-requests", ExtensionRequestViewSet, basename="extension-request")
router.register("volumes", VolumeViewSet, basename="volume")
router.register("presets", PresetViewSet, basename="preset")

urlpatterns = router.urls

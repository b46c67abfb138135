from django.urls import path
from rest_framework.routers import DefaultRouter

from .views import AuditEntryViewSet, InvitationViewSet, MembershipViewSet, MeView, ProjectViewSet, TenantViewSet, TokenViewSet

router = DefaultRouter()
router.register("tenants", TenantViewSet, basename="tenant")
router.register("projects", ProjectViewSet, basename="project")
router.register("memberships", MembershipViewSet, basename="membership")
router.register("invitations", InvitationViewSet, basename="invitation")
router.register("tokens", TokenViewSet, basename="token")
router.register("audit", AuditEntryViewSet, basename="auditentry")

urlpatterns = [path("me/", MeView.as_view(), name="me"), *router.urls]

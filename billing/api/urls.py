from rest_framework.routers import SimpleRouter

from django.urls import path

from .budget_views import BudgetViewSet, CostView
from .statements import StatementViewSet
from .views import DiscountViewSet, PriceViewSet, UsageViewSet

# SimpleRouter: the API root at /api/v1/ belongs to the tenancy router.
router = SimpleRouter()
router.register("prices", PriceViewSet, basename="price")
router.register("discounts", DiscountViewSet, basename="discount")
router.register("usage", UsageViewSet, basename="usage")
router.register("budgets", BudgetViewSet, basename="budget")
router.register("statements", StatementViewSet, basename="statement")

urlpatterns = [*router.urls, path("costs/", CostView.as_view(), name="costs")]

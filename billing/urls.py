from django.urls import path

from . import views

urlpatterns = [
    path("ops/prices/", views.price_list, name="ops-prices"),
    path("ops/prices/new/", views.price_new, name="ops-price-new"),
    path("ops/prices/<int:pk>/", views.price_detail, name="ops-price"),
    path("ops/prices/<int:pk>/delete/", views.price_delete, name="ops-price-delete"),
]

from . import cost_views

urlpatterns += [
    path("costs/projects/<slug:slug>/", cost_views.project_costs, name="project-costs"),
    path("costs/tenants/<slug:slug>/", cost_views.tenant_costs, name="tenant-costs"),
    path("ops/costs/", cost_views.ops_costs, name="ops-costs"),
]

from django.urls import path

from . import statement_views, views

urlpatterns = [
    path("ops/prices/", views.price_list, name="ops-prices"),
    path("ops/prices/new/", views.price_new, name="ops-price-new"),
    path("ops/prices/<int:pk>/", views.price_detail, name="ops-price"),
    path("ops/prices/<int:pk>/delete/", views.price_delete, name="ops-price-delete"),
    path("statements/", statement_views.statement_list, name="statements"),
    path("statements/draft/", statement_views.statement_draft, name="statement-draft"),
    path("statements/<int:pk>/", statement_views.statement_detail, name="statement"),
    path("statements/<int:pk>/csv/", statement_views.statement_csv, name="statement-csv"),
    path("ops/tenants/<slug:slug>/billing/", statement_views.billing_profile, name="ops-billing-profile"),
]

from . import budget_views, cost_views

urlpatterns += [
    path("tenants/<slug:slug>/budgets/", budget_views.tenant_budgets, name="tenant-budgets"),
    path("tenants/<slug:slug>/budgets/set/", budget_views.tenant_budget_set, name="tenant-budget-set"),
    path("costs/projects/<slug:slug>/", cost_views.project_costs, name="project-costs"),
    path("costs/tenants/<slug:slug>/", cost_views.tenant_costs, name="tenant-costs"),
    path("ops/costs/", cost_views.ops_costs, name="ops-costs"),
]

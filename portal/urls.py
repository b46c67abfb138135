from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

urlpatterns = [
    path("", include("tenants.urls")),
    path("", include("quotas.urls")),
    path("", include("workloads.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include(("tenants.api.urls", "api"), namespace="api")),
    path("api/v1/", include(("quotas.api.urls", "quotas-api"), namespace="quotas-api")),
    path("api/v1/", include(("workloads.api.urls", "workloads-api"), namespace="workloads-api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
]

# A URL under /api/ that matches no route answers in the API's error format (JSON), not a page.
handler404 = "portal.api.not_found"

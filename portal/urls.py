from django.conf import settings
from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.utils.csp import CSP
from django.views.decorators.csp import csp_override
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView

from portal import health
from portal.api import schema_page, schema_view

# Redoc styles itself with inline <style> elements it creates at run time (no nonce): its page alone
# allows inline styles. Scripts stay as strict as everywhere else.
REDOC_CSP = settings.SECURE_CSP | {"style-src": [CSP.SELF, CSP.UNSAFE_INLINE], "worker-src": [CSP.SELF, "blob:"]}

def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    return HttpResponsePermanentRedirect(static("img/favicon.svg"))


urlpatterns = [
    # Probes (portal/health.py); HealthMiddleware answers them first, before the host check and redirects.
    path("healthz/live", health.live, name="healthz-live"),
    path("healthz/ready", health.ready, name="healthz-ready"),
    # Browsers ask for /favicon.ico on pages without an icon link (the notebook's own pages): the portal's icon.
    path("favicon.ico", favicon, name="favicon"),
    # The API first, under one prefix: a call resolves after one prefix check instead of trying every page's
    # pattern, and a page pays one failed prefix check.
    path("api/v1/", include([
        path("", include(("tenants.api.urls", "api"), namespace="api")),
        path("", include(("quotas.api.urls", "quotas-api"), namespace="quotas-api")),
        path("", include(("workloads.api.urls", "workloads-api"), namespace="workloads-api")),
        path("", include(("billing.api.urls", "billing-api"), namespace="billing-api")),
        path("", include(("insights.api.urls", "insights-api"), namespace="insights-api")),
        path("", include(("insights.review_api_urls", "review-api"), namespace="review-api")),
        path("", include(("maintenance.api.urls", "maintenance-api"), namespace="maintenance-api")),
    ])),
    path("", include("tenants.urls")),
    path("", include("quotas.urls")),
    path("", include("workloads.urls")),
    path("", include("billing.urls")),
    path("", include("insights.urls")),
    path("", include("insights.review_urls")),
    path("", include("maintenance.urls")),
    path("admin/", admin.site.urls),
    # Public unless PORTAL_SCHEMA_PUBLIC is off (production's default): then signed-in users and tokens only.
    path("api/schema/", schema_view(), name="schema"),
    path("api/docs/", schema_page(SpectacularSwaggerView.as_view(url_name="schema")), name="api-docs"),
    path("api/redoc/", schema_page(csp_override(REDOC_CSP)(SpectacularRedocView.as_view(url_name="schema"))), name="api-redoc"),
]

# With DEBUG off, pages answer errors with the portal's own pages (templates/400.html, 403.html, 404.html,
# 500.html, in the site's layout); the API answers in its JSON error shape.
# An unexpected error (DEBUG off): JSON in the API's error shape under /api/, the HTML page elsewhere.
handler500 = "portal.api.server_error"
# A URL under /api/ that matches no route answers in the API's error format (JSON), not a page.
handler404 = "portal.api.not_found"
handler403 = "portal.api.permission_denied"
handler400 = "portal.api.bad_request"

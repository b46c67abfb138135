"""The portal's URLs plus the workloads API, until portal/urls.py includes it (then: the portal's as-is)."""

from django.urls import include, path

from portal.urls import urlpatterns as portal_urlpatterns

NAMESPACE = "workloads-api"
_included = any(getattr(p, "namespace", None) == NAMESPACE for p in portal_urlpatterns)

urlpatterns = list(portal_urlpatterns)
if not _included:
    urlpatterns.append(path("api/v1/", include(("workloads.api.urls", NAMESPACE), namespace=NAMESPACE)))

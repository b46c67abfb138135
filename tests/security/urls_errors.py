"""The portal's URLs plus views that refuse (403), cannot read the request (400) or fail (500), as a page and
under /api/ (for the error page tests)."""

from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.urls import path

from portal import urls as portal_urls


def refuse(request):
    raise PermissionDenied("Only the owls may read this.")


def unreadable(request):
    raise SuspiciousOperation("a forged header")


def boom(request):
    raise RuntimeError("boom: a bug in a page")


urlpatterns = [
    path("refuse/", refuse), path("unreadable/", unreadable), path("boom/", boom),
    path("api/v1/refuse/", refuse), path("api/v1/unreadable/", unreadable),
    *portal_urls.urlpatterns,
]
handler400 = portal_urls.handler400
handler403 = portal_urls.handler403
handler404 = portal_urls.handler404
handler500 = portal_urls.handler500

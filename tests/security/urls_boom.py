"""The portal's URLs plus two views that fail: one in the API, one page (for the 500 handler tests)."""

from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.views import APIView

from portal import urls as portal_urls


class Boom(APIView):
    permission_classes = [AllowAny]

    def get(self, request):
        raise RuntimeError("boom: a bug in an API view")


def boom_page(request):
    raise RuntimeError("boom: a bug in a page")


urlpatterns = [path("api/v1/boom/", Boom.as_view()), path("boom/", boom_page), *portal_urls.urlpatterns]
handler500 = getattr(portal_urls, "handler500", "django.views.defaults.server_error")

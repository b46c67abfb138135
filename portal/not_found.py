"""The portal's own 404 page with DEBUG on too (``make run``). Django answers a 404 under DEBUG with its debug page,
which lists every URL pattern of the portal: not what a person trying the portal should see, and not what production
shows. With ``DEBUG_404`` (off by default) the debug page comes back, for whoever works on the URL configuration.

A URL that matches no route (no ``resolver_match``) and an ``Http404`` raised by a page both get ``handler404``
(``portal.api.not_found``: the API's JSON error under /api/, the 404 page elsewhere). With DEBUG off Django does
this already, and the middleware does nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import Resolver404


def _active() -> bool:
    return bool(settings.DEBUG) and not getattr(settings, "DEBUG_404", False)


def _page(request: HttpRequest, exception: Exception) -> HttpResponse:
    from .api import not_found

    response = not_found(request, exception)
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response = response.render()
    return response


class NotFoundPageMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code == 404 and _active() and getattr(request, "resolver_match", None) is None:
            return _page(request, Resolver404({"path": request.path}))  # no route: Django's debug page otherwise
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        if isinstance(exception, Http404) and _active():
            return _page(request, exception)
        return None

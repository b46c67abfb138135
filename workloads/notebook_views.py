"""The notebook proxy (``/notebooks/<id>/<path>``) and the ingress's login check (``notebook_auth``): which paths may
be forwarded is decided by ``portal/urlpaths.py`` (docs/security.md), who may open a notebook by ``workloads.policy``."""

from __future__ import annotations

import re

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt

from . import kinds, selectors, services
from .models import WorkloadRequest
from .states import FINAL
from .views import S, _actor, _visible_request

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

# Request headers a notebook gets from the browser; everything else (the portal's own cookies and credentials
# included) stays here.
FORWARD_HEADERS = ("Accept", "Accept-Language", "Content-Type", "X-XSRFToken", "X-Requested-With", "If-None-Match",
                   "If-Modified-Since", "User-Agent")

NOTEBOOK_PATH = re.compile(r"^/notebooks/(\d+)(/|$)")


def _notebook_cookies(request: HttpRequest) -> str:
    """The browser's cookies minus the portal's own (the session must never reach a notebook)."""
    from django.conf import settings

    own = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, settings.LANGUAGE_COOKIE_NAME}
    return "; ".join(f"{k}={v}" for k, v in request.COOKIES.items() if k not in own)


def _same_origin(request: HttpRequest, host: str | None = None, scheme: str | None = None) -> bool:
    """Unsafe methods must come from the portal's own pages: the notebook trusts its token and skips its own
    XSRF check, so a cross-site form must not get through the portal with the user's session."""
    from urllib.parse import urlsplit

    host = host or request.get_host()
    origin = request.headers.get("Origin") or ""
    if origin and origin != "null":
        parts = urlsplit(origin)
        return parts.netloc == host and (scheme is None or parts.scheme == scheme)
    if origin == "null":
        return False
    referer = request.headers.get("Referer") or ""
    if referer:
        return urlsplit(referer).netloc == host
    return request.headers.get("Sec-Fetch-Site", "same-origin") in ("same-origin", "none")


def _notebook_page(request: HttpRequest, req: WorkloadRequest | None, status: int, title: str, text: str) -> HttpResponse:
    response = render(request, "workloads/notebook_unavailable.html",
                      {"req": req, "title": title, "text": text}, status=status)
    response["Cache-Control"] = "no-store"
    return response


def _notebook_upstream_path(req: WorkloadRequest, rest: str) -> str:
    from .manifests import notebook_path

    if str((req.parameters or {}).get("ide") or "jupyterlab") == "vscode":
        return rest  # code-server serves at its root behind a prefix-stripping proxy
    return notebook_path(req.pk).lstrip("/") + rest


def _unproxied(body: bytes, prefix: str) -> bytes:
    """Undo the API server's service-proxy link rewriting (it prefixes absolute links in HTML with its own path)."""
    return body.replace(prefix.encode(), b"/") if prefix.encode() in body else body


def _notebook_path_refusal(request: HttpRequest, rest: str) -> str | None:
    """Why the path after ``/notebooks/<id>/`` may not be forwarded (``portal.urlpaths.refusal``): checked as the
    server decoded it and, where the server keeps it (gunicorn's ``RAW_URI``, ``REQUEST_URI``), as it was sent."""
    from portal.urlpaths import refusal

    raw = request.META.get("RAW_URI") or request.META.get("REQUEST_URI") or ""
    return refusal(rest, decoded=True) or (refusal(raw.split("?", 1)[0], decoded=False) if raw else None)


@csrf_exempt
def notebook_proxy(request: HttpRequest, pk: int, rest: str = "") -> HttpResponse:
    """``/notebooks/<id>/...``: the demo's way into a notebook, through the Kubernetes API's service proxy.

    Each request is authorised here (``selectors.notebook_may_open``: a 404 for requests the user cannot see, a 403
    for someone else's notebook), counts as activity for idle culling, and reaches the notebook with its token added
    on the way (never in the browser's URL). Plain HTTP only: the development server cannot carry WebSockets;
    production routes ``/notebooks/`` through an ingress that asks ``notebook_auth`` (docs/notebooks.md)."""
    from portal.kube import ClusterError, kube_for, service_proxy
    from portal.urlpaths import PathRefused

    from .materialize import notebook_token

    if not request.user.is_authenticated:
        if request.method in SAFE_METHODS:
            from django.contrib.auth.views import redirect_to_login

            return redirect_to_login(request.get_full_path())
        return HttpResponse("Sign in to the portal first.", status=401, content_type="text/plain; charset=utf-8")
    actor = _actor(request)
    req = _visible_request(actor, pk)
    if not kinds.get(req.template.kind).proxied:
        raise Http404("No such notebook.")
    if not selectors.notebook_may_open(actor=actor, request=req):
        return _notebook_page(request, req, 403, "Not your notebook",
                              "Only the person who requested this notebook can open it"
                              + (", and the project's approvers." if req.project.notebooks_open_to_approvers else "."))
    if req.state != S.RUNNING:
        if req.state in FINAL:
            return _notebook_page(request, req, 503, "This notebook is stopped",
                                  f"Notebook {req.name} is {req.get_state_display().lower()}"
                                  + (f": {req.state_reason}" if req.state_reason else ".")
                                  + (" Its home volume is kept: restart it from the request page." if req.state == S.STOPPED else ""))
        return _notebook_page(request, req, 503, "This notebook is not running yet",
                              f"Notebook {req.name} is {req.get_state_display().lower()}. This page works once it runs.")
    if request.method not in SAFE_METHODS and not _same_origin(request):
        return HttpResponse("Cross-site requests to a notebook are refused.", status=403,
                            content_type="text/plain; charset=utf-8")
    why = _notebook_path_refusal(request, rest)
    if why:
        return HttpResponse(f"This path is refused: it has {why}.", status=400, content_type="text/plain; charset=utf-8")
    services.notebook_activity_record(request_id=req.pk)

    headers = {name: request.headers[name] for name in FORWARD_HEADERS if name in request.headers}
    cookies = _notebook_cookies(request)
    if cookies:
        headers["Cookie"] = cookies
    # The API server authenticates with Authorization and removes it before proxying: the token goes in the query.
    query = [(k, v) for k, values in request.GET.lists() if k != "token" for v in values]
    query.append(("token", notebook_token(req)))
    port = "http"
    try:
        answer = service_proxy(kube_for(req.cluster), req.project.namespace, req.k8s_name, port,
                               _notebook_upstream_path(req, rest), method=request.method or "GET", query=query,
                               headers=headers, body=request.body or None)
    except PathRefused as exc:  # never reached after _notebook_path_refusal; the last guard before the cluster
        return HttpResponse(f"This path is refused: {exc}", status=400, content_type="text/plain; charset=utf-8")
    except ClusterError as exc:
        return _notebook_page(request, req, 502, "The cluster did not answer", f"Try again in a moment. ({exc})")
    if answer.status in (404, 503) and "json" in answer.header("Content-Type"):
        # The API server's own answer (not the notebook's): no Service, or no ready pod behind it.
        import json

        try:
            status_body = json.loads(answer.body)
        except ValueError:
            status_body = {}
        if isinstance(status_body, dict) and status_body.get("kind") == "Status":
            return _notebook_page(request, req, 503, "The notebook is not reachable right now",
                                  "Its pod is not ready (starting, restarting or moving). This page works again once "
                                  f"it is. The cluster says: {status_body.get('message', '')}")
    prefix = f"/api/v1/namespaces/{req.project.namespace}/services/{req.k8s_name}:{port}/proxy/"
    body = answer.body
    if "html" in answer.header("Content-Type"):
        body = _unproxied(body, prefix)
    response = HttpResponse(body, status=answer.status)
    for name, value in answer.headers:
        lower = name.lower()
        if lower == "set-cookie":
            from http.cookies import SimpleCookie

            jar: SimpleCookie = SimpleCookie()
            jar.load(value)
            for key, morsel in jar.items():
                response.cookies[key] = morsel
        elif lower == "location":
            response["Location"] = value.replace(prefix, "/")
        elif lower not in ("date", "server", "cache-control", "audit-id", "x-kubernetes-pf-flowschema-uid",
                           "x-kubernetes-pf-prioritylevel-uid"):
            response[name] = value
    response["Cache-Control"] = answer.header("Cache-Control") or "private, no-cache"
    return response


@csrf_exempt
def notebook_auth(request: HttpRequest) -> HttpResponse:
    """``/notebooks/auth/``: the ingress asks before every request to ``/notebooks/<id>/...`` (nginx
    ``auth_request``, ingress-nginx ``auth-url``, Traefik ``forwardAuth``, Envoy ``ext_authz``).

    The original path comes in ``X-Original-URI`` (nginx) or ``X-Forwarded-Uri`` (Traefik), the session in the
    browser's cookie. 200 (with ``Authorization: token ...`` for the notebook and ``X-Auth-Request-User``) when the
    user may open that notebook, 401 when nobody is signed in, 403 otherwise (also for notebooks the user cannot see:
    an auth check answers nothing else). An unsafe method (``X-Original-Method``/``X-Forwarded-Method``) must come
    from the same origin."""
    from .materialize import notebook_token

    def deny(status: int, why: str) -> HttpResponse:
        response = HttpResponse(why, status=status, content_type="text/plain; charset=utf-8")
        response["Cache-Control"] = "no-store"
        return response

    from portal.urlpaths import refusal

    uri = request.headers.get("X-Original-URI") or request.headers.get("X-Forwarded-Uri") or ""
    if not request.user.is_authenticated:
        return deny(401, "Sign in to the portal first.")
    path = uri.split("?", 1)[0].split("#", 1)[0]
    why = refusal(path, decoded=False)
    if why:  # /notebooks/2/../390/lab is not notebook 2's, whatever the proxy behind would make of it
        return deny(403, f"This path is refused: it has {why}.")
    match = NOTEBOOK_PATH.match(path)
    if not match:
        return deny(403, "Not a notebook path.")
    actor = _actor(request)
    req = selectors.requests_for(actor=actor).filter(pk=int(match.group(1))).first()
    if req is None or not selectors.notebook_may_open(actor=actor, request=req):
        return deny(403, "You may not open this notebook.")
    method = (request.headers.get("X-Original-Method") or request.headers.get("X-Forwarded-Method") or "GET").upper()
    from urllib.parse import urlsplit

    original = urlsplit(request.headers.get("X-Original-URL") or "")  # ingress-nginx: scheme://host/path
    host = request.headers.get("X-Forwarded-Host") or original.netloc or None
    scheme = request.headers.get("X-Forwarded-Proto") or original.scheme or None
    if method not in SAFE_METHODS and not _same_origin(request, host=host, scheme=scheme):
        return deny(403, "Cross-site requests to a notebook are refused.")
    services.notebook_activity_record(request_id=req.pk)
    response = HttpResponse(b"", status=200, content_type="text/plain")
    response["Authorization"] = f"token {notebook_token(req)}"
    response["X-Auth-Request-User"] = request.user.get_username()
    response["Cache-Control"] = "no-store"
    return response

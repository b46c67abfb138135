"""An inference service's address, its API keys and its size over time (``workloads.endpoints``; docs/inference.md).

- ``/inference/<id>/v1/...``: the portal's own proxy to the service's model server (the demo's route), through the
  Kubernetes API's service proxy. Only ``Authorization: Bearer <key>`` with a live key of *that* service gets through
  (401 otherwise, the same answer for a wrong, a revoked or another service's key, and for a service that does not
  exist); only the model paths (``endpoints.model_path``) are forwarded, never anything else of the Kubernetes API;
  no header but ``Content-Type``/``Accept`` and no query goes on; each key is rate limited (429).
- ``/inference/auth/<id>/``: the same checks for an ingress that asks before each request (forward auth:
  ingress-nginx ``auth-url``, Traefik ``forwardAuth``), on ``X-Original-URI`` as sent; ``/inference/auth/<id>/<path>``
  for a Gateway API HTTPRoute's ``ExternalAuth`` filter, which appends the client's path.
- ``/requests/<id>/endpoint/``: the page: the address, the keys (made and revoked by the requester and the project's
  approvers, each shown once), and the replica count over time.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from portal.exceptions import NotAllowed, PortalError
from tenants.ui import page

from . import endpoints, kinds, policy
from .kinds.inference import replica_bounds, route_host
from .models import RequestState, WorkloadRequest
from .views import _actor, _visible_request

# What a client's request may carry to the model server; its Authorization (the service's key) stays here.
FORWARD_HEADERS = ("Content-Type", "Accept")
# Each model path and the one method it answers.
METHODS = {"v1/models": "GET", "v1/completions": "POST", "v1/chat/completions": "POST", "v1/embeddings": "POST"}
MAX_BODY = 8 * 1024 * 1024


def _json(status: int, message: str, kind: str, **headers: str) -> HttpResponse:
    """An error in the OpenAI API's shape, which the clients of the model server already read."""
    response = HttpResponse(json.dumps({"error": {"message": message, "type": kind}}), status=status,
                            content_type="application/json")
    response["Cache-Control"] = "no-store"
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _unauthorised() -> HttpResponse:
    return _json(401, "A valid API key of this service is required (Authorization: Bearer <key>).",
                 "invalid_api_key", WWW_Authenticate='Bearer realm="inference"')


def _service(pk: int) -> WorkloadRequest | None:
    return WorkloadRequest.objects.select_related("template", "project", "cluster").filter(pk=pk).first()


@csrf_exempt  # no cookie is read: the key in the Authorization header is the only credential
def inference_proxy(request: HttpRequest, pk: int, rest: str = "") -> HttpResponse:
    from portal.kube import ClusterError, kube_for, service_proxy
    from portal.urlpaths import PathRefused

    raw = (request.META.get("RAW_URI") or request.META.get("REQUEST_URI") or "").split("?", 1)[0]
    raw_rest = raw.split(f"/inference/{pk}/", 1)[1] if f"/inference/{pk}/" in raw else ""
    path, why = endpoints.model_path(rest, decoded=True, raw=raw_rest)
    refused = why if why.startswith("it has") else ""
    if refused:
        return _json(400, f"This path is refused: {refused}.", "invalid_request_error")
    key = endpoints.key_check(pk, endpoints.presented_key(request.headers.get("Authorization", "")))
    if key is None:
        return _unauthorised()
    req = key.request if key.request_id == pk else _service(pk)
    if req is None or not endpoints.serves(req):
        return _unauthorised()
    if path is None:
        return _json(404, f"Not a model path: {why}.", "invalid_request_error")
    if request.method != METHODS[path]:
        return _json(405, f"/{path} answers {METHODS[path]} only.", "invalid_request_error", Allow=METHODS[path])
    wait = endpoints.key_throttled(request, key)
    if wait is not None:
        return _json(429, "Too many requests with this key; slow down.", "rate_limit_exceeded",
                     Retry_After=str(max(1, round(wait))))
    if req.state != RequestState.RUNNING:
        return _json(503, f"The service is {req.get_state_display().lower()}, not running.", "service_unavailable")
    if len(request.body or b"") > MAX_BODY:
        return _json(413, "The request body is too large.", "invalid_request_error")
    headers = {name: request.headers[name] for name in FORWARD_HEADERS if name in request.headers}
    try:
        answer = service_proxy(kube_for(req.cluster), req.project.namespace, req.k8s_name, "http", path,
                               method=request.method or "GET", headers=headers, body=request.body or None)
    except PathRefused as exc:  # never reached after model_path; the last guard before the cluster
        return _json(400, f"This path is refused: {exc}", "invalid_request_error")
    except ClusterError as exc:
        return _json(502, f"The cluster did not answer; try again in a moment. ({exc})", "service_unavailable")
    if answer.status in (404, 503) and "json" in answer.header("Content-Type"):
        try:
            body = json.loads(answer.body)
        except ValueError:
            body = {}
        if isinstance(body, dict) and body.get("kind") == "Status":  # the API server's own answer: no ready replica
            return _json(503, "No replica of the service is ready right now; try again in a moment.",
                         "service_unavailable", Retry_After="5")
    response = HttpResponse(answer.body, status=answer.status,
                            content_type=answer.header("Content-Type") or "application/json")
    response["Cache-Control"] = "no-store"
    return response


@csrf_exempt
def inference_auth(request: HttpRequest, pk: int, rest: str | None = None) -> HttpResponse:
    """The route's forward-auth check: 200 when the request in ``X-Original-URI`` (``X-Forwarded-Uri``) is a model
    path and carries a live key of service ``pk``; 400 for a refused path, 401 without a valid key, 429 over the
    key's rate. Answers nothing about whether the service exists. A Gateway API ``ExternalAuth`` filter sends the
    client's path after the check's own instead (``/inference/auth/<id>/v1/completions``): ``rest``, checked as
    decoded and as sent."""
    if rest is not None:
        raw = (request.META.get("RAW_URI") or request.META.get("REQUEST_URI") or "").split("?", 1)[0]
        raw_rest = raw.split(f"/inference/auth/{pk}/", 1)[1] if f"/inference/auth/{pk}/" in raw else ""
        path, why = endpoints.model_path(rest, decoded=True, raw=raw_rest)
    else:
        uri = request.headers.get("X-Original-URI") or request.headers.get("X-Forwarded-Uri") or ""
        path, why = endpoints.model_path(uri.split("?", 1)[0].split("#", 1)[0], decoded=False)
    if why.startswith("it has"):
        return _json(400, f"This path is refused: {why}.", "invalid_request_error")
    key = endpoints.key_check(pk, endpoints.presented_key(request.headers.get("Authorization", "")))
    if key is None or not endpoints.serves(key.request):
        return _unauthorised()
    if path is None:
        return _json(404, f"Not a model path: {why}.", "invalid_request_error")
    wait = endpoints.key_throttled(request, key)
    if wait is not None:
        return _json(429, "Too many requests with this key; slow down.", "rate_limit_exceeded",
                     Retry_After=str(max(1, round(wait))))
    response = HttpResponse(b"", status=200, content_type="text/plain")
    response["X-Auth-Request-User"] = f"key:{key.prefix}"
    response["Cache-Control"] = "no-store"
    return response


# --------------------------------------------------------------------------------------------------------- the page
def replica_chart(series: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A line chart (static/js/charts.js) of the recorded replica counts; the same numbers are in a table."""
    if not series:
        return None
    return {"type": "line", "title": "Replicas over time (as the status follower saw them)", "unit": "replicas",
            "labels": [row["at"].strftime("%Y-%m-%d %H:%M:%S") for row in series], "stacked": False,
            "datasets": [{"label": "Replicas", "data": [row["replicas"] for row in series], "color": "#2563eb"},
                         {"label": "Ready", "data": [row["ready"] for row in series], "color": "#059669"}]}


def _endpoint_request(request: HttpRequest, pk: int) -> tuple[Any, WorkloadRequest]:
    actor = _actor(request)
    req = _visible_request(actor, pk)
    if not endpoints.serves(req):
        raise Http404("Only inference services have an endpoint.")
    if not policy.may_manage_inference_keys(actor, req):
        raise PermissionDenied("Only the requester and the project's approvers see this service's endpoint and keys.")
    return actor, req


def addresses(request: HttpRequest, req: WorkloadRequest) -> dict[str, str]:
    proxy = request.build_absolute_uri(reverse("inference-proxy", args=[req.pk, "v1/models"]).removesuffix("v1/models"))
    out = {"proxy": proxy}
    domain = getattr(settings, "PORTAL_INFERENCE_DOMAIN", "")
    if domain:
        out["route"] = f"https://{route_host(kinds.target(req), domain)}/"
    return out


def model_name(req: WorkloadRequest) -> str:
    """The model as vLLM names it for clients (``--model`` without a scheme: ``hf://org/model`` -> ``org/model``)."""
    uri = str((req.parameters or {}).get("model_uri") or "")
    return uri.split("://", 1)[1] if "://" in uri else uri


NEW_KEY_SESSION_KEY = "workloads:new-inference-key"


def _new_key_flash(request: HttpRequest, req: WorkloadRequest) -> dict[str, Any] | None:
    """The key just made and its secret, once: taken out of the session as the page shows them (the POST that made
    it redirects here, so a reload neither re-sends the form nor shows the secret again)."""
    flash = request.session.get(NEW_KEY_SESSION_KEY)
    if not isinstance(flash, dict) or flash.get("request") != req.pk:
        return None
    del request.session[NEW_KEY_SESSION_KEY]
    key = next((k for k in endpoints.keys_of(req) if k.pk == flash.get("id")), None)
    return {"key": key, "secret": str(flash.get("secret") or "")} if key is not None else None


@login_required
def inference_endpoint(request: HttpRequest, pk: int, *, new_key: Any = None, status: int = 200,
                       error: str = "") -> HttpResponse:
    actor, req = _endpoint_request(request, pk)
    new_key = new_key or _new_key_flash(request, req)
    series = endpoints.replica_series(req)
    low, top = replica_bounds(req)
    response = page(request, "workloads/inference_endpoint.html", {
        "req": req, "keys": endpoints.keys_of(req), "new_key": new_key, "error": error, "series": series,
        "chart": replica_chart(series), "addresses": addresses(request, req), "min_replicas": low, "max_replicas": top,
        "model": model_name(req),
    }, status=status)
    if new_key:
        response["Cache-Control"] = "no-store"  # the key is on this page once
    return response


@login_required
@require_POST
def inference_key_create(request: HttpRequest, pk: int) -> HttpResponse:
    actor, req = _endpoint_request(request, pk)
    try:
        made = endpoints.key_create(actor=actor, request=req, name=request.POST.get("name", ""))
    except NotAllowed as exc:
        raise PermissionDenied(exc.message) from exc
    except PortalError as exc:
        return inference_endpoint(request, pk, status=400, error=exc.message)
    request.session[NEW_KEY_SESSION_KEY] = {"request": req.pk, "id": made.key.pk, "secret": made.secret}
    return redirect("inference-endpoint", pk=pk)  # the page shows the secret once (_new_key_flash)


@login_required
@require_POST
def inference_key_revoke(request: HttpRequest, pk: int, key_id: int) -> HttpResponse:
    actor, req = _endpoint_request(request, pk)
    try:
        key = endpoints.key_revoke(actor=actor, request=req, key_id=key_id)
    except NotAllowed as exc:
        raise PermissionDenied(exc.message) from exc
    except PortalError as exc:
        raise Http404(exc.message) from exc
    messages.success(request, f"Key {key.prefix}… ({key.name}) is revoked: it no longer opens the service.")
    return redirect("inference-endpoint", pk=pk)

"""Inference endpoints: the API keys of a service, the paths a client may call, the replica history (docs/inference.md).

- **Keys.** ``key_create`` makes a random key (``gpk-`` + 43 URL-safe characters), keeps only its SHA-256 and hands the
  key back once; ``key_revoke`` marks it revoked. Both are allowed to the requester and the project's approvers
  (``policy.may_manage_inference_keys``) and audited (``inference_key.create`` / ``inference_key.revoke``).
  ``key_check`` answers which live key of *that* service a presented key is: a revoked key, another service's key or
  anything else is None (the proxy answers 401).
- **Paths.** ``model_path`` is the one rule both the portal's proxy and the route's forward-auth check apply: the path
  passes ``portal.urlpaths.refusal`` (no dot segment, no encoded slash, nothing decoded twice, ...) and is exactly one
  of the model server's OpenAI-compatible paths (``kinds.inference.MODEL_PATHS``); nothing else is forwarded, least of
  all anything of the Kubernetes API.
- **Rate.** ``KeyRateThrottle``: ``INFERENCE_RATE_KEY`` calls per key (portal/throttles.py's sliding window).
- **Replicas.** ``replicas_observe`` (called by the status follower) keeps a ``ReplicaSample`` each time a service's
  Deployment changes size or readiness; ``replica_series`` reads them for the request page's chart.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.exceptions import Invalid
from portal.throttles import _SettingsRateThrottle
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.guards import require

from . import kinds, policy
from .kinds.inference import MODEL_PATHS
from .models import InferenceKey, ReplicaSample, WorkloadRequest

KEY_PREFIX = "gpk-"
SHOWN_CHARS = 12  # the key's first characters kept in the clear, to tell keys apart on the page
USED_EVERY = timedelta(minutes=1)  # last_used_at is written at most this often per key
SAMPLES_SHOWN = 500


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def serves(req: WorkloadRequest) -> bool:
    """Is ``req`` a kind that serves clients (and so has keys and an address)?"""
    return kinds.get(req.template.kind).serving


# ------------------------------------------------------------------------------------------------------------- keys
@dataclass(frozen=True)
class NewKey:
    key: InferenceKey
    secret: str  # shown once: only its digest is kept


def key_create(*, actor: Actor, request: WorkloadRequest, name: str) -> NewKey:
    require(policy.may_manage_inference_keys(actor, request), "Only the requester and the project's approvers manage "
            "this service's API keys.")
    if not serves(request):
        raise Invalid("Only inference services have API keys.", field="name")
    name = (name or "").strip()
    if not name:
        raise Invalid("Name the key (who or what uses it).", field="name")
    if len(name) > 100:
        raise Invalid("At most 100 characters.", field="name")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        key = InferenceKey.objects.create(request=request, name=name, prefix=secret[:SHOWN_CHARS], digest=digest(secret),
                                          created_by=actor.user)
        audit_record(actor=actor, action="inference_key.create", target=request, tenant=request.tenant,
                     project=request.project, after={"key": key.pk, "name": name, "prefix": key.prefix})
    return NewKey(key, secret)


def key_revoke(*, actor: Actor, request: WorkloadRequest, key_id: int) -> InferenceKey:
    require(policy.may_manage_inference_keys(actor, request), "Only the requester and the project's approvers manage "
            "this service's API keys.")
    with transaction.atomic():
        key = InferenceKey.objects.select_for_update().filter(request=request, pk=key_id).first()
        if key is None:
            raise Invalid("This service has no such key.", field="key")
        if key.revoked_at is None:
            key.revoked_at, key.revoked_by = timezone.now(), actor.user
            key.save(update_fields=["revoked_at", "revoked_by"])
            audit_record(actor=actor, action="inference_key.revoke", target=request, tenant=request.tenant,
                         project=request.project, before={"key": key.pk, "name": key.name, "prefix": key.prefix})
    return key


def keys_of(request: WorkloadRequest) -> list[InferenceKey]:
    """The service's keys, newest first, revoked ones included (for whoever ``may_manage_inference_keys``)."""
    return list(InferenceKey.objects.filter(request=request).select_related("created_by", "revoked_by"))


def presented_key(authorization: str) -> str:
    """The key in an ``Authorization: Bearer <key>`` header (OpenAI clients send it so), or ""."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def key_check(request_id: int, presented: str) -> InferenceKey | None:
    """The live key of service ``request_id`` that ``presented`` is, else None (no key, a wrong one, a revoked one,
    another service's). Marks it used (at most once a minute)."""
    if not presented.startswith(KEY_PREFIX) or len(presented) > 200:
        return None
    key = InferenceKey.objects.filter(digest=digest(presented)).first()
    if key is None or key.request_id != int(request_id) or key.revoked_at is not None:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at >= USED_EVERY:
        InferenceKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


class KeyRateThrottle(_SettingsRateThrottle):
    """Calls per API key (``INFERENCE_RATE_KEY``, e.g. ``600/min``; empty: no limit), counted in the shared cache."""

    scope = "endpoint_key"
    setting = "INFERENCE_RATE_KEY"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        key = getattr(request, "inference_key", None)
        return f"throttle_{self.scope}_key-{key.pk}" if key is not None else None


def key_throttled(http_request: Any, key: InferenceKey) -> float | None:
    """None when ``key`` may call now, else the seconds to wait (429 with Retry-After)."""
    throttle = KeyRateThrottle()
    http_request.inference_key = key
    if throttle.allow_request(http_request, None):
        return None
    return throttle.wait() or 1.0


# ------------------------------------------------------------------------------------------------------------ paths
def model_path(path: str, *, decoded: bool, raw: str = "") -> tuple[str | None, str]:
    """(the model server path to forward, why not): ``path`` is what follows the service's prefix (``v1/models``).
    ``decoded``: as a WSGI server hands it over (checked again as sent, ``raw``, when the server keeps it);
    otherwise as sent (an ingress's ``X-Original-URI``)."""
    from portal.urlpaths import refusal

    why = refusal(path, decoded=decoded) or (refusal(raw, decoded=False) if raw else None)
    if why:
        return None, f"it has {why}"
    bare = path.strip("/")
    if bare not in MODEL_PATHS:
        return None, "only the model server's " + ", ".join("/" + p for p in MODEL_PATHS) + " are served here"
    return bare, ""


# --------------------------------------------------------------------------------------------------------- replicas
def replicas_observe(seen: Iterable[tuple[WorkloadRequest, dict[str, Any] | None, dict[str, Any] | None]]) -> int:
    """The status follower's cycle: ``(request, deployment summary before, after)`` of the requests it saved; a
    sample for each serving request whose Deployment's size or readiness changed. Rows written."""
    now = timezone.now()
    rows = [ReplicaSample(request_id=req.pk, at=now, replicas=int(after.get("replicas") or 0),
                          ready=int(after.get("ready") or 0))
            for req, before, after in seen
            if after is not None and serves(req) and (before or {}) != after]
    if rows:
        ReplicaSample.objects.bulk_create(rows)
    return len(rows)


def replica_series(request: WorkloadRequest) -> list[dict[str, Any]]:
    """The service's recorded sizes, oldest first (the last ``SAMPLES_SHOWN``): ``{"at", "replicas", "ready"}``."""
    rows = list(ReplicaSample.objects.filter(request=request).order_by("-at", "-id")
                .values("at", "replicas", "ready")[:SAMPLES_SHOWN])
    rows.reverse()
    return rows

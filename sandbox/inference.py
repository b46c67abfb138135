"""Model servers and their autoscaling in the sandbox (docs/inference.md).

No model runs behind a sandbox Service. A ready pod whose main container has a ``MODEL_URI`` environment variable (the
portal's inference kind sets it) answers through the API server's service proxy as an OpenAI-compatible server
(vLLM's) would:

* ``GET /v1/models``: one model, named after ``MODEL_URI`` (``hf://org/model`` → ``org/model``);
* ``POST /v1/completions`` and ``/v1/chat/completions``: a deterministic completion: the same model, prompt and
  ``max_tokens`` always give the same words (picked by SHA-256 from a small vocabulary), with token counts;
* ``GET /health``: 200; anything else: 404 in the OpenAI error shape; a body that is not a JSON object: 400.

Each answered request counts as load on the pod's Deployment (:class:`InferenceLoad`, in simulated time).
:class:`HorizontalPodAutoscalerController` is a minimal HorizontalPodAutoscaler (autoscaling/v2) for a Deployment
with one ``Pods`` metric of type ``AverageValue`` (the request rate, whatever its name):

    rate      = requests answered in the last 60 simulated seconds / 60
    desired   = ceil(rate / target average value), at least 1, clamped to [minReplicas, maxReplicas]
    scale up  at once; scale down only once ``behavior.scaleDown.stabilizationWindowSeconds`` (default 300)
              simulated seconds have passed since the last change.

It writes the Deployment's ``spec.replicas`` and the HPA's ``status`` (current/desired replicas, the current
metric, ``lastScaleTime``). An ``External`` metric of type ``AverageValue`` (what KEDA's HPAs carry) reads the same
request rate. Other metric types are ignored (the HPA keeps the Deployment between its bounds only).

**Optional APIs.** A profile's ``apis`` list makes the cluster serve what a real one serves only where it is
installed (:data:`OPTIONAL_APIS`, :func:`optional_types`):

* ``gateway-api``: ``gateway.networking.k8s.io/v1`` Gateway and HTTPRoute (stored and served; no gateway routes
  traffic in the sandbox);
* ``keda``: ``keda.sh/v1alpha1`` ScaledObject, and :class:`KedaController`: as KEDA's operator does, each
  ScaledObject gets an HPA ``keda-hpa-<name>`` (owned by it, so it goes with it) between ``minReplicaCount`` and
  ``maxReplicaCount`` on one External metric whose ``AverageValue`` is the first trigger's ``threshold``; the HPA
  controller above then scales on the request rate.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import deque
from datetime import datetime, timedelta

from .clock import format_time, parse_time
from .registry import ResourceType

HPA = ("autoscaling/v2", "HorizontalPodAutoscaler")
DEPLOYMENT = ("apps/v1", "Deployment")
SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")
KEDA_HPA_PREFIX = "keda-hpa-"
KEDA_NAME_LABEL = "scaledobject.keda.sh/name"
WINDOW_SECONDS = 60.0
DEFAULT_SCALE_DOWN_WINDOW = 300.0
_VOCABULARY = ("the", "model", "answers", "with", "a", "sandbox", "token", "for", "each", "prompt", "GPU", "portal",
               "quietly", "and", "deterministic", "words", "in", "order", "of", "its", "hash")


def _open_crd(group: str, version: str, kind: str, plural: str, short: tuple[str, ...] = ()) -> ResourceType:
    """A namespaced custom kind with a status subresource whose schema keeps every field (the real CRDs are large;
    the sandbox only stores these objects and reads a few fields back)."""
    keep = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema = {"type": "object", "properties": {"spec": keep, "status": keep}}
    return ResourceType(group, version, kind, plural, kind.lower(), True, short, (), frozenset({"status"}), schema,
                        crd=True)


# The optional APIs a profile may ask for (``apis: [gateway-api, keda]``).
OPTIONAL_APIS: dict[str, tuple[ResourceType, ...]] = {
    "gateway-api": (_open_crd("gateway.networking.k8s.io", "v1", "Gateway", "gateways", ("gtw",)),
                    _open_crd("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")),
    "keda": (_open_crd("keda.sh", "v1alpha1", "ScaledObject", "scaledobjects", ("so",)),),
}


def optional_types(profile: dict | None) -> list[ResourceType]:
    """The kinds of the optional APIs ``profile`` asks for (its ``apis`` list); ValueError for an unknown one."""
    names = (profile or {}).get("apis") or []
    if not isinstance(names, list):
        raise ValueError("apis: a list of optional APIs (" + ", ".join(OPTIONAL_APIS) + ")")
    unknown = [n for n in names if n not in OPTIONAL_APIS]
    if unknown:
        raise ValueError(f"apis: unknown {unknown}; the sandbox serves " + ", ".join(OPTIONAL_APIS))
    return [t for name in names for t in OPTIONAL_APIS[name]]


def _quantity(text) -> float:
    s = str(text).strip()
    if s.endswith("m"):
        return float(s[:-1]) / 1000
    suffixes = {"k": 1e3, "M": 1e6, "G": 1e9}
    if s and s[-1] in suffixes:
        return float(s[:-1]) * suffixes[s[-1]]
    return float(s)


def _milli(value: float) -> str:
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


class InferenceLoad:
    """Requests answered per Deployment, by simulated time; thread-safe (the server's threads write it, the
    controllers read it)."""

    def __init__(self, clock):
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], deque[datetime]] = {}
        self.total: dict[tuple[str, str], int] = {}

    def record(self, namespace: str, deployment: str) -> None:
        with self._lock:
            key = (namespace, deployment)
            self._seen.setdefault(key, deque()).append(self.clock.now())
            self.total[key] = self.total.get(key, 0) + 1

    def rate(self, namespace: str, deployment: str, window: float = WINDOW_SECONDS) -> float:
        """Requests per second over the last ``window`` simulated seconds."""
        cutoff = self.clock.now() - timedelta(seconds=window)
        with self._lock:
            seen = self._seen.get((namespace, deployment))
            if not seen:
                return 0.0
            while seen and seen[0] < cutoff:
                seen.popleft()
            return len(seen) / window


def model_of(pod: dict) -> str | None:
    """The model a pod serves (its main container's ``MODEL_URI``), or None: not a model server."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "MODEL_URI" and env.get("value"):
                uri = str(env["value"])
                return uri.split("://", 1)[1] if "://" in uri else uri
    return None


def owner_deployment(pod: dict) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Deployment":
            return str(ref.get("name"))
    return None


def _error(code: int, message: str, kind: str = "invalid_request_error") -> tuple[int, dict]:
    return code, {"error": {"message": message, "type": kind, "code": code}}


def _words(seed: str, count: int) -> list[str]:
    out: list[str] = []
    digest = b""
    while len(out) < count:
        digest = hashlib.sha256(digest + seed.encode()).digest()
        out.extend(_VOCABULARY[b % len(_VOCABULARY)] for b in digest[: count - len(out)])
    return out


def answer(method: str, path: str, body: bytes, model: str, now: datetime) -> tuple[int, dict]:
    """What the OpenAI-compatible server answers ``method path`` with: (status, JSON body)."""
    path = "/" + path.strip("/")
    if path == "/health" and method in ("GET", "HEAD"):
        return 200, {"status": "ok"}
    if path == "/v1/models":
        if method != "GET":
            return _error(405, "Method not allowed.")
        return 200, {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "sandbox",
                                                  "root": model, "max_model_len": 4096}]}
    if path not in ("/v1/completions", "/v1/chat/completions"):
        return _error(404, f"Not found: {path}", "not_found_error")
    if method != "POST":
        return _error(405, "Method not allowed.")
    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return _error(400, "The body is not JSON.")
    if not isinstance(payload, dict):
        return _error(400, "The body must be a JSON object.")
    if payload.get("model") not in (None, model):
        return _error(404, f"The model `{payload.get('model')}` does not exist.", "not_found_error")
    try:
        max_tokens = max(1, min(256, int(payload.get("max_tokens") or 16)))
    except (TypeError, ValueError):
        return _error(400, "max_tokens must be an integer.")
    chat = path == "/v1/chat/completions"
    if chat:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages must be a non-empty list.")
        prompt = json.dumps(messages, sort_keys=True)
    else:
        prompt = payload.get("prompt")
        if not isinstance(prompt, str):
            return _error(400, "prompt must be a string.")
    words = _words(f"{model}\n{max_tokens}\n{prompt}", max_tokens)
    text = " " + " ".join(words)
    ident = hashlib.sha256(f"{model}\n{prompt}".encode()).hexdigest()[:24]
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": max_tokens,
             "total_tokens": len(prompt.split()) + max_tokens}
    created = int(now.timestamp())
    if chat:
        return 200, {"id": f"chatcmpl-{ident}", "object": "chat.completion", "created": created, "model": model,
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text.strip()},
                                  "finish_reason": "length"}], "usage": usage}
    return 200, {"id": f"cmpl-{ident}", "object": "text_completion", "created": created, "model": model,
                 "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}], "usage": usage}


class HorizontalPodAutoscalerController:
    """See the module's docstring for the rule."""

    name = "horizontal-pod-autoscaler"
    timed = True

    def __init__(self, ctx, load: InferenceLoad):
        self.ctx = ctx
        self.load = load

    def reconcile(self) -> None:
        ctx = self.ctx
        for hpa in ctx.list_items(HPA):
            try:
                self._sync(hpa)
            except Exception as exc:  # one broken HPA must not stop the others
                ctx._error("hpa-sync", HPA, hpa["metadata"]["name"], exc)

    def _sync(self, hpa: dict) -> None:
        ctx = self.ctx
        meta, spec = hpa["metadata"], hpa.get("spec") or {}
        ref = spec.get("scaleTargetRef") or {}
        if ref.get("kind") != "Deployment":
            return
        namespace = meta.get("namespace")
        deployment = ctx.get(DEPLOYMENT, ref.get("name", ""), namespace)
        if deployment is None or (deployment.get("metadata") or {}).get("deletionTimestamp"):
            return
        low, top = int(spec.get("minReplicas") or 1), int(spec.get("maxReplicas") or 1)
        current = int((deployment.get("spec") or {}).get("replicas") or 1)
        desired = min(max(current, low), top)
        metric_status = []
        for metric in spec.get("metrics") or []:
            kind = {"Pods": "pods", "External": "external"}.get(metric.get("type"))
            source = metric.get(kind) if kind else None
            target = (source or {}).get("target") or {}
            if not source or target.get("type") != "AverageValue" or not target.get("averageValue"):
                continue
            rate = self.load.rate(namespace, ref["name"])
            per_pod = _quantity(target["averageValue"])
            desired = min(max(1, math.ceil(rate / per_pod - 1e-9), low), top)
            metric_status.append({"type": metric["type"], kind: {"metric": dict(source.get("metric") or {}),
                                                               "current": {"averageValue": _milli(rate / max(current, 1))}}})
        status = dict(hpa.get("status") or {})
        last = parse_time(status.get("lastScaleTime"))
        window = float(((spec.get("behavior") or {}).get("scaleDown") or {}).get("stabilizationWindowSeconds",
                                                                                  DEFAULT_SCALE_DOWN_WINDOW))
        if desired < current and last is not None and (ctx.now() - last).total_seconds() < window:
            desired = current  # scale down waits for the stabilisation window
        new_status = {**status, "currentReplicas": current, "desiredReplicas": desired, "currentMetrics": metric_status}
        if desired != current:
            ctx.patch(DEPLOYMENT, ref["name"], namespace, {"spec": {"replicas": desired}})
            ctx.event(hpa, "Normal", "SuccessfulRescale", f"New size: {desired}; reason: pods metric above target"
                      if desired > current else f"New size: {desired}; reason: all metrics below target", self.name)
            new_status["lastScaleTime"] = format_time(ctx.now())
            new_status["currentReplicas"] = current
        ctx.write_status(hpa, new_status)


class KedaController:
    """KEDA's operator, for the sandbox: a ScaledObject gets its HPA ``keda-hpa-<name>`` (see the module's
    docstring); an HPA of ours whose ScaledObject is gone goes too. Nothing when the cluster does not serve
    ScaledObject (a profile without ``apis: [keda]``)."""

    name = "keda-operator"
    timed = True

    def __init__(self, ctx):
        self.ctx = ctx

    def _served(self) -> bool:
        try:
            self.ctx.store.registry.by_kind(*SCALED_OBJECT)
        except KeyError:
            return False
        return True

    def reconcile(self) -> None:
        if not self._served():
            return
        ctx = self.ctx
        wanted: set[tuple[str, str]] = set()
        for so in ctx.list_items(SCALED_OBJECT):
            meta = so["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            wanted.add((meta.get("namespace"), KEDA_HPA_PREFIX + meta["name"]))
            try:
                self._sync(so)
            except Exception as exc:  # one broken ScaledObject must not stop the others
                ctx._error("keda-sync", SCALED_OBJECT, meta["name"], exc)
        for hpa in ctx.list_items(HPA, label_selector=KEDA_NAME_LABEL):
            meta = hpa["metadata"]
            if (meta.get("namespace"), meta["name"]) not in wanted and not meta.get("deletionTimestamp"):
                ctx.delete(HPA, meta["name"], meta.get("namespace"))

    def _sync(self, so: dict) -> None:
        ctx = self.ctx
        meta, spec = so["metadata"], so.get("spec") or {}
        ref = spec.get("scaleTargetRef") or {}
        trigger = next(iter(spec.get("triggers") or []), {}) or {}
        threshold = str((trigger.get("metadata") or {}).get("threshold") or "1")
        behavior = ((spec.get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}).get("behavior")
        name = KEDA_HPA_PREFIX + meta["name"]
        hpa_spec = {
            "scaleTargetRef": {"apiVersion": ref.get("apiVersion") or "apps/v1", "kind": ref.get("kind") or "Deployment",
                               "name": ref.get("name", "")},
            "minReplicas": int(spec.get("minReplicaCount", 1) or 1),
            "maxReplicas": int(spec.get("maxReplicaCount", 100) or 100),
            "metrics": [{"type": "External", "external": {
                "metric": {"name": f"s0-{trigger.get('type') or 'metric'}",
                           "selector": {"matchLabels": {KEDA_NAME_LABEL: meta["name"]}}},
                "target": {"type": "AverageValue", "averageValue": _milli(_quantity(threshold))}}}],
        }
        if behavior:
            hpa_spec["behavior"] = behavior
        live = ctx.get(HPA, name, meta.get("namespace"))
        if live is None:
            ctx.create({"apiVersion": HPA[0], "kind": HPA[1], "metadata": {
                "name": name, "namespace": meta.get("namespace"),
                "labels": {KEDA_NAME_LABEL: meta["name"], "app.kubernetes.io/managed-by": "keda-operator"},
                "ownerReferences": [{"apiVersion": SCALED_OBJECT[0], "kind": SCALED_OBJECT[1], "name": meta["name"],
                                     "uid": meta.get("uid"), "controller": True, "blockOwnerDeletion": True}]},
                "spec": hpa_spec})
        elif {k: (live.get("spec") or {}).get(k) for k in hpa_spec} != hpa_spec:
            ctx.update({**live, "spec": {**(live.get("spec") or {}), **hpa_spec}})
        ready = {"type": "Ready", "status": "True", "reason": "ScaledObjectReady",
                 "message": "ScaledObject is defined correctly and is ready for scaling"}
        status = {"hpaName": name, "scaleTargetKind": f"{hpa_spec['scaleTargetRef']['apiVersion']}.Deployment",
                  "conditions": [ready]}
        if (so.get("status") or {}).get("hpaName") != name:
            ctx.write_status(so, status)

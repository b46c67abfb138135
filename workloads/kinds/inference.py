"""The inference kind: a model server behind a Service, with replicas and a readiness probe; it scales.

Objects: a Service and a Deployment (each pod is its own Kueue Workload); under an architecture with an online
pool (F) it is pinned to that pool and its ``<project>-online`` LocalQueue. The follower reads the Deployment:
running once a replica is ready. The Deployment rolls updates with ``maxUnavailable: 0`` (a new replica is ready
before an old one goes). With ``min_replicas`` below the approved replicas, a HorizontalPodAutoscaler (autoscaling/v2)
moves it between the two on the pods' request rate (:func:`render_autoscaler`; a KEDA ScaledObject where the cluster
runs KEDA, :func:`render_scaled_object`); with ``RenderOptions.inference_domain`` set, an Ingress gives it an address
under the portal's domain whose every request the portal checks first (:func:`render_route`, forward auth with the
service's API keys; an HTTPRoute where the cluster serves the Gateway API, :func:`render_http_route`;
docs/inference.md). It always runs in the online class (``priority_fixed``), and a minimum above the replicas is
refused (:func:`size_check`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import manifests as m
from ..manifests import Manifest, Target, main_container, metadata, pod_template, service
from .registry import BASE_ACTIONS, Kind, RenderOptions, TemplateDefaults, register

if TYPE_CHECKING:  # pragma: no cover
    from ..models import WorkloadRequest

INFERENCE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["model_uri"],
    "properties": {
        "model_uri": {
            "type": "string", "title": "Model", "minLength": 1, "maxLength": 500,
            "description": "Where the model comes from, e.g. hf://meta-llama/Llama-3.1-8B-Instruct or s3://bucket/model",
        },
        "port": {"type": "integer", "title": "Port", "minimum": 1, "maximum": 65535, "default": 8000},
        "readiness_path": {
            "type": "string", "title": "Readiness path", "pattern": "^/", "maxLength": 200, "default": "/health",
        },
        "min_replicas": {
            "type": "integer", "title": "Minimum replicas", "minimum": 1, "maximum": 64,
            "description": "Scale between this and the approved replicas on the request rate (empty: a fixed size).",
        },
        "target_requests_per_second": {
            "type": "number", "title": "Requests per second per replica", "exclusiveMinimum": 0, "maximum": 10000,
            "default": 5, "description": "The autoscaler adds a replica when the replicas average more than this.",
        },
    },
}

# The pods metric the autoscaler reads (a Prometheus adapter serves it from the model server's request counter; the
# sandbox computes it from the requests its service proxy answered): requests per second, averaged over the pods.
REQUEST_RATE_METRIC = "http_requests_per_second"
DEFAULT_TARGET_RPS = 5
# The OpenAI-compatible paths a client may call through the route or the portal's proxy: nothing else is forwarded.
MODEL_PATHS = ("v1/models", "v1/completions", "v1/chat/completions", "v1/embeddings")


# A template may bound the replicas (the autoscaler's maximum) with this keyword at the top of its parameters schema,
# e.g. ``"x-max-replicas": 4``; the minimum is bounded by the schema of ``min_replicas`` itself (its ``maximum``).
TEMPLATE_MAX_REPLICAS = "x-max-replicas"


def template_max_replicas(schema: dict[str, Any] | None) -> int | None:
    """The most replicas the template allows (``x-max-replicas``), or None when it says nothing."""
    value = (schema or {}).get(TEMPLATE_MAX_REPLICAS)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def size_check(schema: dict[str, Any], parameters: dict[str, Any], replicas: int) -> list[tuple[str, str]]:
    """What a submission's (or a scale's) size may not be: ``replicas`` (the autoscaler's maximum) above the
    template's ``x-max-replicas``, or ``min_replicas`` above ``replicas`` (a minimum above the maximum is refused,
    never taken for a fixed size). (field, message) pairs; empty when it is fine."""
    problems: list[tuple[str, str]] = []
    top = template_max_replicas(schema)
    if top is not None and replicas > top:
        problems.append(("replicas", f"At most {top} replicas for this template."))
    low = (parameters or {}).get("min_replicas")
    if isinstance(low, int) and not isinstance(low, bool) and low > replicas:
        problems.append(("parameters.min_replicas",
                         f"The minimum ({low}) cannot be above the replicas ({replicas}), the autoscaler's maximum."))
    return problems


def replica_bounds(request: WorkloadRequest) -> tuple[int, int]:
    """(minimum, maximum) replicas: the maximum is the approved ``replicas`` (what the quota and the approval
    cover); the minimum is ``parameters.min_replicas`` (the template's schema bounds it). A submission or a scale
    with the minimum above the maximum is refused (:func:`size_check`); a row from before that rule is held to the
    maximum. Equal: a fixed size, no autoscaler."""
    top = max(1, int(request.replicas or 1))
    low = (request.parameters or {}).get("min_replicas")
    return (min(top, max(1, int(low))) if low not in (None, "") else top), top


def autoscaled(request: WorkloadRequest) -> bool:
    low, top = replica_bounds(request)
    return low < top


def _milli(value: float) -> str:
    """A quantity for ``averageValue``: ``5`` or ``250m``."""
    milli = max(1, round(float(value) * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def render_autoscaler(request: WorkloadRequest, t: Target) -> Manifest:
    """The HorizontalPodAutoscaler between :func:`replica_bounds`, on :data:`REQUEST_RATE_METRIC` per pod."""
    low, top = replica_bounds(request)
    target = (request.parameters or {}).get("target_requests_per_second") or DEFAULT_TARGET_RPS
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(t),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": t.name},
            "minReplicas": low,
            "maxReplicas": top,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": REQUEST_RATE_METRIC},
                "target": {"type": "AverageValue", "averageValue": _milli(float(target))},
            }}],
            # Up at once, down after five quiet minutes (a model server is slow to start again).
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def route_host(t: Target, domain: str) -> str:
    """The service's host name under the portal's inference domain: ``req-<id>-<namespace>.<domain>``."""
    return f"{t.name}-{t.namespace}.{domain.strip('.').lower()}"


def render_route(t: Target, *, domain: str, auth_url: str, ingress_class: str = "") -> Manifest:
    """An Ingress (networking.k8s.io/v1) for the model paths only, at :func:`route_host`, whose every request the
    ingress controller first asks ``auth_url`` about (ingress-nginx's ``auth-url``: the portal's
    ``/inference/auth/<id>/``, which checks the API key and the path); TLS from the ``<host>-tls`` Secret."""
    host = route_host(t, domain)
    annotations = {
        "nginx.ingress.kubernetes.io/auth-url": auth_url,
        "nginx.ingress.kubernetes.io/auth-method": "GET",
        "nginx.ingress.kubernetes.io/proxy-body-size": "8m",
    }
    spec: dict[str, Any] = {
        "tls": [{"hosts": [host], "secretName": f"{t.name}-tls"}],
        "rules": [{"host": host, "http": {"paths": [
            {"path": "/" + path, "pathType": "Exact",
             "backend": {"service": {"name": t.name, "port": {"name": "http"}}}}
            for path in MODEL_PATHS
        ]}}],
    }
    if ingress_class:
        spec["ingressClassName"] = ingress_class
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": metadata(t, annotations=annotations),
            "spec": spec}


def render_http_route(t: Target, *, domain: str, gateway: str, auth_service: str = "") -> Manifest:
    """A Gateway API HTTPRoute (gateway.networking.k8s.io/v1), the Ingress's equivalent where the cluster serves
    the Gateway API: attached to ``gateway`` ("namespace/name", or a name in the service's namespace), at
    :func:`route_host`, the model paths only (``Exact``) to the service's Service (port 80). With ``auth_service``
    ("namespace/name:port", the portal's Service) every request is first checked by the portal, through the
    ``ExternalAuth`` filter: the gateway asks ``/inference/auth/<id>`` + the path it got (docs/inference.md)."""
    namespace, _, name = gateway.strip().rpartition("/")
    parent: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name}
    if namespace:
        parent["namespace"] = namespace
    rule: dict[str, Any] = {
        "matches": [{"path": {"type": "Exact", "value": "/" + path}} for path in MODEL_PATHS],
        "backendRefs": [{"name": t.name, "port": 80}],
    }
    if auth_service:
        where, _, port = auth_service.strip().rpartition(":")
        auth_namespace, _, auth_name = where.rpartition("/")
        backend: dict[str, Any] = {"name": auth_name, "port": int(port)}
        if auth_namespace:
            backend["namespace"] = auth_namespace
        rule["filters"] = [{"type": "ExternalAuth", "externalAuth": {
            "protocol": "HTTP", "backendRef": backend, "http": {"path": f"/inference/auth/{t.request_id}"}}}]
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": metadata(t),
            "spec": {"parentRefs": [parent], "hostnames": [route_host(t, domain)], "rules": [rule]}}


# The model server's request counter, as Prometheus scrapes it from each pod (vLLM's; a rate of it is the load).
REQUEST_COUNTER = "vllm:request_success_total"


def render_scaled_object(request: WorkloadRequest, t: Target, *, prometheus_url: str) -> Manifest:
    """A KEDA ScaledObject (keda.sh/v1alpha1), the HPA's equivalent where the cluster runs KEDA: between
    :func:`replica_bounds` on a Prometheus trigger, the service's request rate (``REQUEST_COUNTER`` over its pods)
    averaged per replica against ``target_requests_per_second``; KEDA makes and owns the HPA."""
    low, top = replica_bounds(request)
    target = (request.parameters or {}).get("target_requests_per_second") or DEFAULT_TARGET_RPS
    query = f'sum(rate({REQUEST_COUNTER}{{namespace="{t.namespace}",pod=~"{t.name}-.*"}}[1m]))'
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(t),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": t.name},
            "minReplicaCount": low,
            "maxReplicaCount": top,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}}},
            "triggers": [{"type": "prometheus", "metricType": "AverageValue", "metadata": {
                "serverAddress": prometheus_url, "query": query, "threshold": f"{float(target):g}"}}],
        },
    }


def render_inference(request: WorkloadRequest, t: Target, options: RenderOptions | None = None) -> list[Manifest]:
    params = request.parameters or {}
    port = int(params.get("port") or m.DEFAULT_INFERENCE_PORT)
    env = []
    if params.get("model_uri"):
        env.append({"name": "MODEL_URI", "value": str(params["model_uri"])})
    container = main_container(request, env=env, ports=[{"name": "http", "containerPort": port, "protocol": "TCP"}])
    container["readinessProbe"] = {
        "httpGet": {"path": str(params.get("readiness_path") or m.DEFAULT_READINESS_PATH), "port": port},
        "initialDelaySeconds": 5,
        "periodSeconds": 10,
    }
    spec: dict[str, Any] = {
        "replicas": int(request.replicas),
        "selector": {"matchLabels": m.selector_labels(t)},
        # Rolling updates of the model or image keep every ready replica until its successor is ready.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": pod_template(request, t, [container], restart_policy="Always"),
    }
    objects: list[Manifest] = [service(t, port=80, target_port="http")]
    if autoscaled(request):
        # The autoscaler owns the size: applying a replica count would undo its decisions at each apply.
        spec.pop("replicas")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(t, labels=m.kueue_labels(t)),
                  "spec": spec}
    objects.append(deployment)
    options = options or RenderOptions()
    if autoscaled(request):
        objects.append(render_scaled_object(request, t, prometheus_url=options.prometheus_url) if options.keda
                       else render_autoscaler(request, t))
    if options.inference_domain and options.gateway_api:
        objects.append(render_http_route(t, domain=options.inference_domain, gateway=options.gateway,
                                         auth_service=options.auth_service))
    elif options.inference_domain:
        objects.append(render_route(t, domain=options.inference_domain, auth_url=options.inference_auth_url(t.request_id),
                                    ingress_class=options.ingress_class))
    return objects


def _render(request: WorkloadRequest, t: Target, options: RenderOptions) -> list[Manifest]:
    return render_inference(request, t, options)


def _derive(objects: dict[str, dict[str, Any]], admitted: bool, running: int) -> tuple[str, str]:
    dep = objects.get("deployment") or {}
    if int(dep.get("ready") or 0) >= 1:
        ready, replicas = int(dep.get("ready") or 0), int(dep.get("replicas") or 0)
        return "running", f"{ready} of {replicas} {'replica' if replicas == 1 else 'replicas'} ready."
    return "queued", "No replica is ready yet."


KIND = register(Kind(
    name="inference",
    order=30,
    label="Inference service",
    render=_render,
    schema=INFERENCE_SCHEMA,
    defaults=TemplateDefaults(
        "inference", "Inference service", "A model server behind a Service, with replicas and a readiness probe.",
        default_gpus=1, max_gpus=8, max_duration_hours=720,
    ),
    default_priority="production",
    priority_fixed=True,  # the online class: never preempted by batch work (docs/inference.md)
    size_check=size_check,
    follows=("deployment",),
    derive=_derive,
    actions=BASE_ACTIONS | {"scale"},
    needs_admin_rule=True,
    serving=True,
    images=(("vLLM", "vllm/vllm-openai:v0.12.0", "OpenAI-compatible LLM server."),),
))

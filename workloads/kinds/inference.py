"""The inference kind: a model server behind a Service, with replicas and a readiness probe; it scales.

Objects: a Service and a Deployment (each pod is its own Kueue Workload); under an architecture with an online
pool (F) it is pinned to that pool and its ``<project>-online`` LocalQueue. The follower reads the Deployment:
running once a replica is ready.
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
    },
}


def render_inference(request: WorkloadRequest, t: Target) -> list[Manifest]:
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
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(t, labels=m.kueue_labels(t)),
        "spec": {
            "replicas": int(request.replicas),
            "selector": {"matchLabels": m.selector_labels(t)},
            "template": pod_template(request, t, [container], restart_policy="Always"),
        },
    }
    return [service(t, port=80, target_port="http"), deployment]


def _render(request: WorkloadRequest, t: Target, options: RenderOptions) -> list[Manifest]:
    return render_inference(request, t)


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
    follows=("deployment",),
    derive=_derive,
    actions=BASE_ACTIONS | {"scale"},
    needs_admin_rule=True,
    serving=True,
    images=(("vLLM", "vllm/vllm-openai:v0.12.0", "OpenAI-compatible LLM server."),),
))

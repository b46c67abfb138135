"""The default service catalogue: three templates, curated images and the global approval rules.

``seed_catalogue()`` is idempotent: run it on every deploy or demo start. It creates what is
missing and leaves what ops changed alone (it never overwrites an existing template version, image
or rule); templates without flavors get the first cluster's active GPU flavors.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from quotas.models import Cluster, Flavor

from .models import ApprovalRule, Image, ServiceTemplate, TemplateKind

NOTEBOOK_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "ide": {
            "type": "string", "title": "IDE", "enum": ["jupyterlab", "vscode"], "default": "jupyterlab",
            "description": "JupyterLab or VS Code in the browser.",
        },
        "home_size_gib": {
            "type": "integer", "title": "Home volume (GiB)", "minimum": 1, "maximum": 500, "default": 20,
            "description": "Persistent home directory; kept when the notebook stops.",
        },
    },
}

TRAINING_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["command"],
    "properties": {
        "command": {
            "type": "string", "title": "Command", "minLength": 1, "maxLength": 2000,
            "description": "What to run, e.g. python train.py",
        },
        "args": {
            "type": "array", "title": "Arguments", "items": {"type": "string", "maxLength": 1000}, "maxItems": 100,
            "default": [],
        },
        "env": {
            "type": "object", "title": "Environment", "additionalProperties": {"type": "string", "maxLength": 4000},
            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "default": {},
        },
        "data_volume": {
            "type": "string", "title": "Data volume", "maxLength": 253, "default": "",
            "description": "Name of an existing PersistentVolumeClaim mounted at /data (empty: none).",
        },
        "retries": {"type": "integer", "title": "Retries", "minimum": 0, "maximum": 10, "default": 0},
        "distributed": {
            "type": "boolean", "title": "Distributed (multi-node)", "default": False,
            "description": "Gang-scheduled PyTorch job across several workers.",
        },
        "workers": {"type": "integer", "title": "Workers", "minimum": 1, "maximum": 16, "default": 1},
    },
}

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


@dataclass(frozen=True)
class TemplateSpec:
    kind: str
    slug: str
    name: str
    description: str
    schema: dict
    default_gpus: int
    max_gpus: int
    max_duration_hours: int
    idle_timeout_minutes: int | None = None
    default_cpu: int = 4
    max_cpu: int = 64
    default_memory_gib: int = 32
    max_memory_gib: int = 512


TEMPLATES = [
    TemplateSpec(
        TemplateKind.NOTEBOOK, "notebook", "Notebook",
        "JupyterLab (or VS Code) with a persistent home directory; stopped after an idle hour.",
        NOTEBOOK_SCHEMA, default_gpus=1, max_gpus=2, max_duration_hours=12, idle_timeout_minutes=60,
        max_cpu=16, max_memory_gib=128,
    ),
    TemplateSpec(
        TemplateKind.TRAINING, "training", "Training job",
        "A batch training run: one node, or a gang-scheduled distributed PyTorch job.",
        TRAINING_SCHEMA, default_gpus=1, max_gpus=8, max_duration_hours=72,
    ),
    TemplateSpec(
        TemplateKind.INFERENCE, "inference", "Inference service",
        "A model server behind a Service, with replicas and a readiness probe.",
        INFERENCE_SCHEMA, default_gpus=1, max_gpus=8, max_duration_hours=720,
    ),
]

IMAGES = [
    ("PyTorch notebook", "jupyter/pytorch-notebook:2026.10", "Jupyter's PyTorch stack with CUDA.", [TemplateKind.NOTEBOOK]),
    ("NVIDIA PyTorch", "nvcr.io/nvidia/pytorch:26.10-py3", "NGC PyTorch container.", [TemplateKind.TRAINING, TemplateKind.NOTEBOOK]),
    ("vLLM", "vllm/vllm-openai:v0.12.0", "OpenAI-compatible LLM server.", [TemplateKind.INFERENCE]),
]

# Global rule: small, short requests go ahead on their own; inference always needs a project admin.
GLOBAL_RULE = {"auto_approve_max_gpus": 2, "auto_approve_max_hours": 8, "require_admin_for_inference": True}


def _gpu_flavors() -> list[Flavor]:
    cluster = Cluster.objects.order_by("pk").first()
    if cluster is None:
        return []
    return list(cluster.flavors.filter(active=True).exclude(kind=Flavor.Kind.CPU))


@transaction.atomic
def seed_catalogue() -> dict[str, int]:
    """Create the default templates, images and global rules that are missing. Returns counts created."""
    created = {"templates": 0, "images": 0, "rules": 0}
    flavors = _gpu_flavors()
    for spec in TEMPLATES:
        template, made = ServiceTemplate.objects.get_or_create(
            slug=spec.slug,
            version=1,
            defaults={
                "kind": spec.kind, "name": spec.name, "description": spec.description,
                "parameters_schema": spec.schema, "default_gpus": spec.default_gpus, "max_gpus": spec.max_gpus,
                "default_cpu": spec.default_cpu, "max_cpu": spec.max_cpu,
                "default_memory_gib": spec.default_memory_gib, "max_memory_gib": spec.max_memory_gib,
                "max_duration_hours": spec.max_duration_hours, "idle_timeout_minutes": spec.idle_timeout_minutes,
            },
        )
        created["templates"] += made
        if flavors and not template.allowed_flavors.exists():
            template.allowed_flavors.set(flavors)
    for name, reference, description, kinds in IMAGES:
        _, made = Image.objects.get_or_create(
            reference=reference, defaults={"name": name, "description": description, "kinds": [str(k) for k in kinds]}
        )
        created["images"] += made
    _, made = ApprovalRule.objects.get_or_create(project=None, template_slug="", defaults=GLOBAL_RULE)
    created["rules"] += made
    return created

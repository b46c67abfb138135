"""The notebook kind: JupyterLab or VS Code with a persistent home volume, one replica, culled when idle.

Objects: a Secret (the access token), a Service and a StatefulSet (one pod, the ``home`` claim template). Kueue
holds the StatefulSet back as one Workload. The follower reads the StatefulSet: running once Kueue admitted it and
its pod is ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import manifests as m
from ..manifests import Manifest, Target, main_container, metadata, pod_template, service
from .registry import Kind, RenderOptions, TemplateDefaults, register

if TYPE_CHECKING:  # pragma: no cover
    from ..models import WorkloadRequest

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


def notebook_command(ide: str, t: Target) -> list[str]:
    base_url = m.notebook_path(t.request_id)
    if ide == "vscode":
        return ["code-server", "--bind-addr", f"0.0.0.0:{m.NOTEBOOK_PORT}", "--auth", "password", m.NOTEBOOK_HOME]
    return [
        "jupyter", "lab", "--ip=0.0.0.0", f"--port={m.NOTEBOOK_PORT}", "--no-browser",
        f"--ServerApp.base_url={base_url}", "--IdentityProvider.token=$(NOTEBOOK_TOKEN)",
        f"--ServerApp.root_dir={m.NOTEBOOK_HOME}",
    ]



def render_notebook(request: WorkloadRequest, t: Target, *, token: str = "") -> list[Manifest]:
    params = request.parameters or {}
    ide = str(params.get("ide") or "jupyterlab")
    home_gib = int(params.get("home_size_gib") or m.DEFAULT_HOME_GIB)
    secret_name = f"{t.name}-token"
    token_env = {"name": "NOTEBOOK_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret_name, "key": "token"}}}
    # code-server reads its password from $PASSWORD.
    password_env = {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": secret_name, "key": "token"}}}
    container = main_container(
        request,
        command=notebook_command(ide, t),
        env=[token_env, password_env, {"name": "HOME", "value": m.NOTEBOOK_HOME}],
        ports=[{"name": "http", "containerPort": m.NOTEBOOK_PORT, "protocol": "TCP"}],
    )
    container["volumeMounts"] = [{"name": "home", "mountPath": m.NOTEBOOK_HOME}]
    container["readinessProbe"] = {"tcpSocket": {"port": m.NOTEBOOK_PORT}, "periodSeconds": 10}
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata(t, secret_name),
        "stringData": {"token": token},
    }
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(t, labels=m.kueue_labels(t)),
        "spec": {
            "replicas": 1,
            "serviceName": t.name,
            # Kueue runs a StatefulSet as one pod group and forces Parallel; say so rather than be overridden.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": m.selector_labels(t)},
            "template": pod_template(request, t, [container], restart_policy="Always"),
            "volumeClaimTemplates": [{
                "metadata": {"name": "home", "labels": m.owner_labels(t)},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": f"{home_gib}Gi"}}},
            }],
        },
    }
    return [secret, service(t, port=80, target_port="http"), statefulset]


def _render(request: WorkloadRequest, t: Target, options: RenderOptions) -> list[Manifest]:
    return render_notebook(request, t, token=options.notebook_token)


def _derive(objects: dict[str, dict[str, Any]], admitted: bool, running: int) -> tuple[str, str]:
    sts = objects.get("statefulset") or {}
    if admitted and (int(sts.get("ready") or 0) >= 1 or running):
        return "running", "Admitted; the notebook is running."
    return "queued", "Waiting for admission."


KIND = register(Kind(
    name="notebook",
    order=10,
    label="Notebook",
    render=_render,
    schema=NOTEBOOK_SCHEMA,
    defaults=TemplateDefaults(
        "notebook", "Notebook", "JupyterLab (or VS Code) with a persistent home directory; stopped after an idle hour.",
        default_gpus=1, max_gpus=2, max_duration_hours=12, idle_timeout_minutes=60, max_cpu=16, max_memory_gib=128,
    ),
    default_priority="interactive",
    follows=("statefulset",),
    derive=_derive,
    replicas="one",
    pod_group=m.NOTEBOOK_GROUP,
    interactive=True,
    proxied=True,
    extra_volumes_gib=lambda params: int(params.get("home_size_gib") or m.DEFAULT_HOME_GIB),
    stop_note="the home volume stays",
    images=(
        ("PyTorch notebook", "jupyter/pytorch-notebook:2026.10", "Jupyter's PyTorch stack with CUDA."),
        ("NVIDIA PyTorch", "nvcr.io/nvidia/pytorch:26.10-py3", "NGC PyTorch container."),
    ),
))

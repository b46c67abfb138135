"""The batch-inference kind: a model run once over a dataset, as a batch/v1 Job; GPUs, not interactive, not scaled.

Objects: one batch/v1 Job (Kueue holds it back as one Workload, like a single-node training run), with the dataset
volume (a PersistentVolumeClaim, when named) mounted at ``/data``: the model reads ``/data/<input_file>`` and writes
``/data/<output_file>``. The default command is vLLM's offline batch runner (OpenAI batch format); a ``command``
replaces it. The follower reads the Job (the generic Job/Workload rule); billing meters it like training, from its
Workload's admission to its end. Everything about it is in this module: the other apps ask the registry's traits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import manifests as m
from ..manifests import Manifest, Target, main_container, metadata, pod_template
from .registry import Kind, RenderOptions, TemplateDefaults, register

if TYPE_CHECKING:  # pragma: no cover
    from ..models import WorkloadRequest

BATCH_INFERENCE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["model_uri"],
    "properties": {
        "model_uri": {
            "type": "string", "title": "Model", "minLength": 1, "maxLength": 500,
            "description": "The model to run, e.g. hf://meta-llama/Llama-3.1-8B-Instruct or s3://bucket/model",
        },
        "dataset_volume": {
            "type": "string", "title": "Dataset volume", "pattern": "^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            "maxLength": 63, "default": "",
            "description": "Name of a PersistentVolumeClaim with the inputs, mounted at /data (empty: none).",
        },
        "input_file": {"type": "string", "title": "Input file", "maxLength": 200, "default": "input.jsonl",
                       "pattern": "^[^/].*$", "description": "Under /data: one request per line (OpenAI batch format)."},
        "output_file": {"type": "string", "title": "Output file", "maxLength": 200, "default": "output.jsonl",
                        "pattern": "^[^/].*$", "description": "Under /data: where the results are written."},
        "command": {"type": "string", "title": "Command", "maxLength": 2000,
                    "description": "Replaces the default vLLM batch runner (empty: the default)."},
        "retries": {"type": "integer", "title": "Retries", "minimum": 0, "maximum": 10, "default": 0},
    },
}


def batch_command(params: dict[str, Any]) -> list[str]:
    """vLLM's offline batch runner over ``/data/<input_file>`` into ``/data/<output_file>``."""
    return ["python", "-m", "vllm.entrypoints.openai.run_batch", "--model", "$(MODEL_URI)",
            "-i", f"{m.DATA_MOUNT}/{params.get('input_file') or 'input.jsonl'}",
            "-o", f"{m.DATA_MOUNT}/{params.get('output_file') or 'output.jsonl'}"]


def render_batch_inference(request: WorkloadRequest, t: Target, *, job_ttl_seconds: int | None) -> list[Manifest]:
    params = request.parameters or {}
    container = main_container(request, command=batch_command(params),
                               env=[{"name": "MODEL_URI", "value": str(params.get("model_uri") or "")}])
    volumes = []
    if params.get("dataset_volume"):
        volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": str(params["dataset_volume"])}}]
        container["volumeMounts"] = [{"name": "data", "mountPath": m.DATA_MOUNT}]
    # The sandbox (and kwok on the real control plane) end the pod after the request's duration; a kubelet ignores it.
    duration = {m.SANDBOX_DURATION: f"{int(request.duration_hours)}h"}
    template = pod_template(request, t, [container], restart_policy="Never", volumes=volumes)
    template["metadata"]["annotations"] = dict(duration)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(t, labels=m.kueue_labels(t), annotations=duration, outcome=True),
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": max(0, int(params.get("retries") or 0)),
            **({} if job_ttl_seconds is None else {"ttlSecondsAfterFinished": int(job_ttl_seconds)}),
            "template": template,
        },
    }
    return [job]


def _render(request: WorkloadRequest, t: Target, options: RenderOptions) -> list[Manifest]:
    return render_batch_inference(request, t, job_ttl_seconds=options.job_ttl_seconds)


KIND = register(Kind(
    name="batchinfer",
    order=40,
    label="Batch inference",
    render=_render,
    schema=BATCH_INFERENCE_SCHEMA,
    defaults=TemplateDefaults(
        "batch-inference", "Batch inference", "Run a model once over a dataset (a Job): results written to its volume.",
        default_gpus=1, max_gpus=8, max_duration_hours=24,
    ),
    default_priority="batch",
    follows=("job",),
    replicas="one",
    gone_message=("Its Job is gone from the cluster and its outcome was not seen: deleted outside the portal, "
                  "or removed after it finished (ttlSecondsAfterFinished) while its status was not followed."),
    images=(("vLLM", "vllm/vllm-openai:v0.12.0", "OpenAI-compatible LLM server."),),
))

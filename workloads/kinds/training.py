"""The training kind: a batch run on one node, or a distributed PyTorch job.

Objects: one node → a batch/v1 Job; n > 1 → a headless Service and an Indexed Job (Kueue admits all n pods
together); on a Volcano-owned flavor (architecture E's offline whole GPUs) → a Volcano Job (a gang of ``master``
+ ``worker`` tasks), single-node too. The follower reads the Job (or the Volcano Job) and the Kueue Workload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from portal.labels import TASK_LABEL
from quotas import manifests as quota_manifests

from .. import manifests as m
from ..manifests import Manifest, Target, main_container, metadata, pod_template, service
from .registry import Kind, RenderOptions, TemplateDefaults, register

if TYPE_CHECKING:  # pragma: no cover
    from ..models import WorkloadRequest

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


def training_volumes(request: WorkloadRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    claim = (request.parameters or {}).get("data_volume")
    if not claim:
        return [], []
    return ([{"name": "data", "persistentVolumeClaim": {"claimName": str(claim)}}],
            [{"name": "data", "mountPath": m.DATA_MOUNT}])


def duration_annotations(request: WorkloadRequest) -> dict[str, str]:
    return {m.SANDBOX_DURATION: f"{int(request.duration_hours)}h"}


def timed(template: dict[str, Any], request: WorkloadRequest) -> dict[str, Any]:
    """The pod template with the duration annotation too: kwok, which plays the kubelets of the real control
    plane in tests (docs/real-cluster.md), reads it from the pod; a real kubelet ignores it."""
    template["metadata"].setdefault("annotations", {}).update(duration_annotations(request))
    return template


def topology_placed(template: dict[str, Any], request: WorkloadRequest) -> dict[str, Any]:
    """The pod template with Kueue's TAS annotation when the request asks for one rack or block (only a multi-pod
    Job through Kueue gets here; the submission checked the flavor takes part in its cluster's topology):
    ``kueue.x-k8s.io/podset-required-topology`` (or ``-preferred-``) naming the level's node label."""
    extra = quota_manifests.placement_annotations(request.flavor.cluster, request.topology)
    if extra and quota_manifests.topology_flavor(request.flavor.cluster, request.flavor):
        annotations = template["metadata"].setdefault("annotations", {})
        annotations.pop(quota_manifests.UNCONSTRAINED_TOPOLOGY, None)  # Kueue takes one topology request per pod set
        annotations.update(extra)
    return template


def retries(request: WorkloadRequest) -> int:
    return max(0, int((request.parameters or {}).get("retries") or 0))


def ttl_spec(job_ttl_seconds: int | None) -> dict[str, int]:
    return {} if job_ttl_seconds is None else {"ttlSecondsAfterFinished": int(job_ttl_seconds)}


def render_training(request: WorkloadRequest, t: Target, *,
                    job_ttl_seconds: int | None = m.DEFAULT_JOB_TTL_SECONDS) -> list[Manifest]:
    if m.on_volcano(request, t):
        return [render_volcano_job(request, t, job_ttl_seconds=job_ttl_seconds)]
    if int(request.replicas) > 1:
        return render_indexed_job(request, t, job_ttl_seconds=job_ttl_seconds)
    volumes, mounts = training_volumes(request)
    container = main_container(request)
    if mounts:
        container["volumeMounts"] = mounts
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(t, labels=m.kueue_labels(t), annotations=duration_annotations(request), outcome=True),
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": retries(request),
            **ttl_spec(job_ttl_seconds),
            "template": timed(pod_template(request, t, [container], restart_policy="Never", volumes=volumes),
                              request),
        },
    }
    return [job]


def render_indexed_job(request: WorkloadRequest, t: Target, *,
                       job_ttl_seconds: int | None = m.DEFAULT_JOB_TTL_SECONDS) -> list[Manifest]:
    """n pods through Kueue (admitted all together as one pod set), ranks from the completion index."""
    n = int(request.replicas)
    volumes, mounts = training_volumes(request)
    dist_env = [
        {"name": "MASTER_ADDR", "value": f"{t.name}-0.{t.name}"},
        {"name": "MASTER_PORT", "value": str(m.PYTORCH_PORT)},
        {"name": "WORLD_SIZE", "value": str(n)},
        {"name": "RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
    ]
    container = main_container(request, env=dist_env,
                               ports=[{"name": "dist", "containerPort": m.PYTORCH_PORT, "protocol": "TCP"}])
    if mounts:
        container["volumeMounts"] = mounts
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(t, labels=m.kueue_labels(t), annotations=duration_annotations(request), outcome=True),
        "spec": {
            "completionMode": "Indexed",
            "parallelism": n,
            "completions": n,
            "backoffLimit": retries(request),
            **ttl_spec(job_ttl_seconds),
            "template": topology_placed(timed(pod_template(request, t, [container], restart_policy="Never",
                                                           volumes=volumes, spec_extra={"subdomain": t.name}), request),
                                        request),
        },
    }
    # The headless Service gives the pods their <job>-<index>.<job> names; it comes first so DNS is there.
    return [service(t, port=m.PYTORCH_PORT, target_port=m.PYTORCH_PORT, headless=True), job]


def render_volcano_job(request: WorkloadRequest, t: Target, *,
                       job_ttl_seconds: int | None = m.DEFAULT_JOB_TTL_SECONDS) -> Manifest:
    """A gang of n pods (1 master + n-1 workers) in the project's Volcano Queue; no Kueue labels anywhere. Asked to
    be within one rack or block: ``spec.networkTopology`` (hard, or soft for "prefer-rack") with that tier."""
    n = int(request.replicas)
    volumes, mounts = training_volumes(request)

    def task(name: str, replicas: int) -> dict[str, Any]:
        container = main_container(request)
        if mounts:
            container["volumeMounts"] = mounts
        template = timed(pod_template(request, t, [container], restart_policy="Never", volumes=volumes,
                                      extra_labels={TASK_LABEL: name}), request)
        return {"name": name, "replicas": replicas, "minAvailable": replicas, "template": template}

    # One rack or block: Volcano's network-topology-aware scheduling over the cluster's HyperNodes (the same placement
    # choice the Kueue TAS path takes; quotas.manifests.network_topology).
    topology = quota_manifests.network_topology(request.flavor.cluster, request.flavor, request.topology) \
        if request.topology else {}
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": metadata(t, annotations=duration_annotations(request), outcome=True),
        "spec": {
            "schedulerName": "volcano",
            "queue": m.volcano_queue_name(t.project),
            "minAvailable": n,
            "maxRetry": max(1, retries(request)),
            **({"networkTopology": topology} if topology else {}),
            **ttl_spec(job_ttl_seconds),
            "plugins": {
                "pytorch": ["--master=master", "--worker=worker", f"--port={m.PYTORCH_PORT}"],
                "env": [],
                "svc": [],
            },
            # An evicted pod restarts the whole gang; a failed one too, until maxRetry is spent.
            "policies": [{"event": "PodEvicted", "action": "RestartJob"}, {"event": "PodFailed", "action": "RestartJob"}],
            "tasks": [task("master", 1)] + ([task("worker", n - 1)] if n > 1 else []),
        },
    }


def _render(request: WorkloadRequest, t: Target, options: RenderOptions) -> list[Manifest]:
    return render_training(request, t, job_ttl_seconds=options.job_ttl_seconds)


KIND = register(Kind(
    name="training",
    order=20,
    label="Training job",
    render=_render,
    schema=TRAINING_SCHEMA,
    defaults=TemplateDefaults(
        "training", "Training job", "A batch training run: one node, or a gang-scheduled distributed PyTorch job.",
        default_gpus=1, max_gpus=8, max_duration_hours=72,
    ),
    default_priority="batch",
    follows=("job", "vcjob"),
    replicas="workers",
    gang=True,
    images=(("NVIDIA PyTorch", "nvcr.io/nvidia/pytorch:26.10-py3", "NGC PyTorch container."),),
    gone_message=("Its Job is gone from the cluster and its outcome was not seen: deleted outside the portal, "
                  "or removed after it finished (ttlSecondsAfterFinished) while its status was not followed."),
))

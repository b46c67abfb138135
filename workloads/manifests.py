"""A request's Kubernetes objects, as plain dicts: our rows in, manifests out. No I/O, no queries, no settings.

``workloads.kinds.request_manifests(request)`` renders a request through its kind (``workloads/kinds/``), whose
modules build their objects from the building blocks here. It reads the request and the rows it points at (template, flavor, cluster,
project, tenant — load them with ``select_related``) and returns every object the request needs, in the
order they are applied:

==============  ============================================================  =====================================
template        objects                                                        held back by
==============  ============================================================  =====================================
notebook        Secret (access token), Service, StatefulSet (1 replica, home  Kueue (the set is one Workload)
                PVC template, JupyterLab or VS Code server)
training, 1     batch/v1 Job                                                   Kueue (``spec.suspend``)
training, n>1   headless Service + Indexed batch/v1 Job                        Kueue (all n pods admitted together)
training, E     on a Volcano-owned flavor (offline whole GPUs): Volcano Job    Volcano (the project's Volcano Queue)
                (gang of n: ``master`` + ``worker`` tasks, ``pytorch``/``env``/
                ``svc`` plugins), single-node too
inference       Service, Deployment (replicas, port, readiness probe, model   Kueue (each pod is its own Workload)
                location); architecture F: pinned to the online pool
==============  ============================================================  =====================================

Names derive from ``request.k8s_name`` (``req-<pk>``), so applying the same request twice writes the same
objects. Every object carries the owner labels (tenant, project, request), and so does every pod template, so
the status follower can find pods by label. Kueue-managed top-level objects carry the queue-name and
priority-class labels; Volcano Jobs carry neither, here or on their pods (docs/cluster-objects.md, "Kueue and Volcano together": a queue label on
a Volcano pod would make each pod its own Kueue Workload and break the gang).

GPU resources come from the flavor, always explicit (docs/cluster-objects.md, "HAMi"): ``nvidia.com/gpu`` for whole GPUs,
``nvidia.com/mig-<profile>`` for MIG slices, ``nvidia.com/gpu`` + ``nvidia.com/gpumem`` + ``nvidia.com/gpucores``
for HAMi. CPU and memory requests equal limits. The pod templates select the flavor's nodes (``nodeSelector`` =
its node labels, plus its tolerations): Kueue would inject them on admission, but writing them pins the flavor
the user chose among a ClusterQueue's flavors, and Volcano (which Kueue never touches) needs them anyway. A consenting
request that routing lets Kueue choose for (``request.kueue_flavors``) carries node affinity over those flavors instead.

Training objects carry the sandbox cluster's ``sandbox.gpuportal.dev/duration`` annotation (the request's
duration), so the demo's simulated jobs end; a real cluster ignores it.

Template parameters read here (all optional; the catalogue's JSON Schemas define them): ``command``, ``args``,
``env`` (mapping), ``working_dir``; notebooks ``ide`` (``jupyterlab`` | ``vscode``), ``home_size_gib``;
training ``data_volume`` (a PVC name, mounted at ``/data``), ``retries`` (``distributed``/``workers`` arrive as
``request.replicas``); inference ``port``, ``readiness_path``, ``model_uri`` (the catalogue's JSON Schemas,
``workloads/catalogue.py``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from portal.labels import (
    INSTALLATION_LABEL, KIND_LABEL, MANAGED_BY, MANAGER, OUTCOME_FINALIZER, OWNER_ANNOTATION, POOL_LABEL, PROJECT_LABEL,
    REQUEST_LABEL, TENANT_LABEL,
)
from portal.labels import PRIORITY_CLASS_LABEL as PRIORITY_LABEL
from portal.labels import QUEUE_NAME_LABEL as QUEUE_LABEL
from portal.labels import SANDBOX_DURATION_ANNOTATION as SANDBOX_DURATION  # noqa: F401 - read by kinds/training.py
from portal.quantities import kube_quantity
from quotas import architectures
from quotas import manifests as quota_manifests

if TYPE_CHECKING:  # pragma: no cover
    from quotas.models import Flavor

    from .models import WorkloadRequest

Manifest = dict[str, Any]

# Labels and annotations: portal/labels.py (imported above).
# Ports and paths.
NOTEBOOK_PORT = 8888
NOTEBOOK_HOME = "/home/jovyan"
DEFAULT_HOME_GIB = 20
DEFAULT_INFERENCE_PORT = 8000
DEFAULT_READINESS_PATH = "/health"
PYTORCH_PORT = 23456
DATA_MOUNT = "/data"
# A notebook's home volume is its StatefulSet's claim ``home-<sts>-0``; ``Volume`` rows record them as the requester's.
NOTEBOOK_HOME_PREFIX = "home-req-"
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")

# Cluster hygiene. Finished Jobs (batch/v1 and Volcano) are removed by the cluster's TTL controller after this many
# seconds unless the caller says otherwise (setting ``WORKLOADS_JOB_TTL_SECONDS``); the portal keeps the record.
DEFAULT_JOB_TTL_SECONDS = 3600
# Every pod runs as a non-root user with the runtime's default seccomp profile, no privilege escalation and no
# capabilities (the Pod Security "restricted" profile). The uid: 1000 everywhere, the uid of the notebook images'
# user (jovyan, group 100 in the Jupyter images, which also owns their home). Images built to run as root (NGC
# PyTorch, vLLM) start as uid 1000 too: they need a writable HOME/cache directory (the notebook's home volume,
# ``/tmp``, or a ``data_volume``), which is why HOME is set for notebooks. An image that needs another uid is
# rebuilt with ``USER 1000`` rather than given root.
RUN_AS_USER = 1000
RUN_AS_GROUP = 1000
NOTEBOOK_GROUP = 100

# Which architecture hands a pool to Volcano, or keeps an online pool for inference: quotas/architectures.py.


def local_queue_name(t: Target) -> str:
    """The LocalQueue named in the queue label: the project's, or its online one for inference under F.

    The names are the quota side's (``quotas.manifests.local_queue_name``), so both always agree.
    """
    return quota_manifests.local_queue_name(t, t.project, serving=t.serving)


def cluster_queue_name(t: Target) -> str:
    """The ClusterQueue behind that LocalQueue: ``shared`` under A, else the LocalQueue's own name."""
    return quota_manifests.SHARED_QUEUE if architectures.of(t).shared_queue else local_queue_name(t)


def volcano_queue_name(project_slug: str) -> str:
    """The project's Volcano Queue under E (cluster-scoped, named after the project; ``quotas.manifests``)."""
    return project_slug


@dataclass(frozen=True)
class Target:
    """Where and as what a request lands: the bits of the surrounding rows the renderer needs."""

    name: str
    namespace: str
    tenant: str
    project: str
    request_id: int
    kind: str
    architecture: str
    priority: str
    installation: str = quota_manifests.DEFAULT_INSTALLATION
    # What the kind declares (workloads/kinds/): the pods' group, gang-scheduled, a long-running server.
    pod_group: int = 1000
    gang: bool = False
    serving: bool = False


def notebook_home_claim(statefulset_name: str) -> str:
    """The PersistentVolumeClaim the StatefulSet controller makes from the ``home`` claim template."""
    return f"home-{statefulset_name}-0"


def manifests_hash(objects: list[Manifest]) -> str:
    """A stable digest of what is applied: equal for equal content, whatever the dict order."""
    return hashlib.sha256(json.dumps(objects, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- building blocks
def installation_id() -> str:
    """The installation this portal labels its objects with (setting ``PORTAL_INSTALLATION_ID``)."""
    from django.conf import settings

    return getattr(settings, "PORTAL_INSTALLATION_ID", "") or quota_manifests.DEFAULT_INSTALLATION


def owner_labels(t: Target) -> dict[str, str]:
    return {
        TENANT_LABEL: t.tenant,
        PROJECT_LABEL: t.project,
        REQUEST_LABEL: str(t.request_id),
        KIND_LABEL: t.kind,
        MANAGED_BY: MANAGER,
        INSTALLATION_LABEL: t.installation,
    }


def owner_annotations(t: Target) -> dict[str, str]:
    """The owner annotation on every top-level object: installation, tenant, project (and request)."""
    return {OWNER_ANNOTATION: f"{quota_manifests.owner_text(t.installation, t.tenant, t.project)}; request {t.request_id}"}


def kueue_labels(t: Target) -> dict[str, str]:
    return {QUEUE_LABEL: local_queue_name(t), PRIORITY_LABEL: t.priority}


def metadata(t: Target, name: str | None = None, *, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, outcome: bool = False) -> dict[str, Any]:
    """``outcome``: the object's end is the run's outcome (a Job): it carries ``OUTCOME_FINALIZER``, so the cluster
    keeps it until the status follower has recorded that outcome (docs/architecture.md, "Outcomes survive the
    follower")."""
    meta: dict[str, Any] = {"name": name or t.name, "namespace": t.namespace, "labels": {**owner_labels(t), **(labels or {})}}
    meta["annotations"] = {**owner_annotations(t), **(annotations or {})}
    if outcome:
        meta["finalizers"] = [OUTCOME_FINALIZER]
    return meta


def gpu_resources(flavor: Flavor, gpus: int, share: tuple[int, int] | None = None) -> dict[str, str]:
    """The flavor's extended resources for ``gpus`` GPUs (slices, vGPUs); always explicit for HAMi (docs/cluster-objects.md):
    each vGPU's ``share`` (GPU memory MiB, % of a card's cores; default: the flavor's preset)."""
    if gpus <= 0 or flavor.kind == "cpu":
        return {}
    if flavor.kind == "whole":
        return {"nvidia.com/gpu": str(gpus)}
    if flavor.kind == "mig":
        return {f"nvidia.com/mig-{flavor.mig_profile}": str(gpus)}
    if flavor.kind == "hami":
        memory_mib, cores_percent = share or (flavor.hami_memory_mib, flavor.hami_cores_percent)
        return {
            "nvidia.com/gpu": str(gpus),
            "nvidia.com/gpumem": str(memory_mib),
            "nvidia.com/gpucores": str(cores_percent),
        }
    raise ValueError(f"Unknown flavor kind {flavor.kind!r}.")


def container_resources(request: WorkloadRequest) -> dict[str, dict[str, str]]:
    amounts = {"cpu": kube_quantity("cpu", request.cpu), "memory": kube_quantity("memory", request.memory_gib),
               **gpu_resources(request.flavor, int(request.gpus), request.hami_share)}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def placement(request: WorkloadRequest, t: Target) -> dict[str, Any]:
    """nodeSelector and tolerations of the flavor (and of the online pool for inference under F); where Kueue chooses
    between flavors (``request.kueue_flavors``), node affinity over what tells them apart."""
    flavor = request.flavor
    selector = {str(k): str(v) for k, v in (flavor.node_labels or {}).items()}
    tolerations = [dict(tol) for tol in (flavor.tolerations or [])]
    pool = flavor.pool_label
    arch = architectures.of(t)
    if arch.online_for(serving=t.serving):
        pool = pool or arch.online_pool
    if pool and arch.online_pool:
        selector.setdefault(POOL_LABEL, pool)
        pool_toleration = {"key": POOL_LABEL, "operator": "Equal", "value": pool, "effect": "NoSchedule"}
        if pool_toleration not in tolerations:
            tolerations.append(pool_toleration)
    affinity = None
    choice = [c for c in (request.kueue_flavors or []) if isinstance(c, dict)]
    if len(choice) > 1:
        # Kueue chooses among these flavors (docs/cluster-objects.md, "Flavor fungibility"): the labels they share stay
        # in the nodeSelector, the ones that tell them apart (the GPU model) become one node-affinity term per flavor,
        # so Kueue's flavor assigner finds every one of them compatible and injects the one it admits on.
        labels = [{str(k): str(v) for k, v in (c.get("node_labels") or {}).items()} for c in choice]
        differ = {k for one in labels for k in one if any(other.get(k) != one[k] for other in labels)}
        for key in differ:
            selector.pop(key, None)
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": k, "operator": "In", "values": [one[k]]} for k in sorted(differ) if k in one]}
            for one in labels]}}}
        for c in choice:
            for tol in c.get("tolerations") or []:
                if dict(tol) not in tolerations:
                    tolerations.append(dict(tol))
    out: dict[str, Any] = {}
    if selector:
        out["nodeSelector"] = selector
    if affinity:
        out["affinity"] = affinity
    if tolerations:
        out["tolerations"] = tolerations
    return out


def env_list(values: Any) -> list[dict[str, Any]]:
    if isinstance(values, dict):
        return [{"name": str(k), "value": str(v)} for k, v in sorted(values.items())]
    if isinstance(values, list):
        return [dict(item) for item in values if isinstance(item, dict) and item.get("name")]
    return []


def as_command(value: Any) -> list[str] | None:
    if value in (None, "", []):
        return None
    if isinstance(value, str):
        return ["/bin/sh", "-c", value]
    return [str(part) for part in value]


def main_container(request: WorkloadRequest, *, command: list[str] | None = None, env: list[dict[str, Any]] | None = None,
                   ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    params = request.parameters or {}
    container: dict[str, Any] = {"name": "main", "image": request.image, "imagePullPolicy": "IfNotPresent"}
    cmd = as_command(params.get("command")) or command
    if cmd:
        container["command"] = cmd
    if params.get("args"):
        container["args"] = [str(a) for a in params["args"]]
    if params.get("working_dir"):
        container["workingDir"] = str(params["working_dir"])
    all_env = (env or []) + env_list(params.get("env"))
    if all_env:
        container["env"] = all_env
    if ports:
        container["ports"] = ports
    container["resources"] = container_resources(request)
    return container


def pod_security_context(t: Target) -> dict[str, Any]:
    """The pod's: non-root with a fixed uid, RuntimeDefault seccomp; volumes group-owned by the user's group."""
    group = t.pod_group
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": group, "fsGroup": group,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict[str, Any]:
    """Every container's: no privilege escalation, no capabilities, never root."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}


def pod_template(request: WorkloadRequest, t: Target, containers: list[dict[str, Any]], *, restart_policy: str,
                 extra_labels: dict[str, str] | None = None, volumes: list[dict[str, Any]] | None = None,
                 spec_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    containers = [{**c, "securityContext": container_security_context()} for c in containers]
    spec: dict[str, Any] = {"restartPolicy": restart_policy, "securityContext": pod_security_context(t),
                            "containers": containers, **placement(request, t)}
    if volumes:
        spec["volumes"] = volumes
    spec.update(spec_extra or {})
    template: dict[str, Any] = {"metadata": {"labels": {**owner_labels(t), **(extra_labels or {})}}, "spec": spec}
    if request.flavor is not None and quota_manifests.topology_flavor(request.flavor.cluster, request.flavor):
        # A placed flavor admits only pod sets that ask Kueue for TAS (quota_manifests.UNCONSTRAINED_TOPOLOGY);
        # kinds/training.topology_placed swaps this for one rack or block when the request asks for it.
        template["metadata"]["annotations"] = {quota_manifests.UNCONSTRAINED_TOPOLOGY: "true"}
    return template


def selector_labels(t: Target) -> dict[str, str]:
    return {REQUEST_LABEL: str(t.request_id)}


def service(t: Target, *, name: str | None = None, port: int, target_port: int | str, headless: bool = False,
            selector: dict[str, str] | None = None) -> Manifest:
    spec: dict[str, Any] = {
        "selector": selector or selector_labels(t),
        "ports": [{"name": "http" if not headless else "dist", "port": port, "targetPort": target_port, "protocol": "TCP"}],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True
    else:
        spec["type"] = "ClusterIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(t, name), "spec": spec}


# ---------------------------------------------------------------------------------------------- notebook
def notebook_path(request_id: int) -> str:
    """The path a notebook is served under, on the portal (its proxy) and on the ingress route that asks the portal
    first (docs/notebooks.md): ``/notebooks/<request id>/``. JupyterLab's ``base_url`` is the same path, so nothing
    is rewritten on the way."""
    return f"/notebooks/{request_id}/"


def notebook_access_url(*, request_id: int, ide: str, base_url: str = "") -> str:
    """The link users open: on the portal (or ``base_url``, the host of the ingress route). It carries no token:
    the portal authorises each request and adds the notebook's token on the way in."""
    root = base_url.rstrip("/")
    path = notebook_path(request_id)
    return f"{root}{path}" if ide == "vscode" else f"{root}{path}lab"


# ---------------------------------------------------------------------------------------------- Volcano or Kueue
def on_volcano(request: WorkloadRequest, t: Target) -> bool:
    """Under E, a gang-scheduled kind on a Volcano-owned flavor (the offline pool's whole GPUs,
    ``quotas.manifests.volcano_owned``) is a Volcano Job — single-node too: Kueue has no ResourceFlavor for those
    nodes. On any other flavor (online GPUs, MIG, HAMi — Volcano would know HAMi only as ``volcano.sh/vgpu-*``,
    docs/cluster-objects.md) it stays with Kueue. The same rule for rows: ``workloads.kinds.uses_volcano``."""
    return t.gang and quota_manifests.volcano_owned(request.cluster, request.flavor)

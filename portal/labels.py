"""The Kubernetes label and annotation vocabulary: every key (and the few fixed values) the portal writes or
selects on, defined once. The manifest modules, the reconciler, the status follower and the inventory import
them from here.

Naming rule: ``*_LABEL`` is a label *key*, ``*_ANNOTATION`` an annotation key. ``MANAGED_BY`` is the key
``app.kubernetes.io/managed-by`` and ``MANAGER`` its value (``gpu-portal``); together with
``INSTALLATION_LABEL`` they make an object ours (docs/ownership.md).
"""

from __future__ import annotations

# ------------------------------------------------------------------------------------------- ownership
MANAGED_BY = "app.kubernetes.io/managed-by"  # key
MANAGER = "gpu-portal"  # its value on everything we write
INSTALLATION_LABEL = "gpuportal.dev/installation"  # which portal installation owns it
OWNER_ANNOTATION = "gpuportal.dev/owner"  # "gpu-portal installation <id>; tenant <t>; project <p>[; request <n>]"
DEFAULT_INSTALLATION = "gpu-portal"

# ------------------------------------------------------------------------------------------- our keys
TENANT_LABEL = "gpuportal.dev/tenant"
PROJECT_LABEL = "gpuportal.dev/project"
REQUEST_LABEL = "gpuportal.dev/request"  # on a request's objects and pods (the status follower selects on it)
KIND_LABEL = "gpuportal.dev/kind"  # the request's template kind
TASK_LABEL = "gpuportal.dev/task"  # a Volcano Job's task (master / worker) on its pods
POOL_LABEL = "gpuportal.dev/pool"  # node pool (online / offline in architecture F), also a taint key
ARCHIVED_LABEL = "gpuportal.dev/archived"  # an archived project's retained namespace
VOLCANO_QUEUE_LABEL = "gpuportal.dev/volcano-queue"  # architecture E: the namespace's Volcano Queue
MODEL_LABEL = "gpuportal.dev/gpu-model"  # an ops-set GPU model name on nodes
GPU_SHARING_LABEL = "gpuportal.dev/gpu-sharing"  # "hami" on HAMi nodes
SANDBOX_DURATION_ANNOTATION = "sandbox.gpuportal.dev/duration"  # the sandbox cluster's simulated run time
# On the objects whose end is a run's outcome (batch and Volcano Jobs): the cluster (its TTL controller, a hand
# delete) cannot remove them before the status follower recorded the outcome and closed the usage interval
# (docs/architecture.md, "Outcomes survive the follower").
OUTCOME_FINALIZER = "gpu-portal.io/outcome"

# ------------------------------------------------------------------------------------------- Kueue
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"

# ------------------------------------------------------------------------------------------- Kubernetes / NVIDIA
# Pod Security Admission on project namespaces: enforce baseline (notebook images run as root and use
# sudo/apt, which restricted refuses), warn and audit at restricted so users see what would break.
POD_SECURITY = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"


def managed_selector() -> str:
    """The label selector for objects any portal installation manages."""
    return f"{MANAGED_BY}={MANAGER}"


def request_selector(request_id: int | str) -> str:
    """The label selector for one request's objects and pods."""
    return f"{REQUEST_LABEL}={request_id}"

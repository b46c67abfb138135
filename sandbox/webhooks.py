"""Admission webhooks of the operators the sandbox simulates, run synchronously by the store on every write.

Volcano installs two webhooks for ``batch.volcano.sh`` Jobs (``pkg/webhooks/admission/jobs/{mutate,validate}``):

* ``mutatejob.volcano.sh`` (CREATE): ``queue`` -> ``default``, ``schedulerName`` -> ``volcano``, ``maxRetry`` -> 3,
  task names -> ``default<i>``, task ``minAvailable`` -> its ``replicas``, job ``minAvailable`` (when 0 or unset)
  -> the sum of the tasks' ``minAvailable``, plugins ``pytorch``/``tensorflow``/``mpi``/``ray`` add ``svc`` and
  ``mpi`` adds ``ssh``.
* ``validatejob.volcano.sh`` (CREATE, UPDATE): the rules of :func:`volcano_job_create_errors` and
  :func:`volcano_job_update_error`. A refusal is what the API server makes of a webhook denial: HTTP 400, status
  ``Failure``, message ``admission webhook "validatejob.volcano.sh" denied the request: <message>``, where the
  message is Volcano's own (its pieces end with ``;``). Negative counts never get that far: the CRD schema
  (``minimum: 0``) refuses them first with 422 Invalid, as on a real API server.

Kueue's ``vjob.kb.io`` (``batch/v1`` Jobs with a queue, CREATE and UPDATE) is checked for one rule only: the
multi-layer TAS annotation needs an alpha feature gate (:func:`kueue_job_tas_errors`); its denial is
controller-runtime's, 403 Forbidden.

Not checked (see sandbox/README.md): the MPI plugin's arguments, ``dependsOn`` references and cycles, the pod
template's core validation beyond the store's own checks, ``partitionPolicy``, ``networkTopology``, and the
``volcano.sh/vgpu-*`` resources.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

VCJOB_GROUP = "batch.volcano.sh"
QUEUE_API = ("scheduling.volcano.sh/v1beta1", "Queue")
VALIDATE_JOB_WEBHOOK = "validatejob.volcano.sh"

POLICY_EVENTS = ("*", "PodPending", "PodRunning", "PodFailed", "PodEvicted", "Unknown", "TaskCompleted", "TaskFailed")
POLICY_ACTIONS = ("AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition", "TerminateJob",
                  "CompleteJob")
PLUGINS = ("env", "svc", "ssh", "pytorch", "tensorflow", "mpi", "ray", "hcclrank")
DEFAULT_QUEUE = "default"
DEFAULT_SCHEDULER = "volcano"
DEFAULT_MAX_RETRY = 3

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                      "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
                      "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")

QueueLookup = Callable[[str], "dict | None"]
ChildQueues = Callable[[str], bool]


def is_volcano_job(rt) -> bool:
    return rt.group == VCJOB_GROUP and rt.kind == "Job"


def _int(v, default: int = 0) -> int:
    try:
        return int(v) if v is not None else default
    except (TypeError, ValueError):
        return default


# ------------------------------------------------------------------------------------------------ mutating
def mutate_volcano_job(obj: dict) -> None:
    """``mutatejob.volcano.sh`` on CREATE (in place)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if not spec.get("queue"):
        spec["queue"] = DEFAULT_QUEUE
    if not spec.get("schedulerName"):
        spec["schedulerName"] = DEFAULT_SCHEDULER
    if spec.get("maxRetry") in (None, 0):
        spec["maxRetry"] = DEFAULT_MAX_RETRY
    tasks = spec.get("tasks")
    total_min = 0
    for i, t in enumerate(tasks if isinstance(tasks, list) else []):
        if not isinstance(t, dict):
            continue
        if not t.get("name"):
            t["name"] = f"default{i}"
        if t.get("minAvailable") is None and isinstance(t.get("replicas", 0), int):
            t["minAvailable"] = _int(t.get("replicas"))
        total_min += _int(t.get("minAvailable"))
    if not spec.get("minAvailable"):
        spec["minAvailable"] = total_min
    plugins = spec.get("plugins")
    if isinstance(plugins, dict):
        if any(p in plugins for p in ("pytorch", "tensorflow", "mpi", "ray")):
            plugins.setdefault("svc", [])
        if "mpi" in plugins:
            plugins.setdefault("ssh", [])


# ------------------------------------------------------------------------------------------------ validating
def _policy_errors(policies, path: str) -> str:
    """Volcano's ``validatePolicies``: one message (``""`` when fine)."""
    errs: list[str] = []
    events: set[str] = set()
    codes: set[int] = set()
    for p in policies if isinstance(policies, list) else []:
        if not isinstance(p, dict):
            continue
        evs = [p["event"]] if p.get("event") else []
        evs += [e for e in (p.get("events") or []) if e]
        code = p.get("exitCode")
        if evs and code is not None:
            errs.append("must not specify event and exitCode simultaneously")
            break
        if not evs and code is None:
            errs.append("either event and exitCode should be specified")
            break
        if evs:
            stop = False
            for ev in evs:
                if ev not in POLICY_EVENTS:
                    errs.append(f'{path}: Invalid value: "{ev}": invalid policy event')
                    stop = True
                    break
                if p.get("action") not in POLICY_ACTIONS:
                    errs.append(f'{path}: Invalid value: "{p.get("action") or ""}": invalid policy action')
                    stop = True
                    break
                if ev in events:
                    errs.append(f"duplicate event {ev} across different policy")
                    stop = True
                    break
                events.add(ev)
            if stop:
                break
        else:
            c = _int(code)
            if c == 0:
                errs.append("0 is not a valid error code")
                break
            if c in codes:
                errs.append(f"duplicate exitCode {c}")
                break
            codes.add(c)
    if "*" in events and len(events) > 1:
        errs.append("if there's * here, no other policy should be here")
    if not errs:
        return ""
    return (" " + "; ".join(errs) + f" valid events are [{' '.join(POLICY_EVENTS)}], "
            f"valid actions are [{' '.join(POLICY_ACTIONS)}];")


def volcano_job_create_errors(obj: dict, queue_of: QueueLookup, has_children: ChildQueues) -> str:
    """``validatejob.volcano.sh`` on CREATE: Volcano's message, ``""`` when admitted."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    name = (obj.get("metadata") or {}).get("name", "")
    if _int(spec.get("minAvailable")) < 0:
        return "job 'minAvailable' must be >= 0."
    if _int(spec.get("maxRetry")) < 0:
        return "'maxRetry' cannot be less than zero."
    if spec.get("ttlSecondsAfterFinished") is not None and _int(spec.get("ttlSecondsAfterFinished")) < 0:
        return "'ttlSecondsAfterFinished' cannot be less than zero."
    tasks = [t for t in (spec.get("tasks") or []) if isinstance(t, dict)]
    if not tasks:
        return "No task specified in job spec"
    msg = ""
    names: set[str] = set()
    total = 0
    for index, t in enumerate(tasks):
        tname = str(t.get("name") or "")
        replicas = _int(t.get("replicas"))
        if replicas < 0:
            msg += f" 'replicas' < 0 in task: {tname};"
        if t.get("minAvailable") is not None:
            tmin = _int(t.get("minAvailable"))
            if tmin < 0:
                msg += f" 'minAvailable' < 0 in task: {tname};"
            elif tmin > replicas:
                msg += f" 'minAvailable' is greater than 'replicas' in task: {tname}, job: {name};"
        total += replicas
        label_errs = []
        if len(tname) > 63:
            label_errs.append("must be no more than 63 characters")
        if not _DNS1123_LABEL.match(tname):
            label_errs.append(_DNS1123_LABEL_MSG)
        if label_errs:
            msg += f" [{' '.join(label_errs)}];"
        if tname in names:
            msg += f" duplicated task name {tname};"
            break
        names.add(tname)
        msg += _policy_errors(t.get("policies"), "spec.tasks.policies")
        pod_name = f"{name}-{tname}-{index}"
        if len(pod_name) > 63:
            msg += f" create pod with name {pod_name} validate failed [must be no more than 63 characters];"
    if total < _int(spec.get("minAvailable")):
        msg += " job 'minAvailable' should not be greater than total replicas in tasks;"
    msg += _policy_errors(spec.get("policies"), "spec.policies")
    plugins = spec.get("plugins")
    for pname in sorted(plugins) if isinstance(plugins, dict) else []:
        if pname not in PLUGINS:
            msg += f" unable to find job plugin: {pname};"
    mounts: set[str] = set()
    for v in spec.get("volumes") or []:
        if not isinstance(v, dict):
            continue
        mp = v.get("mountPath") or ""
        if not mp:
            msg += " mountPath is required;"
        elif mp in mounts:
            msg += f" duplicated mountPath: {mp};"
        mounts.add(mp)
    qname = str(spec.get("queue") or DEFAULT_QUEUE)
    queue = queue_of(qname)
    if queue is None:
        msg += f' unable to find job queue: queues.scheduling.volcano.sh "{qname}" not found;'
    else:
        # a queue the controller has not reconciled yet has no state: treated as Open (it becomes Open at once)
        state = (queue.get("status") or {}).get("state") or "Open"
        if state != "Open":
            msg += f" can only submit job to queue with state `Open`, queue `{qname}` status is `{state}`;"
        elif qname == "root" or has_children(qname):
            msg += f" can only submit job to leaf queue, queue `{qname}` has child queues;"
    return msg.strip()


_UPDATABLE_MSG = "job updates may not change fields other than `minAvailable`, `tasks[*].replicas under spec`"


def volcano_job_update_error(old: dict, new: dict) -> str:
    """``validatejob.volcano.sh`` on UPDATE (Volcano's ``validateJobUpdate``): ``""`` when allowed."""
    ospec = copy.deepcopy(old.get("spec") or {})
    nspec = copy.deepcopy(new.get("spec") or {})
    total = 0
    ntasks = [t for t in (nspec.get("tasks") or []) if isinstance(t, dict)]
    for t in ntasks:
        replicas = _int(t.get("replicas"))
        if replicas < 0:
            return f"'replicas' must be >= 0 in task: {t.get('name', '')}"
        if t.get("minAvailable") is not None and _int(t.get("minAvailable")) > replicas:
            return f"'minAvailable' must be <= 'replicas' in task: {t.get('name', '')};"
        total += replicas
    if _int(nspec.get("minAvailable")) > total:
        return "job 'minAvailable' must not be greater than total replicas"
    if _int(nspec.get("minAvailable")) < 0:
        return "job 'minAvailable' must be >= 0"
    otasks = [t for t in (ospec.get("tasks") or []) if isinstance(t, dict)]
    if len(otasks) != len(ntasks):
        return "job updates may not add or remove tasks"
    for spec in (ospec, nspec):
        spec.pop("minAvailable", None)
        spec.pop("priorityClassName", None)
        for t in spec.get("tasks") or []:
            if isinstance(t, dict):
                t.pop("replicas", None)
                t.pop("minAvailable", None)
    if ospec != nspec:
        return _UPDATABLE_MSG
    return ""


KUEUE_JOB_WEBHOOK = "vjob.kb.io"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_SYSTEM_NAMESPACES = ("kube-system", "kueue-system")  # outside the namespaceSelector of Kueue's webhooks
MULTI_LAYER_ANNOTATION = "kueue.x-k8s.io/podset-slice-required-topology-constraints"


def is_kueue_job(rt, obj: dict) -> bool:
    """A ``batch/v1`` Job in a namespace Kueue's ``vjob.kb.io`` webhook sees, with a queue (one Kueue manages)."""
    meta = obj.get("metadata") or {}
    return (rt.group == "batch" and rt.kind == "Job" and meta.get("namespace") not in KUEUE_SYSTEM_NAMESPACES
            and bool((meta.get("labels") or {}).get(KUEUE_QUEUE_LABEL)))


def kueue_job_tas_errors(obj: dict) -> str:
    """Kueue v0.17's Job webhook on the pod template's TAS annotations (jobframework/tas_validation.go), the part the
    sandbox checks: the multi-layer slice constraints need the ``TASMultiLayerTopology`` feature gate, alpha and off
    by default (the sandbox runs Kueue's default gates), as Kueue's own ``sample-job-multi-layer.yaml`` meets it."""
    ann = (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {}
    if MULTI_LAYER_ANNOTATION in ann:
        return (f"spec.template.metadata.annotations[{MULTI_LAYER_ANNOTATION}]: Forbidden: the TASMultiLayerTopology "
                "feature gate must be enabled to use this annotation")
    return ""


def kueue_denied(webhook: str, message: str):
    """A controller-runtime webhook's ``admission.Denied`` (Kueue's validators): 403, reason Forbidden."""
    from .store import ApiError

    return ApiError(403, "Forbidden", f'admission webhook "{webhook}" denied the request: {message}')


def denied(webhook: str, message: str):
    """The API server's answer to a webhook denial (``ToStatusErr``): 400, status Failure."""
    from .store import ApiError

    return ApiError(400, "BadRequest", f'admission webhook "{webhook}" denied the request: {message}')

"""Built-in workload controllers and the kubelet: batch/v1 Job, apps/v1 Deployment and StatefulSet, pod lifecycle.

* :class:`JobController` — creates pods ``<job>-<rand5>`` (Indexed: ``<job>-<index>-<rand5>`` with the
  ``batch.kubernetes.io/job-completion-index`` annotation/label and ``JOB_COMPLETION_INDEX`` env), never while
  ``spec.suspend`` is true (suspending deletes the active pods); honours parallelism/completions, ``backoffLimit``
  (failed pods are replaced until ``failed > backoffLimit``), ``activeDeadlineSeconds`` and
  ``ttlSecondsAfterFinished``. Status: active/ready/succeeded/failed/terminating/startTime/completionTime/
  completedIndexes and the conditions ``Suspended`` (JobSuspended/JobResumed), ``SuccessCriteriaMet`` + ``Complete``
  (CompletionsReached), ``FailureTarget`` + ``Failed`` (BackoffLimitExceeded/DeadlineExceeded), with the job
  controller's events.
* :class:`DeploymentController` — simplification: **no ReplicaSet object**; pods ``<deploy>-<hash>-<rand5>`` are owned
  by the Deployment directly (``pod-template-hash`` label, hash of the pod template). Scaling adds/removes pods
  (unscheduled/newest first); a template change replaces all pods at once (Recreate-like, no surge); finished
  pods are replaced (restartPolicy Always). Status replicas/updatedReplicas/readyReplicas/availableReplicas/
  unavailableReplicas and conditions Available/Progressing; ``ScalingReplicaSet`` events name the would-be
  ReplicaSet ``<deploy>-<hash>``.
* :class:`StatefulSetController` — pods ``<sts>-<i>`` (all created at once, as with Kueue's forced ``Parallel``
  policy), hostname/subdomain, one PVC per volumeClaimTemplate ``<tpl>-<sts>-<i>`` (Bound, retained on scale-down
  and deletion); a template change recreates the pods. Status replicas/readyReplicas/currentReplicas/
  updatedReplicas/availableReplicas/currentRevision/updateRevision.
* :class:`Kubelet` — bound pods: ``Pending`` (ContainerCreating) for ``start_delay`` simulated seconds, then
  ``Running`` (podIP, hostIP, ready containers, Pulled/Created/Started events, log lines), then after the simulated
  duration (annotation ``sandbox.gpuportal.dev/duration``; default 180 s for Job, Volcano Job and bare pods, forever
  for Deployment/StatefulSet pods and for a container running agnhost's ``pause``, as Kueue's samples do) ``Succeeded`` (exit code 0) or ``Failed`` (``sandbox.gpuportal.dev/outcome:
  Failed``, exit code 1). Transition times are exact even when a tick comes late (``finishedAt = startedAt +
  duration``). Restart of containers in place (``restartPolicy: OnFailure``) is not simulated: a failing container
  fails its pod.
* :class:`GarbageCollector` — deletes pods/Workloads/PodGroups whose controller owner is gone (the store also
  cascades deletes; this catches objects created while the owner was being deleted) and forgets logs of deleted pods.
"""

from __future__ import annotations

import heapq
import json
import threading

from sandbox.controllers import resources as R
from sandbox.controllers.common import (
    DEPLOYMENT,
    DURATION_ANNOTATION,
    JOB,
    NODE,
    OUTCOME_ANNOTATION,
    POD,
    PVC,
    STATEFULSET,
    VC_JOB,
    VC_PODGROUP,
    WORKLOAD,
    condition_true,
    controller_ref,
    find_condition,
    is_deleting,
    owner_ref,
    parse_duration,
    sandbox_annotations,
    set_condition,
    short_hash,
    uid_of,
)
from sandbox.clock import format_time, parse_time
from sandbox.controllers import logtext
from sandbox.patch import deep_copy

DEFAULT_BATCH_SECONDS = 180.0
START_DELAY_SECONDS = 2.0
LOG_EVERY_SECONDS = 30.0
INDEX_KEY = "batch.kubernetes.io/job-completion-index"


# ------------------------------------------------------------------------------------------------ pod helpers
def pod_phase(p: dict) -> str:
    return (p.get("status") or {}).get("phase") or "Pending"


def is_terminal(p: dict) -> bool:
    return pod_phase(p) in ("Succeeded", "Failed")


def is_ready(p: dict) -> bool:
    return condition_true(p, "Ready")


def owned_pods(pods, owner: dict) -> list[dict]:
    """Pods whose controller is ``owner``; ``pods`` is a list or a :func:`pods_by_owner` index."""
    uid = uid_of(owner)
    if isinstance(pods, dict):
        return list(pods.get(uid, ()))
    return [p for p in pods if (controller_ref(p) or {}).get("uid") == uid]


def pods_by_owner(pods: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in pods:
        ref = controller_ref(p)
        if ref is not None:
            out.setdefault(ref.get("uid"), []).append(p)
    return out


def build_pod(ctx, owner: dict, template: dict, name: str, *, labels: dict | None = None,
              annotations: dict | None = None) -> dict:
    """A Pod from a pod template, owned by ``owner``; runs the registered pod "webhooks" (Kueue gating, HAMi)."""
    tmeta = deep_copy(template.get("metadata") or {})
    spec = deep_copy(template.get("spec") or {})
    ann = dict(tmeta.get("annotations") or {})
    for k, v in sandbox_annotations(owner, template).items():
        ann.setdefault(k, v)
    ann.update(annotations or {})
    lab = dict(tmeta.get("labels") or {})
    lab.update(labels or {})
    spec.setdefault("schedulerName", "default-scheduler")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": owner["metadata"]["namespace"], "labels": lab,
                     "ownerReferences": [owner_ref(owner)]},
        "spec": spec,
    }
    if ann:
        pod["metadata"]["annotations"] = ann
    for mutate in getattr(ctx, "pod_mutators", ()):
        mutate(pod, owner)
    return pod


def create_pod(ctx, pod: dict) -> dict | None:
    """Create a pod, retrying with a new random suffix if the name is taken (names ending in ``-<rand5>``)."""
    for _ in range(5):
        res = ctx.create(pod)
        if res is not None:
            return res
        last = ctx.errors[-1] if ctx.errors else ""
        if "already exists" not in last:
            return None
        base = pod["metadata"]["name"].rsplit("-", 1)[0]
        pod["metadata"]["name"] = f"{base}-{ctx.rand5()}"
    return None


def template_hash(template: dict) -> str:
    h = short_hash(json.dumps(template, sort_keys=True), 20)
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(alphabet[int(h[i : i + 2], 16) % len(alphabet)] for i in range(0, 20, 2))[:10]


def delete_pods(ctx, owner: dict, pods: list[dict], component: str) -> None:
    for p in pods:
        if ctx.delete(POD, p["metadata"]["name"], p["metadata"]["namespace"]):
            ctx.event(owner, "Normal", "SuccessfulDelete", f"Deleted pod: {p['metadata']['name']}", component)


PAUSE_ARG = "pause"  # registry.k8s.io/e2e-test-images/agnhost's subcommand that never exits


def pod_duration(pod: dict) -> float | None:
    """Simulated run time of a pod: its duration annotation, else the default for its owner kind."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    d = parse_duration(ann.get(DURATION_ANNOTATION))
    if d is not None:
        return max(0.0, d)
    if any((c.get("args") or [None])[0] == PAUSE_ARG for c in (pod.get("spec") or {}).get("containers") or []):
        return None  # agnhost's ``pause`` waits for ever (a real kubelet's pod of Kueue's samples never completes)
    ref = controller_ref(pod)
    kind = (ref or {}).get("kind")
    if ref is None or (kind == "Job" and (ref.get("apiVersion") or "").startswith(("batch/", "batch.volcano.sh/"))):
        return DEFAULT_BATCH_SECONDS
    if kind in ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"):
        return None
    return DEFAULT_BATCH_SECONDS


# ------------------------------------------------------------------------------------------------ Job
def _fmt_indexes(idx: set[int]) -> str:
    out, run = [], []
    for i in sorted(idx):
        if run and i == run[-1] + 1:
            run.append(i)
        else:
            if run:
                out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _counted(job: dict, pods: list[dict]) -> bool:
    st = job.get("status") or {}
    return (st.get("succeeded", 0) == sum(1 for p in pods if pod_phase(p) == "Succeeded")
            and st.get("failed", 0) == sum(1 for p in pods if pod_phase(p) == "Failed"))


def job_finished(job: dict) -> str | None:
    """"Complete" / "Failed" when the Job has that condition True, else None."""
    for t in ("Complete", "Failed"):
        if condition_true(job, t):
            return t
    return None


class JobController:
    """Incremental: a pass syncs only the Jobs that changed or whose pods changed since the last pass (informer
    listener), the Jobs whose sync failed, and — every pass — the Jobs whose outcome depends on time
    (``activeDeadlineSeconds``, ``ttlSecondsAfterFinished``). A Job outside those sets would sync to a no-op."""

    name = "job-controller"

    def __init__(self, ctx):
        self.ctx = ctx
        self._lock = threading.Lock()
        self._dirty: set[tuple[str, str]] = set()
        self._timed: set[tuple[str, str]] = set()
        self._epoch = None
        ctx.informer.listen(self._on_change)

    def _on_change(self, gvk, etype: str, new: dict, old: dict | None) -> None:
        if gvk == JOB:
            m = new.get("metadata") or {}
            key = (m.get("namespace") or "", m.get("name") or "")
            spec = new.get("spec") or {}
            with self._lock:
                self._dirty.add(key)
                if etype != "DELETED" and (spec.get("activeDeadlineSeconds") is not None
                                           or spec.get("ttlSecondsAfterFinished") is not None):
                    self._timed.add(key)
                else:
                    self._timed.discard(key)
        elif gvk == POD:
            with self._lock:
                for o in (old, new):
                    ref = controller_ref(o) if o is not None else None
                    if ref and ref.get("kind") == "Job" and (ref.get("apiVersion") or "").startswith("batch/"):
                        self._dirty.add(((o.get("metadata") or {}).get("namespace") or "", ref.get("name") or ""))

    def reconcile(self) -> None:
        ctx = self.ctx
        inf = ctx.informer
        with self._lock:
            full = inf.epoch != self._epoch
            self._epoch = inf.epoch
            keys = self._dirty | self._timed
            self._dirty = set()
        if full:
            jobs = ctx.list_items(JOB)
            with self._lock:
                self._timed = {(j["metadata"].get("namespace") or "", j["metadata"]["name"]) for j in jobs
                               if (j.get("spec") or {}).get("activeDeadlineSeconds") is not None
                               or (j.get("spec") or {}).get("ttlSecondsAfterFinished") is not None}
        else:
            if not keys:
                return
            jobs = [j for j in (inf.get(JOB, k[1], k[0]) for k in sorted(keys)) if j is not None]
        pods = pods_by_owner(ctx.list_items(POD))
        for job in jobs:
            if is_deleting(job) or (job.get("spec") or {}).get("managedBy") not in (None, "kubernetes.io/job-controller"):
                continue  # another controller owns it (spec.managedBy: MultiKueue on a manager cluster)
            mine = owned_pods(pods, job)
            if job_finished(job) and (job.get("spec") or {}).get("ttlSecondsAfterFinished") is None and \
                    not any(not is_terminal(p) for p in mine) and _counted(job, mine):
                continue  # finished and settled: nothing left to do
            before = ctx.error_count
            try:
                self._sync(job, mine)
            except Exception as exc:  # keep the other jobs going
                ctx._error("job-sync", JOB, job["metadata"]["name"], exc)
            if ctx.error_count != before:  # a failed write: try again on the next pass
                with self._lock:
                    self._dirty.add((job["metadata"].get("namespace") or "", job["metadata"]["name"]))

    def _sync(self, job: dict, pods: list[dict]) -> None:
        ctx = self.ctx
        now = ctx.ts()
        spec = job.get("spec") or {}
        status = deep_copy(job.get("status") or {})
        conds = status.setdefault("conditions", [])
        active = [p for p in pods if not is_terminal(p) and not is_deleting(p)]
        succeeded = [p for p in pods if pod_phase(p) == "Succeeded"]
        failed = [p for p in pods if pod_phase(p) == "Failed"]
        finished = job_finished(job)
        indexed = spec.get("completionMode") == "Indexed"
        completions = spec.get("completions")
        parallelism = int(spec.get("parallelism", 1) if spec.get("parallelism") is not None else 1)
        backoff = int(spec.get("backoffLimit", 6) if spec.get("backoffLimit") is not None else 6)

        if finished:
            if active:
                delete_pods(ctx, job, active, self.name)
                active = []
            self._ttl(job, status)
        elif spec.get("suspend"):
            if active:
                delete_pods(ctx, job, active, self.name)
                active = []
            if set_condition(conds, "Suspended", "True", "JobSuspended", "Job suspended", now, lastProbeTime=now):
                ctx.event(job, "Normal", "Suspended", "Job suspended", self.name)
        else:
            c = find_condition(conds, "Suspended")
            if c is not None and c.get("status") == "True":
                set_condition(conds, "Suspended", "False", "JobResumed", "Job resumed", now, lastProbeTime=now)
                status["startTime"] = now
                ctx.event(job, "Normal", "Resumed", "Job resumed", self.name)
            status.setdefault("startTime", now)
            done_idx = {self._index(p) for p in succeeded} - {None}
            outcome = None
            deadline = spec.get("activeDeadlineSeconds")
            elapsed = ctx.since(status.get("startTime"))
            if len(failed) > backoff:
                outcome = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
            elif deadline is not None and elapsed is not None and elapsed >= float(deadline):
                outcome = ("DeadlineExceeded", "Job was active longer than specified deadline")
            if outcome:
                reason, msg = outcome
                set_condition(conds, "FailureTarget", "True", reason, msg, now, lastProbeTime=now)
                set_condition(conds, "Failed", "True", reason, msg, now, lastProbeTime=now)
                if active:
                    delete_pods(ctx, job, active, self.name)
                    active = []
                ctx.event(job, "Warning", reason, msg, self.name)
            else:
                complete = False
                if indexed:
                    complete = completions is not None and len(done_idx) >= int(completions)
                elif completions is not None:
                    complete = len(succeeded) >= int(completions)
                else:
                    complete = bool(succeeded) and not active
                if complete:
                    msg = "Reached expected number of succeeded pods"
                    set_condition(conds, "SuccessCriteriaMet", "True", "CompletionsReached", msg, now, lastProbeTime=now)
                    set_condition(conds, "Complete", "True", "CompletionsReached", msg, now, lastProbeTime=now)
                    status["completionTime"] = self._last_finish(succeeded) or now
                    if active:
                        delete_pods(ctx, job, active, self.name)
                        active = []
                    ctx.event(job, "Normal", "Completed", "Job completed", self.name)
                else:
                    active = active + self._create_pods(job, active, succeeded, done_idx, indexed, completions,
                                                        parallelism)
        # counters
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if is_ready(p))
        status["succeeded"] = len(succeeded)
        status["failed"] = len(failed)
        status["terminating"] = 0
        status.setdefault("uncountedTerminatedPods", {})
        for k in ("active", "succeeded", "failed"):
            if not status[k]:
                status.pop(k)
        if indexed:
            idx = {self._index(p) for p in succeeded} - {None}
            if idx:
                status["completedIndexes"] = _fmt_indexes(idx)
        if not conds:
            status.pop("conditions")
        ctx.write_status(job, status)

    @staticmethod
    def _index(p: dict):
        v = ((p.get("metadata") or {}).get("annotations") or {}).get(INDEX_KEY)
        try:
            return int(v)
        except (TypeError, ValueError):
            return None

    @staticmethod
    def _last_finish(pods: list[dict]) -> str | None:
        times = []
        for p in pods:
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                t = ((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")
                if t:
                    times.append(t)
        return max(times) if times else None

    def _create_pods(self, job, active, succeeded, done_idx, indexed, completions, parallelism) -> list[dict]:
        ctx = self.ctx
        jname, uid = job["metadata"]["name"], uid_of(job)
        template = (job.get("spec") or {}).get("template") or {}
        want = parallelism
        if indexed:
            running_idx = {self._index(p) for p in active}
            todo = [i for i in range(int(completions or 0)) if i not in done_idx and i not in running_idx]
            n = max(0, min(want - len(active), len(todo)))
            plan = todo[:n]
        else:
            if completions is not None:
                remaining = int(completions) - len(succeeded)
                want = min(want, remaining)
            elif succeeded:
                want = 0
            plan = [None] * max(0, want - len(active))
        created = []
        labels = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": jname,
                  "controller-uid": uid, "job-name": jname}
        for idx in plan:
            ann = {}
            lab = dict(labels)
            if idx is not None:
                ann[INDEX_KEY] = str(idx)
                lab[INDEX_KEY] = str(idx)
                name = f"{jname}-{idx}-{ctx.rand5()}"
            else:
                name = f"{jname}-{ctx.rand5()}"
            pod = build_pod(ctx, job, template, name, labels=lab, annotations=ann)
            if idx is not None:
                for c in pod["spec"].get("containers") or []:
                    env = c.setdefault("env", [])
                    if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                        env.append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                            "apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}})
                if (pod["spec"].get("subdomain")) and not pod["spec"].get("hostname"):
                    pod["spec"]["hostname"] = f"{jname}-{idx}"
            res = create_pod(ctx, pod)
            if res is not None:
                created.append(res)
                ctx.event(job, "Normal", "SuccessfulCreate", f"Created pod: {res['metadata']['name']}", self.name)
        return created

    def _ttl(self, job: dict, status: dict) -> None:
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        t = status.get("completionTime")
        if not t:
            c = find_condition(status.get("conditions"), "Failed")
            t = c.get("lastTransitionTime") if c else None
        since = self.ctx.since(t)
        if since is not None and since >= float(ttl):
            self.ctx.delete(JOB, job["metadata"]["name"], job["metadata"]["namespace"], propagation_policy="Background")


# ------------------------------------------------------------------------------------------------ Deployment
class DeploymentController:
    name = "deployment-controller"
    watches = (DEPLOYMENT, POD)

    def __init__(self, ctx):
        self.ctx = ctx

    def reconcile(self) -> None:
        ctx = self.ctx
        pods = pods_by_owner(ctx.list_items(POD))
        for d in ctx.list_items(DEPLOYMENT):
            if is_deleting(d):
                continue
            try:
                self._sync(d, owned_pods(pods, d))
            except Exception as exc:
                ctx._error("deployment-sync", DEPLOYMENT, d["metadata"]["name"], exc)

    def _sync(self, d: dict, pods: list[dict]) -> None:
        ctx = self.ctx
        spec = d.get("spec") or {}
        name = d["metadata"]["name"]
        replicas = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        template = spec.get("template") or {}
        h = template_hash(template)
        rs_name = f"{name}-{h}"
        live = [p for p in pods if not is_deleting(p)]
        # finished pods are replaced (restartPolicy Always)
        done = [p for p in live if is_terminal(p)]
        if done:
            delete_pods(ctx, d, done, self.name)
            live = [p for p in live if not is_terminal(p)]
        old = [p for p in live if (p["metadata"].get("labels") or {}).get("pod-template-hash") != h]
        cur = [p for p in live if (p["metadata"].get("labels") or {}).get("pod-template-hash") == h]
        # A rolling update with maxUnavailable 0 keeps the old pods until as many new ones are ready.
        rolling = spec.get("strategy") or {}
        keep_old = (rolling.get("type", "RollingUpdate") == "RollingUpdate"
                    and str((rolling.get("rollingUpdate") or {}).get("maxUnavailable", "25%")) in ("0", "0%")
                    and sum(1 for p in cur if is_ready(p)) < replicas)
        if old and not spec.get("paused") and not keep_old:
            for p in old:
                ctx.delete(POD, p["metadata"]["name"], p["metadata"]["namespace"])
            ctx.event(d, "Normal", "ScalingReplicaSet",
                      f"Scaled down replica set {name}-{old[0]['metadata']['labels'].get('pod-template-hash', '')} "
                      f"from {len(old)} to 0", self.name)
            old = []
        if len(cur) < replicas:
            n_before = len(cur)
            for _ in range(replicas - len(cur)):
                pod = build_pod(ctx, d, template, f"{rs_name}-{ctx.rand5()}", labels={"pod-template-hash": h})
                res = create_pod(ctx, pod)
                if res is not None:
                    cur.append(res)
            ctx.event(d, "Normal", "ScalingReplicaSet",
                      f"Scaled up replica set {rs_name} from {n_before} to {replicas}", self.name)
        elif len(cur) > replicas:
            # remove unscheduled first, then not-ready, then newest
            def rank(p):
                return (bool((p.get("spec") or {}).get("nodeName")), is_ready(p),
                        "".join(chr(255 - ord(c)) for c in (p["metadata"].get("creationTimestamp") or "")))
            victims = sorted(cur, key=rank)[: len(cur) - replicas]
            for p in victims:
                ctx.delete(POD, p["metadata"]["name"], p["metadata"]["namespace"])
            ctx.event(d, "Normal", "ScalingReplicaSet",
                      f"Scaled down replica set {rs_name} from {len(cur)} to {replicas}", self.name)
            vn = {p["metadata"]["name"] for p in victims}
            cur = [p for p in cur if p["metadata"]["name"] not in vn]
        ready = sum(1 for p in cur + old if is_ready(p))
        total = len(cur) + len(old)
        now = ctx.ts()
        status = deep_copy(d.get("status") or {})
        conds = status.setdefault("conditions", [])
        status.update({
            "observedGeneration": d["metadata"].get("generation", 1),
            "replicas": total,
            "updatedReplicas": len(cur),
            "readyReplicas": ready,
            "availableReplicas": ready,
        })
        unavailable = max(0, replicas - ready)
        if unavailable:
            status["unavailableReplicas"] = unavailable
        else:
            status.pop("unavailableReplicas", None)
        for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas"):
            if not status[k]:
                status.pop(k)
        max_unavail = _max_unavailable(spec, replicas)
        if ready >= replicas - max_unavail:
            set_condition(conds, "Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.",
                          now, lastUpdateTime=now)
        else:
            set_condition(conds, "Available", "False", "MinimumReplicasUnavailable",
                          "Deployment does not have minimum availability.", now, lastUpdateTime=now)
        if ready >= replicas and len(cur) == replicas:
            set_condition(conds, "Progressing", "True", "NewReplicaSetAvailable",
                          f'ReplicaSet "{rs_name}" has successfully progressed.', now, lastUpdateTime=now)
        else:
            set_condition(conds, "Progressing", "True", "ReplicaSetUpdated", f'ReplicaSet "{rs_name}" is progressing.',
                          now, lastUpdateTime=now)
        ctx.write_status(d, status)


def _max_unavailable(spec: dict, replicas: int) -> int:
    """As Kubernetes' deployment controller: only a RollingUpdate may run short of replicas (a Recreate Deployment is
    Available only when all its replicas are), and a percentage rounds down."""
    strat = spec.get("strategy") or {}
    if strat.get("type", "RollingUpdate") != "RollingUpdate" or not replicas:
        return 0
    v = ((strat.get("rollingUpdate") or {}).get("maxUnavailable", "25%"))
    if isinstance(v, str) and v.endswith("%"):
        return int(replicas * int(v[:-1]) // 100)
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


# ------------------------------------------------------------------------------------------------ StatefulSet
class StatefulSetController:
    name = "statefulset-controller"
    watches = (STATEFULSET, POD, PVC)

    def __init__(self, ctx):
        self.ctx = ctx

    def reconcile(self) -> None:
        ctx = self.ctx
        pods = pods_by_owner(ctx.list_items(POD))
        for s in ctx.list_items(STATEFULSET):
            if is_deleting(s):
                continue
            try:
                self._sync(s, owned_pods(pods, s))
            except Exception as exc:
                ctx._error("statefulset-sync", STATEFULSET, s["metadata"]["name"], exc)

    def _sync(self, s: dict, pods: list[dict]) -> None:
        ctx = self.ctx
        spec = s.get("spec") or {}
        name, ns = s["metadata"]["name"], s["metadata"]["namespace"]
        replicas = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        template = spec.get("template") or {}
        rev = f"{name}-{template_hash(template)}"
        live = {p["metadata"]["name"]: p for p in pods if not is_deleting(p)}
        # finished or outdated pods are deleted (and recreated below on the next pass)
        for pname, p in list(live.items()):
            outdated = (p["metadata"].get("labels") or {}).get("controller-revision-hash") != rev
            if is_terminal(p) or outdated:
                if ctx.delete(POD, pname, ns):
                    ctx.event(s, "Normal", "SuccessfulDelete", f"delete Pod {pname} in StatefulSet {name} successful",
                              self.name)
                del live[pname]
        # scale down: highest ordinal first
        for pname in sorted(live, key=lambda name: -_ordinal(name)):
            if _ordinal(pname) >= replicas:
                if ctx.delete(POD, pname, ns):
                    ctx.event(s, "Normal", "SuccessfulDelete", f"delete Pod {pname} in StatefulSet {name} successful",
                              self.name)
                del live[pname]
        for i in range(replicas):
            pname = f"{name}-{i}"
            if pname in live:
                continue
            claims = self._ensure_pvcs(s, i)
            labels = {"statefulset.kubernetes.io/pod-name": pname, "apps.kubernetes.io/pod-index": str(i),
                      "controller-revision-hash": rev}
            pod = build_pod(ctx, s, template, pname, labels=labels)
            pod["spec"].setdefault("hostname", pname)
            if spec.get("serviceName"):
                pod["spec"].setdefault("subdomain", spec["serviceName"])
            vols = pod["spec"].setdefault("volumes", [])
            have = {v.get("name") for v in vols}
            for vname, cname in claims:
                if vname not in have:
                    vols.append({"name": vname, "persistentVolumeClaim": {"claimName": cname}})
            if not vols:
                pod["spec"].pop("volumes")
            res = create_pod(ctx, pod)
            if res is not None:
                live[pname] = res
                ctx.event(s, "Normal", "SuccessfulCreate", f"create Pod {pname} in StatefulSet {name} successful",
                          self.name)
        pods_now = list(live.values())
        ready = sum(1 for p in pods_now if is_ready(p))
        current = sum(1 for p in pods_now if (p["metadata"].get("labels") or {}).get("controller-revision-hash") == rev)
        status = deep_copy(s.get("status") or {})
        status.update({
            "observedGeneration": s["metadata"].get("generation", 1),
            "replicas": len(pods_now),
            "readyReplicas": ready,
            "currentReplicas": current,
            "updatedReplicas": current,
            "availableReplicas": ready,
            "currentRevision": rev,
            "updateRevision": rev,
            "collisionCount": 0,
        })
        for k in ("readyReplicas", "currentReplicas", "updatedReplicas"):
            if not status[k]:
                status.pop(k)
        ctx.write_status(s, status)

    def _ensure_pvcs(self, s: dict, i: int) -> list[tuple[str, str]]:
        ctx = self.ctx
        name, ns = s["metadata"]["name"], s["metadata"]["namespace"]
        out = []
        sel = ((s.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        for tpl in (s.get("spec") or {}).get("volumeClaimTemplates") or []:
            tname = (tpl.get("metadata") or {}).get("name")
            if not tname:
                continue
            cname = f"{tname}-{name}-{i}"
            out.append((tname, cname))
            if ctx.get(PVC, cname, ns) is not None:
                continue
            tspec = deep_copy(tpl.get("spec") or {})
            tspec.setdefault("accessModes", ["ReadWriteOnce"])
            tspec.setdefault("storageClassName", "standard")
            tspec.setdefault("volumeMode", "Filesystem")
            tspec["volumeName"] = f"pvc-{short_hash(ns + '/' + cname, 8)}-{short_hash(cname, 4)}-sandbox"
            labels = dict((tpl.get("metadata") or {}).get("labels") or {})
            labels.update(sel)
            pvc = {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": cname, "namespace": ns, "labels": labels,
                             "annotations": {"pv.kubernetes.io/bind-completed": "yes",
                                             "pv.kubernetes.io/bound-by-controller": "yes",
                                             "volume.kubernetes.io/storage-provisioner": "sandbox.gpuportal.dev/hostpath"}},
                "spec": tspec,
            }
            created = ctx.create(pvc)
            if created is not None:
                req = ((tspec.get("resources") or {}).get("requests") or {}).get("storage")
                st = {"phase": "Bound", "accessModes": list(tspec["accessModes"]),
                      "capacity": {"storage": req} if req else {}}
                ctx.write_status(created, st)
                ctx.event(s, "Normal", "SuccessfulCreate",
                          f"create Claim {cname} Pod {name}-{i} in StatefulSet {name} success", self.name)
        return out


def _ordinal(pod_name: str) -> int:
    try:
        return int(pod_name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


# ------------------------------------------------------------------------------------------------ kubelet
class Kubelet:
    """Runs bound pods through Pending -> Running -> Succeeded/Failed in simulated time.

    Incremental: a pass syncs the pods that changed since the last pass (informer listener; any Node change: all
    pods) and the pods whose next transition or progress-log line is due (a heap of due times, simulated epoch
    seconds); a pod outside those sets would sync to a no-op."""

    name = "kubelet"

    def __init__(self, ctx, start_delay: float = START_DELAY_SECONDS):
        self.ctx = ctx
        self.start_delay = start_delay
        self._lock = threading.Lock()
        self._dirty: set[tuple[str, str]] = set()
        self._all = True
        self._epoch = None
        self._heap: list[tuple[float, tuple[str, str]]] = []
        self._due: dict[tuple[str, str], float] = {}
        ctx.informer.listen(self._on_change)

    def _on_change(self, gvk, etype: str, new: dict, old: dict | None) -> None:
        if gvk == POD:
            m = new.get("metadata") or {}
            with self._lock:
                self._dirty.add((m.get("namespace") or "", m.get("name") or ""))
        elif gvk == NODE:
            with self._lock:
                self._all = True

    def reconcile(self) -> None:
        ctx = self.ctx
        inf = ctx.informer
        now = ctx.now().timestamp()
        with self._lock:
            full = self._all or inf.epoch != self._epoch
            self._all, self._epoch = False, inf.epoch
            keys, self._dirty = self._dirty, set()
        while self._heap and self._heap[0][0] <= now:
            due, key = heapq.heappop(self._heap)
            if self._due.get(key) == due:
                del self._due[key]
                keys.add(key)
        if full:
            pods = ctx.list_items(POD)
            self._heap, self._due = [], {}
        elif not keys:
            return
        else:
            pods = [p for p in (inf.get(POD, k[1], k[0]) for k in sorted(keys)) if p is not None]
        nodes = {n["metadata"]["name"]: n for n in ctx.list_items(NODE)}
        for pod in pods:
            node_name = (pod.get("spec") or {}).get("nodeName")
            if not node_name or is_terminal(pod) or is_deleting(pod):
                continue
            node = nodes.get(node_name)
            if node is None:
                continue
            key = (pod["metadata"].get("namespace") or "", pod["metadata"]["name"])
            before = ctx.error_count
            try:
                self._sync(pod, node)
            except Exception as exc:
                ctx._error("kubelet", POD, pod["metadata"]["name"], exc)
            if ctx.error_count != before:
                with self._lock:
                    self._dirty.add(key)
                continue
            self._schedule_next(key, now)

    def _schedule_next(self, key: tuple[str, str], now: float) -> None:
        """Remember when the pod (as now stored) next needs a pass: start, finish or the next progress-log line."""
        pod = self.ctx.informer.get(POD, key[1], key[0])
        if pod is None or is_terminal(pod) or is_deleting(pod):
            return
        status = pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        due = None
        if phase == "Pending":
            sched = find_condition(status.get("conditions"), "PodScheduled")
            bound_at = parse_time((sched or {}).get("lastTransitionTime")) or parse_time(
                pod["metadata"].get("creationTimestamp"))
            due = (bound_at.timestamp() if bound_at else now) + self.start_delay
        elif phase == "Running":
            started = _running_since(status)
            if started is None:
                return
            dur = pod_duration(pod)
            have = sum(1 for ln in self.ctx.logs.get(key) or [] if logtext.is_progress(ln))
            due = started + (have + 1) * LOG_EVERY_SECONDS  # the next progress line not written yet
            if dur is not None:
                due = min(due, started + dur)
        if due is None:
            return
        # (a due time already past — more log lines due than one pass writes — is taken on the next pass)
        if self._due.get(key) == due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))

    def _sync(self, pod: dict, node: dict) -> None:
        ctx = self.ctx
        now_dt = ctx.now()
        status = deep_copy(pod.get("status") or {})
        conds = status.setdefault("conditions", [])
        sched = find_condition(conds, "PodScheduled")
        bound_at = parse_time((sched or {}).get("lastTransitionTime")) or parse_time(
            pod["metadata"].get("creationTimestamp")) or now_dt
        host_ip = next((a["address"] for a in (node.get("status") or {}).get("addresses") or []
                        if a.get("type") == "InternalIP"), "10.0.0.1")
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        containers = (pod.get("spec") or {}).get("containers") or []
        phase = status.get("phase") or "Pending"
        events = []
        if phase == "Pending":
            if sched is None:  # created with spec.nodeName: no scheduler involved
                set_condition(conds, "PodScheduled", "True", "", "", format_time(bound_at), lastProbeTime=None)
                for c in conds:
                    if c["type"] == "PodScheduled":
                        c.pop("reason", None)
                        c.pop("message", None)
            if not status.get("startTime"):
                status["startTime"] = format_time(bound_at)
                status["hostIP"] = host_ip
                status["hostIPs"] = [{"ip": host_ip}]
                set_condition(conds, "PodReadyToStartContainers", "False", "", "", format_time(bound_at),
                              lastProbeTime=None)
                set_condition(conds, "Initialized", "True", "", "", format_time(bound_at), lastProbeTime=None)
                set_condition(conds, "Ready", "False", "ContainersNotReady",
                              f"containers with unready status: [{' '.join(c['name'] for c in containers)}]",
                              format_time(bound_at), lastProbeTime=None)
                set_condition(conds, "ContainersReady", "False", "ContainersNotReady",
                              f"containers with unready status: [{' '.join(c['name'] for c in containers)}]",
                              format_time(bound_at), lastProbeTime=None)
                status["containerStatuses"] = [
                    {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
                     "started": False, "state": {"waiting": {"reason": "ContainerCreating"}}}
                    for c in containers
                ]
                for c in containers:
                    events.append(("Pulling", f'Pulling image "{c.get("image", "")}"'))
            started_at = bound_at.timestamp() + self.start_delay
            if now_dt.timestamp() >= started_at:
                t = format_time(_dt(started_at))
                phase = "Running"
                status["phase"] = "Running"
                ip = _pod_ip(node, pod)
                status["podIP"] = ip
                status["podIPs"] = [{"ip": ip}]
                for ctype in ("PodReadyToStartContainers", "Ready", "ContainersReady"):
                    set_condition(conds, ctype, "True", "", "", t, lastProbeTime=None)
                for c in conds:
                    if c["type"] in ("PodReadyToStartContainers", "Ready", "ContainersReady", "Initialized"):
                        c.pop("reason", None)
                        c.pop("message", None)
                status["containerStatuses"] = [
                    {"name": c["name"], "image": c.get("image", ""),
                     "imageID": f"{c.get('image', '')}@sha256:{short_hash(c.get('image', ''), 64)}",
                     "containerID": f"containerd://{short_hash(uid_of(pod) + c['name'], 64)}",
                     "ready": True, "restartCount": 0, "started": True, "state": {"running": {"startedAt": t}}}
                    for c in containers
                ]
                for c in containers:
                    events.append(("Pulled", f'Successfully pulled image "{c.get("image", "")}" in 1.2s (1.2s including waiting). Image size: 1024 bytes.'))
                    events.append(("Created", f"Created container: {c['name']}"))
                    events.append(("Started", f"Started container {c['name']}"))
                gpus = {k: v for k, v in R.pod_requests(pod.get("spec")).items() if R.is_gpu_resource(k)}
                at = _dt(started_at)
                visible = ", ".join(f"{k}={R.fmt(k, v)}" for k, v in sorted(gpus.items()))
                for line in logtext.start_lines(pod, node["metadata"]["name"], visible, pod_duration(pod), at):
                    ctx.log(ns, name, line, at)
        if phase == "Running":
            started = _running_since(status)
            dur = pod_duration(pod)
            self._progress_logs(pod, started, now_dt.timestamp(), dur)
            if dur is not None and started is not None and now_dt.timestamp() >= started + dur:
                fin = format_time(_dt(started + dur))
                failed = str(((pod.get("metadata") or {}).get("annotations") or {}).get(OUTCOME_ANNOTATION, "")).lower() == "failed"
                code = 1 if failed else 0
                status["phase"] = "Failed" if failed else "Succeeded"
                for ctype in ("Ready", "ContainersReady"):
                    set_condition(conds, ctype, "False", "PodFailed" if failed else "PodCompleted", "", fin,
                                  lastProbeTime=None)
                set_condition(conds, "PodReadyToStartContainers", "False", "", "", fin, lastProbeTime=None)
                for c in conds:
                    if c["type"] in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
                        c.pop("message", None)
                        if c["type"] == "PodReadyToStartContainers":
                            c.pop("reason", None)
                for cs in status.get("containerStatuses") or []:
                    run = (cs.get("state") or {}).get("running") or {}
                    cs["state"] = {"terminated": {"exitCode": code, "reason": "Error" if failed else "Completed",
                                                  "startedAt": run.get("startedAt", fin), "finishedAt": fin,
                                                  "containerID": cs.get("containerID", "")}}
                    cs["ready"] = False
                    cs["started"] = False
                at = _dt(started + dur)
                ctx.log(ns, name, logtext.end_line(pod, failed, at), at)
        ctx.write_status(pod, status)
        for reason, msg in events:
            ctx.event(pod, "Normal", reason, msg, "kubelet", host=node["metadata"]["name"])

    def _progress_logs(self, pod, started, now, dur) -> None:
        if started is None:
            return
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        lines = self.ctx.logs.get((ns, name)) or []
        have = sum(1 for ln in lines if logtext.is_progress(ln))
        end = now if dur is None else min(now, started + dur)
        due = int((end - started) // LOG_EVERY_SECONDS)
        for k in range(have + 1, min(due, have + 200) + 1):
            at = _dt(started + k * LOG_EVERY_SECONDS)
            self.ctx.log(ns, name, logtext.progress_line(pod, k, dur, LOG_EVERY_SECONDS, at), at)


def _dt(ts: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC)


def _running_since(status: dict) -> float | None:
    for cs in status.get("containerStatuses") or []:
        t = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
        if t:
            pt = parse_time(t)
            return pt.timestamp() if pt else None
    return None


def _pod_ip(node: dict, pod: dict) -> str:
    cidr = (node.get("spec") or {}).get("podCIDR") or "10.244.0.0/24"
    base = cidr.split("/")[0].rsplit(".", 1)[0]
    n = int(short_hash(uid_of(pod) or pod["metadata"]["name"], 4), 16) % 250 + 2
    return f"{base}.{n}"


# ------------------------------------------------------------------------------------------------ GC
class GarbageCollector:
    name = "garbage-collector"
    OWNER_KINDS = {("batch/v1", "Job"): JOB, ("apps/v1", "Deployment"): DEPLOYMENT,
                   ("apps/v1", "StatefulSet"): STATEFULSET, ("batch.volcano.sh/v1alpha1", "Job"): VC_JOB,
                   ("v1", "Pod"): POD}
    watches = (JOB, DEPLOYMENT, STATEFULSET, VC_JOB, POD, WORKLOAD, VC_PODGROUP)

    def __init__(self, ctx):
        self.ctx = ctx

    def reconcile(self) -> None:
        ctx = self.ctx
        uids = set()
        for gvk in self.OWNER_KINDS.values():
            uids.update(uid_of(o) for o in ctx.list_items(gvk))
        pods = ctx.list_items(POD)
        for gvk, objs in ((POD, pods), (WORKLOAD, ctx.list_items(WORKLOAD)), (VC_PODGROUP, ctx.list_items(VC_PODGROUP))):
            for o in objs:
                ref = controller_ref(o)
                if ref is None and gvk == WORKLOAD:  # a plain pod group's Workload: goes with the last of its pods
                    refs = (o.get("metadata") or {}).get("ownerReferences") or []
                    if refs and all(r.get("kind") == "Pod" and r.get("uid") not in uids for r in refs) \
                            and not is_deleting(o):
                        ctx.delete(gvk, o["metadata"]["name"], o["metadata"].get("namespace"))
                    continue
                if ref is None or (ref.get("apiVersion"), ref.get("kind")) not in self.OWNER_KINDS:
                    continue
                if ref.get("uid") not in uids and not is_deleting(o):
                    ctx.delete(gvk, o["metadata"]["name"], o["metadata"].get("namespace"))
        live = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}
        for k in [k for k in ctx.logs if k not in live]:
            del ctx.logs[k]

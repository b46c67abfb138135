"""The status follower: the cluster says what happens to a request's objects, this moves the request along.

It follows seven kinds — Kueue Workloads, batch/v1 Jobs, Volcano Jobs, Deployments, StatefulSets, Pods (ours
carry the ``gpuportal.dev/request`` label; Workloads and Events are matched by their owner's / object's name,
``req-<pk>``) and Warning Events — with *list, then watch from the list's resourceVersion*. A cycle watches
every kind from where the last one stopped (in parallel, for ``watch_seconds``), so what it reads, the cluster
calls it makes and the database writes it does grow with the number of changes, not of requests. A dropped
connection is resumed from the last resourceVersion seen; an expired one (410) re-lists that kind; every
``resync_seconds`` everything is re-listed and compared (an unchanged request is not written).

Per request we keep a small summary of its objects in ``request.cluster_status`` (conditions, phases, counts;
no timestamps, so an object that changed nothing we care about changes nothing), and derive the state from it
(docs/cluster-objects.md, "Submitting work and following it", "Volcano"):

* Workload ``Finished=True`` → succeeded / failed (checked first: Kueue keeps ``Admitted`` on finished ones);
  Job ``Complete`` / ``Failed`` likewise; Volcano ``Completed`` → succeeded, ``Failed``/``Aborted``/``Terminated``
  → failed.
* A Workload newly ``Evicted`` (its ``schedulingStats.evictions`` count went up), or a running Volcano Job
  ``Restarting`` → preempted, then queued again (Kueue requeues it), then running once its pods run again.
* Running: a pod of it runs (Job, StatefulSet), at least one replica is ready (Deployment), Volcano ``Running``.
* Otherwise it waits: queued, with the answer to "why is it pending?" (``workloads/pending.py``).

Requests whose top-level object disappeared while active (deleted outside the portal) fail — except a Job the
cluster's TTL controller removed after it finished (``ttlSecondsAfterFinished``): the DELETED event carries its
final state, which counts. Requests that already ended are never followed again, so a finished request whose
Job is later removed keeps its state; the portal keeps the record. Jobs and Volcano Jobs carry our finalizer
``gpu-portal.io/outcome``: a deletion (the TTL controller's, a hand delete) leaves them, final status and all, until
this follower recorded the outcome and billing saw the objects; then ``_release_outcomes`` takes it off
(docs/architecture.md, "Outcomes survive the follower").
Each cluster is followed in isolation (``follow_one``): an error in one is logged and recorded on the cluster
(``health``, ``last_error``) and the other clusters' cycles run on. Only
``states.move`` changes a state, so the follower, a user's stop and the materializer never fight.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import F, OuterRef, Subquery
from django.utils import timezone

from portal.events import after_commit
from portal.extensions import usage_meter
from portal.kube import ClusterRejected, ClusterUnavailable, Kube, kube_for

from portal.labels import INSTALLATION_LABEL, OUTCOME_FINALIZER, REQUEST_LABEL
from portal.leases import Lease

from . import kinds, notify
from .kinds import uses_volcano
from .manifests import cluster_queue_name, installation_id, volcano_queue_name
from .models import Reclaim, RequestEvent, RequestState, WorkloadRequest
from .pending import request_pending_reason, topology_hosts
from .preemption import preemption_of
from .states import ACTIVE, move

logger = logging.getLogger(__name__)
S = RequestState
ACTOR = "cluster"
KUEUE = "kueue.x-k8s.io/v1beta2"
VOLCANO_QUEUE = "scheduling.volcano.sh/v1beta1"
NAME_RE = re.compile(r"(?:^|-)req-(\d+)(?:-|$)")
WORKLOAD_CONDITIONS = ("QuotaReserved", "Admitted", "Evicted", "Preempted", "Requeued", "Finished")
JOB_CONDITIONS = ("Complete", "Failed", "Suspended")
VOLCANO_DONE = {"Completed": S.SUCCEEDED, "Completing": S.SUCCEEDED, "Failed": S.FAILED, "Aborted": S.FAILED,
                "Aborting": S.FAILED, "Terminated": S.FAILED, "Terminating": S.FAILED}
TOP_LEVEL = kinds.FOLLOWABLE  # every top-level object a kind may follow (workloads/kinds/: Kind.follows)
# The objects that carry our OUTCOME_FINALIZER (manifests.metadata(outcome=True)): the only ones the follower patches.
OUTCOME_KINDS = (("batch/v1", "Job"), ("batch.volcano.sh/v1alpha1", "Job"))
MISSING_GRACE = timedelta(seconds=60)
# "Why is it pending?" also depends on the ClusterQueue's usage and on who is ahead, which change without any event
# of the waiting request's own objects: every PENDING_REFRESH_SECONDS the follower reads the ClusterQueues that
# waiting requests use and rewrites the sentences of those whose queue changed: the PENDING_REFRESH_MAX longest
# waiting (the heads of the queues, next to run), so that a deep queue never delays the following of the cluster.
PENDING_REFRESH_SECONDS = 10
PENDING_REFRESH_MAX = 200
WARNINGS_KEPT = 3


@dataclass(frozen=True)
class Followed:
    key: str
    api_version: str
    kind: str
    labelled: bool = True  # carries our request label (else matched by name)

    @property
    def selector(self) -> str | None:
        return REQUEST_LABEL if self.labelled else None


FOLLOWED: tuple[Followed, ...] = (
    Followed("workload", KUEUE, "Workload", labelled=False),
    Followed("job", "batch/v1", "Job"),
    Followed("vcjob", "batch.volcano.sh/v1alpha1", "Job"),
    Followed("deployment", "apps/v1", "Deployment"),
    Followed("statefulset", "apps/v1", "StatefulSet"),
    Followed("pod", "v1", "Pod"),
    Followed("event", "v1", "Event", labelled=False),
)


# ------------------------------------------------------------------------------------------------ pure parts
def request_id_of(f: Followed, obj: dict[str, Any]) -> int | None:
    meta = obj.get("metadata") or {}
    if f.labelled:
        value = (meta.get("labels") or {}).get(REQUEST_LABEL, "")
        return int(value) if str(value).isdigit() else None
    names = [ref.get("name", "") for ref in meta.get("ownerReferences") or []]
    if f.key == "event":
        names = [(obj.get("involvedObject") or {}).get("name", "")]
    for name in names:
        match = NAME_RE.search(name or "")
        if match:
            return int(match.group(1))
    return None


def _conditions(status: dict[str, Any], wanted: Iterable[str]) -> dict[str, list[str]]:
    keep = set(wanted)
    return {
        c["type"]: [str(c.get("status", "")), str(c.get("reason") or ""), str(c.get("message") or "")[:300]]
        for c in status.get("conditions") or []
        if c.get("type") in keep
    }


def summarize(key: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What we keep of an object: only what the state mapping and the pending sentence read."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if key == "workload":
        evictions = sum(int(e.get("count") or 0) for e in (status.get("schedulingStats") or {}).get("evictions") or [])
        out = {"c": _conditions(status, WORKLOAD_CONDITIONS), "ev": evictions,
               "cq": (status.get("admission") or {}).get("clusterQueue", ""),
               "uid": str((obj.get("metadata") or {}).get("uid") or "")}
        # Kueue TAS: the hosts it placed the pods on (host -> pods; the page says which rack and block).
        hosts: dict[str, int] = {}
        for psa in (status.get("admission") or {}).get("podSetAssignments") or []:
            for host, pods in topology_hosts(psa.get("topologyAssignment")).items():
                hosts[host] = hosts.get(host, 0) + pods
        if hosts:
            out["topo"] = dict(sorted(hosts.items())[:50])
        # The flavors Kueue admitted it on (where Kueue chose between flavors, the request's flavor follows them).
        admitted_on = sorted({str(name) for psa in (status.get("admission") or {}).get("podSetAssignments") or []
                              for name in (psa.get("flavors") or {}).values()})
        if admitted_on:
            out["fl"] = admitted_on[:8]
        # Kueue MultiKueue on a manager cluster: the worker it was dispatched to, and its admission checks' word
        if status.get("clusterName"):
            out["worker"] = str(status["clusterName"])[:253]
        checks = [[str(c.get("name") or ""), str(c.get("state") or ""), str(c.get("message") or "")[:300]]
                  for c in (status.get("admissionChecks") or [])[:5]]
        if checks:
            out["checks"] = checks
        return out
    if key == "job":
        return {"c": _conditions(status, JOB_CONDITIONS), "active": status.get("active", 0), "ready": status.get("ready", 0),
                "succeeded": status.get("succeeded", 0), "failed": status.get("failed", 0), "suspend": bool(spec.get("suspend"))}
    if key == "vcjob":
        state = status.get("state") or {}
        return {"phase": state.get("phase") or "Pending", "msg": str(state.get("message") or state.get("reason") or "")[:300],
                "retry": status.get("retryCount", 0), "running": status.get("running", 0)}
    if key in ("deployment", "statefulset"):
        return {"replicas": spec.get("replicas", 1), "ready": status.get("readyReplicas", 0) or 0}
    if key == "pod":
        sched = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        # A pod on its way out (preemption, stop) no longer counts as running.
        phase = "Terminating" if (obj.get("metadata") or {}).get("deletionTimestamp") else status.get("phase") or "Pending"
        return {"phase": phase,
                "sched": [str(sched.get("status")), str(sched.get("reason") or ""), str(sched.get("message") or "")[:300]]
                if sched else None}
    raise ValueError(key)


def dispatched_worker(cluster_status: dict[str, Any] | None) -> str | None:
    """Kueue MultiKueue: the worker cluster the request's Workload was dispatched to (its ``status.clusterName`` on
    a manager cluster, as the follower last read it), else None."""
    objects = (cluster_status or {}).get("objects") or {}
    return next((str(v["worker"]) for k, v in sorted(objects.items())
                 if k.startswith("workload/") and isinstance(v, dict) and v.get("worker")), None)


def object_key(f: Followed, obj: dict[str, Any]) -> str:
    name = (obj.get("metadata") or {}).get("name", "")
    return f"{f.key}/{name}" if f.key in ("workload", "pod") else f.key


# Kueue's eviction message names the preemptor by its Workload's UID ("Preempted to accommodate a workload (UID:
# <uid>, JobUID: <uid>) due to reclamation within the cohort; ..."; older Kueue: "(UID: <uid>) due to ...").
RECLAIM_RE = re.compile(r"to accommodate a workload \(UID: ([^,)\s]+)[^)]*\) due to reclamation within the cohort")
def reclaimed_for(message: str | None) -> str | None:
    """The lender's Workload UID when ``message`` is Kueue's eviction for a reclaim within the cohort, else None."""
    found = preemption_of(message)
    return found.uid if found is not None and found.why == "reclaim" else None


def current_workload_uid(objects: dict[str, dict[str, Any]]) -> str:
    """The UID of the request's current Kueue Workload (an unfinished one first), or ""."""
    uids = [(((v.get("c") or {}).get("Finished") or [""])[0] == "True", v.get("uid") or "")
            for k, v in objects.items() if k.startswith("workload/")]
    return next((uid for _, uid in sorted(uids) if uid), "")


def admitted_flavor(objects: dict[str, dict[str, Any]], choice: list[str]) -> str:
    """The flavor among ``choice`` that Kueue admitted the request's current Workload on (its admission's
    ``podSetAssignments[].flavors``, as summarized), or "" (not admitted, or pinned)."""
    uid = current_workload_uid(objects)
    for key, summary in objects.items():
        if key.startswith("workload/") and summary.get("uid", "") == uid:
            return next((name for name in summary.get("fl") or () if name in choice), "")
    return ""


def _kueue_chose(req: WorkloadRequest, objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Where Kueue chose between flavors for ``req`` (``kueue_flavors``): the fields that make the request say the
    flavor it was admitted on (``flavor``, ``spilled``, ``spilled_from_model``), with a timeline entry; {} when nothing
    changed. The request page, the API and billing then name the model that ran."""
    choice = [c for c in req.kueue_flavors or [] if isinstance(c, dict) and c.get("name")]
    if len(choice) < 2:
        return {}
    name = admitted_flavor(objects, [c["name"] for c in choice])
    if not name or name == req.flavor.name:
        return {}
    from quotas.models import Flavor

    flavor = Flavor.objects.filter(cluster_id=req.cluster_id, name=name).first()
    if flavor is None:
        return {}
    first = (list(req.accepted_models or ()) or [choice[0].get("model") or ""])[0]
    model = flavor.gpu_model or flavor.name
    spilled = model != first
    why = f": {first} was full there; the job consented and the project allows {model}." if spilled else "."
    RequestEvent.objects.create(request=req, actor_label=ACTOR,
                                message=f"Kueue admitted it on {model} (flavor {name}) in its queue's flavor order{why}"[:1000])
    req.flavor, req.spilled, req.spilled_from_model = flavor, spilled, first if spilled else ""
    return {"flavor": flavor, "spilled": spilled, "spilled_from_model": req.spilled_from_model}


def reclaims_link(*, uids: Iterable[str] = (), admitted: Iterable[int] = ()) -> int:
    """Link recorded reclaims to their lender (the request whose Workload has the preemptor's UID), with when the
    lender's run started waiting; and stamp the lender's admission on the reclaims of its current run. Rows written."""
    written = 0
    uids = {u for u in uids if u}
    if uids:
        lenders = {r.workload_uid: r for r in WorkloadRequest.objects.filter(workload_uid__in=uids)
                   .only("pk", "workload_uid", "queued_at", "admitted_at")}
        for reclaim in Reclaim.objects.filter(lender__isnull=True, preemptor_uid__in=list(lenders)):
            lender = lenders[reclaim.preemptor_uid]
            admitted_at = (lender.admitted_at if lender.admitted_at and lender.queued_at
                           and lender.admitted_at >= lender.queued_at else None)
            written += Reclaim.objects.filter(pk=reclaim.pk, lender__isnull=True).update(
                lender=lender, lender_queued_at=lender.queued_at, lender_admitted_at=admitted_at)
    admitted = set(admitted)
    if admitted:
        lender_admitted = WorkloadRequest.objects.filter(pk=OuterRef("lender_id")).values("admitted_at")[:1]
        written += (Reclaim.objects.filter(lender_id__in=admitted, lender_admitted_at__isnull=True,
                                           lender__admitted_at__isnull=False,
                                           lender__queued_at=F("lender_queued_at"))
                    .update(lender_admitted_at=Subquery(lender_admitted)))
    return written


def newly_evicted(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """The eviction message when a Workload was evicted since we last looked at it, else None."""
    evicted = (new.get("c") or {}).get("Evicted") or ["", "", ""]
    if old is not None:
        if int(new.get("ev") or 0) > int(old.get("ev") or 0):
            return evicted[2] or "evicted by Kueue"
        return None
    admitted = ((new.get("c") or {}).get("Admitted") or [""])[0] == "True"
    if evicted[0] == "True" and not admitted:
        return evicted[2] or "evicted by Kueue"
    return None


def pods_running(n: int) -> str:
    return f"{n} pod running" if n == 1 else f"{n} pods running"


@dataclass(frozen=True)
class Derived:
    state: str
    reason: str


def derive(kind: str, objects: dict[str, dict[str, Any]]) -> Derived:
    """The request state the cluster's objects say (docs/cluster-objects.md). Finished before admitted."""
    workloads = [v for k, v in objects.items() if k.startswith("workload/")]
    for wl in workloads:
        fin = (wl.get("c") or {}).get("Finished")
        if fin and fin[0] == "True":
            if fin[1] == "Succeeded":
                return Derived(S.SUCCEEDED, f"Finished: {fin[2] or 'succeeded'}.")
            return Derived(S.FAILED, f"Failed: {fin[2] or fin[1]}.")
    job = objects.get("job")
    if job:
        conds = job.get("c") or {}
        if (conds.get("Complete") or [""])[0] == "True":
            return Derived(S.SUCCEEDED, "Finished: the Job completed.")
        if (conds.get("Failed") or [""])[0] == "True":
            failed = conds["Failed"]
            return Derived(S.FAILED, f"Failed: {failed[2] or failed[1] or 'the Job failed'}.")
    pods = [v for k, v in objects.items() if k.startswith("pod/")]
    running = sum(1 for p in pods if p.get("phase") == "Running")
    worker = next((w["worker"] for w in workloads if w.get("worker")), "")
    if worker and not running:  # MultiKueue: the pods run on the worker; the manager's Job mirrors their count
        running = int((job or {}).get("active") or 0)
    vc = objects.get("vcjob")
    if vc:
        phase = vc.get("phase") or "Pending"
        if phase in VOLCANO_DONE:
            done = VOLCANO_DONE[phase]
            text = vc.get("msg") or phase.lower()
            return Derived(done, f"Finished: {text}." if done == S.SUCCEEDED else f"Failed: Volcano job {phase.lower()}: {text}.")
        if phase == "Restarting":
            return Derived(S.PREEMPTED, f"Volcano restarts the gang: {vc.get('msg') or 'a pod was evicted or failed'}.")
        if phase == "Running":
            return Derived(S.RUNNING, f"Volcano scheduled the gang; {pods_running(int(vc.get('running') or running))}.")
        return Derived(S.QUEUED, "Waiting in the Volcano queue.")
    # Kueue's word first: a pod still shown running while its Workload was just evicted is on its way out.
    admitted = not workloads or any(((w.get("c") or {}).get("Admitted") or [""])[0] == "True" for w in workloads)
    kind_derive = kinds.get(kind).derive  # the kind's reading of its own top-level object (workloads/kinds/)
    if kind_derive is not None:
        state, reason = kind_derive(objects, admitted, running)
        return Derived(state, reason)
    if admitted and running and not (job or {}).get("suspend"):
        if worker:
            return Derived(S.RUNNING, f"Admitted; dispatched by MultiKueue to worker {worker}; {pods_running(running)}.")
        return Derived(S.RUNNING, f"Admitted; {pods_running(running)}.")
    return Derived(S.QUEUED, "Waiting for admission.")


# ------------------------------------------------------------------------------------------------ the follower
@dataclass
class CycleStats:
    events: int = 0
    requests_touched: int = 0
    db_writes: int = 0
    moves: int = 0
    cluster_calls: int = 0
    resynced: bool = False
    errors: list[str] = field(default_factory=list)


@dataclass
class _Tracked:
    request: WorkloadRequest
    original: dict[str, Any]
    status: dict[str, Any]
    changed: bool = False
    admitted: Any = None  # when the current run's admission was first seen in this cycle: ``_save`` stamps it
    reclaimed_for: str = ""  # the lender's Workload UID when this cycle evicted the request to reclaim quota
    reason: str = ""  # the running request's line as the cluster says it now ("2 pods running"): ``_save`` keeps it
    preempted: bool = False  # this cycle moved it to preempted: ``_save`` tells the requester, once the UIDs are kept


def admitted_seen(objects: dict[str, dict[str, Any]]) -> bool:
    """Do the objects say the cluster admitted the current run? A Kueue Workload ``Admitted=True`` (not finished, and
    not on its way out: an evicted one may keep ``Admitted`` until its pods stop; Kueue resets ``Evicted`` when it
    admits it again), or a Volcano Job whose gang is scheduled (``Running``)."""
    for key, summary in objects.items():
        if key.startswith("workload/"):
            conds = summary.get("c") or {}
            if ((conds.get("Admitted") or [""])[0] == "True" and (conds.get("Finished") or [""])[0] != "True"
                    and (conds.get("Evicted") or [""])[0] != "True"):
                return True
    return (objects.get("vcjob") or {}).get("phase") == "Running"


def _state_key(cluster: Any, kube: Kube) -> str:
    # The API server's address is part of the key: resourceVersions mean nothing to another cluster.
    host = hashlib.sha256(str(getattr(kube.api.configuration, "host", "")).encode()).hexdigest()[:12]
    return f"workloads:follow:{cluster.pk}:{host}"


def followed_key(cluster_id: int) -> str:
    """Where a cycle leaves when it last completed (epoch seconds): ``gpuportal_follower_lag_seconds`` reads it."""
    return f"workloads:followed:{cluster_id}"


def followed_at(cluster_ids: list[int]) -> dict[int, float]:
    """When the follower of each cluster last completed a cycle (epoch seconds); a cluster never followed since the
    cache was emptied is left out. One read of the cache for them all."""
    found = cache.get_many([followed_key(pk) for pk in cluster_ids])
    return {pk: float(found[followed_key(pk)]) for pk in cluster_ids if found.get(followed_key(pk)) is not None}


class StatusFollower:
    """Follows one cluster. Keep one per process (``follow_cluster``), or rebuild it each cycle: the
    resourceVersions it resumes from are kept in the cache (a lost cache only costs one re-list)."""

    def __init__(self, cluster: Any, *, kube: Kube | None = None, watch_seconds: int = 1, resync_seconds: float = 300) -> None:
        self.cluster = cluster
        self.kube = kube or kube_for(cluster)
        self.watch_seconds = watch_seconds
        self.resync_seconds = resync_seconds
        self.state_key = _state_key(cluster, self.kube)
        saved = cache.get(self.state_key) or {}
        self.versions: dict[str, str] = dict(saved.get("versions") or {})
        self.resynced_at: float = float(saved.get("resynced_at") or 0)
        self.pending_at: float = float(saved.get("pending_at") or 0)
        self.queue_digests: dict[str, str] = dict(saved.get("queue_digests") or {})
        self.unserved: set[str] = set()
        self.broken: set[str] = set()  # the kinds whose watch broke in this cycle (``_follow``)

    # -- one cycle -------------------------------------------------------------------------------------------
    def cycle(self, *, resync: bool | None = None) -> CycleStats:
        stats = CycleStats()
        calls_before = sum(self.kube.calls.values())
        due = resync if resync is not None else (
            time.time() - self.resynced_at >= self.resync_seconds or any(
                f.key not in self.versions for f in FOLLOWED if f.key not in self.unserved))
        if due:
            self._resync(stats)
        else:
            self._follow(stats)
        if time.time() - self.pending_at >= PENDING_REFRESH_SECONDS:
            self._refresh_pending(stats)
        stats.cluster_calls = sum(self.kube.calls.values()) - calls_before
        cache.set(self.state_key, {"versions": self.versions, "resynced_at": self.resynced_at,
                                   "pending_at": self.pending_at, "queue_digests": self.queue_digests}, None)
        cache.set(followed_key(self.cluster.pk), time.time(), None)
        return stats

    def _refresh_pending(self, stats: CycleStats) -> None:
        """Rewrite the pending sentences of the waiting requests whose ClusterQueue changed since the last look (its
        usage, its quota) or whose queue's waiting requests changed (one left, one came): one GET per queue in use,
        and writes only where the sentence changed."""
        self.pending_at = time.time()
        waiting = list(WorkloadRequest.objects.filter(cluster=self.cluster, state__in=[S.QUEUED, S.PREEMPTED])
                       .select_related("flavor", "template", "project", "cluster").order_by("created_at")
                       [:PENDING_REFRESH_MAX])
        by_queue: dict[str, list[WorkloadRequest]] = defaultdict(list)
        for req in waiting:
            if not uses_volcano(req, req.cluster.architecture):
                by_queue[cluster_queue_name(_target_of(req))].append(req)
        digests: dict[str, str] = {}
        for name, reqs in by_queue.items():
            try:
                cq = self.kube.get(KUEUE, "ClusterQueue", name)
            except (ClusterUnavailable, ClusterRejected):
                continue
            # Who waits ahead is the portal's own reading (the requests still waiting), not the queue's: a request
            # that leaves the wait in a cycle where the queue's usage did not change must still move the others up.
            digest = hashlib.sha256(repr(((cq or {}).get("spec"), ((cq or {}).get("status") or {}).get(
                "flavorsUsage"), [(r.pk, r.priority) for r in reqs])).encode()).hexdigest()[:16]
            digests[name] = digest
            if self.queue_digests.get(name) == digest:
                continue
            for req, ahead in _ahead_of(reqs):
                sentence = request_pending_reason(req, cluster_queue=cq, volcano=False, ahead=ahead)
                if sentence != req.pending_reason:
                    stats.db_writes += WorkloadRequest.objects.filter(pk=req.pk, state=req.state).update(
                        pending_reason=sentence)
        self.queue_digests = digests

    def _list(self, f: Followed) -> list[dict[str, Any]] | None:
        try:
            items, version = self.kube.list(f.api_version, f.kind, label_selector=f.selector)
        except ClusterRejected as exc:
            if exc.status == 404:  # this cluster does not serve the kind (no Volcano): nothing to follow
                self.unserved.add(f.key)
                return None
            raise
        self.versions[f.key] = version
        return items

    def _watch(self, f: Followed) -> list[tuple[str, dict[str, Any]]] | None:
        """Events since our resourceVersion; None when it expired (410) and the kind must be re-listed."""
        events: list[tuple[str, dict[str, Any]]] = []
        try:
            for etype, obj in self.kube.watch(f.api_version, f.kind, resource_version=self.versions.get(f.key),
                                              timeout_seconds=self.watch_seconds, label_selector=f.selector):
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.versions[f.key] = version
                if etype != "BOOKMARK":
                    events.append((etype, obj))
        except ClusterRejected as exc:
            if exc.status in (410, 0) or exc.reason in ("Expired", "Gone"):
                return None
            raise
        except ClusterUnavailable as exc:
            # A dropped stream: keep what arrived; the next cycle resumes from the last version we saw.
            logger.info("watch %s on %s broke: %s", f.kind, self.cluster, exc)
            self.broken.add(f.key)
        return events

    def _follow(self, stats: CycleStats) -> None:
        kinds = [f for f in FOLLOWED if f.key not in self.unserved]
        self.broken = set()
        with ThreadPoolExecutor(max_workers=len(kinds)) as pool:
            results = dict(zip([f.key for f in kinds], pool.map(self._watch_safely, kinds), strict=True))
        if kinds and all(f.key in self.broken and not results[f.key] for f in kinds):
            # Every watch broke with nothing: is the cluster there at all? One list answers (else ClusterUnavailable
            # reaches ``follow_one``, which records the cluster unhealthy, as for a refused connection).
            self.kube.list(kinds[0].api_version, kinds[0].kind, label_selector=kinds[0].selector)
        expired = [f for f in kinds if results[f.key] is None]
        if expired:
            # Too far behind for a watch: a full resync is the simple, correct answer (rare).
            self._resync(stats)
            return
        batch = [(f, etype, obj) for f in kinds for etype, obj in results[f.key] or []]
        stats.events = len(batch)
        if not batch:
            return
        ids = {rid for f, _, obj in batch if (rid := request_id_of(f, obj)) is not None}
        tracked = self._load(ids)
        for f, etype, obj in batch:
            rid = request_id_of(f, obj)
            item = tracked.get(rid) if rid is not None else None
            if item is None:
                continue
            self._apply_event(item, f, etype, obj, stats)
        self._save(tracked.values(), stats)
        # Billing meters usage from the same objects (docs/billing.md); finished requests' events count too.
        usage_meter.call(cluster=self.cluster, seen=[(f.key, etype, obj, request_id_of(f, obj)) for f, etype, obj in batch])
        self._release_outcomes([(f, obj) for f, etype, obj in batch if etype != "DELETED"], stats)

    def _watch_safely(self, f: Followed) -> list[tuple[str, dict[str, Any]]] | None:
        try:
            return self._watch(f)
        except ClusterUnavailable as exc:
            logger.info("watch %s on %s failed: %s", f.kind, self.cluster, exc)
            self.broken.add(f.key)
            return []

    def _resync(self, stats: CycleStats) -> None:
        stats.resynced = True
        listed: dict[int, list[tuple[Followed, dict[str, Any]]]] = defaultdict(list)
        warnings: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for f in FOLLOWED:
            if f.key in self.unserved:
                continue
            items = self._list(f)
            for obj in items or []:
                rid = request_id_of(f, obj)
                if rid is None:
                    continue
                if f.key == "event":
                    if obj.get("type") == "Warning":
                        warnings[rid].append(obj)
                else:
                    listed[rid].append((f, obj))
        self.resynced_at = time.time()
        active = (
            WorkloadRequest.objects.filter(cluster=self.cluster, state__in=ACTIVE)
            .select_related("template", "flavor", "project", "cluster")
            .order_by("pk")
        )
        now = timezone.now()
        touched: list[_Tracked] = []
        for req in active.iterator(chunk_size=2000):
            item = _Tracked(req, req.cluster_status or {}, dict(req.cluster_status or {}))
            old_objects = dict(item.status.get("objects") or {})
            new_objects: dict[str, dict[str, Any]] = {}
            preempted = None
            for f, obj in listed.get(req.pk, []):
                key = object_key(f, obj)
                summary = summarize(f.key, obj)
                new_objects[key] = summary
                if f.key == "workload":
                    preempted = newly_evicted(old_objects.get(key), summary) or preempted
            item.status["objects"] = new_objects
            for event in sorted(warnings.get(req.pk, []), key=lambda e: e["metadata"].get("resourceVersion", "")):
                self._note_warning(item, event)
            stats.events += len(listed.get(req.pk, []))
            if not any(k in new_objects for k in TOP_LEVEL):
                if req.state in (S.QUEUED, S.RUNNING, S.PREEMPTED) and (req.queued_at or now) < now - MISSING_GRACE:
                    gone = kinds.get(req.template.kind).gone_message
                    if move(req, to=S.FAILED, actor_label=ACTOR, reason=gone):
                        stats.moves += 1
                continue
            self._transition(item, preempted, stats)
            touched.append(item)
        self._save(touched, stats)
        usage_meter.call(cluster=self.cluster, seen=[(f.key, "LISTED", obj, rid) for rid, pairs in listed.items()
                                                     for f, obj in pairs], complete=True)
        self._release_outcomes([pair for pairs in listed.values() for pair in pairs], stats)

    # -- outcomes the cluster waits for ----------------------------------------------------------------------------
    def _release_outcomes(self, seen: Iterable[tuple[Followed, dict[str, Any]]], stats: CycleStats) -> None:
        """Let go of the top-level objects the cluster wants to delete (``deletionTimestamp``: the TTL controller, a
        hand delete) that carry our ``OUTCOME_FINALIZER``, once their run's outcome is recorded. Runs after this
        cycle's moves and after billing was handed the same objects (so the usage interval is closed first).

        A request still active whose object is being deleted gets its outcome here: the object's own end when it
        finished (a Job the TTL controller removes), else failed ("deleted outside the portal"). Objects of another
        installation are left alone; an unchanged cluster has no such object, so this costs nothing then."""
        installation = installation_id()
        doomed: dict[int, list[tuple[Followed, dict[str, Any]]]] = defaultdict(list)
        for f, obj in seen:
            meta = obj.get("metadata") or {}
            if ((f.api_version, f.kind) in OUTCOME_KINDS and meta.get("deletionTimestamp")
                    and OUTCOME_FINALIZER in (meta.get("finalizers") or [])
                    and (meta.get("labels") or {}).get(INSTALLATION_LABEL) == installation
                    and (rid := request_id_of(f, obj)) is not None):
                doomed[rid].append((f, obj))
        if not doomed:
            return
        requests = {r.pk: r for r in WorkloadRequest.objects.filter(pk__in=list(doomed), cluster=self.cluster)
                    .select_related("template")}
        for rid, pairs in doomed.items():
            req = requests.get(rid)
            for f, obj in pairs:
                if req is not None and req.state in ACTIVE:
                    if req.state == S.APPROVED:
                        continue  # the materializer records it first; a later cycle decides
                    ended = derive(req.template.kind, {object_key(f, obj): summarize(f.key, obj)})
                    if ended.state in (S.SUCCEEDED, S.FAILED):
                        stats.moves += move(req, to=ended.state, actor_label=ACTOR, reason=ended.reason)
                    else:
                        stats.moves += move(req, to=S.FAILED, actor_label=ACTOR,
                                            reason=f"Its {f.kind} was deleted outside the portal.")
                    req.refresh_from_db(fields=["state"])
                    if req.state in ACTIVE:
                        continue
                meta = obj["metadata"]
                try:
                    self.kube.finalizer_remove(f.api_version, f.kind, meta["name"], meta.get("namespace"),
                                               finalizer=OUTCOME_FINALIZER)
                except (ClusterUnavailable, ClusterRejected) as exc:  # the next re-list tries again
                    logger.warning("cannot release %s %s/%s: %s", f.kind, meta.get("namespace"), meta["name"], exc)
                    stats.errors.append(str(exc)[:200])

    # -- applying what we saw ------------------------------------------------------------------------------------
    def _load(self, ids: set[int]) -> dict[int, _Tracked]:
        if not ids:
            return {}
        rows = (
            WorkloadRequest.objects.filter(pk__in=ids, cluster=self.cluster, state__in=ACTIVE)
            .select_related("template", "flavor", "project", "cluster")
        )
        return {r.pk: _Tracked(r, r.cluster_status or {}, dict(r.cluster_status or {})) for r in rows}

    def _apply_event(self, item: _Tracked, f: Followed, etype: str, obj: dict[str, Any], stats: CycleStats) -> None:
        if f.key == "event":
            if obj.get("type") == "Warning" and etype != "DELETED":
                self._note_warning(item, obj)
            return
        objects = dict(item.status.get("objects") or {})
        key = object_key(f, obj)
        preempted = None
        if etype == "DELETED":
            objects.pop(key, None)
            item.status["objects"] = objects
            if key in TOP_LEVEL and self._deleted_finished(item, f, obj, stats):
                return
            if key in TOP_LEVEL and self._deleted_outside(item, f, obj):
                return
        else:
            summary = summarize(f.key, obj)
            if f.key == "workload":
                preempted = newly_evicted(objects.get(key), summary)
            objects[key] = summary
            item.status["objects"] = objects
        self._transition(item, preempted, stats)

    def _deleted_finished(self, item: _Tracked, f: Followed, obj: dict[str, Any], stats: CycleStats) -> bool:
        """A finished Job removed by the cluster's TTL controller (``ttlSecondsAfterFinished``): the DELETED
        event carries its last state, so its outcome still counts (it is not "deleted outside the portal")."""
        req = item.request
        ended = derive(req.template.kind, {object_key(f, obj): summarize(f.key, obj)})
        if ended.state not in (S.SUCCEEDED, S.FAILED):
            return False
        if req.state in (S.QUEUED, S.RUNNING, S.PREEMPTED):
            stats.moves += move(req, to=ended.state, actor_label=ACTOR, reason=ended.reason)
        return True

    def _deleted_outside(self, item: _Tracked, f: Followed, obj: dict[str, Any]) -> bool:
        req = item.request
        if req.state not in (S.QUEUED, S.RUNNING, S.PREEMPTED):
            return False
        meta = obj.get("metadata") or {}
        # A stop-and-restart deletes and re-creates the same name: only an object that is really gone counts.
        if self.kube.get(f.api_version, f.kind, meta.get("name", ""), meta.get("namespace")) is not None:
            return False
        return move(req, to=S.FAILED, actor_label=ACTOR, reason=f"Its {f.kind} was deleted outside the portal.")

    @staticmethod
    def _note_warning(item: _Tracked, event: dict[str, Any]) -> None:
        entry = [str(event.get("reason") or ""), str(event.get("message") or "")[:300]]
        kept = list(item.status.get("warnings") or [])
        if kept and kept[-1] == entry:
            return
        item.status["warnings"] = (kept + [entry])[-WARNINGS_KEPT:]

    def _transition(self, item: _Tracked, preempted: str | None, stats: CycleStats) -> None:
        req = item.request
        objects = item.status.get("objects") or {}
        if preempted and req.state in (S.QUEUED, S.RUNNING):
            moved = move(req, to=S.PREEMPTED, actor_label=ACTOR, reason=f"Preempted: {preempted}"[:500])
            stats.moves += moved
            item.preempted = item.preempted or bool(moved)
            lender_uid = reclaimed_for(preempted)
            if moved and lender_uid:
                # Evicted so that a lender in the cohort gets its quota back: kept for reclaim latency
                # (docs/insights.md); ``_save`` links the lender once its Workload's UID is known.
                Reclaim.objects.create(borrower=req, evicted_at=timezone.now(), preemptor_uid=lender_uid[:64])
                item.reclaimed_for = lender_uid[:64]
        derived = derive(req.template.kind, objects)
        target = derived.state
        if target == req.state:
            if target == S.RUNNING:  # still running, but the line follows the cluster (pods, ready replicas)
                item.reason = derived.reason
            self._note_admission(item)
            return
        if target == S.PREEMPTED:
            if req.state == S.RUNNING:
                stats.moves += move(req, to=S.PREEMPTED, actor_label=ACTOR, reason=derived.reason)
            return
        if target == S.QUEUED:
            if req.state == S.PREEMPTED:
                stats.moves += move(req, to=S.QUEUED, actor_label=ACTOR, reason="Requeued by the cluster.")
            self._note_admission(item)
            return  # approved → queued is the materializer's to record
        if target == S.RUNNING and req.state == S.PREEMPTED:
            stats.moves += move(req, to=S.QUEUED, actor_label=ACTOR, reason="Requeued by the cluster.")
        fields: dict[str, Any] = {}
        if target == S.RUNNING and req.expires_at is None:
            fields["expires_at"] = timezone.now() + timedelta(hours=int(req.duration_hours))
        stats.moves += move(req, to=target, actor_label=ACTOR, reason=derived.reason, fields=fields)
        self._note_admission(item)

    @staticmethod
    def _note_admission(item: _Tracked) -> None:
        """The run's admission, the first time it is seen (approved, queued or running; a running request was admitted
        even without a Workload). ``admitted_at`` is the current run's (a preemption clears it, states._timestamps);
        ``first_admitted_at`` is set once per approval, so a preempted and requeued request counts once in the
        queue-wait metrics (docs/insights.md). The follower's time, as for ``queued_at`` and ``started_at``."""
        req = item.request
        if req.admitted_at is not None or req.state not in (S.APPROVED, S.QUEUED, S.RUNNING):
            return
        if req.state == S.RUNNING:
            # Running implies admitted: never later than its start (the move to running may be this cycle's).
            item.admitted = min(timezone.now(), req.started_at or timezone.now())
        elif admitted_seen(item.status.get("objects") or {}):
            item.admitted = timezone.now()

    def _save(self, items: Iterable[_Tracked], stats: CycleStats) -> None:
        """Write each request whose summary (or pending sentence) changed; unchanged ones cost nothing."""
        items = list(items)
        queues: dict[Any, dict[str, Any] | None] = {}
        uids: set[str] = set()  # Workload UIDs seen for the first time, and lenders named by this cycle's reclaims
        admitted: set[int] = set()
        writes: list[tuple[WorkloadRequest, dict[str, Any]]] = []
        for item in items:
            req = item.request
            stats.requests_touched += 1
            values: dict[str, Any] = {}
            if item.status != item.original:
                values["cluster_status"] = item.status
                req.cluster_status = item.status
            uid = current_workload_uid(item.status.get("objects") or {})[:64]
            if uid and uid != req.workload_uid:
                req.workload_uid = values["workload_uid"] = uid
                uids.add(uid)
            if item.reason:
                if req.state == S.RUNNING and item.reason[:500] != req.state_reason:
                    req.state_reason = values["state_reason"] = item.reason[:500]
                item.reason = ""
            if item.reclaimed_for:
                uids.add(item.reclaimed_for)
                item.reclaimed_for = ""
            if item.admitted is not None and req.admitted_at is None:
                req.admitted_at = values["admitted_at"] = item.admitted
                if req.first_admitted_at is None:
                    req.first_admitted_at = values["first_admitted_at"] = item.admitted
                item.admitted = None
                admitted.add(req.pk)
            if item.status != item.original and req.kueue_flavors:
                values.update(_kueue_chose(req, item.status.get("objects") or {}))
            writes.append((req, values))
        # "Why is it pending?" for the waiting requests that changed (or have no sentence yet), with who is ahead of
        # each counted for all of them in one query (not one count per request: a resync of thousands).
        waiting = [(req, values) for req, values in writes
                   if req.state in (S.QUEUED, S.PREEMPTED) and (values or not req.pending_reason)]
        ahead = _ahead_counts([req for req, _ in waiting]) if waiting else {}
        for req, values in waiting:
            volcano = uses_volcano(req, req.cluster.architecture)
            # Kueue's ClusterQueue, or under Volcano the project's Queue: their numbers say what holds it back.
            key: Any = ("volcano", req.project.slug) if volcano else cluster_queue_name(_target_of(req))
            if key not in queues:
                try:
                    if volcano:
                        queues[key] = self.kube.get(VOLCANO_QUEUE, "Queue", volcano_queue_name(req.project.slug))
                    else:
                        queues[key] = self.kube.get(KUEUE, "ClusterQueue", key)
                except (ClusterUnavailable, ClusterRejected):
                    queues[key] = None
            cq = queues[key]
            sentence = request_pending_reason(req, cluster_queue=cq, volcano=volcano, ahead=ahead.get(req.pk))
            if sentence != req.pending_reason:
                values["pending_reason"] = sentence
                req.pending_reason = sentence
        for req, values in writes:
            if values:
                stats.db_writes += WorkloadRequest.objects.filter(pk=req.pk).update(**values)
        # Inference services: their size over time, for the request page's chart (workloads/endpoints.py).
        resized = [(item.request, (item.original.get("objects") or {}).get("deployment"),
                    (item.status.get("objects") or {}).get("deployment"))
                   for item in items if item.status != item.original]
        if resized:
            from .endpoints import replicas_observe

            stats.db_writes += replicas_observe(resized)
        if uids or admitted:
            stats.db_writes += reclaims_link(uids=uids, admitted=admitted)
        for item in items:
            if item.preempted:  # after every Workload UID of the cycle is kept: the email can name the preemptor
                item.preempted = False
                after_commit(notify.request_preempted_notify, item.request.pk)


def _ahead_counts(reqs: list[WorkloadRequest]) -> dict[int, int]:
    """``pending.requests_ahead`` of each request, for all of them in one query: every waiting request of their
    (project, flavor) pairs, ranked as Kueue orders them."""
    from django.db.models import Q

    pairs = {(r.project_id, r.flavor_id) for r in reqs}
    match = Q()
    for project_id, flavor_id in pairs:
        match |= Q(project_id=project_id, flavor_id=flavor_id)
    rows = [WorkloadRequest(pk=pk, project_id=project_id, flavor_id=flavor_id, priority=priority, created_at=created)
            for pk, project_id, flavor_id, priority, created in WorkloadRequest.objects.filter(
                match, state__in=[S.QUEUED, S.PREEMPTED]).values_list(
                "pk", "project_id", "flavor_id", "priority", "created_at")]
    known = {row.pk for row in rows}
    rows += [r for r in reqs if r.pk not in known]  # a request moved meanwhile still gets its count
    return {req.pk: i for req, i in _ahead_of(rows)}


def _ahead_of(reqs: list[WorkloadRequest]) -> list[tuple[WorkloadRequest, int]]:
    """Each waiting request with how many wait before it (``pending.requests_ahead`` for a whole queue at once:
    the same project and flavor, higher priority first, then older first)."""
    from .models import Priority

    rank = {Priority.BATCH: 0, Priority.INTERACTIVE: 1, Priority.PRODUCTION: 2}
    groups: dict[tuple[int, int], list[WorkloadRequest]] = defaultdict(list)
    for req in reqs:
        groups[(req.project_id, req.flavor_id)].append(req)
    out: list[tuple[WorkloadRequest, int]] = []
    for group in groups.values():
        group.sort(key=lambda r: (-rank.get(r.priority, 0), r.created_at))
        out.extend((req, i) for i, req in enumerate(group))
    return out


def _target_of(req: WorkloadRequest) -> Any:
    from .manifests import Target

    return Target(name=req.k8s_name, namespace=req.project.namespace, tenant="", project=req.project.slug,
                  request_id=int(req.pk), kind=req.template.kind, architecture=req.cluster.architecture, priority=req.priority,
                  serving=kinds.get(req.template.kind).serving)


def requests_sync(*, cluster: Any | None = None, watch_seconds: int = 1) -> dict[str, CycleStats]:
    """One status cycle for every cluster (or one). Overlapping cycles of one cluster are skipped."""
    from quotas.models import Cluster

    clusters = [cluster] if cluster is not None else list(Cluster.objects.exclude(kubeconfig_encrypted="", kubeconfig_path=""))
    out: dict[str, CycleStats] = {}
    for c in clusters:
        lease = follow_lease(c)
        if not lease.hold():  # another follower (a task or `follow_cluster`) has this cluster
            continue
        try:
            stats = follow_one(c, watch_seconds=watch_seconds)
            if stats is not None:
                out[c.name] = stats
        finally:
            lease.release()
    return out


def follow_lease(cluster: Any) -> Lease:
    """The lease that makes one follower per cluster active (``portal.leases``): a task's cycle takes it for the
    cycle, ``follow_cluster`` keeps it across cycles; a holder that dies loses it ``PORTAL_FOLLOW_LEASE_SECONDS``
    after its last renewal, and the next cycle elsewhere takes over."""
    return Lease(f"follow:{cluster.pk}:{cluster.kubeconfig_path or cluster.name}", settings.PORTAL_FOLLOW_LEASE_SECONDS)


def follow_one(cluster: Any, *, watch_seconds: int = 1) -> CycleStats | None:
    """One status cycle of one cluster, in isolation: whatever goes wrong (no kubeconfig file, a broken
    kubeconfig, the API server down) is logged and recorded on the cluster (``health``, ``last_error``, shown
    on the ops pages) and never reaches the other clusters' cycles. None when the cycle failed."""
    try:
        stats = StatusFollower(cluster, watch_seconds=watch_seconds).cycle()
    except ClusterUnavailable as exc:
        logger.warning("status sync of %s: cluster unavailable: %s", cluster, exc)
        cluster.health_record(error=f"Unavailable: {exc}")
        return None
    except Exception as exc:
        logger.exception("status sync of %s failed", cluster)
        cluster.health_record(error=f"{type(exc).__name__}: {exc}")
        return None
    cluster.health_record()
    return stats

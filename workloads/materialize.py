"""The cluster side of a request's lifecycle: create its objects, remove them, keep them in line with the row.

Services decide (approve, stop, cancel, scale...) and move the state; these functions make the cluster match,
called from the thin tasks in ``workloads/tasks.py`` with ids only. Each re-reads the request, decides from its
current state, and may run twice: names come from our key and objects are written with server-side apply, so
applying again changes nothing, and every state change is a compare-and-set (``states.move``).

A worker killed after applying and before recording leaves the request ``approved`` with its objects in the
cluster; the next run (the task's retry, or the housekeeping sweep of approved requests) applies the same objects
again — a no-op — and records ``queued``. There is never a second set of objects.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from portal import labels, prometheus
from portal.events import enqueue
from portal.kube import ClusterRejected, ClusterUnavailable, Kube, kube_for
from portal.notify import notify_send, portal_link

from . import hooks, kinds
from .kinds import request_manifests
from .manifests import DEFAULT_JOB_TTL_SECONDS
from .manifests import manifests_hash as objects_hash
from .models import RequestEvent, RequestState, WorkloadRequest
from .states import ACTIVE, FINAL, move, move_many

logger = logging.getLogger(__name__)
S = RequestState

MATERIALIZER = "materializer"
HOUSEKEEPING = "housekeeping"
# Approved requests older than this that no live run holds are materialized again by the sweep (a lost task message,
# a worker killed mid-way); the sweep runs every 10 s (beat), so such a request is queued again within about
# SWEEP_AFTER + 10 s, plus the run itself (docs/operations.md, "Recovery bounds").
SWEEP_AFTER = timedelta(seconds=30)
# Test hook: a file path. When set, the materializer writes it after applying and then sleeps, so a test can
# kill the process between "applied" and "recorded" (tests/workloads/test_lifecycle.py).
PAUSE_AFTER_APPLY_ENV = "PORTAL_TEST_PAUSE_AFTER_APPLY"


def _load(request_id: int) -> WorkloadRequest | None:
    return (
        WorkloadRequest.objects.select_related("tenant", "project", "cluster", "template", "flavor", "requested_by")
        .filter(pk=request_id)
        .first()
    )


def notebook_token(request: WorkloadRequest) -> str:
    """The notebook's access token: derived from our secret and the request, so re-rendering gives the same one."""
    if not kinds.get(request.template.kind).interactive:
        return ""
    return hmac.new(settings.SECRET_KEY.encode(), f"notebook:{request.pk}".encode(), hashlib.sha256).hexdigest()[:32]


# The optional APIs a serving kind's objects use where the cluster serves them (docs/inference.md).
HTTP_ROUTE = ("gateway.networking.k8s.io/v1", "HTTPRoute")
SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")
# A serving kind's route and autoscaler, in either form: what a render leaves out goes (see _serving_prune).
SERVING_EXTRAS = (("networking.k8s.io/v1", "Ingress"), HTTP_ROUTE, ("autoscaling/v2", "HorizontalPodAutoscaler"),
                  SCALED_OBJECT)


def serving_options(request: WorkloadRequest) -> dict[str, Any]:
    """A serving kind's route and autoscaler as the request's cluster serves them: an HTTPRoute where it serves the
    Gateway API (and a domain is set), a KEDA ScaledObject where it serves keda.sh (``Kube.serves``: discovery,
    cached). Raises ClusterUnavailable when discovery cannot be read (the caller's retry renders again)."""
    if not kinds.get(request.template.kind).serving:
        return {}
    try:
        kube = kube_for(request.cluster)
    except Exception:  # no usable kubeconfig (missing, broken): the apply says so for this request alone
        return {}
    domain = getattr(settings, "PORTAL_INFERENCE_DOMAIN", "")
    return {
        "gateway_api": bool(domain) and kube.serves(*HTTP_ROUTE),
        "gateway": getattr(settings, "PORTAL_INFERENCE_GATEWAY", ""),
        "auth_service": getattr(settings, "PORTAL_INFERENCE_AUTH_SERVICE", ""),
        "keda": kube.serves(*SCALED_OBJECT),
        "prometheus_url": getattr(settings, "PORTAL_KEDA_PROMETHEUS_URL", ""),
    }


def request_objects(request: WorkloadRequest) -> list[dict[str, Any]]:
    ttl = getattr(settings, "WORKLOADS_JOB_TTL_SECONDS", DEFAULT_JOB_TTL_SECONDS)
    return request_manifests(request, notebook_token=notebook_token(request), job_ttl_seconds=ttl,
                             inference_domain=getattr(settings, "PORTAL_INFERENCE_DOMAIN", ""),
                             ingress_class=getattr(settings, "PORTAL_INFERENCE_INGRESS_CLASS", ""),
                             portal_url=getattr(settings, "PORTAL_LINK_BASE_URL", ""), **serving_options(request))


def _pause_after_apply() -> None:
    marker = os.environ.get(PAUSE_AFTER_APPLY_ENV)
    if marker:
        Path(marker).write_text("applied")
        time.sleep(120)


def _describe(obj: dict[str, Any]) -> str:
    return f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


# ------------------------------------------------------------------------------------------------ create
def request_materialize(*, request_id: int) -> str:
    """Apply an approved request's objects and record it queued. Returns what happened (for logs and tests).

    Raises ``ClusterUnavailable`` (the task retries with backoff). A refusal by the cluster fails the request
    with the cluster's message, and whatever was already applied is removed.
    """
    req = _load(request_id)
    if req is None or req.state != S.APPROVED:
        return "skipped"
    objects = request_objects(req)
    WorkloadRequest.objects.filter(pk=req.pk).update(attempts=F("attempts") + 1)
    kube = kube_for(req.cluster)
    current = objects[0]
    try:
        for current in objects:
            kube.apply(current)
    except ClusterUnavailable:
        prometheus.materialize_error(cluster=req.cluster.name, reason="unavailable")
        raise
    except ClusterRejected as exc:
        if exc.missing_namespace:  # the reconcile puts it back: wait as for an outage
            prometheus.materialize_error(cluster=req.cluster.name, reason="unavailable")
            missing = NamespaceMissing(exc, current)
            _restore_namespaces(missing, req.cluster_id)
            raise missing from exc
        prometheus.materialize_error(cluster=req.cluster.name, reason="rejected")
        reason = f"The cluster refused {_describe(current)}: {exc.message}"[:500]
        if move(req, to=S.FAILED, actor_label=MATERIALIZER, reason=reason, only_from=[S.APPROVED]):
            _delete_objects(kube, req, objects)
        return "rejected"
    _pause_after_apply()
    fields = {"applied_hash": objects_hash(objects), "pending_reason": "Handed to the cluster; waiting for the queue to look at it."}
    if move(req, to=S.QUEUED, actor_label=MATERIALIZER, reason="Objects created in the cluster.", fields=fields,
            only_from=[S.APPROVED]):
        return "queued"
    # Someone got there first. The status follower (it saw the objects run) is fine; a cancel or stop that
    # happened while we were applying is not: its clean-up may have run before our apply, so clean up again.
    req.refresh_from_db(fields=["state"])
    if req.state in FINAL:
        _delete_objects(kube, req, objects)
        return "cleaned"
    return "raced"


# ------------------------------------------------------------------------------------------------ create, in batches
# How many approved requests one materializer run takes on (the task of one request claims others that wait too).
BATCH = 50
# A claim older than this is taken to belong to a worker that died: another run may claim the request again. A run
# that is merely slow keeps its claim no longer than this either; a second run applying the same objects is a no-op
# and the move to ``queued`` is a compare-and-set, so a lapse on a live run costs only a repeated apply.
CLAIM_LEASE = SWEEP_AFTER


def _claim(request_id: int | None, limit: int) -> list[WorkloadRequest]:
    """Claim up to ``limit`` approved requests that no live run holds (``request_id`` first when it is one of them):
    under their row locks, skipping rows another run is claiming at this moment, and stamp ``claimed_at``.

    One locking statement picks them (``request_id`` sorted first), one stamps them; a run that finds nothing (most
    runs while submissions stream in: another run's batch took theirs) stops after the first, a cheap one."""
    now = timezone.now()
    free = WorkloadRequest.objects.filter(state=S.APPROVED).filter(
        Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - CLAIM_LEASE))
    first = Case(When(pk=request_id, then=Value(0)), default=Value(1)) if request_id is not None else Value(1)
    with transaction.atomic():
        ids = list(free.order_by(first, "pk").select_for_update(skip_locked=True).values_list("pk", flat=True)[:limit])
        if not ids:
            return []
        WorkloadRequest.objects.filter(pk__in=ids).update(claimed_at=now, attempts=F("attempts") + 1)
    rows = (WorkloadRequest.objects.select_related("tenant", "project", "cluster", "template", "flavor", "requested_by")
            .filter(pk__in=ids).order_by("pk"))
    return list(rows)


def _release(requests: list[WorkloadRequest]) -> None:
    """Give claims back (a cluster outage: the task's retry, or any other run, may take them at once)."""
    if requests:
        WorkloadRequest.objects.filter(pk__in=[r.pk for r in requests], state=S.APPROVED).update(claimed_at=None)


def requests_materialize(*, request_id: int | None = None, limit: int = BATCH) -> dict[str, int]:
    """Apply the objects of up to ``limit`` approved requests (``request_id`` among them unless another run has it)
    and record them queued in one write per batch. Returns counts by outcome (for logs, tests and the benchmark).

    Safe to run twice or concurrently: a claim (``claimed_at``, under the rows' locks) keeps two runs off the same
    request, names come from our key and objects are written with server-side apply, and the move to ``queued`` is a
    compare-and-set. A run killed after its claim leaves the requests ``approved``: after ``CLAIM_LEASE`` the
    housekeeping sweep queues them again and the next run applies the same objects (a no-op) and records them.
    Raises ``ClusterUnavailable`` (the task retries) after recording what it did apply and releasing the rest.
    """
    claimed = _claim(request_id, limit)
    out = {"claimed": len(claimed), "queued": 0, "rejected": 0, "cleaned": 0, "raced": 0}
    try:
        rendered = [(req, request_objects(req)) for req in claimed]
    except ClusterUnavailable:  # a serving kind's discovery: give the claims back, the task retries
        _release(claimed)
        raise
    # The cluster calls of a batch run side by side, one lane per project queue (an apply waits on the API server, not
    # on us); the database writes stay in this thread, in the claimed order.
    outcomes = _apply_side_by_side(rendered)
    applied: list[tuple[WorkloadRequest, list[dict[str, Any]]]] = []
    unavailable: WorkloadRequest | None = None
    for (req, objects), (outcome, current, exc) in zip(rendered, outcomes, strict=True):
        if outcome == "applied":
            applied.append((req, objects))
        elif outcome == "rejected":
            prometheus.materialize_error(cluster=req.cluster.name, reason="rejected")
            reason = f"The cluster refused {_describe(current)}: {exc.message}"[:500]
            if move(req, to=S.FAILED, actor_label=MATERIALIZER, reason=reason, only_from=[S.APPROVED],
                    fields={"claimed_at": None}):
                _delete_objects(kube_for(req.cluster), req, objects)
            out["rejected"] += 1
        elif outcome == "unavailable" and unavailable is None:
            unavailable = req
    if unavailable is not None:
        prometheus.materialize_error(cluster=unavailable.cluster.name, reason="unavailable")
        for cluster_id, exc in {r.cluster_id: e for r, (o, _, e) in zip(claimed, outcomes, strict=True)
                                if o == "unavailable" and isinstance(e, NamespaceMissing)}.items():
            _restore_namespaces(exc, cluster_id)
        applied_pks = {a.pk for a, _ in applied}
        _release([r for r, (outcome, _, _) in zip(claimed, outcomes, strict=True) if outcome != "rejected" and r.pk not in applied_pks])
        _record_queued(applied, out)
        raise next(exc for outcome, _, exc in outcomes if outcome == "unavailable")
    if applied:
        _pause_after_apply()
    _record_queued(applied, out)
    return out


# How long one task run keeps taking new batches before it queues a fresh run to take over (a worker's shutdown waits
# on a running task).
RUN_SECONDS = 30


def requests_materialize_until_done(*, request_id: int | None = None, more: Any = None) -> dict[str, int]:
    """``requests_materialize`` again and again while it finds approved requests: one task run takes on the
    submissions that arrive while it works, in batches of what arrived meanwhile, instead of one run per
    submission. Returns the summed counts (``runs``: how many batches it looked for).

    Approvals queue no run while this one will look again (``hooks.RUN_PENDING``, set before each look); before its
    last look, which finds nothing, it removes the mark, so every approval is either seen by a look of this run or
    queues a run of its own. ``more()`` (queue another run) is called when a batch was full: a backlog is shared
    with the worker's other processes. A cluster outage removes the mark and raises (the task retries)."""
    totals = {"claimed": 0, "queued": 0, "rejected": 0, "cleaned": 0, "raced": 0, "runs": 0}
    started = time.monotonic()
    last_look = False
    while True:
        if not last_look:
            hooks.run_will_look()
        try:
            out = requests_materialize(request_id=request_id, limit=BATCH)
        except Exception:
            hooks.run_last_look()
            raise
        request_id = None
        totals["runs"] += 1
        for key, value in out.items():
            totals[key] += value
        if out["claimed"] >= BATCH and more is not None:
            _call_quietly(more)
        if out["claimed"]:
            last_look = False
            if more is not None and time.monotonic() - started > RUN_SECONDS:
                hooks.run_last_look()
                _call_quietly(more)  # a fresh run takes over and looks again
                return totals
            continue
        if last_look:
            return totals
        hooks.run_last_look()
        last_look = True


def _call_quietly(fn: Any) -> None:
    try:
        fn()
    except Exception:  # the broker is down: this run goes on alone; the sweep covers a lost hand-over
        logger.exception("could not queue another materializer run")


# How many cluster calls of one batch may be in flight at once.
APPLY_THREADS = 8


class NamespaceMissing(ClusterUnavailable):
    """The cluster refused a request's object because the project's namespace is not there (deleted by hand, a
    cluster rebuilt from scratch). The portal owns that namespace and its reconcile puts it back, so the request waits
    as for an outage (released, retried) instead of failing; the run queues a reconcile of the cluster."""

    def __init__(self, exc: ClusterRejected, obj: dict[str, Any]) -> None:
        super().__init__(f"{_describe(obj)}: namespace {exc.missing_namespace} is missing on the cluster; the portal "
                         f"restores it and tries again", status=exc.status)
        self.namespace = exc.missing_namespace


def _apply_one(req: WorkloadRequest, objects: list[dict[str, Any]]) -> tuple[str, dict[str, Any], Exception | None]:
    """Apply one request's objects in order: ("applied" | "rejected" | "unavailable", the object at hand, the error).
    A missing namespace is "unavailable" (``NamespaceMissing``), not a refusal; so is a kubeconfig that cannot be read
    now (its file gone while a cluster restarts, say): the requests are released and tried again, never lost to an
    error no run expected."""
    current = objects[0]
    try:
        kube = kube_for(req.cluster)  # one client (and connection pool) per cluster and process; thread-safe
    except Exception as exc:  # no client for this cluster now: an outage, retried (its health shows why)
        return "unavailable", current, ClusterUnavailable(f"cluster {req.cluster.name}: {type(exc).__name__}: {exc}")
    try:
        for current in objects:
            kube.apply(current)
    except ClusterRejected as exc:
        if exc.missing_namespace:
            return "unavailable", current, NamespaceMissing(exc, current)
        return "rejected", current, exc
    except ClusterUnavailable as exc:
        return "unavailable", current, exc
    return "applied", current, None


def _restore_namespaces(exc: Exception, cluster_id: int) -> None:
    """After a ``NamespaceMissing``: queue the cluster's reconcile at once (it re-creates the project's namespace and
    queues; the periodic one would, later). A broker error is logged: the periodic reconcile still comes."""
    if not isinstance(exc, NamespaceMissing):
        return
    logger.warning("%s; reconciling the cluster", exc)
    try:
        enqueue("quotas.reconcile_cluster", cluster_id)
    except Exception:  # the broker: the periodic reconcile catches up
        logger.exception("could not queue the reconcile of cluster %s", cluster_id)


_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _apply_pool() -> ThreadPoolExecutor:
    """This process's apply threads, made on first use and kept (a batch of a few requests would otherwise pay for
    starting and joining its threads). A forked child (a prefork worker) makes its own."""
    global _pool  # noqa: PLW0603 this process's thread pool, made once on first use
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=APPLY_THREADS, thread_name_prefix="apply"))
        return _pool[1]


def _apply_lane(items: list[tuple[WorkloadRequest, list[dict[str, Any]]]]) -> list[tuple[str, Any, Any]]:
    """One lane's requests applied one after another, in the order given. Once the cluster is unavailable the rest of
    the lane is not tried (each is told so): they are released with it and come back in the same order."""
    out: list[tuple[str, Any, Any]] = []
    for req, objects in items:
        if out and out[-1][0] == "unavailable":
            out.append(("unavailable", objects[0], out[-1][2]))
            continue
        out.append(_apply_one(req, objects))
    return out


def _lane(req: WorkloadRequest) -> tuple[int, int]:
    """The queue a request waits in on its cluster: its project's (Kueue LocalQueue, Volcano Queue)."""
    return req.cluster_id, req.project_id


def _apply_side_by_side(rendered: list[tuple[WorkloadRequest, list[dict[str, Any]]]]) -> list[tuple[str, Any, Any]]:
    """``_apply_one`` for every request; the outcomes in the same order. The lanes (``_lane``) run side by side, up to
    ``APPLY_THREADS`` at once; within a lane the requests are applied one after another in the order given (the claim's:
    by id, the order they were submitted). Kueue and Volcano take work of one priority by creation, so a project's
    requests reach its queue in the order they were submitted, whatever the threads do; applied side by side, a
    later request could be created first and hold the queue ahead of an earlier one."""
    lanes: dict[tuple[int, int], list[int]] = {}
    for index, (req, _) in enumerate(rendered):
        lanes.setdefault(_lane(req), []).append(index)
    if len(lanes) <= 1:
        return _apply_lane(rendered)
    for req, _ in rendered:
        kube_for(req.cluster)  # made here, once, rather than by several threads at the same time
    outcomes: list[Any] = [None] * len(rendered)
    done = _apply_pool().map(lambda indexes: _apply_lane([rendered[i] for i in indexes]), lanes.values())
    for indexes, results in zip(lanes.values(), done, strict=True):
        for index, result in zip(indexes, results, strict=True):
            outcomes[index] = result
    return outcomes


def _record_queued(applied: list[tuple[WorkloadRequest, list[dict[str, Any]]]], out: dict[str, int]) -> None:
    if not applied:
        return
    hashes = {req.pk: {"applied_hash": objects_hash(objects)} for req, objects in applied}
    moved = move_many(
        [req for req, _ in applied], to=S.QUEUED, actor_label=MATERIALIZER, reason="Objects created in the cluster.",
        fields={"pending_reason": "Handed to the cluster; waiting for the queue to look at it.", "claimed_at": None},
        fields_each=hashes, only_from=[S.APPROVED],
    )
    out["queued"] += len(moved)
    moved_pks = {r.pk for r in moved}
    for req, objects in applied:
        if req.pk in moved_pks:
            continue
        # Someone got there first: the status follower is fine; a cancel or stop while we applied is not (its
        # clean-up may have run before our apply), so clean up again.
        req.refresh_from_db(fields=["state"])
        if req.state in FINAL:
            _delete_objects(kube_for(req.cluster), req, objects)
            out["cleaned"] += 1
        else:
            out["raced"] += 1


# ------------------------------------------------------------------------------------------------ remove
def _serving_prune(kube: Kube, req: WorkloadRequest, objects: list[dict[str, Any]]) -> int:
    """Delete a serving request's route or autoscaler that ``objects`` (its render now) does not hold: the HPA or
    ScaledObject of a service scaled to a fixed size, the Ingress or HPA of one whose cluster has since installed
    the Gateway API or KEDA (and the other way round). Only kinds the cluster serves are asked; gone counts as done."""
    if not kinds.get(req.template.kind).serving:
        return 0
    rendered = {(o["apiVersion"], o["kind"]) for o in objects}
    return sum(kube.delete(api_version, kind, req.k8s_name, req.project.namespace)
               for api_version, kind in SERVING_EXTRAS
               if (api_version, kind) not in rendered and kube.serves(api_version, kind))


def _delete_objects(kube: Kube, req: WorkloadRequest, objects: list[dict[str, Any]] | None = None, *,
                    volumes: bool = False) -> int:
    """Delete the request's objects, top-level object first (its pods go with it). "Already gone" counts as done."""
    deleted = 0
    objects = objects if objects is not None else request_objects(req)
    deleted += _serving_prune(kube, req, objects)
    for obj in reversed(objects):
        meta = obj["metadata"]
        deleted += kube.delete(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        if labels.OUTCOME_FINALIZER in (meta.get("finalizers") or []):
            # The portal recorded this run's end itself (stop, cancel, delete, expiry, a refusal): nothing waits for
            # the follower, so the object goes now (docs/architecture.md, "Outcomes survive the follower").
            kube.finalizer_remove(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"),
                                  finalizer=labels.OUTCOME_FINALIZER)
    if volumes:
        claims, _ = kube.list("v1", "PersistentVolumeClaim", req.project.namespace,
                              label_selector=labels.request_selector(req.pk))
        for claim in claims:
            deleted += kube.delete("v1", "PersistentVolumeClaim", claim["metadata"]["name"], req.project.namespace)
    return deleted


def request_act(*, request_id: int, action: str) -> str:
    """Make the cluster match a lifecycle action a service already recorded.

    ``stop``/``cancel``: remove the objects (a notebook keeps its home volume); ``delete``: remove them with their
    volumes; ``scale``: apply again (the Deployment gets the new replica count); ``extend``: nothing in the cluster
    (the deadline is ours: ``requests_expire``); ``restart``: materialize again.
    """
    req = _load(request_id)
    if req is None:
        return "gone"
    if action == "restart":
        return request_materialize(request_id=request_id)
    kube = kube_for(req.cluster)
    if action in ("stop", "cancel", "delete", "expire", "cull"):
        if req.state in ACTIVE:
            return "still active"  # a restart won meanwhile; its objects must stay
        _delete_objects(kube, req, volumes=action == "delete")
        return "deleted"
    if action == "scale":
        if req.state not in (S.QUEUED, S.RUNNING, S.PREEMPTED):
            return "not in the cluster"
        objects = request_objects(req)
        # Scaled to a fixed size: its autoscaler goes first, so it cannot undo the size the apply sets.
        _serving_prune(kube, req, objects)
        for obj in objects:
            kube.apply(obj)
        WorkloadRequest.objects.filter(pk=req.pk).update(applied_hash=objects_hash(objects))
        return "applied"
    if action == "extend":
        return "nothing to do"
    raise ValueError(f"Unknown action {action!r}.")


# ------------------------------------------------------------------------------------------------ deadlines
def _end(req: WorkloadRequest, *, to: str, reason: str, action: str) -> bool:
    """Move an active request to its end, then remove its objects; a cluster outage leaves that to a retried task."""
    if not move(req, to=to, actor_label=HOUSEKEEPING, reason=reason, only_from=[S.QUEUED, S.RUNNING, S.PREEMPTED]):
        return False
    try:
        _delete_objects(kube_for(req.cluster), req)
    except (ClusterUnavailable, ClusterRejected):
        enqueue("workloads.tasks.request_changed_task", req.pk, action)
    return True


def requests_expire(now: datetime | None = None) -> int:
    """End every active request past its deadline (``expires_at``). Returns how many expired."""
    now = now or timezone.now()
    due = _select_active().filter(expires_at__lte=now)
    count = 0
    for req in due:
        count += _end(req, to=S.EXPIRED, reason=f"Reached its maximum duration of {req.duration_hours} h.", action="expire")
    return count


def notebooks_cull_idle(now: datetime | None = None) -> int:
    """Stop running notebooks idle longer than their template's timeout, and tell their owners."""
    now = now or timezone.now()
    candidates = _select_active().filter(
        state=S.RUNNING, template__kind__in=[k.name for k in kinds.KINDS.values() if k.interactive],
        template__idle_timeout_minutes__isnull=False
    )
    count = 0
    for req in candidates:
        timeout = timedelta(minutes=req.template.idle_timeout_minutes or 0)
        # The last request seen on the notebook's path (the portal's proxy or the ingress's auth check), or its
        # start when nobody has opened it since: an activity from before a restart does not count.
        since = max((t for t in (req.last_active_at, req.started_at or req.queued_at) if t is not None), default=None)
        if since is None or since + timeout > now:
            continue
        minutes = int((now - since).total_seconds() // 60)
        reason = (f"Stopped after {minutes} minutes without activity (the limit is {req.template.idle_timeout_minutes}). "
                  "Its home volume is kept: restart it to continue.")
        if _end(req, to=S.STOPPED, reason=reason, action="cull"):
            _notice(req, reason)
            count += 1
    return count


def requests_stop_measured_idle() -> int:
    """Stop running requests flagged idle by measured GPU use (``measured_idle_since``, set by insights' idle
    detection), where their project's policy says so: notebooks when it culls idle notebooks by measured GPU use,
    training and batch inference when it stops idle batch jobs. Inference services are never stopped for it."""
    interactive = [k.name for k in kinds.KINDS.values() if k.interactive]
    batch = [k.name for k in kinds.KINDS.values() if not k.interactive and not k.serving]
    due = _select_active().filter(state=S.RUNNING, measured_idle_since__isnull=False).filter(
        Q(template__kind__in=interactive, project__cull_idle_notebooks_by_gpu=True)
        | Q(template__kind__in=batch, project__stop_idle_batch_jobs=True))
    count = 0
    for req in due:
        threshold = req.template.idle_gpu_percent
        threshold = threshold if threshold is not None else float(getattr(settings, "MEASURED_IDLE_PERCENT", 5.0))
        minutes = int((timezone.now() - req.measured_idle_since).total_seconds() // 60)
        reason = (f"Stopped: its GPUs were measured below {threshold:g} % utilisation for {minutes} minutes, and the "
                  f"project {req.project.slug} stops idle {'notebooks' if req.template.kind in interactive else 'batch jobs'}."
                  + (" Its home volume is kept: restart it to continue." if req.template.kind in interactive else ""))
        if _end(req, to=S.STOPPED, reason=reason, action="cull"):
            _notice(req, reason)
            count += 1
    return count


def requests_sweep_approved(now: datetime | None = None) -> list[int]:
    """Approved requests that should have been queued by now and that no live run holds (a lost task, a killed
    worker whose claim lapsed after ``CLAIM_LEASE``): their ids. A request a live run claimed is left to it."""
    now = now or timezone.now()
    return list(
        WorkloadRequest.objects.filter(state=S.APPROVED)
        .filter(Q(approved_at__lte=now - SWEEP_AFTER) | Q(approved_at__isnull=True))
        .filter(Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - CLAIM_LEASE))
        .order_by("pk")
        .values_list("pk", flat=True)[:500]
    )


def _select_active():
    return WorkloadRequest.objects.select_related("tenant", "project", "cluster", "template", "flavor", "requested_by").filter(
        state__in=[S.QUEUED, S.RUNNING, S.PREEMPTED]
    )


def _notice(req: WorkloadRequest, text: str) -> None:
    email = getattr(req.requested_by, "email", "")
    if not email:
        return
    # The mail server's trouble never undoes the stop: logged by the notifier, and no "sent" entry.
    if notify_send(subject=f"[GPU portal] {req.project.slug}/{req.name} stopped",
                   body=f"{text}\n\nThe request: {portal_link(f'/requests/{req.pk}/')}\n", to=[email],
                   topic="idle notice"):
        RequestEvent.objects.create(request_id=req.pk, actor_label=HOUSEKEEPING, message=f"Notice sent to {email}.")

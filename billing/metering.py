"""The meter: usage intervals from what the status follower saw (docs/billing.md, "Metering").

The follower (``workloads/status.py``) hands each cycle's objects to ``portal.extensions.usage_meter``, which
billing fills with :func:`meter_observe`. From them:

* **Kueue Workloads** (everything Kueue admits): a run starts at the ``Admitted`` condition's
  ``lastTransitionTime`` and ends at the ``Finished`` condition's, or when admission ends (eviction: the
  ``Admitted=False`` transition), or at the object's deletion. A preempted and requeued Workload is admitted again
  later: a second run. Time in the queue is never a run.
* **Pods of Volcano Jobs** (Kueue does not own them): a run per pod, from ``status.startTime`` to its containers'
  ``finishedAt`` (or its deletion).
* Each run is one interval per priced unit the request holds (``pricing.shares``), keyed by the run's identity
  from the cluster (object uid + start time): a replayed or duplicated event finds its interval already there
  (``one_interval_per_run_and_unit``) and changes nothing; an interval once closed stays closed.
* A resync lists everything: open intervals whose object is no longer there close at the last time the cluster
  was seen before (the object's deletion time when the DELETED event carried one).

Every instant is the cluster's own; the portal's clock is never used for an interval. The cluster's latest
timestamp is kept per cluster (``ClusterClock``) to price open intervals "up to now" (``selectors.cluster_now``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from workloads.kinds import uses_volcano
from workloads.models import WorkloadRequest

from . import pricing, rollup
from .models import ClusterClock, UsageInterval

logger = logging.getLogger(__name__)
S = UsageInterval.Source
R = UsageInterval.EndReason
METERED = ("workload", "pod", "vcjob")
# A pod's deletionTimestamp is when its grace period ends (it may lie ahead of the cluster's clock): not a clock
# reading. Other objects have no grace period: theirs is the instant of deletion.
GRACEFUL = ("pod",)


def parse_time(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def latest_timestamp(value: Any, depth: int = 0, *, graceful: bool = False) -> datetime | None:
    """The latest timestamp under a key ending in ``Time``/``Timestamp`` (or ``time``, managedFields) in ``value``
    (``graceful``: without a deletionTimestamp, which then lies in the future)."""
    best: datetime | None = None
    if depth > 30:
        return None
    items: Iterable[tuple[Any, Any]] = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        t = None
        if isinstance(v, str):
            if isinstance(k, str) and (k.endswith(("Time", "Timestamp")) or k == "time") and not (
                    graceful and k == "deletionTimestamp"):
                t = parse_time(v) if len(v) >= 20 and v[4:5] == "-" else None
        elif isinstance(v, (dict, list)):
            t = latest_timestamp(v, depth + 1, graceful=graceful)
        if t is not None and (best is None or t > best):
            best = t
    return best


@dataclass
class Run:
    request: WorkloadRequest
    run_key: str
    source: str
    uid: str
    name: str
    start: datetime
    pods: int
    end: datetime | None = None
    reason: str = ""
    flavors: tuple[str, ...] = ()  # the flavors Kueue admitted this run on (``status.admission``)


@dataclass
class Close:
    uid: str
    at: datetime
    reason: str
    before: datetime | None = None  # only runs of this object that started before this instant
    keep: str = ""  # the run now in progress (not to be closed)


@dataclass
class MeterStats:
    opened: int = 0
    closed: int = 0
    runs_seen: int = 0
    clock: datetime | None = None
    errors: list[str] = field(default_factory=list)


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def workload_facts(req: WorkloadRequest, etype: str, obj: dict[str, Any], last_seen: datetime | None) -> tuple[list[Run], list[Close]]:
    """What one Workload says about runs: the run it is in (admitted), or when its run ended."""
    meta = obj.get("metadata") or {}
    uid, name = str(meta.get("uid") or ""), str(meta.get("name") or "")
    if not uid:
        return [], []
    conds = _conditions(obj)
    admitted, finished = conds.get("Admitted") or {}, conds.get("Finished") or {}
    deleted_at = parse_time(meta.get("deletionTimestamp"))
    gone = etype == "DELETED"
    if admitted.get("status") == "True" and (start := parse_time(admitted.get("lastTransitionTime"))) is not None:
        pods = sum(int(ps.get("count") or 1) for ps in (obj.get("spec") or {}).get("podSets") or []) or 1
        admitted_on = tuple(sorted({str(f) for psa in ((obj.get("status") or {}).get("admission") or {}).get(
            "podSetAssignments") or [] for f in (psa.get("flavors") or {}).values()}))
        run = Run(req, f"wl/{uid}/{_iso(start)}", S.WORKLOAD, uid, name, start, pods, flavors=admitted_on)
        if finished.get("status") == "True" and (end := parse_time(finished.get("lastTransitionTime"))):
            run.end, run.reason = end, R.FINISHED
        elif deleted_at is not None:
            run.end, run.reason = deleted_at, R.DELETED
        elif gone:
            run.end, run.reason = last_seen or start, R.GONE
        # An earlier run of the same object we never saw end (its eviction fell between two looks): it ended when
        # Kueue requeued it, or at the latest when this one began.
        requeued = conds.get("Requeued") or {}
        ended = parse_time(requeued.get("lastTransitionTime")) if requeued.get("status") == "True" else None
        earlier = Close(uid, ended if ended is not None and ended <= start else start, R.EVICTED, before=start, keep=run.run_key)
        return [run], [earlier]
    # Not admitted (evicted and waiting again, or never admitted): a run of it that is still open ended when
    # admission ended (the Admitted=False transition), or when the object went.
    evicted = conds.get("Evicted") or {}
    if admitted.get("status") == "False" and (at := parse_time(admitted.get("lastTransitionTime"))):
        return [], [Close(uid, at, R.EVICTED if evicted.get("status") == "True" else R.GONE)]
    if deleted_at is not None:
        return [], [Close(uid, deleted_at, R.DELETED)]
    if gone and last_seen is not None:
        return [], [Close(uid, last_seen, R.GONE)]
    return [], []


def _ran_on(req: WorkloadRequest, run: Run, cache: dict[str, Any]) -> Any:
    """The flavor ``run`` ran on: where Kueue chose between flavors for the request (``kueue_flavors``), the one its
    admission names, so a run is priced as the model that ran (docs/federation.md); else the request's flavor."""
    choice = {c.get("name") for c in req.kueue_flavors or [] if isinstance(c, dict)}
    name = next((f for f in run.flavors if f in choice), "") if len(choice) > 1 else ""
    if not name or name == req.flavor.name:
        return req.flavor
    if name not in cache:
        from quotas.models import Flavor

        cache[name] = Flavor.objects.filter(cluster_id=req.cluster_id, name=name).first()
    return cache[name] or req.flavor


def pod_facts(req: WorkloadRequest, etype: str, obj: dict[str, Any], last_seen: datetime | None) -> tuple[list[Run], list[Close]]:
    """A pod of an object Kueue does not own (a Volcano Job's): one run from its start to its containers' end."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    uid, name = str(meta.get("uid") or ""), str(meta.get("name") or "")
    if not uid:
        return [], []
    deleted_at = parse_time(meta.get("deletionTimestamp"))
    gone = etype == "DELETED"
    phase = status.get("phase") or "Pending"
    start = parse_time(status.get("startTime"))
    if start is None or phase == "Pending":
        at = deleted_at or (last_seen if gone else None)
        return [], ([Close(uid, at, R.DELETED)] if at is not None else [])
    run = Run(req, f"pod/{uid}/{_iso(start)}", S.POD, uid, name, start, 1)
    finished = [parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
                for cs in status.get("containerStatuses") or []]
    ends = [t for t in finished if t is not None]
    if phase in ("Succeeded", "Failed") and ends:
        run.end, run.reason = max(ends), R.FINISHED
    elif deleted_at is not None:
        run.end, run.reason = deleted_at, R.DELETED
    elif gone:
        run.end, run.reason = last_seen or start, R.GONE
    return [run], []


def _clock_update(cluster: Any, seen: list[tuple[str, str, dict[str, Any], int | None]]) -> tuple[datetime | None, datetime | None]:
    """(the cluster's time as last seen before this cycle, as seen now). Moves only forward."""
    latest = None
    for key, _etype, obj, _rid in seen:
        t = latest_timestamp(obj, graceful=key in GRACEFUL)
        if t is not None and (latest is None or t > latest):
            latest = t
    clock = ClusterClock.objects.select_for_update().filter(cluster=cluster).first()
    before = clock.cluster_time if clock is not None else None
    if latest is not None and (before is None or latest > before):
        ClusterClock.objects.update_or_create(cluster=cluster, defaults={"cluster_time": latest, "seen_at": timezone.now()})
        return before, latest
    return before, before


@transaction.atomic
def meter_observe(*, cluster: Any, seen: list[tuple[str, str, dict[str, Any], int | None]], complete: bool = False) -> MeterStats:
    """Open and close usage intervals from one follower cycle's objects (idempotent: see the module docstring)."""
    stats = MeterStats()
    previous, now_seen = _clock_update(cluster, seen)
    stats.clock = now_seen
    # An object whose DELETED event (without a deletion time) arrives now went by the latest instant this cycle shows;
    # one a resync no longer lists was there when the cluster was last seen before it.
    gone_by = now_seen
    last_seen = previous or now_seen
    by_request: dict[int, list[tuple[str, str, dict[str, Any]]]] = defaultdict(list)
    for key, etype, obj, rid in seen:
        if rid is not None and key in METERED:
            by_request[rid].append((key, etype, obj))
    open_rows = list(UsageInterval.objects.filter(cluster=cluster, ended_at__isnull=True)
                     .values_list("request_id", "run_key", "object_uid"))
    if not by_request and not (complete and open_rows):
        return stats
    requests = {r.pk: r for r in WorkloadRequest.objects.filter(pk__in=list(by_request), cluster=cluster)
                .select_related("flavor", "cluster", "template")}
    runs: list[Run] = []
    closes: list[Close] = []
    changed: list[datetime] = []  # instants from which the cost rollup's days changed
    present: set[str] = set()
    for rid, items in by_request.items():
        req = requests.get(rid)
        if req is None:
            continue
        volcano = any(k == "vcjob" for k, _, _ in items) or uses_volcano(req, cluster.architecture)
        for key, etype, obj in items:
            if etype != "DELETED":
                present.add(str((obj.get("metadata") or {}).get("uid") or ""))
            if key == "workload" and not volcano:
                found = workload_facts(req, etype, obj, gone_by)
            elif key == "pod" and volcano:
                found = pod_facts(req, etype, obj, gone_by)
            else:
                continue
            runs += found[0]
            closes += found[1]
    # One cycle may show a run more than once, in any order (admitted, then finished; or a re-listed older version
    # after a newer watch event): the run is what its most complete view says, so one that ended wins.
    merged: dict[tuple[int, str], Run] = {}
    for run in runs:
        have = merged.get((run.request.pk, run.run_key))
        if have is None or (have.end is None and run.end is not None):
            merged[(run.request.pk, run.run_key)] = run
    runs = list(merged.values())
    stats.runs_seen = len(runs)
    ceiling = now_seen  # never an instant after the latest the cluster showed
    open_keys = {(rid, key) for rid, key, _ in open_rows}
    open_uids = {uid for _, _, uid in open_rows}
    open_runs: dict[str, set[str]] = defaultdict(set)
    for _, key, uid in open_rows:
        open_runs[uid].add(key)

    # New runs (and runs first seen already finished): one interval per priced unit, created once.
    if runs:
        known = set(UsageInterval.objects.filter(request_id__in={r.request.pk for r in runs}, run_key__in={r.run_key for r in runs})
                    .values_list("request_id", "run_key"))
        fresh: list[UsageInterval] = []
        ran_on: dict[str, Any] = {}
        for run in runs:
            if run.end is not None and ceiling is not None:
                run.end = max(min(run.end, ceiling), run.start)
            if (run.request.pk, run.run_key) in known:
                continue
            known.add((run.request.pk, run.run_key))
            req = run.request
            for share in pricing.shares(_ran_on(req, run, ran_on), gpus=req.gpus, cpu=req.cpu, memory_gib=req.memory_gib, pods=run.pods,
                                        hami_share=req.hami_share):
                fresh.append(UsageInterval(
                    request=req, tenant_id=req.tenant_id, project_id=req.project_id, cluster=cluster, run_key=run.run_key,
                    source=run.source, object_uid=run.uid, object_name=run.name[:253], unit=share.unit, key=share.key,
                    quantity=share.quantity, started_at=run.start, ended_at=run.end, end_reason=run.reason if run.end else "",
                ))
        if fresh:
            stats.opened = len(UsageInterval.objects.bulk_create(fresh, ignore_conflicts=True))
            changed.extend(iv.started_at for iv in fresh)
            # A run opened in this cycle may have ended in it too (admitted, then evicted: two events of one batch).
            for iv in fresh:
                if iv.ended_at is None:
                    open_uids.add(iv.object_uid)
                    open_runs[iv.object_uid].add(iv.run_key)
        for run in runs:
            if run.end is not None and (run.request.pk, run.run_key) in open_keys:
                closed = UsageInterval.objects.filter(
                    request_id=run.request.pk, run_key=run.run_key, ended_at__isnull=True,
                ).update(ended_at=run.end, end_reason=run.reason)
                stats.closed += closed
                if closed:
                    changed.append(run.end)

    # Runs that ended without a run of their own saying so (evicted, deleted).
    for close in closes:
        if close.uid not in open_uids or (close.keep and open_runs.get(close.uid, set()) <= {close.keep}):
            continue  # nothing of this object is open, or only the run in progress (no query per running request)
        at = min(close.at, ceiling) if ceiling is not None else close.at
        rows = UsageInterval.objects.filter(cluster=cluster, object_uid=close.uid, ended_at__isnull=True, started_at__lte=at)
        if close.before is not None:
            rows = rows.filter(started_at__lt=close.before)
        closed = rows.update(ended_at=at, end_reason=close.reason)
        stats.closed += closed
        if closed:
            changed.append(at)

    # A resync lists everything: an open interval whose object is not there any more ended when last seen.
    if complete and last_seen is not None:
        gone = {uid for uid in open_uids if uid not in present}
        if gone:
            closed = (UsageInterval.objects.filter(cluster=cluster, object_uid__in=gone, ended_at__isnull=True)
                      .update(ended_at=Greatest(Value(last_seen), F("started_at")), end_reason=R.GONE))
            stats.closed += closed
            if closed:
                changed.append(last_seen)
    # The cost rollup's days from the earliest instant these writes affect are recomputed (billing/rollup.py).
    if changed:
        rollup.mark_changed(min(changed))
    return stats


"""The demo's history: three weeks of past requests, 5-minute queue and pool samples, and their metered usage, so
the metric pages, the cost charts and ``/metrics`` have something to show the moment ``make run`` starts.

``seed_insights_demo()`` runs last in ``manage.py seed_demo`` (after the tenants, the sandbox cluster's flavors and
quotas, the catalogue and the price list). Everything it writes is marked: requests and samples ``seeded=True``,
usage intervals a ``run_key`` starting ``seeded:``. Requests are written in final states only (succeeded, failed,
stopped), so the materializer and the status follower never look at them and nothing reaches the cluster.
Idempotent: a part already seeded is left alone. Deterministic: the same random seed every run.

How the history is made: a small queue simulation per project and flavor (quota = nominal + borrowing limit, as
Kueue admits): arrivals over three weeks, each admitted once enough of its quota is free, so busy days have long
waits and the samples show pending work. A few "contention" windows (the cohort lent capacity that was not
reclaimed at once) hold some queues below their nominal quota while they have work waiting: guarantee violations.
About one run in twelve is preempted and requeued (timeline entries ``preempted`` with Kueue's reason), and in
MIG windows pending slices wait although slice memory is free (a shape mismatch).

Two more stories, so that no chart starts empty:

* **Architecture F, then E.** The sandbox cluster (the H100 training zone) ran architecture F (Kueue admits the
  offline whole-GPU pool) until ``ARCHITECTURE_SWITCH_DAYS`` ago, when ops applied a change to E, the architecture it
  runs now (an ``ArchitectureChange`` F -> E, applied, written once): Volcano gang-schedules training on the offline
  pool since. Training there after the switch ran as Volcano gangs: its timeline says so, a preemption there is
  Volcano restarting the gang, and ``gang-start`` counts them; before it, Kueue admitted it. Notebooks, which
  Volcano's pool does not take, moved to the online H100s with the switch.
* **Reclaims.** Where Kueue admits (the offline pool before the switch, the other flavors throughout), when a
  project's run arrives while a sibling project of the same tenant (the same cohort) borrows the flavor, Kueue evicts
  the borrower "to accommodate a workload (UID: <the lender's>) due to reclamation within the cohort" and admits the
  lender seconds later; ``workloads.Reclaim`` rows link them, as the status follower writes them.
"""

from __future__ import annotations

import bisect
import logging
import math
import random
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from billing.models import UsageInterval
from billing.pricing import shares
from quotas.capacity import capacity_by_flavor
from quotas.manifests import volcano_owned
from quotas.models import ArchitectureChange, Cluster, Flavor, Quota
from tenants.models import Membership, Role
from workloads.models import Priority, Reclaim, RequestEvent, RequestState, ServiceTemplate, WorkloadRequest

from . import measured_rollup
from .measured import SLOT_SECONDS, device_memory_mib, slot_end
from .models import MeasuredSample, PoolSample, QueueSample
from .samples import fill_lent, profile_memory_gib

log = logging.getLogger(__name__)
S = RequestState

HISTORY_DAYS = 21
RANDOM_SEED = 20261202
RUN_KEY_PREFIX = "seeded:"
IDEMPOTENCY_PREFIX = "seeded-"
ACTOR = "demo history"
ARCHITECTURE_SWITCH_DAYS = 4  # the sandbox cluster ran F until then, E since (inside the default 7-day period)
SWITCH_FINGERPRINT = "seeded-demo-history-f-to-e"
GANG_RESTART_REASON = "Volcano restarts the gang: a pod was evicted or failed."
RECLAIM_REASON = ("Preempted: Preempted to accommodate a workload (UID: {uid}, JobUID: {job_uid}) due to reclamation "
                  "within the cohort; preemptor path: /{tenant}/{lender}; preemptee path: /{tenant}/{borrower}")
PREEMPT_REASON = ("Preempted to reclaim quota lent to the cohort (Kueue: InCohortReclamation); "
                  "requeued, it keeps its place by priority and age.")
IMAGES = {"training": "nvcr.io/nvidia/pytorch:26.10-py3", "notebook": "jupyter/pytorch-notebook:2026.10",
          "inference": "vllm/vllm-openai:v0.11.0"}
NAMES = {"training": ["resnet", "vit-base", "llama-ft", "bert-pretrain", "diffusion", "sweep", "distill", "yolo"],
         "notebook": ["explore", "eda", "debug", "prototype"],
         "inference": ["chat-api", "embed-svc", "rerank", "summarise"]}


@dataclass
class Stream:
    """One project's queue for one flavor: what it may hold at once and its simulated requests."""

    quota: Quota
    cap: int
    members: list[Any]
    kinds: list[str]
    runs: list[dict[str, Any]] = field(default_factory=list)


def _gpu_quotas(cluster: Cluster) -> list[Quota]:
    rows = (Quota.objects.filter(flavor__cluster=cluster, project__isnull=False, nominal__gt=0, flavor__active=True)
            .exclude(flavor__kind=Flavor.Kind.CPU).select_related("project", "tenant", "flavor").order_by("project__slug", "flavor__order", "flavor__name"))
    return [q for q in rows if q.resource == q.flavor.primary_resource]


def _contention(rng: random.Random, start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """Two to three windows of 5-10 hours in which the queue gets only part of its nominal quota; the first one
    falls in the last week (before today, UTC), so the pages' default period (the last 7 whole days) shows it."""
    first = end - timedelta(hours=rng.randint(36, 110))
    out = [(first, first + timedelta(hours=rng.randint(5, 10)))]
    for _ in range(rng.randint(1, 2)):
        at = start + timedelta(hours=rng.randint(24, HISTORY_DAYS * 24 - 24))
        out.append((at, at + timedelta(hours=rng.randint(5, 10))))
    return out


def _simulate(stream: Stream, rng: random.Random, start: datetime, end: datetime) -> None:
    nominal = int(stream.quota.nominal)
    windows = _contention(rng, start, end)
    t = start + timedelta(minutes=rng.randint(0, 240))
    running: list[tuple[datetime, int]] = []  # (end, gpus) of admitted runs, sorted by end
    while True:
        t += timedelta(minutes=rng.expovariate(1 / 540))  # about two to three arrivals a day per queue
        if t >= end:
            return
        kind = rng.choice(stream.kinds)
        gpus = max(1, min(stream.cap, rng.choice([1, 1, 1, 2, 2, 4, max(1, nominal // 2), nominal])))
        hours = {"notebook": rng.uniform(1, 8), "inference": rng.uniform(6, 30)}.get(kind, rng.lognormvariate(1.2, 0.8))
        manual = gpus > 2 or hours > 8  # more than the global rule approves alone
        approved = t + timedelta(minutes=rng.uniform(10, 240) if manual else 0.02)
        admit = approved + timedelta(seconds=rng.uniform(5, 40))

        def cap_at(at: datetime) -> int:
            low = any(a <= at < b for a, b in windows)
            return max(1, nominal // 2) if low else stream.cap

        # Admitted once its GPUs fit: step from one run's end to the next (or a contention window's end).
        while True:
            running = [r for r in running if r[0] > admit]
            used = sum(g for _, g in running)
            if used + gpus <= cap_at(admit):
                break
            later = [r[0] for r in running] + [b for a, b in windows if a <= admit < b]
            admit = min(later) + timedelta(seconds=rng.uniform(5, 60))
        duration = timedelta(hours=hours)
        preempted = None
        if rng.random() < 1 / 12 and hours > 1:
            at = admit + duration * rng.uniform(0.2, 0.7)
            back = at + timedelta(minutes=rng.uniform(5, 180))
            preempted = (admit, at, back)
            finished = back + (duration - (at - admit))
        else:
            finished = admit + duration
        if finished > end:
            continue  # history only: what would still run now is left out
        bisect.insort(running, (finished, gpus))
        roll = rng.random()
        final = S.SUCCEEDED if roll < 0.76 else S.FAILED if roll < 0.88 else S.STOPPED
        if kind == "notebook" and final == S.FAILED:
            final = S.STOPPED
        stream.runs.append({"kind": kind, "gpus": gpus, "submitted": t - timedelta(seconds=rng.uniform(1, 30)),
                            "approved": approved, "manual": manual, "admitted": admit, "finished": finished,
                            "preempted": preempted, "final": final, "hours": hours,
                            "member": rng.choice(stream.members)})


def _volcano_at(stream: Stream, at: datetime, switch: datetime) -> bool:
    """Did Volcano own the stream's flavor at ``at``: a flavor of E's Volcano pool, after the switch to E?"""
    from types import SimpleNamespace

    return at >= switch and volcano_owned(SimpleNamespace(architecture="E"), stream.quota.flavor)


def _gang(stream: Stream, run: dict[str, Any], switch: datetime) -> bool:
    """Was this run a Volcano gang? Training on a flavor Volcano owns under architecture E, approved after the
    switch to E."""
    return run["kind"] == "training" and _volcano_at(stream, run["approved"], switch)


def _after_switch(streams: list[Stream], switch: datetime) -> None:
    """Volcano's pool takes gang-scheduled kinds only: a notebook the simulation put there after the switch to E is a
    training run instead (notebooks went to the online H100s, where Kueue admits them)."""
    for stream in streams:
        for run in stream.runs:
            if run["kind"] == "notebook" and _volcano_at(stream, run["approved"], switch):
                run["kind"] = "training"


def _reclaims(streams: list[Stream], rng: random.Random, switch: datetime, end: datetime) -> None:
    """Where Kueue admits (not Volcano's pool after the switch to E): when a run of one project arrives while a
    sibling project of the same tenant (its cohort) holds a run of the same flavor, the sibling's run is evicted for
    it (a reclaim) and it is admitted seconds later. Marks ``run["reclaim"]`` on the borrower (the lender run and
    when) and moves both runs' times."""
    by_cohort: dict[tuple[int, int], list[Stream]] = {}
    for stream in streams:
        by_cohort.setdefault((stream.quota.tenant_id, stream.quota.flavor_id), []).append(stream)
    for siblings in by_cohort.values():
        for lenders in siblings:
            for borrowers in siblings:
                if borrowers is lenders:
                    continue
                for lender in lenders.runs:
                    queued = lender["approved"] + timedelta(seconds=3)
                    if _volcano_at(lenders, queued, switch) or lender.get("lent_back") or lender["preempted"]:
                        continue
                    held = [b for b in borrowers.runs if not b["preempted"] and not b.get("lent_back")
                            and not _volcano_at(borrowers, b["approved"], switch)
                            and b["admitted"] + timedelta(minutes=10) < queued < b["finished"] - timedelta(minutes=10)]
                    if not held:
                        continue
                    borrower = held[0]
                    at = queued + timedelta(seconds=rng.uniform(1, 6))  # Kueue reclaims in its next pass
                    back = at + timedelta(minutes=rng.uniform(20, 180))
                    finished = back + (borrower["finished"] - at)
                    admitted = max(lender["admitted"], at + timedelta(seconds=rng.uniform(4, 40)))
                    shift = admitted - lender["admitted"]
                    if finished >= end or lender["finished"] + shift >= end:
                        continue
                    borrower.update(preempted=(borrower["admitted"], at, back), finished=finished,
                                    reclaim={"lender": lender, "at": at})
                    lender.update(admitted=admitted, finished=lender["finished"] + shift, lent_back=True)
                    borrower["lent_back"] = True


def _streams(cluster: Cluster) -> list[Stream]:
    members: dict[int, list[Any]] = {}
    for m in Membership.objects.filter(project__isnull=False).select_related("user").order_by("pk"):
        members.setdefault(m.project_id, []).append(m.user)
    admins: dict[int, list[Any]] = {}
    for m in Membership.objects.filter(project__isnull=True, role=Role.TENANT_ADMIN).select_related("user").order_by("pk"):
        admins.setdefault(m.tenant_id, []).append(m.user)
    out = []
    for quota in _gpu_quotas(cluster):
        users = members.get(quota.project_id) or admins.get(quota.tenant_id) or []
        if not users:
            continue
        nominal = int(quota.nominal)
        borrow = int(quota.borrowing_limit) if quota.borrowing_limit is not None else nominal // 2
        if quota.flavor.pool_label == "online":
            kinds = ["inference"]
        elif quota.flavor.kind == Flavor.Kind.WHOLE:
            kinds = ["training", "training", "training", "notebook"]
        else:
            kinds = ["notebook", "training", "inference"]
        out.append(Stream(quota=quota, cap=max(1, nominal + borrow), members=users, kinds=kinds))
    return out


@contextmanager
def _past_timestamps(*fields: Any) -> Iterator[None]:
    """Let ``bulk_create`` write the history's own ``created_at`` / ``at`` instead of "now" (``auto_now_add``
    would stamp every row on insert; an UPDATE per row afterwards costs seconds). The seed command is one thread."""
    saved = [(f, f.auto_now_add) for f in fields]
    for f, _ in saved:
        f.auto_now_add = False
    try:
        yield
    finally:
        for f, value in saved:
            f.auto_now_add = value


def _seed_requests(cluster: Cluster, streams: list[Stream], now: datetime, switch: datetime) -> list[WorkloadRequest]:
    templates = {t.slug: t for t in ServiceTemplate.objects.filter(active=True).order_by("slug", "version")}
    rows: list[WorkloadRequest] = []
    plan: list[dict[str, Any]] = []
    n = 0
    for stream in streams:
        q = stream.quota
        for run in stream.runs:
            run["gang"] = _gang(stream, run, switch)
            run["project"], run["tenant"] = q.project.slug, q.tenant.slug
            # Kueue's Workload UID (a Volcano gang has no Workload), deterministic like the rest
            run["uid"] = "" if run["gang"] else str(uuid.uuid5(uuid.NAMESPACE_URL, f"seeded-workload-{n + 1}"))
            template = templates.get(run["kind"]) or templates.get("training")
            if template is None:
                return []
            n += 1
            reason = {S.SUCCEEDED: "Completed.", S.FAILED: "The job exited with code 1 (see its logs).",
                      S.STOPPED: "Stopped by its owner."}[run["final"]]
            rows.append(WorkloadRequest(
                tenant=q.tenant, project=q.project, cluster=cluster, template=template,
                name=f"{random.Random(n).choice(NAMES[run['kind']])}-{n:03d}", image=IMAGES[run["kind"]],
                flavor=q.flavor, gpus=run["gpus"], cpu=Decimal(4 * run["gpus"]), memory_gib=32 * run["gpus"],
                parameters={"command": "python train.py"} if run["kind"] == "training" else {},
                duration_hours=max(1, int(run["hours"] + 1)), priority=Priority.BATCH, state=run["final"],
                state_reason=reason, requested_by=run["member"], idempotency_key=f"{IDEMPOTENCY_PREFIX}{n}",
                created_at=run["submitted"], approved_at=run["approved"], queued_at=run["approved"] + timedelta(seconds=3),
                # The current run's admission (after a preemption, the requeued one) and the first one since the
                # approval, as the status follower stamps them (docs/insights.md, "Admission times").
                admitted_at=run["preempted"][2] if run["preempted"] else run["admitted"],
                first_admitted_at=run["admitted"], workload_uid=run["uid"],
                started_at=(run["preempted"][2] if run["preempted"] else run["admitted"]) + timedelta(seconds=45), finished_at=run["finished"], seeded=True,
            ))
            plan.append(run)
    with _past_timestamps(WorkloadRequest._meta.get_field("created_at")):
        made = WorkloadRequest.objects.bulk_create(rows, batch_size=500)
    _seed_events(made, plan)
    _seed_usage(cluster, made, plan)
    return made


def _seed_events(made: list[WorkloadRequest], plan: list[dict[str, Any]]) -> None:
    events: list[RequestEvent] = []

    def add(req: WorkloadRequest, at: datetime, frm: str, to: str, message: str, actor: str = ACTOR) -> None:
        events.append(RequestEvent(request=req, at=at, from_state=frm, to_state=to, actor_label=actor, message=message))

    for req, run in zip(made, plan, strict=True):
        add(req, run["submitted"], "", S.SUBMITTED, "Submitted.", req.requested_by.username)
        if run["manual"]:
            add(req, run["submitted"], S.SUBMITTED, S.PENDING_APPROVAL, "Waiting for an approver.")
            add(req, run["approved"], S.PENDING_APPROVAL, S.APPROVED, "Approved by the project admin.")
        else:
            add(req, run["approved"], S.SUBMITTED, S.APPROVED, "Approved automatically by the rule.")
        add(req, req.queued_at, S.APPROVED, S.QUEUED, "Objects created in the cluster.")
        started = ("Volcano scheduled the gang; {n} pod(s) running." if run["gang"]
                   else "Admitted by Kueue; pods running.").format(n=req.replicas)
        add(req, run["admitted"] + timedelta(seconds=45), S.QUEUED, S.RUNNING, started)
        if run["preempted"]:
            _, at, back = run["preempted"]
            reason = PREEMPT_REASON
            if run["gang"]:
                reason = GANG_RESTART_REASON
            elif run.get("reclaim"):
                lender = run["reclaim"]["lender"]
                reason = RECLAIM_REASON.format(uid=lender["uid"], job_uid=uuid.uuid5(uuid.NAMESPACE_URL, lender["uid"]),
                                               tenant=run["tenant"], lender=lender["project"],
                                               borrower=run["project"])
            add(req, at, S.RUNNING, S.PREEMPTED, reason)
            add(req, at + timedelta(seconds=2), S.PREEMPTED, S.QUEUED, "Requeued after preemption.")
            add(req, back + timedelta(seconds=45), S.QUEUED, S.RUNNING, started.replace("Admitted by", "Admitted again by"))
        add(req, run["finished"], S.RUNNING, run["final"], req.state_reason)
    with _past_timestamps(RequestEvent._meta.get_field("at")):
        RequestEvent.objects.bulk_create(events, batch_size=1000)
    _seed_reclaims(made, plan)


def _seed_reclaims(made: list[WorkloadRequest], plan: list[dict[str, Any]]) -> None:
    """One ``Reclaim`` per borrower evicted for a lender, as the status follower writes it (seen a cycle later)."""
    request_of = {id(run): req for req, run in zip(made, plan, strict=True)}
    rows = []
    for req, run in zip(made, plan, strict=True):
        if not run.get("reclaim"):
            continue
        lender_run = run["reclaim"]["lender"]
        lender = request_of[id(lender_run)]
        rows.append(Reclaim(borrower=req, evicted_at=run["reclaim"]["at"] + timedelta(seconds=2),
                            preemptor_uid=lender_run["uid"], lender=lender, lender_queued_at=lender.queued_at,
                            lender_admitted_at=lender_run["admitted"], seeded=True))
    Reclaim.objects.bulk_create(rows, batch_size=500)


def _seed_usage(cluster: Cluster, made: list[WorkloadRequest], plan: list[dict[str, Any]]) -> None:
    intervals: list[UsageInterval] = []
    for req, run in zip(made, plan, strict=True):
        spans = ([(run["admitted"], run["preempted"][1], UsageInterval.EndReason.EVICTED),
                  (run["preempted"][2], run["finished"], UsageInterval.EndReason.FINISHED)]
                 if run["preempted"] else [(run["admitted"], run["finished"], UsageInterval.EndReason.FINISHED)])
        for i, (start, end, why) in enumerate(spans):
            for share in shares(req.flavor, gpus=req.gpus, cpu=req.cpu, memory_gib=req.memory_gib, pods=req.replicas):
                intervals.append(UsageInterval(
                    request=req, tenant_id=req.tenant_id, project_id=req.project_id, cluster=cluster,
                    run_key=f"{RUN_KEY_PREFIX}{req.pk}:{i}", source=UsageInterval.Source.WORKLOAD,
                    object_uid=f"seeded-{req.pk}", object_name=req.k8s_name, unit=share.unit, key=share.key,
                    quantity=share.quantity, started_at=start, ended_at=end, end_reason=why,
                ))
    UsageInterval.objects.bulk_create(intervals, batch_size=1000, ignore_conflicts=True)


SLOT = timedelta(minutes=5)  # what the sampler writes: one sample per 5-minute slot (insights/samples.py)


def _slot_range(t0: datetime, n: int, a: datetime, b: datetime) -> range:
    """The slots i (instant ``t0 + i * SLOT``) with ``a <= instant < b``."""
    def index(t: datetime) -> int:
        return max(0, min(n, -int(-(t - t0) // SLOT)))  # ceil
    return range(index(a), index(b))


def _queue_series(runs: list[dict[str, Any]], t0: datetime, n: int) -> dict[str, list[int]]:
    """Per slot of one queue: admitted GPUs, pending GPUs, pending count, the smallest waiting request and the idle
    notebook GPUs, as the sampler would have read them (waiting: approved, not admitted yet or preempted)."""
    out = {name: [0] * n for name in ("admitted", "pending", "count", "smallest", "idle")}
    admitted, pending, count, smallest, idle = (out[k] for k in ("admitted", "pending", "count", "smallest", "idle"))
    for run in runs:
        pre, gpus = run["preempted"], run["gpus"]
        held = ([(run["admitted"], pre[1]), (pre[2], run["finished"])] if pre else [(run["admitted"], run["finished"])])
        waits = [(run["approved"], run["admitted"])] + ([(pre[1], pre[2])] if pre else [])
        for a, b in held:
            for i in _slot_range(t0, n, a, b):
                admitted[i] += gpus
                # notebooks sit idle past their timeout about half of the time
                if run["kind"] == "notebook" and ((t0 + i * SLOT) - a).total_seconds() % 7200 > 3600:
                    idle[i] += gpus
        for a, b in waits:
            for i in _slot_range(t0, n, a, b):
                pending[i] += gpus
                count[i] += 1
                smallest[i] = gpus if not smallest[i] else min(smallest[i], gpus)
    return out


def _seed_samples(cluster: Cluster, streams: list[Stream], start: datetime, end: datetime, rng: random.Random) -> int:
    """5-minute queue and pool samples over the history, with every field the metrics read (the sampler's rules:
    pending and its smallest request, borrowed beyond nominal, promised quota, the overcommit setting)."""
    capacity = capacity_by_flavor(cluster)
    tenant_nominal: dict[int, Decimal] = {}
    promised: dict[int, Decimal] = {}
    for q in Quota.objects.filter(flavor__cluster=cluster).select_related("flavor"):
        if q.resource == q.flavor.primary_resource:
            into = promised if q.project_id else tenant_nominal
            into[q.flavor_id] = into.get(q.flavor_id, Decimal(0)) + q.nominal
    flavors = {s.quota.flavor_id: s.quota.flavor for s in streams}
    mig_windows = {fid: _contention(rng, start, end) for fid, f in flavors.items() if f.kind == Flavor.Kind.MIG}
    t0 = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    n = max(0, int((end - t0) // SLOT))
    series = [_queue_series(s.runs, t0, n) for s in streams]
    queue_rows: list[tuple[Any, ...]] = []
    pool_rows: list[tuple[Any, ...]] = []
    overcommit = cluster.overcommit_percent
    for i in range(n):
        at = t0 + i * SLOT
        stamp = connection.ops.adapt_datetimefield_value(at)
        pools: dict[int, list[int]] = {}
        for s, v in zip(streams, series, strict=True):
            q, admitted = s.quota, v["admitted"][i]
            queue_rows.append((stamp, cluster.pk, q.tenant_id, q.project_id, q.flavor_id, q.nominal, q.borrowing_limit,
                               admitted, max(0, admitted - int(q.nominal)), v["pending"][i], v["count"][i],
                               v["smallest"][i], True, 0))
            pool = pools.setdefault(q.flavor_id, [0, 0, 0])
            pool[0] += admitted
            pool[1] += v["pending"][i]
            pool[2] += v["idle"][i]
        for fid, (allocated, queued, idle) in pools.items():
            flavor = flavors[fid]
            pending = queued
            cap = capacity.get((fid, flavor.primary_resource)) or tenant_nominal.get(fid) or Decimal(max(allocated, 1))
            cap = max(cap, Decimal(allocated))
            per_unit = profile_memory_gib(flavor.mig_profile) if flavor.mig_profile else Decimal(80)
            free = (cap - allocated) * per_unit
            mismatch = 0
            if fid in mig_windows and any(a <= at < b for a, b in mig_windows[fid]):
                # Slices of another shape are free: enough memory in all, but not one slice of this profile.
                pending = max(pending, 2)
                mismatch = pending
                free = max(free, per_unit * 3)
            pool_rows.append((stamp, cluster.pk, fid, cap, allocated, idle, pending, mismatch, free,
                              promised.get(fid, Decimal(0)), overcommit, True))
    _insert(QueueSample, QUEUE_COLUMNS, queue_rows)
    _insert(PoolSample, POOL_COLUMNS, pool_rows)
    if n:
        fill_lent(t0, t0 + (n - 1) * SLOT)
    return len(queue_rows) + len(pool_rows)


QUEUE_COLUMNS = ("at", "cluster_id", "tenant_id", "project_id", "flavor_id", "nominal", "borrowing_limit", "admitted",
                 "borrowed", "pending", "pending_count", "pending_smallest", "seeded", "lent")
POOL_COLUMNS = ("at", "cluster_id", "flavor_id", "capacity", "allocated", "idle_allocated", "pending", "shape_mismatch",
                "free_memory_gib", "promised", "overcommit_percent", "seeded")


def _insert(model: Any, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """Tens of thousands of sample rows as plain tuples (instants already adapted, numbers the database takes as
    they are): ``bulk_create`` would spend seconds building a model object and preparing each field of every row.
    PostgreSQL: one ``COPY``; elsewhere many rows per ``INSERT`` (one statement per row costs a round trip each)."""
    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(connection.ops.quote_name(model._meta.get_field(c.removesuffix("_id")).column) for c in columns)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        return
    one = "(" + ", ".join(["%s"] * len(columns)) + ")"
    batch = max(1, min(2000, (connection.features.max_query_params or 65535) // len(columns)))
    with connection.cursor() as cursor:
        for i in range(0, len(rows), batch):
            chunk = rows[i:i + batch]
            cursor.execute(f"INSERT INTO {table} ({names}) VALUES {', '.join([one] * len(chunk))}",
                           [value for row in chunk for value in row])


def seed_insights_demo(*, cluster_name: str = "sandbox", now: datetime | None = None) -> dict[str, Any]:
    """Write the demo's three weeks of history once. Returns what it wrote (zeros when it was there already)."""
    now = now or timezone.now()
    cluster = Cluster.objects.filter(name=cluster_name).first()
    if cluster is None:
        log.warning("insights demo skipped: no cluster %r", cluster_name)
        return {"requests": 0, "samples": 0}
    end = now - timedelta(minutes=10)
    start = end - timedelta(days=HISTORY_DAYS)
    switch = (end - timedelta(days=ARCHITECTURE_SWITCH_DAYS)).replace(minute=0, second=0, microsecond=0)
    if cluster.architecture != "E":
        switch = end  # the F-then-E story is the demo's (E) cluster's; another has no gangs in its history
    rng = random.Random(RANDOM_SEED)
    streams = _streams(cluster)
    for stream in streams:
        _simulate(stream, rng, start, end)
    _after_switch(streams, switch)
    _reclaims(streams, rng, switch, end)
    summary = {"requests": 0, "samples": 0}
    with transaction.atomic():
        if not WorkloadRequest.objects.filter(seeded=True).exists():
            _seed_switch(cluster, switch)
            summary["requests"] = len(_seed_requests(cluster, streams, now, switch))
        if not (QueueSample.objects.filter(seeded=True).exists() or PoolSample.objects.filter(seeded=True).exists()):
            summary["samples"] = _seed_samples(cluster, streams, start, end, rng)
        if not WorkloadRequest.objects.filter(seeded=True, spilled=True).exists():
            summary["requests"] += _seed_spills(end, random.Random(RANDOM_SEED + 1))
        if not WorkloadRequest.objects.filter(idempotency_key=OVERSIZED_KEY).exists():
            summary["requests"] += _seed_oversized(cluster, end)
        if not MeasuredSample.objects.filter(seeded=True).exists():
            _seed_measured(end)
    return summary


SPILLS = 14  # over the last week: acme-vision's training spilled from the full H100 zone to A100


def _seed_spills(end: datetime, rng: random.Random) -> int:
    """Spill-overs in the history (docs/federation.md): acme-vision training that consented to A100 and spilled from
    the H100 training zone while it was full, each with the wait the router estimated there (the source of the
    "queue wait saved" figure) and the short wait it had on A100. Needs the demo's A100 zone (quotas/demo.py)."""
    target = Flavor.objects.filter(cluster__name="a100-inference", gpu_model="a100-80gb", kind=Flavor.Kind.WHOLE).first()
    template = ServiceTemplate.objects.filter(slug="training", active=True).order_by("-version").first()
    member = Membership.objects.filter(project__slug="acme-vision", role=Role.MEMBER).select_related("project", "user").first()
    if target is None or template is None or member is None:
        return 0
    project = member.project
    rows = []
    for i in range(SPILLS):
        created = end - timedelta(days=7) + timedelta(hours=6 + i * 11 + rng.randint(0, 5), minutes=rng.randint(0, 59))
        waited = timedelta(seconds=rng.randint(20, 300))
        hours = rng.choice([1, 2, 3, 4])
        admitted = created + timedelta(seconds=5) + waited
        estimate = rng.randint(45, 240) * 60
        gpus = rng.choice([1, 2, 4])
        rows.append(WorkloadRequest(
            tenant=project.tenant, project=project, cluster=target.cluster, template=template,
            name=f"spill-{i + 1:02d}", image=IMAGES["training"], flavor=target, gpus=gpus, cpu=Decimal(4 * gpus),
            memory_gib=32 * gpus, parameters={"command": "python train.py"}, duration_hours=hours + 1,
            priority=Priority.BATCH, state=S.SUCCEEDED, state_reason="Completed.", requested_by=member.user,
            idempotency_key=f"{IDEMPOTENCY_PREFIX}spill-{i + 1}", created_at=created, approved_at=created + timedelta(seconds=2),
            queued_at=created + timedelta(seconds=5), admitted_at=admitted, first_admitted_at=admitted,
            started_at=admitted + timedelta(seconds=40), finished_at=admitted + timedelta(hours=hours), seeded=True,
            accepted_models=["h100-80gb", "a100-80gb"], spill_consent=True, spilled=True, spilled_from_model="h100-80gb",
            spill_source_pending=rng.randint(2, 9), spill_source_wait_seconds=estimate,
            route_reason=("Spilled over from h100-80gb to a100-80gb in zone a100-inference: h100-80gb is full in every "
                          "zone that offers it to the project; the job consented and the project allows a100-80gb.")))
    with _past_timestamps(WorkloadRequest._meta.get_field("created_at")):
        WorkloadRequest.objects.bulk_create(rows)
    return len(rows)


OVERSIZED_KEY = f"{IDEMPOTENCY_PREFIX}oversized"
OVERSIZED_NAME = "resnet18-finetune"


def _seed_oversized(cluster: Cluster, end: datetime) -> int:
    """The rightsizing story (docs/measured-use.md): acme-vision's memory-light training job that held a whole H100
    for six hours, finished yesterday; its measured samples (``_seed_measured``) peak at 8.2 GiB with SM active
    ~11 %, so its page suggests a 1g.10gb MIG slice (which the project has quota for) and "Clone with the
    suggestion" pre-fills it."""
    flavor = Flavor.objects.filter(cluster=cluster, kind=Flavor.Kind.WHOLE, gpu_model="h100-80gb", active=True).order_by("order", "name").first()
    template = ServiceTemplate.objects.filter(slug="training", active=True).order_by("-version").first()
    member = Membership.objects.filter(project__slug="acme-vision", role=Role.MEMBER).select_related("project", "user").first()
    if flavor is None or template is None or member is None:
        return 0
    started = (end - timedelta(days=1)).replace(minute=0, second=0, microsecond=0) - timedelta(hours=8)
    created = started - timedelta(minutes=2)
    req = WorkloadRequest(
        tenant=member.project.tenant, project=member.project, cluster=cluster, template=template, name=OVERSIZED_NAME,
        image=IMAGES["training"], flavor=flavor, gpus=1, cpu=Decimal(4), memory_gib=32,
        parameters={"command": "python train.py --model resnet18 --batch-size 64"}, duration_hours=8,
        priority=Priority.BATCH, state=S.SUCCEEDED, state_reason="Completed.", requested_by=member.user,
        idempotency_key=OVERSIZED_KEY, created_at=created, approved_at=created + timedelta(seconds=1),
        queued_at=created + timedelta(seconds=4), admitted_at=created + timedelta(seconds=30),
        first_admitted_at=created + timedelta(seconds=30), started_at=started, finished_at=started + timedelta(hours=6),
        workload_uid=str(uuid.uuid5(uuid.NAMESPACE_URL, "seeded-workload-oversized")), seeded=True)
    with _past_timestamps(WorkloadRequest._meta.get_field("created_at")):
        WorkloadRequest.objects.bulk_create([req])
    return 1


MEASURED_COLUMNS = ("at", "request_id", "cluster_id", "tenant_id", "project_id", "flavor_id", "seconds", "gpus",
                    "memory_mib", "util_avg", "sm_active_avg", "fb_used_max", "xid", "seeded")


def _memory_mib(req: WorkloadRequest) -> int:
    """What one device offers; a flavor the demo made without the sandbox has no ``gpu_memory_mib``: its model's
    name says it (``h100-80gb``), else a 48 GiB card."""
    mib = device_memory_mib(req.flavor, req.share_memory_mib)
    if mib:
        return mib
    m = re.search(r"(\d+)gb", req.flavor.gpu_model or "")
    return int(m.group(1)) * 1024 if m else 48 * 1024


def _profile(req: WorkloadRequest, rng: random.Random) -> Any:
    """A request's measured use per 5-minute slot, as (util %, SM active ratio, peak memory MiB) from a function of
    the slot's index: saturated training, bursty notebooks mostly left idle, inference following the day, and a
    few memory-light training jobs (the oversized one is the demo's rightsizing example)."""
    if req.idempotency_key == OVERSIZED_KEY:
        return lambda i: (rng.uniform(30, 50), rng.uniform(0.10, 0.118), rng.uniform(8000, 8400))
    kind = req.template.kind
    mem = _memory_mib(req)
    if kind == "notebook":
        base = rng.uniform(0.03, 0.08) * mem
        return lambda i: ((rng.uniform(20, 70), rng.uniform(0.1, 0.5), base * 4) if rng.random() < 0.2
                          else (rng.uniform(0, 3), rng.uniform(0, 0.02), base))
    if kind == "inference":
        def served(i: int) -> tuple[float, float, float]:
            load = min(100.0, max(2.0, 40 + 30 * math.sin(i / 288 * 2 * math.pi) + rng.uniform(-10, 10)))
            return load, load / 130, mem * rng.uniform(0.85, 0.9)
        return served
    if rng.random() < 0.1:  # memory-light training on big devices
        return lambda i: (rng.uniform(30, 50), rng.uniform(0.1, 0.15), mem * rng.uniform(0.1, 0.15))
    util, share = rng.uniform(60, 95), rng.uniform(0.45, 0.9)
    return lambda i: (min(100.0, util + rng.uniform(-8, 5)), min(1.0, util / 110 + rng.uniform(-0.05, 0.05)),
                      mem * min(0.98, share + rng.uniform(-0.03, 0.03)))


def _seed_measured(end: datetime) -> int:
    """Measured samples (what ``insights.measured_take`` writes from DCGM) for every slot of every seeded run: the
    measured metrics and rightsizing have history without the sandbox. One ``COPY`` (tens of thousands of rows)."""
    rows: list[tuple[Any, ...]] = []
    earliest: datetime | None = None
    history = (WorkloadRequest.objects.filter(seeded=True, started_at__isnull=False, finished_at__isnull=False)
               .select_related("flavor", "template").order_by("pk"))
    for req in history:
        rng = random.Random(f"{RANDOM_SEED}-measured-{req.idempotency_key}")
        use = _profile(req, rng)
        memory = _memory_mib(req)
        at = slot_end(req.started_at) + timedelta(seconds=SLOT_SECONDS)
        last = min(req.finished_at, end)
        earliest = at if earliest is None or at < earliest else earliest
        i = 0
        while at <= last:
            util, sm, fb = use(i)
            rows.append((connection.ops.adapt_datetimefield_value(at), req.pk, req.cluster_id, req.tenant_id,
                         req.project_id, req.flavor_id, SLOT_SECONDS, req.gpus * req.replicas, memory, round(util, 2),
                         round(max(0.0, sm), 4), round(min(fb, memory), 1), 0, True))
            at += timedelta(seconds=SLOT_SECONDS)
            i += 1
    _insert(MeasuredSample, MEASURED_COLUMNS, rows)
    if rows and earliest is not None:  # days already rolled up are read from the samples until refreshed
        measured_rollup.mark_since(earliest)
    return len(rows)


def _seed_switch(cluster: Cluster, switch: datetime) -> None:
    """The history's architecture change: the cluster ran F until ``switch`` and E since (only when it runs E now,
    so the change's record and the live configuration agree)."""
    if cluster.architecture != "E" or ArchitectureChange.objects.filter(fingerprint=SWITCH_FINGERPRINT).exists():
        return
    with _past_timestamps(ArchitectureChange._meta.get_field("created_at")):
        ArchitectureChange.objects.create(
            cluster=cluster, from_architecture="F", to_architecture="E", fingerprint=SWITCH_FINGERPRINT,
            state=ArchitectureChange.State.APPLIED, created_at=switch - timedelta(minutes=3),
            started_at=switch - timedelta(minutes=2), finished_at=switch,
            state_reason="Demo history: training moved from the offline Kueue pool (F) to Volcano gangs (E).")


def seeded_counts() -> dict[str, int]:
    """How much demo history there is (the tests and the pages' "seeded" note)."""
    return {
        "requests": WorkloadRequest.objects.filter(seeded=True).count(),
        "events": RequestEvent.objects.filter(request__seeded=True).count(),
        "usage": UsageInterval.objects.filter(Q(run_key__startswith=RUN_KEY_PREFIX)).count(),
        "queue_samples": QueueSample.objects.filter(seeded=True).count(),
        "pool_samples": PoolSample.objects.filter(seeded=True).count(),
        "reclaims": Reclaim.objects.filter(seeded=True).count(),
        "measured_samples": MeasuredSample.objects.filter(seeded=True).count(),
    }

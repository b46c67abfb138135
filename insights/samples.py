"""The sampler: what each queue and each GPU pool holds now, written every 5 minutes (docs/insights.md, "Samples").

``samples_take()`` writes one ``QueueSample`` per project quota (the flavor's primary resource: GPUs, slices or
vGPUs; CPU flavors are left out) and one ``PoolSample`` per active GPU flavor, all stamped with the start of the
current 5-minute slot. Running it again in the same slot replaces that slot's rows (the unique constraints on
``(at, project, flavor)`` and ``(at, flavor)`` back it), so beat, a retry and a manual run never duplicate.

Where the numbers come from:

* nominal / borrowing limit / admitted (``Quota.used``) / borrowed: the project's ``Quota`` row as the reconcile
  last read it back from its ClusterQueue.
* pending: the requests waiting for admission now (``queued`` without ``admitted_at``, or ``preempted``), as
  gpus x replicas.
* capacity: ``quotas.capacity.capacity_by_flavor`` (ready, present nodes).
* allocated: requests holding an admission now (running, or queued with ``admitted_at`` set), as gpus x replicas;
  the same for every architecture (Kueue's ``used`` misses Volcano's gangs under E).
* idle allocated: running notebooks idle past their template's timeout (the rule of
  ``workloads.materialize.notebooks_cull_idle``); inference has no traffic signal yet, so it counts 0.
* shape mismatch (MIG only): pending slices of a profile beyond its free slices that the pool's free slice memory
  of other profiles could have held (a different layout would have placed them).
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, Min, Q, Sum
from django.utils import timezone

from quotas.capacity import capacity_by_flavor
from quotas.models import Cluster, Flavor, Quota
from workloads import kinds
from workloads.models import RequestState, WorkloadRequest

from .models import PoolSample, QueueSample, SampleHour

S = RequestState
SLOT = timedelta(minutes=5)
# Waiting for admission: queued and not admitted yet (an admitted one may still be starting its pods), or preempted.
WAITING = Q(state=S.PREEMPTED) | Q(state=S.QUEUED, admitted_at__isnull=True)
_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb")


def slot_of(at: datetime) -> datetime:
    """The start of the 5-minute slot ``at`` falls in (samples are stamped with it)."""
    seconds = int(SLOT.total_seconds())
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def profile_memory_gib(profile: str) -> Decimal:
    """The memory of one MIG slice (``1g.10gb`` -> 10); 0 for an unknown name."""
    match = _PROFILE.match(profile or "")
    return Decimal(match.group(2)) if match else Decimal(0)


def profile_gpu_share(profile: str) -> Decimal:
    """A MIG slice's share of a GPU by compute slices (``3g.40gb`` -> 3/7)."""
    match = _PROFILE.match(profile or "")
    return (Decimal(match.group(1)) / 7) if match else Decimal(0)


def _demand() -> Any:
    return F("gpus") * F("replicas")


def _idle_notebooks(now: datetime) -> dict[int, Decimal]:
    """Per flavor: GPUs held by running interactive requests idle past their template's timeout."""
    interactive = [k.name for k in kinds.KINDS.values() if k.interactive]
    rows = (WorkloadRequest.objects.filter(state=S.RUNNING, template__kind__in=interactive,
                                           template__idle_timeout_minutes__isnull=False)
            .values_list("flavor_id", "gpus", "replicas", "last_active_at", "started_at", "queued_at",
                         "template__idle_timeout_minutes"))
    out: dict[int, Decimal] = defaultdict(Decimal)
    for flavor_id, gpus, replicas, last_active, started, queued, minutes in rows:
        since = max((t for t in (last_active, started or queued) if t is not None), default=None)
        if since is not None and since + timedelta(minutes=minutes or 0) <= now:
            out[flavor_id] += Decimal(gpus * replicas)
    return out


def samples_take(now: datetime | None = None) -> dict[str, int]:
    """Write this slot's samples (replacing any already written for it). Returns how many of each."""
    now = now or timezone.now()
    at = slot_of(now)
    flavors = {f.pk: f for f in Flavor.objects.filter(active=True).exclude(kind=Flavor.Kind.CPU).select_related("cluster")}
    quotas = [q for q in Quota.objects.filter(project__isnull=False, flavor_id__in=list(flavors))
              .order_by("project_id", "flavor_id") if q.resource == flavors[q.flavor_id].primary_resource]
    waiting = {
        (r["project_id"], r["flavor_id"]): r
        for r in WorkloadRequest.objects.filter(WAITING, flavor_id__in=list(flavors))
        .values("project_id", "flavor_id").order_by()
        .annotate(demand=Sum(_demand()), count=Count("id"), smallest=Min(_demand()))
    }
    pending_by_flavor: dict[int, Decimal] = defaultdict(Decimal)
    for (_, flavor_id), r in waiting.items():
        pending_by_flavor[flavor_id] += Decimal(r["demand"] or 0)
    allocated = dict(
        WorkloadRequest.objects.filter(flavor_id__in=list(flavors))
        .filter(Q(state=S.RUNNING) | Q(state=S.QUEUED, admitted_at__isnull=False))
        .values("flavor_id").order_by().annotate(units=Sum(_demand())).values_list("flavor_id", "units")
    )
    idle = _idle_notebooks(now)
    promised: dict[int, Decimal] = defaultdict(Decimal)
    queue_rows = []
    for q in quotas:
        w = waiting.get((q.project_id, q.flavor_id)) or {}
        promised[q.flavor_id] += q.nominal
        queue_rows.append(QueueSample(
            at=at, cluster_id=flavors[q.flavor_id].cluster_id, tenant_id=q.tenant_id, project_id=q.project_id,
            flavor_id=q.flavor_id, nominal=q.nominal, borrowing_limit=q.borrowing_limit, admitted=q.used,
            borrowed=q.borrowed, pending=Decimal(w.get("demand") or 0), pending_count=int(w.get("count") or 0),
            pending_smallest=Decimal(w.get("smallest") or 0),
        ))
    capacity: dict[int, Decimal] = {}
    for cluster in Cluster.objects.filter(pk__in={f.cluster_id for f in flavors.values()}):
        mine = [f for f in flavors.values() if f.cluster_id == cluster.pk]
        for (flavor_id, resource), amount in capacity_by_flavor(cluster, flavors=mine).items():
            if resource == flavors[flavor_id].primary_resource:
                capacity[flavor_id] = amount
    pool_rows = []
    mig_free = _mig_free(flavors, capacity, allocated)
    for flavor in flavors.values():
        cap = capacity.get(flavor.pk, Decimal(0))
        held = Decimal(allocated.get(flavor.pk) or 0)
        pending = pending_by_flavor.get(flavor.pk, Decimal(0))
        mismatch, free_gib = Decimal(0), Decimal(0)
        if flavor.kind == Flavor.Kind.MIG:
            mismatch, free_gib = _shape_mismatch(flavor, cap - held, pending, mig_free)
        pool_rows.append(PoolSample(
            at=at, cluster_id=flavor.cluster_id, flavor_id=flavor.pk, capacity=cap, allocated=held,
            idle_allocated=idle.get(flavor.pk, Decimal(0)), pending=pending, shape_mismatch=mismatch,
            free_memory_gib=free_gib, promised=promised.get(flavor.pk, Decimal(0)),
            overcommit_percent=flavor.cluster.overcommit_percent,
        ))
    with transaction.atomic():
        # Written late into an hour already rolled up (a clock jump): the metrics read that hour from the samples
        # until the next refresh recomputes it (insights/sample_rollups.py).
        SampleHour.objects.filter(hour=at.replace(minute=0), dirty=False).update(dirty=True)
        QueueSample.objects.filter(at=at, seeded=False).delete()
        PoolSample.objects.filter(at=at, seeded=False).delete()
        # A run overlapping this one (beat and a retry) wrote the same slot: the last one's numbers stand.
        QueueSample.objects.bulk_create(queue_rows, update_conflicts=True, unique_fields=["at", "project", "flavor"],
                                        update_fields=[f for f in QUEUE_FIELDS])
        PoolSample.objects.bulk_create(pool_rows, update_conflicts=True, unique_fields=["at", "flavor"],
                                       update_fields=[f for f in POOL_FIELDS])
        fill_lent(at, at)
    return {"queue_samples": len(queue_rows), "pool_samples": len(pool_rows)}


# Who lent: in each slot, a cohort's (tenant and flavor's) borrowed units are credited to its queues in proportion to
# their unused nominal quota (max(nominal - admitted, 0)), up to what was unused: lent = min(borrowed, unused) x
# unused / cohort unused. Lending limits are not sampled, so every queue is taken to lend all of its unused quota.
# One statement for PostgreSQL and SQLite (window sums per slot; UPDATE ... FROM).
LENT_SQL = """
UPDATE insights_queuesample SET lent = t.lent FROM (
    SELECT id, ROUND(CASE WHEN cu > 0 THEN (CASE WHEN cb < cu THEN cb ELSE cu END) * 1.0 * unused / cu ELSE 0 END, 3) AS lent
    FROM (SELECT id, unused, SUM(borrowed) OVER w AS cb, SUM(unused) OVER w AS cu
          FROM (SELECT id, at, tenant_id, flavor_id, borrowed,
                       CASE WHEN nominal > admitted THEN nominal - admitted ELSE 0 END AS unused
                FROM insights_queuesample WHERE at >= %s AND at <= %s) u
          WINDOW w AS (PARTITION BY at, tenant_id, flavor_id)) v
) t WHERE insights_queuesample.id = t.id AND insights_queuesample.lent <> t.lent
"""


def fill_lent(first: datetime, last: datetime) -> int:
    """Set ``QueueSample.lent`` for every slot from ``first`` to ``last`` (inclusive) from the slot's own rows; a
    second run changes nothing. Returns the rows changed.

    On PostgreSQL the join is kept off nested loops: with statistics from a table that was empty when last analysed
    (a fresh database just filled by a backfill or the demo's history), the planner expects one row and rescans the
    window subquery once per sample, which took over 15 minutes for the demo's history; a hash join takes
    milliseconds."""
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_nestloop = off")
        cursor.execute(LENT_SQL, [connection.ops.adapt_datetimefield_value(first),
                                  connection.ops.adapt_datetimefield_value(last)])
        return cursor.rowcount


QUEUE_FIELDS = ("cluster", "tenant", "nominal", "borrowing_limit", "admitted", "borrowed", "pending", "pending_count",
                "pending_smallest", "seeded")
POOL_FIELDS = ("cluster", "capacity", "allocated", "idle_allocated", "pending", "shape_mismatch", "free_memory_gib",
               "promised", "overcommit_percent", "seeded")


def _pool_key(flavor: Flavor) -> tuple[int, str, str]:
    """MIG flavors cut from the same GPUs: one cluster, one GPU model, one pool label."""
    return (flavor.cluster_id, flavor.gpu_model, flavor.pool_label)


def _mig_free(flavors: dict[int, Flavor], capacity: dict[int, Decimal], allocated: dict[int, Any]) -> dict[tuple, Decimal]:
    """Per MIG pool: the memory (GiB) of its free slices, over every profile."""
    free: dict[tuple, Decimal] = defaultdict(Decimal)
    for flavor in flavors.values():
        if flavor.kind == Flavor.Kind.MIG:
            slices = max(capacity.get(flavor.pk, Decimal(0)) - Decimal(allocated.get(flavor.pk) or 0), Decimal(0))
            free[_pool_key(flavor)] += slices * profile_memory_gib(flavor.mig_profile)
    return free


def _shape_mismatch(flavor: Flavor, free_slices: Decimal, pending: Decimal,
                    mig_free: dict[tuple, Decimal]) -> tuple[Decimal, Decimal]:
    """(pending slices the pool's free memory could hold but no free slice of this profile can, pool free GiB).

    Pending slices beyond this profile's free ones cannot start; of those, as many as the free memory left in the
    pool's other profiles' slices would hold (``floor(other free GiB / slice GiB)``) are a shape mismatch: the
    memory is there, cut the wrong way."""
    pool_free = mig_free.get(_pool_key(flavor), Decimal(0))
    memory = profile_memory_gib(flavor.mig_profile)
    free_slices = max(free_slices, Decimal(0))
    unplaceable = max(pending - free_slices, Decimal(0))
    if not unplaceable or not memory:
        return Decimal(0), pool_free
    other_free = max(pool_free - free_slices * memory, Decimal(0))
    return min(unplaceable, Decimal(int(other_free // memory))), pool_free

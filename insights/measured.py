"""Measured GPU use (docs/measured-use.md): what running requests actually used, next to what they were allocated.

* **Sampling** (``measured_take``, beat task ``insights.measured_take`` every 5 minutes): four instant queries to
  Prometheus (``portal/prometheus_api.py``) over NVIDIA's DCGM exporter series, grouped by ``namespace`` and
  ``pod``; a pod is a request's when it lives in the request's project namespace and its name starts with the
  request's object name (``req-<id>-``); where one Prometheus answers for several clusters
  (``PROMETHEUS_CLUSTER_LABEL``), also grouped by that label and matched to the request's cluster's value
  (``Cluster.prometheus_cluster_value``). One :class:`~insights.models.MeasuredSample` per running request and
  5-minute slot; a second run in the same slot writes nothing (the unique constraint), so retries are harmless.
  Stored, not queried on demand: a year of a tenant's figures is one grouped sum over an indexed table, and a
  finished request keeps its evidence whatever Prometheus still retains.
* **Metrics** (registered in ``insights/registry.py``, family ``measured``): measured utilisation, idle GPU-hours
  and memory headroom per tenant, project, flavor and cluster, each figure labelled allocated or measured; scoped
  like every metric (``common.narrow``).
* **Rightsizing** (:func:`suggestion`): a request's measured peak memory and SM activity against what it asked;
  the smallest flavor of its cluster (that its template allows) that fits with :data:`MARGIN`.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import localcontext
from typing import Any

from django.conf import settings
from django.db.models import Avg, Count, Max
from django.utils import timezone

from portal import prometheus_api
from quotas.models import Flavor
from workloads.models import RequestState, WorkloadRequest

from . import measured_rollup, memo
from .common import group_fields, hours, make_points, make_rows, narrow, ratio
from .models import MeasuredRollup, MeasuredSample
from .registry import Metric, Query, Result, register

SLOT_SECONDS = 300
MARGIN = 0.2  # a suggestion leaves 20 % above the measured peak
POD_OF_REQUEST = re.compile(r"^req-(\d+)(?:-|$)")
_MIG = re.compile(r"^(\d+)g\.(\d+)gb")
MEASURED_GROUPS = ("tenant", "project", "flavor", "cluster")

QUERIES = {
    "util": "avg by (namespace, pod) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]))",
    "sm": "avg by (namespace, pod) (avg_over_time(DCGM_FI_PROF_SM_ACTIVE[5m]))",
    "fb": "max by (namespace, pod) (max_over_time(DCGM_FI_DEV_FB_USED[5m]))",
    "xid": "max by (namespace, pod) (max_over_time(DCGM_FI_DEV_XID_ERRORS[5m]))",
}


def cluster_label() -> str:
    """The label naming the cluster when one Prometheus answers for several (``PROMETHEUS_CLUSTER_LABEL``; "" none)."""
    return str(getattr(settings, "PROMETHEUS_CLUSTER_LABEL", "") or "")


def queries(label: str = "") -> dict[str, str]:
    """The sampling queries; with a cluster ``label``, grouped ``by (<label>, namespace, pod)``. Pure."""
    if not label:
        return dict(QUERIES)
    return {k: q.replace("by (namespace, pod)", f"by ({label}, namespace, pod)") for k, q in QUERIES.items()}


idle_percent = measured_rollup.idle_percent  # the one threshold, kept where the rollup (imported here) reads it


# -- what a device offers ------------------------------------------------------------------------------------------
def device_memory_mib(flavor: Flavor, share_memory_mib: int = 0) -> int:
    """GPU memory one device of ``flavor`` offers: a card, a MIG slice (by its profile name), a HAMi vGPU."""
    if flavor.kind == Flavor.Kind.MIG:
        m = _MIG.match(flavor.mig_profile or "")
        return int(m.group(2)) * 1024 if m else 0
    if flavor.kind == Flavor.Kind.HAMI:
        return int(share_memory_mib or flavor.hami_memory_mib or flavor.gpu_memory_mib or 0)
    return int(flavor.gpu_memory_mib or 0)


def device_compute_share(flavor: Flavor) -> float:
    """Share of one card's compute a device of ``flavor`` is: 1, g/7 for a MIG slice, the HAMi cores %."""
    if flavor.kind == Flavor.Kind.MIG:
        m = _MIG.match(flavor.mig_profile or "")
        return int(m.group(1)) / 7 if m else 0.0
    if flavor.kind == Flavor.Kind.HAMI:
        return (flavor.hami_cores_percent or 100) / 100
    return 1.0


# -- sampling ------------------------------------------------------------------------------------------------------
def slot_end(now: datetime) -> datetime:
    t = math.floor(now.timestamp() / SLOT_SECONDS) * SLOT_SECONDS
    return datetime.fromtimestamp(t, UTC)


def measured_take(now: datetime | None = None) -> dict[str, Any]:
    """One sample per running request for the slot ending at ``now`` (rounded down to 5 minutes). Idempotent."""
    at = slot_end(now or timezone.now())
    running = list(WorkloadRequest.objects.filter(state=RequestState.RUNNING, seeded=False)
                   .select_related("project", "flavor", "cluster"))
    if not running or not prometheus_api.configured():
        return {"at": at.isoformat(), "requests": len(running), "written": 0}
    label = cluster_label()
    per_pod: dict[str, list[tuple[dict[str, str], float]]] = {}
    for key, expr in queries(label).items():
        per_pod[key] = prometheus_api.query(expr)  # PrometheusUnavailable: the task fails, the next slot retries
    by_request: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    # where a request's pods are: its project namespace, and with one Prometheus over several clusters, the value
    # of the cluster label its cluster's series carry (a namespace and a pod name may exist in every cluster)
    where = {r.pk: (r.cluster.prometheus_cluster_value if label else "", r.project.cluster_namespace or r.project.slug)
             for r in running}
    for key, rows in per_pod.items():
        for labels, value in rows:
            m = POD_OF_REQUEST.match(labels.get("pod", ""))
            if not m:
                continue
            rid = int(m.group(1))
            if where.get(rid) != (labels.get(label, "") if label else "", labels.get("namespace")):
                continue
            by_request[rid][key].append(value)
    rows = []
    for r in running:
        got = by_request.get(r.pk)
        if not got or not got.get("util"):
            continue
        rows.append(MeasuredSample(
            at=at, request_id=r.pk, cluster_id=r.cluster_id, tenant_id=r.tenant_id, project_id=r.project_id,
            flavor_id=r.flavor_id, seconds=SLOT_SECONDS, gpus=r.gpus * r.replicas,
            memory_mib=device_memory_mib(r.flavor, r.share_memory_mib),
            util_avg=sum(got["util"]) / len(got["util"]),
            sm_active_avg=(sum(got["sm"]) / len(got["sm"])) if got.get("sm") else 0.0,
            fb_used_max=max(got.get("fb") or [0.0]), xid=int(max(got.get("xid") or [0.0]))))
    # bulk_create(ignore_conflicts=True) hands back every row it was given, written or not: leave out the slot's
    # rows already there so "written" says what this run added (the constraint still guards a concurrent run)
    have = set(MeasuredSample.objects.filter(at=at).values_list("request_id", flat=True))
    rows = [row for row in rows if row.request_id not in have]
    MeasuredSample.objects.bulk_create(rows, ignore_conflicts=True)
    if rows:  # a day already rolled up (a late or replayed slot) is read from the samples until refreshed
        measured_rollup.mark_since(at)
    return {"at": at.isoformat(), "requests": len(running), "written": len(rows)}


# -- metrics -------------------------------------------------------------------------------------------------------
def _sums(query: Query) -> tuple[dict[tuple, dict[str, float]], dict[tuple, dict[datetime, dict[str, float]]]]:
    """Per group, and per group and chart bucket: device-seconds allocated, utilisation-weighted, idle, memory.
    The three measured metrics of one overview or report share it (``memo.one_page``); the result is only read."""
    key = ("measured-sums", id(query.scope), *(getattr(query, f) for f in (
        "start", "end", "group_by", "bucket", "cluster_id", "flavor_id", "tenant_id", "project_id")))
    return memo.remembered(key, lambda: (query.scope, _sums_now(query)))[1]


def _sums_now(query: Query) -> tuple[dict[tuple, dict[str, float]], dict[tuple, dict[datetime, dict[str, float]]]]:
    """Whole days from the ``measured`` rollup, the rest of ``(start, end]`` from the samples (measured_rollup.py),
    summed exactly (numerics, Decimal) and made floats only per bucket and per total."""
    threshold = idle_percent()
    parts = measured_rollup.plan(query.start, query.end, query.bucket, threshold)
    samples = narrow(MeasuredSample.objects.all(), query)
    rolled = narrow(MeasuredRollup.objects.all(), query)
    exact = measured_rollup.sums(samples, rolled, parts, group_fields(query.group_by), query.bucket, threshold)
    figures = [(k, measured_rollup.SUMS.index(k)) for k in ("alloc", "util", "idle", "mem_used", "mem_total")]
    totals: dict[tuple, dict[str, float]] = {}
    series: dict[tuple, dict[datetime, dict[str, float]]] = defaultdict(dict)
    with localcontext() as ctx:
        ctx.prec = 60  # exact: every figure is a sum, the period's is the sum of its buckets'
        for key, buckets in exact.items():
            total = [0] * len(measured_rollup.SUMS)
            for at, sums in buckets.items():
                series[key][at] = {k: float(sums[i]) for k, i in figures}
                total = [a + b for a, b in zip(total, sums, strict=True)]
            totals[key] = {k: float(total[i]) for k, i in figures}
    return totals, series


def _util(r: dict[str, float]) -> float | None:
    return None if not r["alloc"] else round(r["util"] / r["alloc"], 2)


def _headroom(r: dict[str, float]) -> float | None:
    return None if not r["mem_total"] else round(100 * (1 - r["mem_used"] / r["mem_total"]), 2)


NOTE = ("Measured: DCGM exporter samples of running requests, one per 5 minutes (a MIG slice or vGPU counts as one "
        "device). Allocated: the devices those requests held in the same slots.")


def measured_utilisation(query: Query) -> Result:
    columns = {"measured_utilisation": ("Measured utilisation", "%"),
               "measured_busy_gpu_hours": ("Measured busy", "GPU-hours"),
               "allocated_gpu_hours": ("Allocated", "GPU-hours")}
    totals, series = _sums(query)
    values = {k: {"measured_utilisation": _util(r), "measured_busy_gpu_hours": hours(r["util"] / 100 / 3600),
                  "allocated_gpu_hours": hours(r["alloc"] / 3600)} for k, r in totals.items()}
    points = {k: {at: _util(r) for at, r in s.items()} for k, s in series.items()}
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="measured_utilisation", columns=columns,
                  note=NOTE + " Utilisation: mean DCGM_FI_DEV_GPU_UTIL weighted by allocated device-time.")


def idle_gpu_hours(query: Query) -> Result:
    columns = {"measured_idle_gpu_hours": ("Measured idle", "GPU-hours"),
               "measured_idle_share": ("Measured idle share of allocated", "%"),
               "allocated_gpu_hours": ("Allocated", "GPU-hours")}
    totals, series = _sums(query)
    values = {k: {"measured_idle_gpu_hours": hours(r["idle"] / 3600), "measured_idle_share": ratio(r["idle"], r["alloc"]),
                  "allocated_gpu_hours": hours(r["alloc"] / 3600)} for k, r in totals.items()}
    points = {k: {at: hours(r["idle"] / 3600) for at, r in s.items()} for k, s in series.items()}
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="measured_idle_gpu_hours", columns=columns,
                  note=NOTE + f" Idle: a slot whose mean GPU utilisation was below {idle_percent():g} %.")


def memory_headroom(query: Query) -> Result:
    columns = {"measured_memory_headroom": ("Measured unused GPU memory", "% of allocated"),
               "allocated_memory_gib_hours": ("Allocated GPU memory", "GiB-hours")}
    totals, series = _sums(query)
    values = {k: {"measured_memory_headroom": _headroom(r),
                  "allocated_memory_gib_hours": hours(r["mem_total"] / 1024 / 3600)} for k, r in totals.items()}
    points = {k: {at: _headroom(r) for at, r in s.items()} for k, s in series.items()}
    return Result(rows=make_rows(query.group_by, values), points=make_points(query.group_by, points),
                  chart_value="measured_memory_headroom", columns=columns,
                  note=NOTE + " Headroom: 1 - (peak DCGM_FI_DEV_FB_USED per slot / the device's memory), "
                              "weighted by allocated device-time.")


register(Metric("measured-utilisation", "measured", "Measured GPU utilisation",
                "Measured GPU utilisation (DCGM) of running requests, weighted by their allocated device-time, next "
                "to the allocated GPU-hours.", measured_utilisation, groups=MEASURED_GROUPS))
register(Metric("idle-gpu-hours", "measured", "Idle GPU-hours (measured)",
                "Allocated device-hours whose measured GPU utilisation stayed below the idle threshold.",
                idle_gpu_hours, groups=MEASURED_GROUPS))
register(Metric("memory-headroom", "measured", "GPU memory headroom (measured)",
                "Share of allocated GPU memory that the measured peak per 5-minute slot left unused.",
                memory_headroom, groups=MEASURED_GROUPS))


# -- rightsizing ---------------------------------------------------------------------------------------------------
@dataclass
class Suggestion:
    """What a request measured and the smallest flavor that would have held it."""

    peak_mib: float
    memory_mib: int
    sm_mean: float
    sm_peak: float
    samples: int
    flavor: Flavor | None = None
    gpus: int = 0
    saving_gpu_hours: float = 0.0
    freed_cards: float = 0.0  # card-equivalents the suggestion frees while it runs (all replicas)
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def evidence(self) -> str:
        return (f"peak {self.peak_mib / 1024:.1f} GiB of {self.memory_mib / 1024:.0f} GiB GPU memory, "
                f"SM active {self.sm_mean * 100:.0f} % (peak {self.sm_peak * 100:.0f} %), "
                f"{self.samples} five-minute samples")

    @property
    def sentence(self) -> str:
        if self.flavor is None:
            return f"Measured: {self.evidence}. The size it asked for fits: no smaller flavor would hold it."
        what = self.flavor.display_name or self.flavor.name
        if self.flavor.kind == Flavor.Kind.MIG:
            what = f"a MIG slice {self.flavor.mig_profile} ({self.flavor.name})"
        elif self.flavor.kind == Flavor.Kind.HAMI:
            what = f"a HAMi share {self.flavor.name} ({self.flavor.hami_memory_mib // 1024} GiB, {self.flavor.hami_cores_percent} %)"
        n = f"{self.gpus} × " if self.gpus != 1 else ""
        return (f"Measured: {self.evidence}. Suggested: {n}{what}, with {round(MARGIN * 100)} % margin; saves "
                f"{self.saving_gpu_hours:g} GPU-hours per run.")


def _candidates(req: WorkloadRequest) -> list[Flavor]:
    qs = Flavor.objects.filter(cluster_id=req.cluster_id, active=True).exclude(kind=Flavor.Kind.CPU)
    allowed = list(req.template.allowed_flavors.values_list("pk", flat=True))
    if allowed:
        qs = qs.filter(pk__in=allowed)
    return list(qs)


def suggest(req: WorkloadRequest, peak_mib: float, sm_peak: float, candidates: list[Flavor]) -> tuple[Flavor | None, int]:
    """The smallest (flavor, devices per replica) that holds ``peak_mib`` per device and ``sm_peak`` (a share of
    one card) with the margin, smaller than what ``req`` holds; (None, 0) when nothing smaller fits. Pure."""
    asked = device_compute_share(req.flavor) * req.gpus
    need_mem, need_sm = peak_mib * (1 + MARGIN), sm_peak * (1 + MARGIN)
    best: tuple[float, int, Flavor, int] | None = None
    for f in candidates:
        share, mem = device_compute_share(f), device_memory_mib(f)
        if not share or not mem:
            continue
        if f.kind == Flavor.Kind.WHOLE:  # fewer whole cards: the busiest card's load spread over n
            n = max(1, math.ceil(req.gpus * max(need_mem / mem, need_sm)))
            if need_mem > mem:
                continue
        else:  # one slice or vGPU per replica, for a one-device request
            if req.gpus != 1 or need_mem > mem or need_sm > share:
                continue
            n = 1
        size = share * n
        if size >= asked:
            continue
        key = (size, mem)
        if best is None or key < best[:2]:
            best = (size, mem, f, n)
    return (best[2], best[3]) if best else (None, 0)


# What one request's samples say, as one aggregate (``suggestion``) or one row per request of a grouped query
# (``insights/reclaimable.py``): the same figures feed the same pure :func:`fit`.
SAMPLE_FIGURES = {"peak": Max("fb_used_max"), "sm_mean": Avg("sm_active_avg"), "sm_peak": Max("sm_active_avg"),
                  "n": Count("pk"), "memory": Max("memory_mib")}


def fit(req: WorkloadRequest, figures: dict[str, Any], candidates: list[Flavor]) -> Suggestion | None:
    """The suggestion from a request's sample figures (:data:`SAMPLE_FIGURES`) and the flavors it may use; None
    without samples. Pure: ``req`` needs its flavor, ``gpus``, ``replicas`` and run times, nothing is read."""
    if not figures.get("n"):
        return None
    s = Suggestion(peak_mib=float(figures["peak"] or 0),
                   memory_mib=int(figures["memory"] or device_memory_mib(req.flavor)),
                   sm_mean=float(figures["sm_mean"] or 0), sm_peak=float(figures["sm_peak"] or 0),
                   samples=int(figures["n"]))
    flavor, n = suggest(req, s.peak_mib, s.sm_peak, candidates)
    if flavor is not None:
        s.flavor, s.gpus = flavor, n
        s.freed_cards = (device_compute_share(req.flavor) * req.gpus - device_compute_share(flavor) * n) * req.replicas
        s.saving_gpu_hours = round(s.freed_cards * _run_hours(req), 2)
        s.values = {"flavor": flavor.name, "gpus": n}
    return s


def suggestion(req: WorkloadRequest) -> Suggestion | None:
    """The rightsizing suggestion for a request with measured samples (running or finished); None without any."""
    figures = MeasuredSample.objects.filter(request_id=req.pk).aggregate(**SAMPLE_FIGURES)
    if not figures["n"]:
        return None
    return fit(req, figures, _candidates(req))


def _run_hours(req: WorkloadRequest) -> float:
    if req.started_at and req.finished_at:
        return max(0.0, (req.finished_at - req.started_at).total_seconds() / 3600)
    return float(req.duration_hours or 0)


def suggested_values(req: WorkloadRequest) -> dict[str, Any] | None:
    """For ``?clone=<id>&suggest=1`` (the ``rightsizing`` slot): the form values to change, or None."""
    s = suggestion(req)
    return dict(s.values) if s is not None and s.values else None

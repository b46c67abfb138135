"""Measured GPU use (docs/measured-use.md): what running requests actually used, next to what they were allocated.

* **Sampling** (``measured_take``, beat task ``insights.measured_take`` every 5 minutes): four instant queries to
  Prometheus (``portal/prometheus_api.py``) over NVIDIA's DCGM exporter series, grouped by ``namespace`` and
  ``pod``; a pod is a request's when it lives in the request's project namespace and its name starts with the
  request's object name (``req-<id>-``). One :class:`~insights.models.MeasuredSample` per running request and
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
from typing import Any

from django.conf import settings
from django.db.models import Avg, Count, F, FloatField, Max, Q, Sum
from django.db.models.functions import Cast
from django.utils import timezone

from portal import prometheus_api
from quotas.models import Flavor
from workloads.models import RequestState, WorkloadRequest

from . import memo
from .common import bucket, group_fields, hours, make_points, make_rows, narrow, ratio
from .models import MeasuredSample
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


def idle_percent() -> float:
    return float(getattr(settings, "MEASURED_IDLE_PERCENT", 5.0))


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
                   .select_related("project", "flavor"))
    if not running or not prometheus_api.configured():
        return {"at": at.isoformat(), "requests": len(running), "written": 0}
    per_pod: dict[str, list[tuple[dict[str, str], float]]] = {}
    for key, expr in QUERIES.items():
        per_pod[key] = prometheus_api.query(expr)  # PrometheusUnavailable: the task fails, the next slot retries
    by_request: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    namespaces = {r.pk: (r.project.cluster_namespace or r.project.slug) for r in running}
    for key, rows in per_pod.items():
        for labels, value in rows:
            m = POD_OF_REQUEST.match(labels.get("pod", ""))
            if not m:
                continue
            rid = int(m.group(1))
            if namespaces.get(rid) != labels.get("namespace"):
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
    return {"at": at.isoformat(), "requests": len(running), "written": len(rows)}


# -- metrics -------------------------------------------------------------------------------------------------------
def _sums(query: Query) -> tuple[dict[tuple, dict[str, float]], dict[tuple, dict[datetime, dict[str, float]]]]:
    """Per group, and per group and chart bucket: device-seconds allocated, utilisation-weighted, idle, memory.
    The three measured metrics of one overview or report share it (``memo.one_page``); the result is only read."""
    key = ("measured-sums", id(query.scope), *(getattr(query, f) for f in (
        "start", "end", "group_by", "bucket", "cluster_id", "flavor_id", "tenant_id", "project_id")))
    return memo.remembered(key, lambda: (query.scope, _sums_now(query)))[1]


def _sums_now(query: Query) -> tuple[dict[tuple, dict[str, float]], dict[tuple, dict[datetime, dict[str, float]]]]:
    qs = narrow(MeasuredSample.objects.filter(at__gt=query.start, at__lte=query.end), query)
    by = group_fields(query.group_by)
    weight = F("gpus") * F("seconds")
    figures = {
        "alloc": Sum(Cast(weight, FloatField())),
        "util": Sum(F("util_avg") * weight, output_field=FloatField()),
        "idle": Sum(Cast(weight, FloatField()), filter=Q(util_avg__lt=idle_percent())),
        "mem_used": Sum(F("fb_used_max") * weight, output_field=FloatField()),
        "mem_total": Sum(Cast(F("memory_mib") * weight, FloatField())),
    }
    totals: dict[tuple, dict[str, float]] = {}
    series: dict[tuple, dict[datetime, dict[str, float]]] = defaultdict(dict)
    for row in qs.order_by().annotate(_b=bucket("at", query.bucket)).values(*by, "_b").annotate(**figures):
        key = tuple(row[b] for b in by)
        series[key][row["_b"]] = {k: float(row[k] or 0) for k in figures}
        total = totals.setdefault(key, dict.fromkeys(figures, 0.0))
        for k in figures:  # every figure is a sum: the period's is the sum of its buckets'
            total[k] += float(row[k] or 0)
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


def suggestion(req: WorkloadRequest) -> Suggestion | None:
    """The rightsizing suggestion for a request with measured samples (running or finished); None without any."""
    agg = MeasuredSample.objects.filter(request_id=req.pk).aggregate(
        peak=Max("fb_used_max"), sm_mean=Avg("sm_active_avg"), sm_peak=Max("sm_active_avg"), n=Count("pk"),
        memory=Max("memory_mib"))
    if not agg["n"]:
        return None
    s = Suggestion(peak_mib=float(agg["peak"] or 0), memory_mib=int(agg["memory"] or device_memory_mib(req.flavor)),
                   sm_mean=float(agg["sm_mean"] or 0), sm_peak=float(agg["sm_peak"] or 0), samples=int(agg["n"]))
    flavor, n = suggest(req, s.peak_mib, s.sm_peak, _candidates(req))
    if flavor is not None:
        s.flavor, s.gpus = flavor, n
        run_hours = _run_hours(req)
        s.saving_gpu_hours = round((device_compute_share(req.flavor) * req.gpus - device_compute_share(flavor) * n)
                                   * req.replicas * run_hours, 2)
        s.values = {"flavor": flavor.name, "gpus": n}
    return s


def _run_hours(req: WorkloadRequest) -> float:
    if req.started_at and req.finished_at:
        return max(0.0, (req.finished_at - req.started_at).total_seconds() / 3600)
    return float(req.duration_hours or 0)


def suggested_values(req: WorkloadRequest) -> dict[str, Any] | None:
    """For ``?clone=<id>&suggest=1`` (the ``rightsizing`` slot): the form values to change, or None."""
    s = suggestion(req)
    return dict(s.values) if s is not None and s.values else None

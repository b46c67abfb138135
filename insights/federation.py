"""Federation metrics (docs/federation.md): spill-over and the queue wait it saved.

``spill-over``: requests submitted in the period that spilled to another GPU model than their first (with their
consent), their GPU-hours, and the queue wait saved by spilling. The saving is an estimate computed from data:
at routing time the router recorded the wait the job would have had in its first model's zones
(``WorkloadRequest.spill_source_wait_seconds``, ``workloads.routing.source_wait_estimate``: what runs there frees
its GPUs at its time limit, the work queued ahead goes first); the wait it had on the target is measured (from its
approval to its first admission). Saved = estimated source wait − target wait, counted per request at 0 or more;
requests not admitted yet, or whose source wait was unknown, are left out of the saving (``measured`` says how many
count). Scoped like every metric: a tenant sees its own projects' spills.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from workloads.models import WorkloadRequest

from .common import bucket_of, group_fields, make_points, make_rows, minutes, narrow
from .registry import Metric, Query, Result, register

COLUMNS = {
    "spilled": ("Spilled over", "requests"),
    "gpu_hours": ("GPU-hours on the target model", "GPU-hours"),
    "measured": ("Admitted, with a source estimate", "requests"),
    "source_wait": ("Estimated wait on the first model (mean)", "minutes"),
    "target_wait": ("Wait on the target (mean)", "minutes"),
    "saved_hours": ("Queue wait saved", "hours"),
}


def spill_rows(query: Query) -> list[dict[str, Any]]:
    rows = WorkloadRequest.objects.filter(spilled=True, created_at__gte=query.start, created_at__lt=query.end)
    rows = narrow(rows, query)
    by = group_fields(query.group_by)
    return list(rows.order_by().values(*by, "created_at", "approved_at", "first_admitted_at", "finished_at", "gpus",
                                       "replicas", "spill_source_wait_seconds"))


def spill_over(query: Query) -> Result:
    by = group_fields(query.group_by)
    values: dict[tuple[Any, ...], dict[str, Any]] = {}
    sums: dict[tuple[Any, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    points: dict[tuple[Any, ...], dict[Any, float]] = defaultdict(dict)
    for row in spill_rows(query):
        key = tuple(row[b] for b in by)
        v = values.setdefault(key, {"spilled": 0, "gpu_hours": 0.0, "measured": 0, "source_wait": None,
                                    "target_wait": None, "saved_hours": 0.0})
        v["spilled"] += 1
        admitted = row["first_admitted_at"]
        if admitted is not None:
            end = min(row["finished_at"] or query.end, query.end)
            v["gpu_hours"] += max(0.0, (end - admitted).total_seconds()) / 3600 * row["gpus"] * row["replicas"]
        at = bucket_of(row["created_at"], query.bucket)
        points[key].setdefault(at, 0.0)
        estimate = row["spill_source_wait_seconds"]
        if admitted is None or estimate is None:
            continue
        waited = max(0.0, (admitted - (row["approved_at"] or row["created_at"])).total_seconds())
        saved = max(0.0, estimate - waited)
        v["measured"] += 1
        sums[key]["source"] += estimate
        sums[key]["target"] += waited
        v["saved_hours"] += saved / 3600
        points[key][at] += saved / 3600
    for key, v in values.items():
        if v["measured"]:
            v["source_wait"] = minutes(sums[key]["source"] / v["measured"])
            v["target_wait"] = minutes(sums[key]["target"] / v["measured"])
        v["gpu_hours"], v["saved_hours"] = round(v["gpu_hours"], 2), round(v["saved_hours"], 2)
    note = ("Saved = the wait estimated on the first model's zones when the router spilled it (what runs there frees "
            "its GPUs at its time limit; the work queued ahead goes first) less the wait it had on the target, from "
            "approval to first admission; 0 at least per request. Requests not admitted yet are counted, not measured.")
    if not values:
        note = "No request spilled over to another GPU model in the period."
    return Result(rows=make_rows(query.group_by, values),
                  points=make_points(query.group_by, {k: {at: round(h, 2) for at, h in p.items()} for k, p in points.items()}),
                  chart_value="saved_hours", columns=COLUMNS, note=note, empty_is_zero=True)


register(Metric("spill-over", "scheduling", "Spill-over and queue wait saved",
                "Requests submitted in the period that spilled to another GPU model (with consent), their GPU-hours "
                "there, and the queue wait saved: the wait estimated on their first model when routed less the wait "
                "they had on the target.", spill_over, groups=("cluster", "flavor", "tenant", "project")))

"""Fleet-wide reclaimable capacity (docs/measured-use.md, "Reclaimable capacity"): what would be freed if every
rightsizing suggestion were taken, by tenant.

* **Now**: the running GPU requests. Held: the card-equivalents they hold (a whole card 1, a MIG slice g/7, a HAMi
  vGPU its cores %, × devices × replicas); freed: what their suggestions would give back (``Suggestion.freed_cards``);
  would hold: held − freed.
* **Per week**: the runs that finished in the last 7 days, each with its suggestion's saving in GPU-hours (the
  difference in card share × replicas × the run's hours), summed.

Read in a fixed number of queries whatever the fleet's size: the requests (one query), their sample figures (one
query grouped by request over ``MeasuredSample``, served by the ``(request, at)`` unique index), the active GPU
flavors of their clusters and the allowed flavors of their templates (one each); each suggestion is then
:func:`insights.measured.fit`, the same pure function as the request page's ``suggestion()``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from quotas.models import Flavor
from tenants.models import Tenant
from workloads.models import RequestState, ServiceTemplate, WorkloadRequest

from .measured import SAMPLE_FIGURES, Suggestion, device_compute_share, fit
from .models import MeasuredSample
from .presentation import COLOURS

WEEK = timedelta(days=7)
# What the figures, the pages and the API read of a request (a fleet's requests are thousands: no JSON columns)
FIELDS = ("name", "state", "gpus", "replicas", "cluster_id", "template_id", "started_at", "finished_at",
          "duration_hours", "flavor", "tenant__slug", "tenant__name", "project__slug")
CHART_TENANTS = 20  # the chart draws the page's tenants (the table has them all)


def card_equivalents(req: WorkloadRequest) -> float:
    """What ``req`` holds in whole cards: its device's share of a card × devices × replicas."""
    return device_compute_share(req.flavor) * req.gpus * req.replicas


@dataclass
class RequestLine:
    """One request with a suggestion: running (frees ``freed`` cards now) or finished in the week (saved hours)."""

    request: WorkloadRequest
    running: bool
    held: float
    suggestion: Suggestion

    @property
    def freed(self) -> float:
        return self.suggestion.freed_cards

    @property
    def would_hold(self) -> float:
        return self.held - self.freed

    @property
    def saving_gpu_hours(self) -> float:
        return self.suggestion.saving_gpu_hours


@dataclass
class TenantLine:
    """A tenant's reclaimable capacity: now (running requests) and over the last week (finished runs)."""

    tenant: Tenant
    running: int = 0  # running GPU requests
    running_suggested: int = 0  # ... of them with a suggestion
    held: float = 0.0  # card-equivalents the running requests hold
    freed: float = 0.0  # ... their suggestions would free
    finished_suggested: int = 0  # runs finished in the week with a suggestion
    week_gpu_hours: float = 0.0  # ... the GPU-hours their suggestions would have saved
    lines: list[RequestLine] = field(default_factory=list)

    @property
    def would_hold(self) -> float:
        return self.held - self.freed

    def as_data(self) -> dict[str, Any]:
        return {"tenant": self.tenant.slug, "tenant_name": self.tenant.name, "running": self.running,
                "running_with_suggestion": self.running_suggested, "held_cards": round(self.held, 2),
                "would_hold_cards": round(self.would_hold, 2), "freed_cards": round(self.freed, 2),
                "finished_with_suggestion": self.finished_suggested,
                "freed_gpu_hours_per_week": round(self.week_gpu_hours, 2)}


def _order(line: TenantLine) -> tuple:
    return (-round(line.freed, 6), -round(line.week_gpu_hours, 6), line.tenant.name)


def reclaimable(*, tenants: list[Tenant] | None = None, now: datetime | None = None) -> list[TenantLine]:
    """Per tenant (``tenants``; None: every tenant), sorted by what would be freed now, then per week. Tenants with
    no running GPU request and no suggestion in the week are left out. Each line keeps its requests with a
    suggestion (``lines``: running first, most freed first)."""
    now = now or timezone.now()
    reqs = (WorkloadRequest.objects.exclude(flavor__kind=Flavor.Kind.CPU).filter(gpus__gt=0)
            .filter(Q(state=RequestState.RUNNING)
                    | Q(finished_at__gt=now - WEEK, finished_at__lte=now, started_at__isnull=False)))
    if tenants is not None:
        reqs = reqs.filter(tenant_id__in=[t.pk for t in tenants])
    figures = {row["request_id"]: row for row in MeasuredSample.objects.filter(request_id__in=reqs.values("pk"))
               .order_by().values("request_id").annotate(**SAMPLE_FIGURES)}
    found = list(reqs.select_related("flavor", "tenant", "project").only(*FIELDS).order_by("pk"))
    candidates = _candidates_of(found)
    lines: dict[int, TenantLine] = {}
    for req in found:
        line = lines.get(req.tenant_id) or lines.setdefault(req.tenant_id, TenantLine(tenant=req.tenant))
        running = req.state == RequestState.RUNNING
        held = card_equivalents(req)
        if running:
            line.running += 1
            line.held += held
        s = fit(req, figures.get(req.pk, {}), candidates(req)) if req.pk in figures else None
        if s is None or s.flavor is None:
            continue
        line.lines.append(RequestLine(request=req, running=running, held=held, suggestion=s))
        if running:
            line.running_suggested += 1
            line.freed += s.freed_cards
        else:
            line.finished_suggested += 1
            line.week_gpu_hours += s.saving_gpu_hours
    out = [x for x in lines.values() if x.running or x.lines]
    for x in out:
        x.lines.sort(key=lambda r: (not r.running, -r.freed if r.running else -r.saving_gpu_hours, r.request.pk))
    return sorted(out, key=_order)


def _candidates_of(found: list[WorkloadRequest]):
    """``candidates(req)``: the active GPU flavors of its cluster that its template allows (every one when the
    template names none), as ``measured._candidates`` reads for one request; two queries for all of them."""
    by_cluster: dict[int, list[Flavor]] = defaultdict(list)
    for f in Flavor.objects.filter(cluster_id__in={r.cluster_id for r in found}, active=True).exclude(
            kind=Flavor.Kind.CPU):
        by_cluster[f.cluster_id].append(f)
    allowed: dict[int, set[int]] = defaultdict(set)
    through = ServiceTemplate.allowed_flavors.through
    for template_id, flavor_id in through.objects.filter(
            servicetemplate_id__in={r.template_id for r in found}).values_list("servicetemplate_id", "flavor_id"):
        allowed[template_id].add(flavor_id)

    def candidates(req: WorkloadRequest) -> list[Flavor]:
        mine = allowed.get(req.template_id)
        flavors = by_cluster.get(req.cluster_id, [])
        return [f for f in flavors if f.pk in mine] if mine else list(flavors)

    return candidates


def totals(lines: list[TenantLine]) -> dict[str, float]:
    """The fleet's (or the page's tenants') sums."""
    return {"running": sum(x.running for x in lines), "running_suggested": sum(x.running_suggested for x in lines),
            "held": sum(x.held for x in lines), "freed": sum(x.freed for x in lines),
            "would_hold": sum(x.would_hold for x in lines),
            "finished_suggested": sum(x.finished_suggested for x in lines),
            "week_gpu_hours": sum(x.week_gpu_hours for x in lines)}


def chart_of(lines: list[TenantLine]) -> dict[str, Any] | None:
    """The bar chart (``static/js/charts.js``): held now, what the suggestions would hold, and the GPU-hours a week
    freed, per tenant (the numbers are in the table)."""
    shown = lines[:CHART_TENANTS]
    if not shown:
        return None
    return {"type": "bar", "title": "Card-equivalents held now and with every suggestion taken, by tenant",
            "labels": [x.tenant.slug for x in shown], "stacked": False, "unit": "card-equivalents",
            "notes": [f"frees {x.freed:.2f} cards now; {x.week_gpu_hours:.2f} GPU-hours a week" for x in shown],
            "datasets": [
                {"label": "Held now", "data": [round(x.held, 2) for x in shown], "color": COLOURS[0]},
                {"label": "With the suggestions", "data": [round(x.would_hold, 2) for x in shown], "color": COLOURS[2]},
                {"label": "Freed", "data": [round(x.freed, 2) for x in shown], "color": COLOURS[1]},
            ]}

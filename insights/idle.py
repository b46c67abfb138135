"""Idle detection by measured GPU use (docs/measured-use.md, "Idle detection").

After each sampling run (``insights.measured_take``), every running request whose samples of the last
``MEASURED_IDLE_MINUTES`` (default 30) all stayed below its template's ``idle_gpu_percent`` (else
``MEASURED_IDLE_PERCENT``, default 5) is flagged: ``measured_idle_since`` is set (a compare-and-set, so an idle
episode is flagged once however many runs see it), one timeline entry is written and the requester is told. A sample
at or above the threshold ends the episode (the flag is cleared; a later episode is flagged and told again).

What happens next is the project's word (``workloads.materialize.requests_stop_measured_idle``): notebooks are culled
only where the project culls idle notebooks by measured GPU use, training and batch inference stopped only where it
stops idle batch jobs; inference services never.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.notify import notify_send, portal_link
from workloads.materialize import requests_stop_measured_idle
from workloads.models import RequestEvent, RequestState, WorkloadRequest

from .measured import SLOT_SECONDS
from .models import MeasuredSample

ACTOR = "idle detection (measured GPU use)"


def idle_minutes() -> int:
    return int(getattr(settings, "MEASURED_IDLE_MINUTES", 30))


def threshold_of(req: WorkloadRequest) -> float:
    t = req.template.idle_gpu_percent
    return float(t if t is not None else getattr(settings, "MEASURED_IDLE_PERCENT", 5.0))


def idle_detect(now: datetime | None = None) -> dict[str, int]:
    """Flag running requests idle by their samples up to ``now`` (once per episode), clear those that rose, then
    let the projects' policies stop what they allow. Idempotent."""
    now = now or timezone.now()
    window = timedelta(minutes=idle_minutes())
    needed = max(1, int(window.total_seconds() // SLOT_SECONDS))  # slots covering the window
    running = list(WorkloadRequest.objects.filter(state=RequestState.RUNNING, seeded=False)
                   .select_related("template", "project", "requested_by"))
    samples: dict[int, list[tuple[datetime, float]]] = {}
    for rid, at, util in (MeasuredSample.objects.filter(request_id__in=[r.pk for r in running], at__gt=now - window,
                                                          at__lte=now).values_list("request_id", "at", "util_avg")):
        samples.setdefault(rid, []).append((at, util))
    flagged = cleared = 0
    for req in running:
        got = samples.get(req.pk, [])
        limit = threshold_of(req)
        if len(got) >= needed and all(u < limit for _, u in got):
            since = min(at for at, _ in got) - timedelta(seconds=SLOT_SECONDS)
            flagged += _flag(req, since, limit)
        elif got and req.measured_idle_since is not None and max(got)[1] >= limit:
            cleared += WorkloadRequest.objects.filter(pk=req.pk, measured_idle_since__isnull=False).update(
                measured_idle_since=None)
    stopped = requests_stop_measured_idle()
    return {"flagged": flagged, "cleared": cleared, "stopped": stopped}


def _flag(req: WorkloadRequest, since: datetime, limit: float) -> int:
    with transaction.atomic():
        if not WorkloadRequest.objects.filter(pk=req.pk, measured_idle_since__isnull=True).update(
                measured_idle_since=since):
            return 0  # this episode was flagged already
        req.measured_idle_since = since
        text = (f"Idle: its GPUs were measured below {limit:g} % utilisation for {idle_minutes()} minutes "
                f"(since {since:%Y-%m-%d %H:%M} UTC).")
        RequestEvent.objects.create(request_id=req.pk, actor_label=ACTOR, message=text)
    _tell(req, text)  # after the flag's commit (callers run outside a transaction: beat)
    return 1


def _tell(req: WorkloadRequest, text: str) -> None:
    email = getattr(req.requested_by, "email", "")
    what = _consequence(req)
    body = (f"{text}\n\n{what}\n\nIf it waits on something, nothing needs doing; if it is done, stop it to free the "
            f"GPUs for others.\n\nThe request: {portal_link(f'/requests/{req.pk}/')}\n")
    payload: dict[str, Any] = {"event": "request.idle", "request": req.pk, "name": req.name,
                               "project": req.project.slug, "idle_since": req.measured_idle_since.isoformat(),
                               "requested_by": req.requested_by.get_username()}
    if notify_send(subject=f"[GPU portal] {req.project.slug}/{req.name} is idle", body=body,
                   to=[email] if email else [], payload=payload, topic="idle notice") and email:
        RequestEvent.objects.create(request_id=req.pk, actor_label=ACTOR, message=f"Idle notice sent to {email}.")


def _consequence(req: WorkloadRequest) -> str:
    from workloads import kinds

    kind = kinds.KINDS.get(req.template.kind)
    if kind is not None and kind.interactive:
        stops = req.project.cull_idle_notebooks_by_gpu
    elif kind is not None and kind.serving:
        stops = False
    else:
        stops = req.project.stop_idle_batch_jobs
    return ("The project's policy stops it while it stays idle." if stops
            else "The project's policy keeps it running: you are told, nothing is stopped.")


"""A preemption in plain words, for the one who reads it.

Kueue says why it evicted a workload in its own words ("Preempted to accommodate a workload (UID: ..., JobUID: ...)
due to prioritization in the ClusterQueue; preemptor path: /acme/acme-vision ..."), which the status follower keeps
on the request's timeline as it came (``preemption_of`` reads it, as ``status.reclaimed_for`` does; the metrics count preemptions by it). The
request page, its state line and the email to the requester say instead who preempted it, at what priority, and
what happens next.

The preemptor is the request whose current Kueue Workload has the UID the message names. It is named only when the
reader may see that request (``selectors.requests_for``); otherwise, another project's or another tenant's work, it
is "higher-priority work in the cohort", and the message's paths (which name its queue) are not shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tenants.access import Actor

from . import selectors
from .models import Priority, RequestState, WorkloadRequest

# Any of Kueue's preemption messages: the preemptor's Workload UID, the reason in Kueue's words ("prioritization in
# the ClusterQueue", "reclamation within the cohort", "Fair Sharing within the cohort", ...) and, since Kueue 0.10,
# the paths (cohorts then ClusterQueue) of the preemptor and of the preempted workload.
PREEMPTION_RE = re.compile(
    r"to accommodate a workload \(UID: (?P<uid>[^,)\s]+)[^)]*\) due to (?P<reason>[^;]+?)\s*(?:;|$)"
    r"(?:\s*preemptor path: (?P<preemptor>[^;\s]*))?(?:\s*;\s*preemptee path: (?P<preemptee>[^;\s]*))?")


@dataclass(frozen=True)
class Preemption:
    """Kueue's eviction message, read: ``why`` is ``queue`` (a higher priority in the same ClusterQueue),
    ``reclaim`` (a lender in the cohort takes back quota this workload borrowed), ``fair_sharing`` or ``cohort``."""

    uid: str
    why: str
    reason: str
    preemptor_path: str = ""
    preemptee_path: str = ""


def preemption_of(message: str | None) -> Preemption | None:
    """Kueue's preemption message (as the follower wrote it, "Preempted: ..." included) read, else None."""
    match = PREEMPTION_RE.search(message or "")
    if not match:
        return None
    reason = match.group("reason").strip()
    low = reason.lower()
    why = ("reclaim" if "reclamation" in low else "fair_sharing" if "fair sharing" in low
           else "queue" if "clusterqueue" in low else "cohort")
    return Preemption(uid=match.group("uid"), why=why, reason=reason, preemptor_path=match.group("preemptor") or "",
                      preemptee_path=match.group("preemptee") or "")


S = RequestState
UNSEEN = "higher-priority work in the cohort"
NEXT = ("What happens next: it went back to the queue by itself and starts again when there is room, from the "
        "beginning (or from a checkpoint your code saved). You need not submit it again; stop or cancel it if you no "
        "longer need it. The time it ran is billed, the time it waits is not.")


@dataclass(frozen=True)
class Notice:
    """``text``: who and why, in plain words; ``next``: what happens now; ``preemptor``: the request, when the
    reader may see it."""

    text: str
    next: str
    preemptor: WorkloadRequest | None

    def __str__(self) -> str:
        return f"{self.text} {self.next}"


def _priority(value: str) -> str:
    return str(dict(Priority.choices).get(value, value)).lower()


def preemptor_for(found: Preemption, *, actor: Actor | None, other_than: int | None = None) -> WorkloadRequest | None:
    """The request whose Workload preempted, if ``actor`` may see it (None: nobody asks, so nobody is named)."""
    if actor is None or not found.uid:
        return None
    visible = selectors.requests_for(actor=actor).filter(workload_uid=found.uid)
    if other_than is not None:
        visible = visible.exclude(pk=other_than)
    return visible.first()


def notice(req: WorkloadRequest, message: str | None, *, actor: Actor | None) -> Notice | None:
    """The plain explanation of Kueue's eviction ``message`` of ``req``, as ``actor`` may read it; None when the
    message is not a preemption."""
    found = preemption_of(message)
    if found is None:
        return None
    by = preemptor_for(found, actor=actor, other_than=req.pk)
    own = _priority(req.priority)
    if by is not None:
        who = (f"request {by.name} ({by.template.name.lower()} of {by.requested_by.get_username()} in project "
               f"{by.project.name}), at {_priority(by.priority)} priority")
    else:
        who = UNSEEN
    if found.why == "queue":
        text = (f"Preempted by {who}: it outranks this {own}-priority request, and the project's queue had no room "
                "for both.")
    elif found.why == "reclaim":
        text = (f"Preempted by {who}: this request ran on quota borrowed from the cohort, and the quota's owner took "
                "it back.")
    elif found.why == "fair_sharing":
        text = f"Preempted by {who}: the cohort's fair sharing gave the capacity back to it."
    else:
        text = f"Preempted by {who}: it outranks this {own}-priority request in the cohort."
    return Notice(text=text, next=NEXT, preemptor=by)


def timeline_explained(req: WorkloadRequest, events: Any, *, actor: Actor | None) -> list[Any]:
    """The timeline's entries, each preemption with ``plain`` (its ``Notice``) for the page to show instead of
    Kueue's words."""
    out = list(events)
    for event in out:
        event.plain = notice(req, event.message, actor=actor) if event.to_state == S.PREEMPTED else None
    return out


def latest_notice(req: WorkloadRequest, timeline: list[Any]) -> Notice | None:
    """The notice of the request's last preemption while it has not run again since (preempted, or queued again)."""
    if req.state not in (S.PREEMPTED, S.QUEUED):
        return None
    for event in reversed(timeline):
        if event.to_state == S.RUNNING:
            return None
        if event.to_state == S.PREEMPTED and getattr(event, "plain", None) is not None:
            return event.plain
    return None


def redacted(message: str, *, shown: bool) -> str:
    """Kueue's message without the queue paths when the preemptor is not the reader's to see."""
    if shown:
        return message
    found = preemption_of(message)
    if found is None or not (found.preemptor_path or found.preemptee_path):
        return message
    head, _, _ = message.partition("; preemptor path:")
    return head

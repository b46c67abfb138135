"""A request's logs: the page, following them live (htmx polling with a cursor) and the download."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from tenants.ui import page

from . import selectors
from .models import WorkloadRequest
from .states import FINAL
from .views import _actor, _logs_request

FOLLOW_SECONDS = 2

LOG_TAILS = (100, 200, 1000, 5000)

LOG_LINES = 200


def _tail(request: HttpRequest) -> int:
    try:
        value = int(request.GET.get("tail") or LOG_LINES)
    except ValueError:
        return LOG_LINES
    return min(max(value, 1), max(LOG_TAILS))


def _cursor(pod: selectors.PodLog) -> str:
    """Where following a pod's log resumes: the last line's cluster time and how many lines carry exactly that time
    (``sinceTime`` is inclusive and times repeat, so those lines are skipped when they come again)."""
    lines = pod.lines or []
    if not lines or not lines[-1].at:
        return ""
    last = lines[-1].at
    same = 0
    for line in reversed(lines):
        if line.at != last:
            break
        same += 1
    return f"{last}|{same}"


def _after(lines: list[selectors.LogLine], cursor: str) -> list[selectors.LogLine]:
    """The lines of a ``sinceTime`` answer that are new after ``cursor`` (see ``_cursor``)."""
    last, _, seen = cursor.partition("|")
    last = selectors.log_time_key(last)
    skip = int(seen) if seen.isdigit() else 0
    out = []
    for line in lines:
        key = selectors.log_time_key(line.at)
        if line.at and key < last:
            continue
        if line.at and key == last and skip > 0:
            skip -= 1
            continue
        out.append(line)
    return out


def _logs_context(req: WorkloadRequest, tail: int) -> dict[str, Any]:
    pods: list[selectors.PodLog] = []
    error = ""
    try:
        pods = selectors.logs_for(req, tail=tail)
    except Exception as exc:
        error = f"The cluster did not answer: {exc}"
    follow = [{"name": p.name, "cursor": _cursor(p)} for p in pods if p.lines is not None]
    return {"req": req, "pods": pods, "error": error, "tail": tail, "tails": LOG_TAILS,
            "follow": follow if req.state not in FINAL else [], "follow_seconds": FOLLOW_SECONDS,
            "poll": req.state not in FINAL,
            "pod_names": ",".join(p.name for p in pods if p.lines is not None)}


@login_required
def request_logs(request: HttpRequest, pk: int) -> HttpResponse:
    """The request's pods and the last lines of their logs (cluster time), read from the cluster when asked.

    The full page follows running pods: a poller asks ``request-logs-follow`` every few seconds for the lines
    after the last one shown and appends them. ``?tail=N`` picks how many lines to start with."""
    actor = _actor(request)
    req = _logs_request(actor, pk)
    context = _logs_context(req, _tail(request))
    if request.htmx:
        return render(request, "workloads/_request_logs.html", context)
    return page(request, "workloads/request_logs_page.html", context)


@login_required
def request_logs_follow(request: HttpRequest, pk: int) -> HttpResponse:
    """htmx: the log lines that came after each pod's cursor (``?c=<pod>|<time>|<n>``, one per pod) and the next
    poller. When the pods with a log are no longer those on the page (``?pods=``), the whole log section is sent
    again."""
    actor = _actor(request)
    req = _logs_request(actor, pk)
    cursors = {}
    for value in request.GET.getlist("c"):
        name, _, rest = value.partition("|")
        cursors[name] = rest
    shown = [n for n in (request.GET.get("pods") or "").split(",") if n]
    # Ask from the whole second of each cursor (what every API server takes); ``_after`` drops what was shown.
    since = {name: rest.partition("|")[0].partition(".")[0].rstrip("Z") + "Z" for name, rest in cursors.items() if rest}
    try:
        pods = selectors.logs_for(req, tail=max(LOG_TAILS), since=since)
    except Exception as exc:
        follow = [{"name": name, "cursor": rest} for name, rest in cursors.items()]
        return render(request, "workloads/_log_follow.html", {"req": req, "follow": follow, "new": [],
                                                             "pod_names": ",".join(shown), "error": str(exc),
                                                             "follow_seconds": FOLLOW_SECONDS * 3, "poll": True,
                                                             "tail": _tail(request)})
    if sorted(p.name for p in pods if p.lines is not None) != sorted(shown):
        response = render(request, "workloads/_request_logs.html", _logs_context(req, _tail(request)))
        response["HX-Retarget"] = "#request-logs"
        response["HX-Reswap"] = "innerHTML"
        return response
    new, follow = [], []
    for pod in pods:
        if pod.lines is None:
            continue
        cursor = cursors.get(pod.name, "")
        fresh = _after(pod.lines, cursor) if cursor else pod.lines
        if fresh:
            new.append({"name": pod.name, "lines": fresh})
        follow.append({"name": pod.name, "cursor": _cursor(selectors.PodLog(pod.name, lines=fresh)) if fresh else cursor})
    return render(request, "workloads/_log_follow.html", {
        "req": req, "new": new, "follow": follow, "pod_names": ",".join(shown), "follow_seconds": FOLLOW_SECONDS,
        "poll": req.state not in FINAL, "tail": _tail(request),
    })


@login_required
def request_logs_download(request: HttpRequest, pk: int) -> HttpResponse:
    """The whole log of one pod (``?pod=``) or of every pod of the request, as a plain-text attachment.
    Each line starts with the cluster's timestamp (cluster time, UTC)."""
    actor = _actor(request)
    req = _logs_request(actor, pk)
    wanted = request.GET.get("pod") or None
    try:
        pods = selectors.logs_for(req, tail=None, pod=wanted)
    except Exception as exc:
        return HttpResponse(f"The cluster did not answer: {exc}\n", status=502, content_type="text/plain; charset=utf-8")
    if wanted and not pods:
        raise Http404("No such pod.")
    if wanted:
        body = pods[0].text
    else:
        body = "".join(f"==> {p.name} <==\n{p.text}\n" for p in pods)
    response = HttpResponse(body, content_type="text/plain; charset=utf-8")
    filename = f"{req.k8s_name}-{wanted}.log" if wanted else f"{req.k8s_name}.log"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response

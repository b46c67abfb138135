""""Why is it still pending?" — one plain sentence from what the portal and the cluster know.

``pending_sentence()`` is pure: the request's state and numbers, the summary the status follower keeps in
``request.cluster_status`` (Workload conditions, pods' scheduling messages, Volcano phase), the ClusterQueue's
status (``flavorsUsage`` against its nominal quota) and how many requests are ahead. The follower calls
:func:`request_pending_reason` for the requests whose cluster state changed, and every few seconds for the waiting
requests whose ClusterQueue changed (its usage, who is ahead: ``StatusFollower._refresh_pending``), and stores the
answer in ``request.pending_reason``; the approval side can call :func:`awaiting_approval_sentence`.

    waiting for 4 x H100: asks for 4; the project has 8 and may borrow 2 (6 in use now); 2 requests are ahead of you
    awaiting approval by a project admin since 10:42
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from portal.quantities import fmt, in_portal_units

from .models import RequestState, WorkloadRequest

S = RequestState
_INSUFFICIENT = re.compile(r"insufficient (?:unused )?quota for (?P<resource>\S+) in flavor (?P<flavor>[^,\s]+)")
# Kueue TAS (pkg/cache/scheduler/tas_flavor_snapshot.go, notFitMessage): no domain of the asked level has room.
_TOPOLOGY = re.compile(r'topology "[^"]*" (?:allows to fit only (?P<fit>\d+) out of|doesn\'t allow to fit any of) '
                       r'(?P<count>\d+) pod\(s\)')
# WorkloadRequest.topology -> level word
TOPOLOGY_LEVEL = {"rack": "rack", "prefer-rack": "rack", "block": "block", "nvlink": "NVLink domain",
                  "prefer-nvlink": "NVLink domain"}
# Volcano's network-topology-aware scheduling (the sandbox's words, sandbox/controllers/hypernodes.py): a hard-mode
# gang fits within no HyperNode of the tier it may use.
_NETWORK_TOPOLOGY = re.compile(
    r"network topology unsatisfied: the gang of (?P<pods>\d+) pod\(s\) needs (?P<need>[\d.]+) \S+ within one "
    r"hypernode of tier <= (?P<tier>\d+)(?:; the emptiest, \S+ \(tier \d+\), has (?P<free>[\d.]+) free and room for "
    r"(?P<room>\d+) pod\(s\))?")
TIER_LEVEL = {1: "rack", 2: "block"}  # the preset's quotas.manifests.HYPERNODE_TIERS, the other way round


@dataclass(frozen=True)
class QueueUsage:
    """One (flavor, resource) of a ClusterQueue: what it is promised, what it uses, what it may borrow."""

    nominal: Decimal
    used: Decimal
    borrowing_limit: Decimal | None  # None: unlimited (with a cohort)
    cohort: str


def _num(resource: str, value: Any) -> Decimal:
    """A ClusterQueue quantity in the portal's units; 0 when the cluster wrote something else."""
    try:
        return in_portal_units(resource, value)
    except (ArithmeticError, ValueError):
        return Decimal(0)


def queue_usage(cluster_queue: dict[str, Any] | None, flavor: str, resource: str) -> QueueUsage | None:
    """The ClusterQueue's numbers for one flavor and resource (spec nominal/borrowingLimit, status flavorsUsage)."""
    if not cluster_queue:
        return None
    spec = cluster_queue.get("spec") or {}
    found = None
    for group in spec.get("resourceGroups") or []:
        for fl in group.get("flavors") or []:
            if fl.get("name") != flavor:
                continue
            for res in fl.get("resources") or []:
                if res.get("name") == resource:
                    found = res
    if found is None:
        return None
    used = Decimal(0)
    for fl in (cluster_queue.get("status") or {}).get("flavorsUsage") or []:
        if fl.get("name") == flavor:
            for res in fl.get("resources") or []:
                if res.get("name") == resource:
                    used = _num(resource, res.get("total", 0))
    limit = found.get("borrowingLimit")
    return QueueUsage(nominal=_num(resource, found.get("nominalQuota", 0)), used=used,
                      borrowing_limit=None if limit is None else _num(resource, limit),
                      cohort=str(spec.get("cohortName") or ""))


def volcano_queue_detail(queue: dict[str, Any] | None, *, resource: str, asks: int) -> str:
    """The project's Volcano Queue in plain words when it is what holds a gang back: "the project's Volcano queue
    may hold 8 and its running jobs use 1, so 8 more do not fit yet"; "" when the queue has room (or is unknown)."""
    if not queue or not asks:
        return ""
    cap_raw = ((queue.get("spec") or {}).get("capability") or {}).get(resource)
    if cap_raw is None:
        return ""
    cap = _num(resource, cap_raw)
    used = _num(resource, ((queue.get("status") or {}).get("allocated") or {}).get(resource, 0))
    if used + asks <= cap:
        return ""
    if asks > cap:
        return (f"the project's Volcano queue may hold at most {_plain(cap)}, fewer than this job's {asks}; "
                "it cannot start until the project's quota is raised")
    return (f"the project's Volcano queue may hold {_plain(cap)} and its running jobs use {_plain(used)}, so "
            f"{asks} more do not fit yet; it starts as a whole gang when its running jobs free {_plain(used + asks - cap)}")


def _plain(value: Decimal) -> str:
    return str(int(value)) if value == value.to_integral_value() else str(value.normalize())


def _cond(summary: dict[str, Any], ctype: str) -> list[str] | None:
    return (summary.get("c") or {}).get(ctype)


def _ahead(n: int) -> str:
    if n <= 0:
        return "nothing is ahead of you"
    return "1 request is ahead of you" if n == 1 else f"{n} requests are ahead of you"


def topology_sentence(message: str, *, gpus_per_pod: int, flavor_label: str, topology: str) -> str:
    """Kueue's TAS not-fit message in plain words, or "" when ``message`` is not one:
    "waiting for 24 x H100 free in one rack (3 workers of 8); the emptiest rack has room for 16 now (2 workers)"."""
    found = _TOPOLOGY.search(message or "")
    if found is None:
        return ""
    count, fit = int(found.group("count")), int(found.group("fit") or 0)
    level = TOPOLOGY_LEVEL.get(topology, "topology domain")
    per = max(int(gpus_per_pod), 0)
    if per:
        return (f"waiting for {count * per} x {flavor_label} free in one {level} ({count} workers of {per}); the "
                f"emptiest {level} has room for {fit * per} now ({fit} worker{'' if fit == 1 else 's'})")
    return (f"waiting for room for {count} workers in one {level}; the emptiest {level} has room for {fit} now")


def network_topology_sentence(message: str, topology: str = "") -> str:
    """Volcano's unsatisfied network topology in plain words, or "" when ``message`` is not one: "needs 16 GPUs within
    one rack (tier 1); the emptiest has 8 free (room for 1 of 2 workers)". ``topology``: the request's placement
    choice, which names the level (tiers differ per cluster: an NVLink domain is tier 1 where it is a level)."""
    found = _NETWORK_TOPOLOGY.search(message or "")
    if found is None:
        return ""
    tier = int(found.group("tier"))
    where = f"one {TOPOLOGY_LEVEL.get(topology) or TIER_LEVEL.get(tier, 'network domain')} (tier {tier})"
    head = f"needs {found.group('need')} GPUs within {where}"
    if found.group("free") is None:
        return f"{head}; the cluster has no such domain"
    return (f"{head}; the emptiest has {found.group('free')} free (room for {found.group('room')} of "
            f"{found.group('pods')} workers)")


def topology_hosts(assignment: dict[str, Any] | None) -> dict[str, int]:
    """Host -> pods of a Kueue v1beta2 ``topologyAssignment`` whose lowest level is the hostname (the compact
    encoding: one or more slices, each level's values ``universal`` or ``individual`` prefix + roots + suffix)."""
    out: dict[str, int] = {}
    levels = (assignment or {}).get("levels") or []
    if not levels or levels[-1] != "kubernetes.io/hostname":
        return out
    for sl in (assignment or {}).get("slices") or []:
        n = int(sl.get("domainCount") or 0)
        host_values = (sl.get("valuesPerLevel") or [{}] * len(levels))[len(levels) - 1] or {}
        if host_values.get("universal") is not None:
            hosts = [str(host_values["universal"])] * n
        else:
            ind = host_values.get("individual") or {}
            hosts = [f"{ind.get('prefix') or ''}{root}{ind.get('suffix') or ''}" for root in ind.get("roots") or []]
        counts = sl.get("podCounts") or {}
        per = [int(counts["universal"])] * n if counts.get("universal") is not None else \
            [int(c) for c in counts.get("individual") or []]
        for host, pods in zip(hosts, per, strict=False):  # the cluster's lists, as Kueue reads them
            out[host] = out.get(host, 0) + pods
    return out


def placement_sentence(hosts: dict[str, int], node_labels: dict[str, dict[str, str]], *, rack_label: str,
                       block_label: str) -> str:
    """Where Kueue placed it, by rack and block: "in rack rack-a2 (block block-a): gpu-h100-2, gpu-h100-3"; "" when
    it was not placed by topology. ``node_labels``: the hosts' labels as the inventory read them."""
    if not hosts:
        return ""
    racks = sorted({(node_labels.get(h) or {}).get(rack_label, "") for h in hosts})
    blocks = sorted({(node_labels.get(h) or {}).get(block_label, "") for h in hosts})
    names = ", ".join(f"{h}" + (f" ({n} pods)" if n > 1 else "") for h, n in sorted(hosts.items()))
    if len(racks) == 1 and racks[0]:
        where = f"in rack {racks[0]}" + (f" (block {blocks[0]})" if len(blocks) == 1 and blocks[0] else "")
    elif len(blocks) == 1 and blocks[0]:
        where = f"in block {blocks[0]}, across racks {', '.join(r for r in racks if r)}"
    else:
        where = "across racks " + ", ".join(r for r in racks if r) if any(racks) else "on"
    return f"{where}: {names}"


def pending_sentence(*, state: str, kind: str, gpus_total: int, flavor_name: str, flavor_label: str, resource: str,
                     cluster_status: dict[str, Any], cluster_queue: dict[str, Any] | None = None, ahead: int = 0,
                     since: datetime | None = None, volcano: bool = False, gpus_per_pod: int = 0,
                     topology: str = "") -> str:
    """The plain answer for a waiting request; "" when it is not waiting."""
    if state == S.SUBMITTED:
        return "being checked"
    if state == S.PENDING_APPROVAL:
        return awaiting_approval_sentence(since)
    if state == S.APPROVED:
        return "approved; its objects are being created in the cluster"
    if state not in (S.QUEUED, S.PREEMPTED):
        return ""
    objects = cluster_status.get("objects") or {}
    what = f"{gpus_total} x {flavor_label}" if gpus_total else "CPU and memory"
    prefix = "preempted and requeued; " if state == S.PREEMPTED else ""

    pods = [v for k, v in objects.items() if k.startswith("pod/")]
    unschedulable = [p for p in pods if (p.get("sched") or [None])[0] == "False"]
    if volcano:
        vc = objects.get("vcjob") or {}
        phase = vc.get("phase") or "Pending"
        if unschedulable:
            if network := network_topology_sentence(unschedulable[0]["sched"][2], topology):
                return f"{prefix}waiting for {what}: it {network}; {_ahead(ahead)}"
            return f"{prefix}waiting for {what}: no node has room for the whole gang ({unschedulable[0]['sched'][2]})"
        held = volcano_queue_detail(cluster_queue, resource=resource, asks=gpus_total)
        if held:
            return f"{prefix}waiting for {what}: {held}; {_ahead(ahead)}"
        return f"{prefix}waiting for {what} in the project's Volcano queue (job {phase.lower()}); {_ahead(ahead)}"

    workloads = [v for k, v in objects.items() if k.startswith("workload/")]
    if not workloads:
        return f"{prefix}waiting for Kueue to pick it up"
    admitted = [w for w in workloads if (_cond(w, "Admitted") or [None])[0] == "True"]
    if admitted and len(admitted) == len(workloads):
        if unschedulable:
            message = unschedulable[0]["sched"][2] or "no node fits"
            return f"{prefix}admitted; waiting for a node: {message}"
        return f"{prefix}admitted; its pods are starting"
    waiting = next((w for w in workloads if (_cond(w, "Admitted") or [None])[0] != "True"), workloads[0])
    reserved = _cond(waiting, "QuotaReserved") or ["Unknown", "", ""]
    status, reason, message = (reserved + ["", "", ""])[:3]
    if status == "True":
        return f"{prefix}quota reserved; waiting for admission checks"
    if reason == "Inadmissible":
        return f"{prefix}the project's queue cannot take it: {message}"
    placed = topology_sentence(message, gpus_per_pod=gpus_per_pod, flavor_label=flavor_label, topology=topology)
    if not placed and topology:
        # Kueue's flavor fungibility: after the placed flavor's not-fit it tries the queue's next flavors, and the
        # condition then says only why those do not serve ("Flavor "cpu" does not support TopologyAwareScheduling",
        # seen on the real control plane); the topology wait is in its latest Pending event.
        for _reason, text in reversed((cluster_status or {}).get("warnings") or []):
            placed = topology_sentence(text, gpus_per_pod=gpus_per_pod, flavor_label=flavor_label, topology=topology)
            if placed:
                break
    if placed:
        return f"{prefix}{placed}; {_ahead(ahead)}"
    match = _INSUFFICIENT.search(message or "")
    usage = queue_usage(cluster_queue, match.group("flavor") if match else flavor_name,
                        match.group("resource") if match else resource)
    parts = [f"{prefix}waiting for {what}"]
    if usage is not None:
        parts.append(": " + quota_detail(asks=Decimal(gpus_total) if gpus_total else None, usage=usage))
    elif message:
        parts.append(f": {message}")
    return "".join(parts) + f"; {_ahead(ahead)}"


def quota_detail(*, asks: Decimal | None, usage: QueueUsage) -> str:
    """"asks for 10; the project has 6 and may borrow 4 (8 in use now)": what it asks against what the project has."""
    detail = (f"asks for {fmt(asks)}; " if asks else "") + f"the project has {fmt(usage.nominal)}"
    if not usage.cohort:
        detail += " and no cohort to borrow from"
    elif usage.borrowing_limit is not None:
        detail += f" and may borrow {fmt(usage.borrowing_limit)}" if usage.borrowing_limit else " and may not borrow"
    else:
        detail += " and may borrow from its tenant's cohort, which has nothing to lend now"
    if usage.used:
        detail += f" ({fmt(usage.used)} in use now)"
    return detail


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return "less than a minute"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} day{'s' if days > 1 else ''} {hours} h" if hours else f"{days} day{'s' if days > 1 else ''}"


def queue_line(*, since: datetime | None, now: datetime, ahead: int | None, queue: str = "") -> str:
    """"pending for 12 min, 2nd in the queue acme-vision": how long it has waited and where it stands."""
    parts = []
    if since is not None:
        parts.append(f"pending for {_duration(max((now - since).total_seconds(), 0))}")
    if ahead is not None:
        parts.append(f"{_ordinal(ahead + 1)} in the queue" + (f" {queue}" if queue else ""))
    return ", ".join(parts)


def request_queue_line(request: WorkloadRequest, *, queue: str = "") -> str:
    """The queue line of a request waiting in the cluster (queued or preempted); "" otherwise."""
    if request.state not in (S.QUEUED, S.PREEMPTED):
        return ""
    return queue_line(since=request.queued_at or request.updated_at, now=timezone.now(),
                      ahead=requests_ahead(request), queue=queue)


def awaiting_approval_sentence(since: datetime | None) -> str:
    """"awaiting approval by a project admin since 10:42"; the date too when it is not today's."""
    if since is None:
        return "awaiting approval by a project admin"
    local = timezone.localtime(since)
    when = f"{local:%H:%M}" if local.date() == timezone.localdate() else f"{local:%Y-%m-%d %H:%M}"
    return f"awaiting approval by a project admin since {when}"


def request_placement(request: WorkloadRequest) -> str:
    """Where Kueue placed a request by topology, in racks and blocks (the hosts its Workload's admission names, with
    the labels the inventory read off those nodes); "" when it was not placed by topology."""
    from quotas import manifests as quota_manifests
    from quotas.models import Node

    hosts: dict[str, int] = {}
    for key, value in ((request.cluster_status or {}).get("objects") or {}).items():
        if key.startswith("workload/") and (_cond(value, "Admitted") or [None])[0] == "True":
            for host, pods in (value.get("topo") or {}).items():
                hosts[str(host)] = hosts.get(str(host), 0) + int(pods)
    if not hosts:
        return ""
    labels = dict(Node.objects.filter(cluster_id=request.cluster_id, name__in=list(hosts)).values_list("name", "labels"))
    cluster = request.flavor.cluster if request.flavor_id else None
    sentence = placement_sentence(hosts, labels, rack_label=quota_manifests.topology_label(cluster, "rack"),
                                  block_label=quota_manifests.topology_label(cluster, "block"))
    nvlink = quota_manifests.topology_label(cluster, "nvlink")
    domains = sorted({(labels.get(h) or {}).get(nvlink, "") for h in hosts}) if nvlink else []
    if len(domains) == 1 and domains[0]:
        sentence = f"in NVLink domain {domains[0]}, {sentence}"
    return sentence


def requests_ahead(request: WorkloadRequest) -> int:
    """Requests of the same project and flavor that Kueue orders before this one and that still wait."""
    from .models import Priority

    rank = {Priority.BATCH: 0, Priority.INTERACTIVE: 1, Priority.PRODUCTION: 2}
    mine = rank.get(request.priority, 0)
    higher = [p for p, r in rank.items() if r > mine]
    same = [p for p, r in rank.items() if r == mine]
    waiting = WorkloadRequest.objects.filter(
        project_id=request.project_id, flavor_id=request.flavor_id, state__in=[S.QUEUED, S.PREEMPTED]
    ).exclude(pk=request.pk)
    from django.db.models import Q

    return waiting.filter(Q(priority__in=higher) | Q(priority__in=same, created_at__lt=request.created_at)).count()


def request_pending_reason(request: WorkloadRequest, *, cluster_queue: dict[str, Any] | None, volcano: bool,
                           ahead: int | None = None) -> str:
    flavor = request.flavor
    return pending_sentence(
        state=request.state,
        kind=request.template.kind,
        gpus_total=int(request.gpus) * int(request.replicas),
        flavor_name=flavor.name,
        flavor_label=str(flavor.display_name or flavor.gpu_model or flavor.name),
        resource=flavor.primary_resource,
        cluster_status=request.cluster_status or {},
        cluster_queue=cluster_queue,
        ahead=requests_ahead(request) if ahead is None else ahead,
        since=request.updated_at,
        volcano=volcano,
        gpus_per_pod=int(request.gpus),
        topology=request.topology,
    )[:500]

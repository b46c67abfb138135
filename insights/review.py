"""The architecture review, answered from the live configuration (docs/insights.md, "Architecture review").

Pure functions: rows in (a :class:`Snapshot` that ``insights/review_selectors.py`` reads), answers out; no queries,
no settings, no URLs resolved here. Each :class:`Answer` is one question of the review checklist with a one-line
answer and the details it stands on, so the page, the API and the tests read the same thing.

What the words come from: the pool's ``NodePool.sharing`` (what the nodes offer), the cluster's architecture
(``quotas/architectures.py``: its label and whether it offers MIG / HAMi flavors, runs Volcano, splits online and
offline pools), the quota rows (nominal, borrowing, lending per flavor), the cluster's ``overcommit_percent`` and
health, node readiness, and the metering intervals.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from quotas import architectures
from workloads import kinds


def _kinds_words(**traits: Any) -> str:
    """The registered kinds with these traits, as the review writes them (``training`` or ``training, inference``)."""
    return ", ".join(kinds.where(**traits)) or "nothing"

UNIT_WORDS = {
    "whole": "whole GPU",
    "mig": "MIG slice",
    "hami": "HAMi shared vGPU",
    "none": "no GPU (CPU only)",
}
ISOLATION_WORDS = {
    "whole": ("whole card", "a pod gets entire GPUs: nothing else runs on the card, so memory, compute and faults "
                            "are its own"),
    "mig": ("MIG hardware isolation", "each slice has its own memory, cache and compute engines in the GPU itself: "
                                      "a neighbour can neither read its memory nor slow it down, and an error stays "
                                      "in its slice"),
    "hami": ("HAMi soft limits", "pods share a card; HAMi caps each one's device memory and share of compute in the "
                                 "CUDA layer. The limits are enforced in software: no fault isolation, and a busy "
                                 "neighbour still competes for memory bandwidth"),
}


@dataclass(frozen=True)
class ClusterRow:
    name: str
    architecture: str
    use_mig: bool = False
    use_hami: bool = False
    overcommit_percent: int = 0
    volcano_capacity_plugin: bool = False
    health: str = "unknown"
    last_error: str = ""
    last_seen_at: datetime | None = None
    zone: str = ""  # federation (docs/federation.md): the zone it is, its failure domain, drained or not
    failure_domain: str = ""
    draining: bool = False
    drain_reason: str = ""
    role: str = "standalone"  # Cluster.role: standalone, or a Kueue MultiKueue manager or worker
    manager: str = ""  # a MultiKueue worker's manager cluster


@dataclass(frozen=True)
class PoolRow:
    cluster: str
    name: str
    sharing: str
    gpu_product: str = ""
    mig_config: str = ""
    pool_label: str = ""
    nodes: int = 0
    nodes_ready: int = 0


@dataclass(frozen=True)
class FlavorRow:
    cluster: str
    name: str
    kind: str
    mig_profile: str = ""
    pool_label: str = ""
    gpu_model: str = ""


@dataclass(frozen=True)
class SpillPolicyRow:
    tenant: str
    project: str
    allowed: bool
    target_models: tuple[str, ...] = ()
    needs_approval: bool = False


@dataclass(frozen=True)
class QuotaRow:
    cluster: str
    flavor: str
    kind: str
    resource: str
    tenant: str
    project: str  # "" for the tenant's own row (its cohort)
    nominal: Decimal
    borrowing_limit: Decimal | None = None
    lending_limit: Decimal | None = None


@dataclass(frozen=True)
class UsageRow:
    tenant: str
    project: str
    intervals: int
    open_intervals: int = 0


@dataclass
class Snapshot:
    """What the review is answered from, already narrowed to who asks (``tenant`` set: one tenant's parts)."""

    clusters: list[ClusterRow]
    pools: list[PoolRow]
    flavors: list[FlavorRow]
    quotas: list[QuotaRow]
    tenants: dict[str, int]  # tenant slug -> active projects
    usage: list[UsageRow]
    tenant: str = ""
    mig_changes_url: str = ""
    usage_days: int = 30
    spill_policies: list[SpillPolicyRow] = field(default_factory=list)
    spills: list[tuple[str, str, int]] = field(default_factory=list)  # (from model, to model, requests) in usage_days


@dataclass
class Answer:
    key: str
    question: str
    answer: str
    details: list[str] = field(default_factory=list)


QUESTIONS = {
    "unit": "What is the resource unit of each pool, and why?",
    "isolation": "What isolation does each unit give?",
    "governed": "Who are the governed objects?",
    "admission": "How are admission and quota defined?",
    "reconfiguration": "Can the GPU layout be reconfigured, and by whom?",
    "usage": "How is usage measured and attributed?",
    "failure": "What are the failure domains?",
    "zones": "Which zones are there, and what does each offer?",
    "routing": "How is work routed among zones?",
    "spill": "When may work spill over to another GPU model?",
}


def _arch(cluster: ClusterRow) -> architectures.Arch:
    return architectures.get(cluster.architecture)


def _n(value: Decimal | int | None) -> str:
    if value is None:
        return "no limit"
    value = Decimal(value)
    return f"{value.normalize():f}" if value == value.to_integral() else f"{value:f}".rstrip("0")


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _why_unit(pool: PoolRow, cluster: ClusterRow) -> str:
    arch = _arch(cluster)
    kind = pool.sharing
    label = f"architecture {arch.label}"
    if kind in ("mig", "hami"):
        switched = cluster.use_mig if kind == "mig" else cluster.use_hami
        if arch.offers(kind, use_mig=cluster.use_mig, use_hami=cluster.use_hami):
            how = "switched on for this cluster" if getattr(arch, kind) == architectures.SWITCH else "part of it"
            return f"{label}: {UNIT_WORDS[kind]} flavors are {how}"
        if arch.may_use(kind) and not switched:
            return f"{label} could offer them but they are switched off for this cluster: the pool is not offered"
        return f"{label} never offers {UNIT_WORDS[kind]} flavors: the pool is not offered"
    if kind == "whole":
        extra = ""
        if arch.volcano_pool and pool.pool_label == arch.volcano_pool:
            extra = f"; Volcano gang-schedules {_kinds_words(gang=True)} here"
        if arch.online_pool and pool.pool_label == arch.online_pool:
            extra = f"; kept for {_kinds_words(serving=True)} (the online pool)"
        return f"{label}: whole GPUs are offered everywhere{extra}"
    return f"{label}: CPU-only nodes"


def answer_unit(s: Snapshot) -> Answer:
    clusters = {c.name: c for c in s.clusters}
    counts: dict[str, int] = defaultdict(int)
    details = []
    profiles: dict[str, set[str]] = defaultdict(set)
    for f in s.flavors:
        if f.kind == "mig" and f.mig_profile:
            profiles[f.cluster].add(f.mig_profile)
    for pool in s.pools:
        cluster = clusters.get(pool.cluster)
        if cluster is None:
            continue
        counts[pool.sharing] += 1
        what = UNIT_WORDS.get(pool.sharing, pool.sharing)
        if pool.sharing == "mig":
            layout = f" (layout {pool.mig_config})" if pool.mig_config else ""
            shown = ", ".join(sorted(profiles.get(pool.cluster, ()))) or "none offered yet"
            what += f"{layout}, profiles {shown}"
        gpu = f" ({pool.gpu_product})" if pool.gpu_product else ""
        details.append(f"{pool.cluster} / {pool.name}{gpu}: {what}. Why: {_why_unit(pool, cluster)}.")
    if not s.pools:
        # Inventory not read yet: say what the flavors offer instead.
        kinds = sorted({f.kind for f in s.flavors if f.kind != "cpu"})
        text = ("No node pools are known yet (the inventory has not been read). The flavors offer: "
                + (", ".join(UNIT_WORDS.get(k, k) for k in kinds) or "nothing") + ".")
        return Answer("unit", QUESTIONS["unit"], text, [f"{f.cluster} / {f.name}: {UNIT_WORDS.get(f.kind, f.kind)}"
                                                         for f in s.flavors])
    parts = [f"{UNIT_WORDS.get(k, k)} in {_plural(n, 'pool')}" for k, n in sorted(counts.items()) if k != "none"]
    return Answer("unit", QUESTIONS["unit"], "Resource units: " + ("; ".join(parts) or "no GPU pools") + ".", details)


def answer_isolation(s: Snapshot) -> Answer:
    kinds = sorted({p.sharing for p in s.pools if p.sharing in ISOLATION_WORDS}
                   or {f.kind for f in s.flavors if f.kind in ISOLATION_WORDS})
    details = [f"{ISOLATION_WORDS[k][0]} ({UNIT_WORDS[k]}): {ISOLATION_WORDS[k][1]}." for k in kinds]
    pools = defaultdict(list)
    for p in s.pools:
        if p.sharing in ISOLATION_WORDS:
            pools[ISOLATION_WORDS[p.sharing][0]].append(f"{p.cluster}/{p.name}")
    details += [f"{target}: {', '.join(names)}" for target, names in sorted(pools.items())]
    text = ("Isolation targets: " + ", ".join(ISOLATION_WORDS[k][0] for k in kinds) + "."
            if kinds else "No GPU pools: nothing to isolate.")
    return Answer("isolation", QUESTIONS["isolation"], text, details)


def answer_governed(s: Snapshot) -> Answer:
    tenants_on: dict[str, set[str]] = defaultdict(set)
    projects_on: dict[str, set[str]] = defaultdict(set)
    for q in s.quotas:
        tenants_on[q.cluster].add(q.tenant)
        if q.project:
            projects_on[q.cluster].add(q.project)
    details = []
    for c in s.clusters:
        arch = _arch(c)
        t, p = len(tenants_on[c.name]), len(projects_on[c.name])
        if arch.shared_queue:
            details.append(f"{c.name} ({arch.label}): one ClusterQueue 'shared' for everyone, no cohorts; "
                           f"{_plural(p, 'project')} each get a LocalQueue in their namespace.")
            continue
        queues = p * (2 if arch.queues == architectures.POOLS else 1)
        split = " (an offline and an online one per project)" if arch.queues == architectures.POOLS else ""
        details.append(f"{c.name} ({arch.label}): {_plural(t, 'tenant')} → {_plural(t, 'Cohort')}; "
                       f"{_plural(p, 'project')} → {_plural(queues, 'ClusterQueue')}{split}, their LocalQueues "
                       f"and {_plural(p, 'namespace')}.")
    total_projects = sum(s.tenants.values())
    who = f"tenant {s.tenant}" if s.tenant else _plural(len(s.tenants), "tenant")
    text = (f"{who} with {_plural(total_projects, 'active project')}: each tenant is a Kueue Cohort, each project a "
            "ClusterQueue with a LocalQueue in its own namespace (the project's namespace is its boundary).")
    return Answer("governed", QUESTIONS["governed"], text, details)


def answer_admission(s: Snapshot) -> Answer:
    details = []
    by_cluster: dict[str, list[QuotaRow]] = defaultdict(list)
    for q in s.quotas:
        by_cluster[q.cluster].append(q)
    for c in s.clusters:
        arch = _arch(c)
        rows = by_cluster[c.name]
        borrowing = sum(1 for q in rows if q.project and q.borrowing_limit is not None)
        lending = sum(1 for q in rows if q.lending_limit is not None)
        over = (f"tenants' nominal quotas may exceed capacity by {c.overcommit_percent}%" if c.overcommit_percent
                else "tenants' nominal quotas may not exceed capacity (no overcommit)")
        line = f"{c.name}: Kueue admits against nominal quota per flavor; {over}"
        if arch.cohorts:
            line += (f"; projects borrow idle quota inside their tenant's cohort ({_plural(borrowing, 'project quota')} "
                     f"with a borrowing limit, {_plural(lending, 'quota')} with a lending limit; no limit: up to "
                     "what the cohort has free)")
        else:
            line += "; one shared queue: no borrowing or lending"
        if arch.volcano_pool:
            plugin = " with its capacity plugin (deserved/guarantee written)" if c.volcano_capacity_plugin else ""
            line += (f"; Volcano{plugin} gang-schedules {_kinds_words(gang=True)} on the "
                     f"'{arch.volcano_pool}' pool (all workers start together or none)")
        details.append(line + ".")
        nominal: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        for q in rows:
            if q.project:
                nominal[(q.flavor, q.resource)] += q.nominal
        for (flavor, resource), total in sorted(nominal.items()):
            details.append(f"  {c.name} / {flavor} {resource}: {_n(total)} nominal across projects")
    for q in s.quotas if s.tenant else []:
        owner = q.project or f"{q.tenant} (tenant)"
        details.append(f"  {owner} · {q.flavor} {q.resource}: nominal {_n(q.nominal)}, borrowing "
                       f"{_n(q.borrowing_limit)}, lending {_n(q.lending_limit)}")
    text = ("Admission: Kueue, by nominal quota per flavor with borrowing and lending inside each tenant's cohort"
            + ("; Volcano for gang-scheduled training" if any(_arch(c).volcano_pool for c in s.clusters) else "")
            + ". Ops set tenant quotas, tenant admins split them across projects.")
    return Answer("admission", QUESTIONS["admission"], text, details)


def answer_reconfiguration(s: Snapshot) -> Answer:
    mig = [p for p in s.pools if p.sharing == "mig"]
    where = f" ({s.mig_changes_url})" if s.mig_changes_url else " (the maintenance app's MIG changes)"
    details = [f"{p.cluster} / {p.name}: MIG layout {p.mig_config or 'not reported'}" for p in mig]
    details.append("Architecture: ops switch a cluster's architecture (A–F) by applying a reviewed plan; the change "
                   "is recorded and applied under the cluster's reconcile lock.")
    if any(p.sharing == "hami" for p in s.pools):
        details.append("HAMi: vGPU sizes (memory, compute share) are flavor settings, changed by ops.")
    if mig:
        text = (f"Yes: {_plural(len(mig), 'MIG pool')} can be re-partitioned. Who: ops, with approval{where}; "
                "the nodes are drained of work first and capacity counts only once the new layout is reported.")
    elif not s.pools and any(f.kind == "mig" for f in s.flavors):
        text = (f"MIG flavors are offered, but the node pools are not known yet (the inventory has not been read). "
                f"Re-partitioning MIG nodes is for ops, with approval{where}.")
    else:
        text = "No MIG pools: the GPU layout is fixed by the hardware. Ops can still change a cluster's architecture."
    return Answer("reconfiguration", QUESTIONS["reconfiguration"], text, details)


def answer_usage(s: Snapshot) -> Answer:
    total = sum(u.intervals for u in s.usage)
    running = sum(u.open_intervals for u in s.usage)
    tenants = {u.tenant for u in s.usage if u.intervals}
    projects = {u.project for u in s.usage if u.intervals}
    details = [f"{u.tenant} / {u.project}: {_plural(u.intervals, 'interval')}"
               + (f" ({u.open_intervals} running)" if u.open_intervals else "") for u in s.usage if u.intervals]
    text = ("Metered from the cluster: a usage interval opens when Kueue admits a run (a Volcano Job's pods: when "
            "they start) and closes when it finishes, is evicted or is deleted, in the cluster's own time, per priced "
            "unit (GPU model, MIG profile, HAMi memory and compute, CPU, memory). Each interval carries its request's "
            f"tenant and project. In the last {s.usage_days} days: {_plural(total, 'interval')} ({running} open) for "
            f"{_plural(len(tenants), 'tenant')} and {_plural(len(projects), 'project')}.")
    return Answer("usage", QUESTIONS["usage"], text, details)


def answer_failure(s: Snapshot) -> Answer:
    details = []
    unhealthy = 0
    for c in s.clusters:
        pools = [p for p in s.pools if p.cluster == c.name]
        nodes = sum(p.nodes for p in pools)
        ready = sum(p.nodes_ready for p in pools)
        state = {"healthy": "healthy", "unhealthy": "UNHEALTHY", "unknown": "not contacted yet"}.get(c.health, c.health)
        if c.health == "unhealthy":
            unhealthy += 1
        line = f"{c.name}: {state}; {_plural(len(pools), 'node pool')}, {ready} of {_plural(nodes, 'node')} ready"
        if c.health == "unhealthy" and c.last_error:
            line += f" (last error: {c.last_error[:200]})"
        details.append(line + ".")
        for p in pools:
            if p.nodes_ready < p.nodes:
                details.append(f"  {c.name} / {p.name}: {p.nodes - p.nodes_ready} of {_plural(p.nodes, 'node')} not "
                               "ready (their capacity does not count)")
    domains: dict[str, list[str]] = defaultdict(list)
    for c in s.clusters:
        if c.failure_domain:
            domains[c.failure_domain].append(c.name)
    if domains:
        details.extend(f"Failure domain {d}: {', '.join(names)}" for d, names in sorted(domains.items()))
    text = (f"{_plural(len(s.clusters), 'cluster')}, each its own control plane: the portal follows each one on its "
            "own, so one that fails stops only its own work. Inside a cluster, a node pool is a failure domain per "
            "GPU kind, and a node that is not ready leaves the capacity."
            + (f" Across clusters: {_plural(len(domains), 'failure domain')} ({', '.join(sorted(domains))}); a cluster "
               "unhealthy for longer than the re-dispatch delay has its pending work moved to another zone once, "
               "and its running work is never duplicated." if domains else "")
            + (f" Now: {_plural(unhealthy, 'cluster')} unhealthy." if unhealthy else ""))
    return Answer("failure", QUESTIONS["failure"], text, details)


def _models_by_zone(s: Snapshot) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for f in s.flavors:
        if f.gpu_model and f.kind == "whole" and f.gpu_model not in out[f.cluster]:
            out[f.cluster].append(f.gpu_model)
    return out


def answer_zones(s: Snapshot) -> Answer:
    models = _models_by_zone(s)
    details = []
    for c in s.clusters:
        state = "draining" + (f" ({c.drain_reason})" if c.drain_reason else "") if c.draining else c.health
        details.append(f"{c.zone or c.name} (cluster {c.name}, failure domain {c.failure_domain or 'not set'}): "
                       f"{', '.join(models.get(c.name, [])) or 'no whole-GPU model'}; {state}.")
    offered = sorted({m for ms in models.values() for m in ms})
    text = (f"{_plural(len(s.clusters), 'zone')}: each cluster is one zone, as a rule one GPU model's pool"
            + (f"; the GPU models are {', '.join(offered)}." if offered else "."))
    return Answer("zones", QUESTIONS["zones"], text, details)


def answer_routing(s: Snapshot) -> Answer:
    models = _models_by_zone(s)
    zones_of: dict[str, list[str]] = defaultdict(list)
    names = {c.name: c.zone or c.name for c in s.clusters}
    workers = {c.name for c in s.clusters if c.role == "worker"}
    for cluster, ms in models.items():
        if cluster in workers:
            continue  # a MultiKueue worker takes work from its manager only
        for m in ms:
            zones_of[m].append(names.get(cluster, cluster))
    details = [f"{m}: {', '.join(sorted(z))}" + (" (the least loaded that fits now is taken)" if len(z) > 1 else "")
               for m, z in sorted(zones_of.items())]
    own = ("the image's needs are checked against each accepted model's card first (memory and compute capability "
           "from GPU Feature Discovery; a refusal is shown, never retried), then the job's own model is tried in every "
           "zone that offers it to the project, the least loaded one that fits now by the clusters' own ClusterQueues "
           "(free capacity, queue depth); a drained or unhealthy zone takes nothing new.")
    managers = [c for c in s.clusters if c.role == "manager"]
    if not managers:
        text = "The portal routes by itself (no MultiKueue manager cluster): " + own
        return Answer("routing", QUESTIONS["routing"], text, details)
    parts = []
    for m in managers:
        mine = sorted(c.name for c in s.clusters if c.role == "worker" and c.manager == m.name)
        parts.append(f"MultiKueue on {m.name}" + (f" (workers {', '.join(mine)})" if mine else " (no worker registered)"))
        details.append(f"MultiKueue on {m.name}: dispatches to " + (", ".join(mine) or "no registered worker"))
    text = ("; ".join(parts) + ": what the portal sends to a manager is admitted by its Kueue and dispatched by Kueue "
            "MultiKueue to the first worker whose Kueue admits it (the request's page names the worker). Between the "
            "manager and the other clusters the portal routes by itself: " + own)
    return Answer("routing", QUESTIONS["routing"], text, details)


def answer_spill(s: Snapshot) -> Answer:
    allowed = [p for p in s.spill_policies if p.allowed]
    details = [f"{p.tenant} / {p.project}: to {', '.join(p.target_models) or 'any model'}"
               + ("; a spilled request waits for an approver" if p.needs_approval else "") for p in allowed]
    details += [f"Spilled in the last {s.usage_days} days: {src} → {dst}, {_plural(n, 'request')}" for src, dst, n in s.spills]
    text = ("Only when the job consented and its project's policy allows the target model, and only when every zone of "
            "its own model is full; otherwise it waits for its own model. "
            f"{_plural(len(allowed), 'project')} allow spill-over"
            + (f"; {sum(n for _, _, n in s.spills)} requests spilled in the last {s.usage_days} days." if s.spills else "."))
    return Answer("spill", QUESTIONS["spill"], text, details)


ANSWERS = (answer_unit, answer_isolation, answer_governed, answer_admission, answer_reconfiguration, answer_usage,
           answer_failure, answer_zones, answer_routing, answer_spill)


def review(snapshot: Snapshot) -> list[Answer]:
    """Every question of the checklist, answered from ``snapshot``."""
    return [build(snapshot) for build in ANSWERS]


def as_data(snapshot: Snapshot, answers: Iterable[Answer]) -> dict[str, Any]:
    """The API's shape: the scope, the clusters the answers cover, and the answers."""
    return {
        "tenant": snapshot.tenant or None,
        "clusters": [{"name": c.name, "architecture": c.architecture, "architecture_label": _arch(c).label,
                      "health": c.health} for c in snapshot.clusters],
        "answers": [asdict(a) for a in answers],
    }

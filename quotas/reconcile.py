"""Materialization: load a snapshot, render the desired state, plan against the cluster, apply the plan.

    snapshot_load(cluster) -> Snapshot          one function reads the database (5 queries)
    manifests.desired_state(cluster, snapshot)  pure rendering
    plan_build(cluster) -> Plan                 one label-selected list call per kind, never a GET per object
    plan_apply(plan) -> ApplyResult             server-side apply in dependency order, deletes, records
    reconcile(cluster)                          all of the above plus ClusterQueue usage read back

What counts as a change: an object is written when it is missing on the cluster, when the fields we
own differ there (someone edited or deleted it with kubectl: drift is repaired within one period),
or when its rendered hash differs from the hash we last applied (so fields we stopped setting are
dropped by server-side apply). Otherwise nothing is written: a no-op reconcile only lists.

Units: a tenant's objects (cohort, queues, namespaces, guard rails) are applied as one unit, in
dependency order; the first object that fails stops that unit and is recorded
(``AppliedObject.error``), the rest of the unit keeps its old hash, and the next run resumes from the
live state.

Retries: each cluster call is made once here. The Celery task that runs a reconcile retries the
whole run with backoff when the cluster was unavailable (``quotas/tasks.py``), and the periodic run
catches up after that; a retry loop here as well would multiply the attempts and block whoever waits. Nothing of a tenant is applied out of order, so a half-applied tenant is always a
consistent prefix (its cohort before its queues, a namespace before what lives in it).
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import yaml
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from portal import labels
from portal.quantities import in_portal_units, parse_quantity
from tenants.models import Project, Tenant

from . import architectures
from . import manifests as m
from .models import AppliedObject, Architecture, Cluster, Flavor, Node, Quota

log = logging.getLogger(__name__)


def installation_id() -> str:
    return getattr(settings, "PORTAL_INSTALLATION_ID", m.DEFAULT_INSTALLATION) or m.DEFAULT_INSTALLATION


def _reserved(name: str) -> bool:
    return m.reserved_namespace(name, getattr(settings, "PORTAL_RESERVED_NAMESPACES", ()))

Key = tuple[str, str, str, str]  # (apiVersion, kind, namespace, name)
MANAGED_SELECTOR = labels.managed_selector()
# Fields Kubernetes refuses to change in place: a different value means delete and create again.
# A Topology's levels too (Kueue v0.17: "field is immutable"); the services refuse to change them while flavors carry
# the Topology, so the one replaced is unused and Kueue lets it go (its resource-in-use finalizer).
IMMUTABLE = {("LocalQueue", ("spec", "clusterQueue")), ("Topology", ("spec", "levels"))}
APPLY_WORKERS = 8  # tenant units applied side by side


# ----------------------------------------------------------------------------------------- snapshot
def snapshot_load(cluster: Cluster) -> m.Snapshot:
    """Everything rendering needs for ``cluster``, read in a fixed number of queries."""
    flavors = list(Flavor.objects.filter(cluster=cluster, active=True))
    by_id = {f.pk: f for f in flavors}
    tenant_quotas: dict[int, list[m.QuotaRow]] = {}
    project_quotas: dict[int, list[m.QuotaRow]] = {}
    rows = Quota.objects.filter(flavor__cluster=cluster, flavor__active=True).values_list(
        "tenant_id", "project_id", "flavor_id", "resource", "nominal", "borrowing_limit", "lending_limit"
    ).order_by("tenant_id", "project_id", "flavor_id", "resource")
    for tenant_id, project_id, flavor_id, resource, nominal, borrowing, lending in rows:
        flavor = by_id.get(flavor_id)
        if flavor is None or resource not in flavor.resource_names:
            continue
        row = m.QuotaRow(flavor.name, resource, nominal, borrowing, lending)
        (project_quotas.setdefault(project_id, []) if project_id else tenant_quotas.setdefault(tenant_id, [])).append(row)
    tenants = [
        m.TenantRow(t.slug, t.status == Tenant.Status.ACTIVE, tuple(tenant_quotas.get(t.pk, ())), t.pk)
        for t in Tenant.objects.order_by("slug")
    ]
    # Active projects, and archived ones whose namespace is retained (not yet released for deletion).
    projects = [
        m.ProjectRow(p.slug, p.tenant.slug, p.status == Project.Status.ACTIVE, tuple(project_quotas.get(p.pk, ())), p.pk,
                     p.namespace)
        for p in Project.objects.filter(Q(status=Project.Status.ACTIVE) | Q(namespace_released_at__isnull=True))
        .select_related("tenant").order_by("slug")
    ]
    flavor_rows = [
        m.FlavorRow(f.name, f.kind, tuple(f.resource_names), dict(f.node_labels or {}), tuple(f.taints or ()),
                    tuple(f.tolerations or ()), f.pool_label, f.order, f.pk)
        for f in flavors
    ]
    cluster_row = m.ClusterRow(cluster.name, cluster.architecture, cluster.use_mig, cluster.use_hami, cluster.volcano_capacity_plugin,
                               cluster.topology, cluster.multikueue_check, m.cluster_levels(cluster))
    # Volcano HyperNodes (one per value of each level above the host) come from the nodes' topology labels; read only
    # where they are drawn.
    racks: set[tuple[str, ...]] = set()
    if levels := m.hypernode_levels(cluster):
        for node_labels in Node.objects.filter(cluster=cluster, present=True).values_list("labels", flat=True):
            values = tuple(str((node_labels or {}).get(label) or "") for _name, label in levels)
            if values[-1]:
                racks.add(values)
    return m.Snapshot(cluster_row, tuple(flavor_rows), tuple(tenants), tuple(projects), installation_id(),
                      service_account=getattr(settings, "PORTAL_SERVICE_ACCOUNT", ""), racks=tuple(sorted(racks)),
                      workers=_workers(cluster))


def _as_planned(cluster: Cluster, architecture: str | None) -> Cluster:
    if not architecture or architecture == cluster.architecture:
        return cluster
    planned = copy.copy(cluster)
    planned.architecture = architecture
    return planned


def worker_mismatches(cluster: Cluster, architecture: str | None = None) -> dict[str, str]:
    """A MultiKueue manager's workers whose queues would differ from its own (``architectures.queue_mismatch``), by
    name, with how: found in existing data (the services refuse to make them). ``architecture``: the manager's as
    planned. One query, for a manager only."""
    if cluster.role != "manager":
        return {}
    manager = _as_planned(cluster, architecture)
    out = {}
    for worker in Cluster.objects.filter(role="worker", manager=cluster).order_by("name"):
        found = architectures.queue_mismatch(manager, worker)
        if found:
            out[worker.name] = (f"worker {worker.name} has {' and '.join(w for _, w in found)} as on its manager "
                                f"{cluster.name}: left out of MultiKueue (a workload dispatched there would never be "
                                f"admitted); make it match, or make it standalone")
    return out


def _workers(cluster: Cluster, architecture: str | None = None) -> tuple[m.WorkerRow, ...]:
    """A MultiKueue manager's workers with their kubeconfigs (read only for a manager). A worker whose kubeconfig
    cannot be read is left out (so not dispatched to), with a warning that names it and never the content; so is a
    worker whose queues differ from the manager's (``worker_mismatches``: the plan reports it)."""
    from portal.kube import kubeconfig_text

    if cluster.role != "manager":
        return ()
    rows = []
    manager = _as_planned(cluster, architecture)
    for worker in Cluster.objects.filter(role="worker", manager=cluster).order_by("name"):
        if architectures.queue_mismatch(manager, worker):
            log.warning("multikueue %s: worker %s left out: its queues differ from the manager's", cluster.name, worker.name)
            continue
        try:
            rows.append(m.WorkerRow(worker.name, kubeconfig_text(worker)))
        except (OSError, ValueError) as exc:
            log.warning("multikueue %s: worker %s left out: its kubeconfig cannot be read (%s)", cluster.name,
                        worker.name, type(exc).__name__)
    return tuple(rows)


def object_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _same(live: Any, want: Any) -> bool:
    if live == want:
        return True
    if isinstance(live, (str, int, float)) and isinstance(want, (str, int, float)):
        try:  # "16.5" vs "16500m", 4 vs "4": the same quantity written differently
            return parse_quantity(live) == parse_quantity(want)
        except Exception:
            return False
    return False


def contains(live: Any, want: Any) -> bool:
    """Does ``live`` carry every field of ``want`` with the same value? (Fields we own; extra live fields are fine.)

    An empty map or list we want may be missing from ``live``: a real API server leaves empty ``omitempty`` fields
    out of what it stores (``spec.hard: {}`` of a ResourceQuota comes back as ``spec: {}``), which is not drift."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(
            contains(live[k], v) if k in live else v in ({}, [], None) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(contains(a, b) for a, b in zip(live, want, strict=True))
    return _same(live, want)


def project_onto(live: Any, want: Any) -> Any:
    """``live`` restricted to the shape of ``want``: what a diff of the fields we own should show."""
    if isinstance(want, dict) and isinstance(live, dict):
        return {k: project_onto(live[k], v) for k, v in want.items() if k in live}
    if isinstance(want, list) and isinstance(live, list):
        return [project_onto(a, want[i]) if i < len(want) else a for i, a in enumerate(live)]
    return live


def _get(obj: dict, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = (obj or {}).get(part) if isinstance(obj, dict) else None
    return obj


def _yaml(obj: Any) -> list[str]:
    """An object's lines in a plan diff (a Secret's values redacted: plans are shown on pages)."""
    return yaml.safe_dump(m.redacted(obj), sort_keys=False).splitlines() if obj else []


def _strip_live(obj: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "status"}
    meta = dict(out.get("metadata") or {})
    for key in ("managedFields", "resourceVersion", "uid", "creationTimestamp", "generation"):
        meta.pop(key, None)
    out["metadata"] = meta
    return out


# ----------------------------------------------------------------------------------------- plan
@dataclass
class Item:
    """One planned write. ``conflict``: an object we want exists and is not ours (or lives in a namespace
    that is not ours, or is reserved): nothing is written, the reason is recorded for ops. ``release``:
    a reserved namespace carries our labels (written before the portal checked): we remove our fields
    from it (an apply of the bare object) and never delete it."""

    action: str  # create | change | replace | delete | conflict | release
    key: Key
    desired: dict[str, Any] | None
    live: dict[str, Any] | None
    hash: str = ""
    tenant: str | None = None
    project: str | None = None
    diff: str = ""
    owner: dict[str, str] | None = None  # labels the live object must carry before a forced apply
    reason: str = ""

    @property
    def label(self) -> str:
        _, kind, namespace, name = self.key
        return f"{kind} {namespace + '/' if namespace else ''}{name}"


@dataclass
class Plan:
    cluster_id: int
    architecture: str
    items: list[Item] = field(default_factory=list)
    unchanged: int = 0
    desired_count: int = 0
    live_cluster_queues: list[dict[str, Any]] = field(default_factory=list)
    live_quota_objects: dict[Key, dict[str, Any]] = field(default_factory=dict)  # live ClusterQueues and Cohorts
    ids: dict[str, dict[str, int]] = field(default_factory=dict)  # "tenant"/"project" slug -> id
    known: set[Key] = field(default_factory=set)  # desired or live: AppliedObject rows for anything else are stale
    # (namespace, LocalQueue) -> ClusterQueue, as wanted and as live: what a plan does to the work in the queues
    queue_of: dict[tuple[str, str], str] = field(default_factory=dict)
    live_queue_of: dict[tuple[str, str], str] = field(default_factory=dict)
    project_queues: set[str] = field(default_factory=set)  # wanted ClusterQueues that belong to one project
    draining: list[str] = field(default_factory=list)  # held ClusterQueues left in place until their work is done
    impact: list[dict[str, Any]] | None = None  # workload_impact(), for an architecture change (architecture.plan_for)
    worker_mismatches: list[str] = field(default_factory=list)  # MultiKueue workers left out: their queues differ

    @property
    def removed_queues(self) -> set[str]:
        return {i.key[3] for i in self.deletes if i.key[1] == "ClusterQueue"}

    def of(self, action: str) -> list[Item]:
        return [i for i in self.items if i.action == action]

    @property
    def creates(self) -> list[Item]:
        return self.of("create")

    @property
    def changes(self) -> list[Item]:
        return self.of("change") + self.of("replace")

    @property
    def deletes(self) -> list[Item]:
        return self.of("delete")

    @property
    def conflicts(self) -> list[Item]:
        return self.of("conflict") + self.of("release")

    @property
    def empty(self) -> bool:
        return not self.items

    def summary(self) -> str:
        text = (f"{len(self.creates)} to create, {len(self.changes)} to change, {len(self.deletes)} to delete, "
                f"{self.unchanged} unchanged")
        text += f", {len(self.conflicts)} not ours (left alone)" if self.conflicts else ""
        return text + (f"; {'; '.join(self.worker_mismatches)}" if self.worker_mismatches else "")

    def text(self) -> str:
        """The whole plan as one reviewable unified diff."""
        parts = [f"# plan for architecture {self.architecture}: {self.summary()}"]
        parts += [item.diff for item in self.items]
        return "\n".join(parts) + "\n"


def _live_objects(kube: Any, desired_kinds: set[tuple[str, str]], *, installation: str = m.DEFAULT_INSTALLATION, applied: Any = (),
                  ) -> tuple[dict[Key, dict], list[dict]]:
    """Our objects on the cluster: one (paginated) list call per kind, selected by our managed-by label.

    Ours = our installation id too; objects labelled managed-by us without an installation id (written
    before ids existed) count as ours only when we recorded applying them (``applied`` keys). Another
    installation's objects are not ours: never changed, never pruned.
    """
    from portal.kube import ClusterRejected

    live: dict[Key, dict] = {}
    queues: list[dict] = []
    multikueue = any(k in m.MULTIKUEUE_KINDS for k in desired_kinds) or any(
        (key[0], key[1]) in m.MULTIKUEUE_KINDS for key in applied)
    for api_version, kind in m.KIND_ORDER:
        if (api_version, kind) in m.MULTIKUEUE_KINDS and not multikueue:
            continue  # not a manager, and none written before: no Secret list at all
        try:
            items, _ = kube.list(api_version, kind, m.KIND_NAMESPACE.get((api_version, kind)),
                                 label_selector=MANAGED_SELECTOR)
        except ClusterRejected as exc:
            if exc.status == 404 and (api_version, kind) not in desired_kinds:
                continue  # e.g. no Volcano on a cluster that does not need it
            raise
        for obj in items:
            key = m.object_key(obj)
            owner = m.ownership(obj, installation)
            if owner == "foreign" or (owner == "legacy" and key not in applied):
                continue
            live[key] = obj
            if kind == "ClusterQueue" or (api_version, kind) == (m.VOLCANO_QUEUE, "Queue"):
                queues.append(obj)  # their status is the quota in use (usage_readback)
    return live, queues


def _any_objects(kube: Any, kinds: set[tuple[str, str]]) -> dict[Key, dict]:
    """Every object of ``kinds``, whoever owns it: one list per kind, only for kinds we are about to create."""
    found: dict[Key, dict] = {}
    for api_version, kind in sorted(kinds):
        items, _ = kube.list(api_version, kind, m.KIND_NAMESPACE.get((api_version, kind)))
        for obj in items:
            found[m.object_key(obj)] = obj
    return found


def plan_fingerprint(plan: Plan) -> str:
    """What the person reviewed: applying re-plans and refuses when this differs.

    It covers what will be written: the summary, and each item's action, object and diff, except the live
    content of an object to be deleted. Controllers keep writing their own metadata on live objects (Kueue puts
    its in-use finalizer on a new ClusterQueue a moment after it is made); that changes the diff shown for a
    deletion, not what the deletion does."""
    parts = [plan.text().split("\n", 1)[0]]
    parts += ["|".join(map(str, (item.action, *item.key))) + ("" if item.action == "delete" else "\n" + item.diff)
              for item in plan.items]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _namespace_of(key: Key) -> str:
    return key[3] if key[1] == "Namespace" else key[2]


def plan_build(cluster: Cluster, *, kube: Any = None, snapshot: m.Snapshot | None = None,
               architecture: str | None = None) -> Plan:
    """Compare the desired state with the cluster (and what we last applied); nothing is written."""
    from portal.kube import kube_for

    kube = kube or kube_for(cluster)
    snapshot = snapshot or snapshot_load(cluster)
    if architecture:
        snapshot = snapshot.with_architecture(architecture)
        if cluster.role == "manager":  # its workers as they compare with the planned architecture
            snapshot = replace(snapshot, workers=_workers(cluster, architecture))
    mismatches = worker_mismatches(cluster, snapshot.cluster.architecture)
    desired = m.desired_state(snapshot.cluster, snapshot)
    installation = snapshot.installation
    applied_rows = {(a.api_version, a.kind, a.namespace, a.name): a.hash for a in AppliedObject.objects.filter(cluster=cluster)}
    live, queues = _live_objects(kube, {(o["apiVersion"], o["kind"]) for o in desired},
                                 installation=installation, applied=applied_rows)
    applied = applied_rows
    adopted = set(Project.objects.filter(namespace_adopted_at__isnull=False).values_list("cluster_namespace", flat=True))
    plan = Plan(cluster.pk, snapshot.cluster.architecture, desired_count=len(desired), live_cluster_queues=queues,
                worker_mismatches=list(mismatches.values()),
                ids={"tenant": {t.slug: t.id for t in snapshot.tenants if t.id},
                     "project": {p.slug: p.id for p in snapshot.projects if p.id}})
    ours = m.owner_selector(installation)
    # Objects we want that are not (visibly) ours: are they missing, or someone else's?
    missing_kinds = {(o["apiVersion"], o["kind"]) for o in desired if m.object_key(o) not in live}
    anyone = _any_objects(kube, missing_kinds) if missing_kinds else {}
    # Namespaces we must not write into: reserved, or existing without our labels (and not adopted).
    foreign_ns: dict[str, str] = {}
    for obj in desired:
        key = m.object_key(obj)
        if key[1] != "Namespace":
            continue
        if _reserved(key[3]):
            foreign_ns[key[3]] = f"conflict: namespace {key[3]} is reserved; the portal never writes into it"
        elif key not in live and key in anyone and key[3] not in adopted:
            foreign_ns[key[3]] = (f"conflict: namespace {key[3]} exists and is not managed by this portal "
                                  f"(installation {installation}); ops may adopt it")
    for obj in desired:
        if obj["kind"] == "LocalQueue":
            plan.queue_of[(obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = obj["spec"]["clusterQueue"]
        elif obj["kind"] == "ClusterQueue" and ((obj["metadata"].get("labels") or {}).get(m.PROJECT_LABEL)):
            plan.project_queues.add(obj["metadata"]["name"])
    for key, obj in live.items():
        if key[1] == "LocalQueue":
            plan.live_queue_of[(key[2], key[3])] = (obj.get("spec") or {}).get("clusterQueue", "")
    wanted: set[Key] = set()
    for obj in desired:
        key = m.object_key(obj)
        wanted.add(key)
        digest = object_hash(obj)
        tenant, project = m.owner_of(obj)
        current = live.get(key)
        name = f"{key[1]}/{key[2] + '/' if key[2] else ''}{key[3]}"
        namespace = _namespace_of(key)
        if namespace in foreign_ns:
            reason = foreign_ns[namespace] if key[1] == "Namespace" else (
                f"conflict: not written: {foreign_ns[namespace].removeprefix('conflict: ')}")
            action = "release" if key[1] == "Namespace" and current is not None else "conflict"
            if key[1] != "Namespace" and current is not None and _reserved(namespace):
                action = "delete"  # ours, written into a reserved namespace by an older portal: take it out
            plan.items.append(Item(action, key, obj, current or anyone.get(key), "", tenant, project, f"# {reason}", None, reason))
            continue
        other = anyone.get(key) if current is None else None
        if other is not None and not (other.get("metadata") or {}).get("deletionTimestamp"):
            if key[1] == "Namespace" and key[3] in adopted:
                diff = "\n".join(difflib.unified_diff(_yaml(project_onto(other, obj)), _yaml(obj), f"live/{name}",
                                                      f"desired/{name}", lineterm=""))
                plan.items.append(Item("change", key, obj, other, digest, tenant, project, diff, None))  # adopted by ops
                continue
            owner_labels = (other.get("metadata") or {}).get("labels") or {}
            by = owner_labels.get(m.MANAGED_BY) or "nobody"
            reason = (f"conflict: {key[1]} {key[2] + '/' if key[2] else ''}{key[3]} exists and is not ours "
                      f"(managed by {by}, installation {owner_labels.get(m.INSTALLATION_LABEL, 'none')}); not applied")
            plan.items.append(Item("conflict", key, obj, other, "", tenant, project, f"# {reason}", None, reason))
            continue
        if current is None or (current.get("metadata") or {}).get("deletionTimestamp"):
            diff = "\n".join(difflib.unified_diff([], _yaml(obj), f"live/{name}", f"desired/{name}", lineterm=""))
            plan.items.append(Item("create", key, obj, current, digest, tenant, project, diff))
            continue
        if contains(current, obj) and applied.get(key) == digest:
            plan.unchanged += 1
            continue
        action = "change"
        for kind, path in IMMUTABLE:
            if key[1] == kind and _get(current, path) != _get(obj, path):
                action = "replace"
        legacy = m.ownership(current, installation) == "legacy"
        diff = "\n".join(difflib.unified_diff(_yaml(project_onto(current, obj)), _yaml(obj), f"live/{name}",
                                              f"desired/{name}", lineterm=""))
        plan.items.append(Item(action, key, obj, current, digest, tenant, project, diff,
                               {m.MANAGED_BY: m.MANAGER} if legacy else dict(ours)))
    for key, obj in live.items():
        if key in wanted or (obj.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if key[1] == "ClusterQueue" and _draining(obj):
            plan.draining.append(key[3])  # the "drain" policy: removed once its last admitted workload is done
            continue
        tenant, project = m.owner_of(obj)
        if key[1] == "Namespace" and _reserved(key[3]):
            # Labelled by an older portal: take our labels off, never delete it.
            reason = f"conflict: namespace {key[3]} is reserved; our labels are removed, it is never deleted"
            plan.items.append(Item("release", key, None, obj, "", tenant, project, f"# {reason}", None, reason))
            continue
        name = f"{key[1]}/{key[2] + '/' if key[2] else ''}{key[3]}"
        diff = "\n".join(difflib.unified_diff(_yaml(_strip_live(obj)), [], f"live/{name}", f"desired/{name}", lineterm=""))
        plan.items.append(Item("delete", key, None, obj, "", tenant, project, diff))
    plan.known = wanted | set(live)
    plan.live_quota_objects = {k: o for k, o in live.items() if k[1] in QUOTA_KINDS}
    return plan


def _draining(cq: dict[str, Any]) -> bool:
    return ((cq.get("spec") or {}).get("stopPolicy") == "Hold"
            and int((cq.get("status") or {}).get("reservingWorkloads") or 0) > 0)


# ----------------------------------------------------------------------------------------- work in moved queues
# What an architecture change does to work admitted in a ClusterQueue it removes (docs/architecture.md,
# "Architecture changes and running work"); ops choose one per change.
DRAIN, REQUEUE, KEEP = "drain", "requeue", "keep"
POLICIES = {
    DRAIN: "drain: removed queues stop admitting and stay until their running work finishes, then go",
    REQUEUE: "requeue: running work in removed queues is evicted and queued again in the new queues",
    KEEP: "keep: running work stays where it is; removed queues stay Terminating until empty",
}


def _conditions(wl: dict[str, Any]) -> dict[str, str]:
    return {c.get("type", ""): c.get("status", "") for c in (wl.get("status") or {}).get("conditions") or []}


def _reserved_in(wl: dict[str, Any]) -> str | None:
    """The ClusterQueue an unfinished Workload holds quota in, or None (pending or finished)."""
    cond = _conditions(wl)
    if cond.get("QuotaReserved") != "True" or cond.get("Finished") == "True":
        return None
    return ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue")


def workload_impact(plan: Plan, workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What applying ``plan`` does to the unfinished Workloads, one entry per Workload it moves: running work in a
    ClusterQueue the plan removes (``policy`` says what happens to it), and pending work whose LocalQueue now leads
    to another ClusterQueue (``looser``: one that is not its project's, so its project quota no longer holds it
    back) or to none. Pure: reads the plan and the listed Workloads."""
    removed = plan.removed_queues
    out: list[dict[str, Any]] = []
    for wl in workloads:
        meta = wl.get("metadata") or {}
        if _conditions(wl).get("Finished") == "True":
            continue
        namespace, queue = meta.get("namespace", ""), (wl.get("spec") or {}).get("queueName", "")
        after = plan.queue_of.get((namespace, queue))
        entry = {"namespace": namespace, "workload": meta.get("name", ""),
                 "owner": ((meta.get("ownerReferences") or [{}])[0]).get("name", ""), "local_queue": queue}
        running_in = _reserved_in(wl)
        if running_in:
            if running_in in removed:
                out.append(entry | {"state": "running", "from": running_in, "to": after, "looser": False})
            continue
        before = plan.live_queue_of.get((namespace, queue))
        if after == before:
            continue
        looser = after is not None and after not in plan.project_queues
        out.append(entry | {"state": "pending", "from": before, "to": after, "looser": looser})
    return sorted(out, key=lambda e: (e["state"] != "running", e["namespace"], e["workload"]))


def impact_text(entry: dict[str, Any], policy: str) -> str:
    """One sentence for the plan's reviewer: what happens to this Workload under ``policy``."""
    what = f"{entry['namespace']}/{entry['owner'] or entry['workload']}"
    if entry["state"] == "running":
        return {
            DRAIN: f"{what} runs on in {entry['from']}, which admits nothing new and is removed once its work is done",
            REQUEUE: f"{what} is evicted from {entry['from']} and queued again in {entry['to'] or 'no queue (its LocalQueue goes)'}",
            KEEP: f"{what} keeps running in {entry['from']}, which stays Terminating until it is empty (its use still counts)",
        }[policy]
    if entry["to"] is None:
        return f"{what} stays pending: its LocalQueue {entry['local_queue']} is removed"
    if entry["looser"]:
        return (f"{what} (pending) moves to {entry['to']} and may be admitted at once under that queue's limits, "
                f"not its project's quota")
    return f"{what} (pending) moves from {entry['from'] or 'no queue'} to {entry['to']}"


def running_work_handle(plan: Plan, policy: str, *, kube: Any, impact: list[dict[str, Any]] | None = None,
                        settle_seconds: float = 30.0) -> dict[str, Any]:
    """Carry out ``policy`` for the work the plan's removed ClusterQueues still hold. Call it after ``plan_apply``
    (the LocalQueues already lead to the new queues). Makes each cluster call once; returns what it did."""
    import time

    running = [e for e in (impact or []) if e["state"] == "running"]
    done: dict[str, Any] = {"policy": policy, "running": len(running)}
    if policy == DRAIN:
        # Held, not deleted: it admits nothing new, its admitted work runs on; plan_build leaves a held queue with
        # admitted work alone and the periodic reconcile removes it once empty.
        held = sorted({e["from"] for e in running})
        for name in held:
            kube.patch(m.KUEUE, "ClusterQueue", name, {"spec": {"stopPolicy": "Hold"}})
        done["draining"] = held
    elif policy == REQUEUE:
        # Kueue re-queues a deactivated Workload when it is activated again: evicted (its Job suspended), then back
        # in its LocalQueue, which now leads to the new ClusterQueue.
        for e in running:
            kube.patch(m.KUEUE, "Workload", e["workload"], {"spec": {"active": False}}, e["namespace"])
        deadline = time.monotonic() + settle_seconds
        waiting = list(running)
        while waiting and time.monotonic() < deadline:
            waiting = [e for e in waiting
                       if _reserved_in(kube.get(m.KUEUE, "Workload", e["workload"], e["namespace"]) or {})]
            if waiting:
                time.sleep(0.2)
        for e in running:
            kube.patch(m.KUEUE, "Workload", e["workload"], {"spec": {"active": True}}, e["namespace"])
        done["requeued"] = len(running) - len(waiting)
    return done


def plan_for_architecture_change(cluster: Cluster, new_architecture: str, *, kube: Any = None) -> Plan:
    """What switching ``cluster`` to ``new_architecture`` would create, change and delete. Writes nothing;
    start applying it with ``quotas.architecture.architecture_change_start``, which records the new architecture."""
    if new_architecture not in Architecture.values:
        raise ValueError(f"unknown architecture {new_architecture!r}")
    return plan_build(cluster, kube=kube, architecture=new_architecture)


# ----------------------------------------------------------------------------------------- apply
@dataclass
class ApplyResult:
    applied: int = 0
    deleted: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (object label, error)
    skipped: int = 0  # objects of a unit not attempted because an earlier one failed
    unavailable: bool = False  # some failure was the cluster being unavailable: worth retrying soon

    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (object label, why it was left alone)

    @property
    def ok(self) -> bool:
        return not self.failed


def _rank(item: Item) -> int:
    return m.KIND_RANK.get((item.key[0], item.key[1]), 99)


def _units(plan: Plan) -> list[tuple[str, list[Item]]]:
    """Cluster-wide writes first, then one unit per tenant (writes in order, then deletes in reverse
    order), then cluster-wide deletes (a removed flavor goes after the queues that named it changed)."""
    cluster_writes = sorted((i for i in plan.items if i.tenant is None and i.action != "delete"), key=_rank)
    cluster_deletes = sorted((i for i in plan.items if i.tenant is None and i.action == "delete"), key=_rank, reverse=True)
    tenants: dict[str, list[Item]] = {}
    for item in plan.items:
        if item.tenant is not None:
            tenants.setdefault(item.tenant, []).append(item)
    units: list[tuple[str, list[Item]]] = []
    if cluster_writes:
        units.append(("", cluster_writes))
    for slug in sorted(tenants):
        items = tenants[slug]
        writes = sorted((i for i in items if i.action != "delete"), key=lambda i: (_rank(i), i.key))
        deletes = sorted((i for i in items if i.action == "delete"), key=lambda i: (_rank(i), i.key), reverse=True)
        units.append((slug, writes + deletes))
    if cluster_deletes:
        units.append(("", cluster_deletes))
    return units


def _error_text(exc: Exception) -> str:
    from portal.kube import ClusterRejected

    if isinstance(exc, ClusterRejected):
        fields = ", ".join(exc.fields)
        return f"{exc.status} {exc.reason}: {exc.message}" + (f" [fields: {fields}]" if fields else "")
    return f"unavailable: {exc}"


def plan_apply(plan: Plan, *, kube: Any = None, workers: int = APPLY_WORKERS) -> ApplyResult:
    """Apply ``plan`` to its cluster: server-side apply (field manager ``gpu-portal``) and deletes.

    The plan must be for the cluster's recorded architecture: a change of architecture is recorded
    and audited first by ``quotas.architecture.architecture_change_apply``, which then calls this.
    """
    from portal.kube import ClusterError, ClusterUnavailable, kube_for

    cluster = Cluster.objects.get(pk=plan.cluster_id)
    if plan.architecture != cluster.architecture:
        raise ValueError("an architecture change is applied only through quotas.architecture (recorded and audited)")
    kube = kube or kube_for(cluster)
    result = ApplyResult()
    rows = {(a.api_version, a.kind, a.namespace, a.name): a for a in AppliedObject.objects.filter(cluster=cluster)}

    def run_unit(items: list[Item]) -> tuple[list[tuple[Item, str]], ApplyResult]:
        """Apply one unit in order; stop at its first lasting failure. Cluster calls only (any thread)."""
        done: list[tuple[Item, str]] = []  # (item, "applied" | "deleted" | error text)
        part = ApplyResult()
        for n, item in enumerate(items):
            try:
                if item.action == "conflict":
                    part.conflicts.append((item.label, item.reason))
                    done.append((item, item.reason))
                    continue
                if item.action == "release":
                    bare = {"apiVersion": item.key[0], "kind": item.key[1], "metadata": {"name": item.key[3]}}
                    kube.apply(bare, force=False)
                    part.conflicts.append((item.label, item.reason))
                    done.append((item, item.reason))
                    continue
                if item.action in ("delete", "replace"):
                    kube.delete(item.key[0], item.key[1], item.key[3], item.key[2] or None)
                if item.action == "delete":
                    part.deleted += 1
                    done.append((item, "deleted"))
                    continue
                if item.action == "create":
                    # Not forced: if someone created it since we looked, the server refuses to take their fields.
                    kube.apply(item.desired, force=False)
                else:
                    kube.apply(item.desired, owner=item.owner)
                part.applied += 1
                done.append((item, "applied"))
            except ClusterError as exc:
                text = _error_text(exc)
                log.warning("reconcile %s: %s failed: %s", cluster.name, item.label, text)
                part.failed.append((item.label, text))
                part.unavailable = isinstance(exc, ClusterUnavailable)
                part.skipped = len(items) - n - 1
                done.append((item, text))
                break
        return done, part

    def merge(done: list[tuple[Item, str]], part: ApplyResult) -> None:
        result.applied += part.applied
        result.deleted += part.deleted
        result.failed += part.failed
        result.conflicts += part.conflicts
        result.skipped += part.skipped
        result.unavailable |= part.unavailable
        _record(cluster, plan, done, rows)  # database writes stay on this thread

    units = _units(plan)
    first = units[0] if units and units[0][0] == "" and units[0][1][0].action != "delete" else None
    last = units[-1] if units and units[-1][0] == "" and units[-1][1][0].action == "delete" else None
    tenant_units = [u for u in units if u is not first and u is not last]
    if first:  # flavors and priority classes before any queue names them
        merge(*run_unit(first[1]))
    if workers > 1 and len(tenant_units) > 1:
        # Tenants are independent of each other: their units run side by side.
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for done, part in pool.map(lambda u: run_unit(u[1]), tenant_units):
                merge(done, part)
    else:
        for _slug, items in tenant_units:
            merge(*run_unit(items))
    if last:  # removed flavors after the queues stopped naming them
        merge(*run_unit(last[1]))
    # Records of objects that are neither wanted nor on the cluster any more.
    stale = [row.pk for key, row in rows.items() if key not in plan.known and row.pk is not None]
    if stale:
        AppliedObject.objects.filter(pk__in=stale).delete()
    return result


def _record(cluster: Cluster, plan: Plan, done: list[tuple[Item, str]], rows: dict[Key, AppliedObject]) -> None:
    """Write what one unit did: hash/time for successes, the error for a failure; a few queries per unit."""
    now = timezone.now()
    create: list[AppliedObject] = []
    update: list[AppliedObject] = []
    gone: list[int] = []
    for item, outcome in done:
        row = rows.get(item.key)
        if outcome == "deleted":
            if row is not None:
                gone.append(row.pk)
                rows.pop(item.key)
            continue
        if row is None:
            row = AppliedObject(cluster=cluster, api_version=item.key[0], kind=item.key[1], namespace=item.key[2],
                                name=item.key[3])
            rows[item.key] = row
            create.append(row)
        elif row.pk is not None:
            update.append(row)
        row.tenant_id = plan.ids["tenant"].get(item.tenant or "")
        row.project_id = plan.ids["project"].get(item.project or "")
        if outcome == "applied":
            row.hash, row.applied_at, row.error, row.error_at = item.hash, now, "", None
        else:
            row.error, row.error_at = outcome[:4000], now
    if create:
        AppliedObject.objects.bulk_create(create)
    if update:
        AppliedObject.objects.bulk_update(update, ["tenant_id", "project_id", "hash", "applied_at", "error", "error_at"])
    if gone:
        AppliedObject.objects.filter(pk__in=gone).delete()


# ----------------------------------------------------------------------------------------- usage read-back
def _amount(resource: str, value: Any) -> Decimal:
    return in_portal_units(resource, value).quantize(Decimal("0.001"))


def shared_queues_in_use(queues: list[dict[str, Any]]) -> set[str]:
    """ClusterQueues that hold reserved work but belong to no project (architecture A's ``shared``, also while it
    is Terminating after a switch away from A): their usage is read from their Workloads, per namespace."""
    return {(cq.get("metadata") or {}).get("name", "") for cq in queues
            if not ((cq.get("metadata") or {}).get("labels") or {}).get(m.PROJECT_LABEL)
            and int((cq.get("status") or {}).get("reservingWorkloads") or 0) > 0}


def workload_usage(workloads: list[dict[str, Any]], queues: set[str]) -> dict[tuple[str, str, str], Decimal]:
    """(namespace, flavor, resource) -> quota reserved by the unfinished Workloads admitted in ``queues``."""
    out: dict[tuple[str, str, str], Decimal] = {}
    for wl in workloads:
        status = wl.get("status") or {}
        admission = status.get("admission") or {}
        if admission.get("clusterQueue") not in queues:
            continue
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        if conditions.get("QuotaReserved") != "True" or conditions.get("Finished") == "True":
            continue
        namespace = (wl.get("metadata") or {}).get("namespace", "")
        for psa in admission.get("podSetAssignments") or []:
            flavors = psa.get("flavors") or {}
            for resource, value in (psa.get("resourceUsage") or {}).items():
                if resource in flavors:
                    key = (namespace, flavors[resource], resource)
                    out[key] = out.get(key, Decimal(0)) + _amount(resource, value)
    return out


def usage_readback(cluster: Cluster, queues: list[dict[str, Any]],
                   shared_usage: dict[tuple[str, str, str], Decimal] | None = None) -> int:
    """Copy ClusterQueue status (reserved quota and what is borrowed) into ``Quota.used``/``borrowed``.

    Project rows get their queues' numbers (two queues per project in F), Terminating queues included: Kueue keeps a
    deleted ClusterQueue until its admitted work is done, and that work still runs. ``shared_usage`` (from
    ``workload_usage``) adds what a project's Workloads hold in a queue of no project (A's ``shared``). Tenant rows
    the sum of their projects'. Only rows whose numbers changed are written. Returns the number of rows written.
    """
    per_project: dict[tuple[str, str, str], list[Decimal]] = {}
    volcano = [q for q in queues if q.get("kind") == "Queue"]
    queues = [q for q in queues if q.get("kind") != "Queue"]
    if shared_usage:
        slug_of = {(ns or slug): slug for slug, ns in Project.objects.values_list("slug", "cluster_namespace")}
        for (namespace, flavor, resource), amount in shared_usage.items():
            project = slug_of.get(namespace)
            if project:
                per_project.setdefault((project, flavor, resource), [Decimal(0), Decimal(0)])[0] += amount
    for cq in queues:
        project = ((cq.get("metadata") or {}).get("labels") or {}).get(m.PROJECT_LABEL)
        status = cq.get("status") or {}
        flavors = status.get("flavorsReservation") or status.get("flavorsUsage") or []
        if not project:
            continue
        for flavor in flavors:
            for res in flavor.get("resources") or []:
                key = (project, flavor.get("name", ""), res.get("name", ""))
                acc = per_project.setdefault(key, [Decimal(0), Decimal(0)])
                acc[0] += _amount(key[2], res.get("total"))
                acc[1] += _amount(key[2], res.get("borrowed"))
    per_tenant: dict[tuple[int, str, str], Decimal] = {}
    now = timezone.now()
    changed: list[Quota] = []
    rows = list(Quota.objects.filter(flavor__cluster=cluster).select_related("project", "flavor"))
    if volcano:
        _volcano_usage(cluster, volcano, rows, per_project)
    for row in rows:
        if row.project_id is None:
            continue
        used, borrowed = per_project.get((row.project.slug, row.flavor.name, row.resource), [Decimal(0), Decimal(0)])
        key = (row.tenant_id, row.flavor.name, row.resource)
        per_tenant[key] = per_tenant.get(key, Decimal(0)) + used
        if row.used != used or row.borrowed != borrowed:
            row.used, row.borrowed, row.usage_at = used, borrowed, now
            changed.append(row)
    for row in rows:
        if row.project_id is None:
            used = per_tenant.get((row.tenant_id, row.flavor.name, row.resource), Decimal(0))
            if row.used != used:
                row.used, row.usage_at = used, now
                changed.append(row)
    if changed:
        Quota.objects.bulk_update(changed, ["used", "borrowed", "usage_at"])
    return len(changed)


def _volcano_usage(cluster: Cluster, queues: list[dict[str, Any]], rows: list[Quota],
                   per_project: dict[tuple[str, str, str], list[Decimal]]) -> None:
    """Architecture E: a project's Volcano Queue (``status.allocated``) is what its gangs hold of the Volcano-owned
    flavors. A Queue caps resources, not flavors, so its numbers go to the project's one Volcano-owned flavor with
    that resource (the usual case: one offline whole-GPU flavor); with several, none is guessed. What exceeds the
    row's nominal is borrowed, as Kueue would count it."""
    owned: dict[tuple[str, str], list[Quota]] = {}
    for row in rows:
        if row.project_id is not None and m.volcano_owned(cluster, row.flavor):
            owned.setdefault((row.project.slug, row.resource), []).append(row)
    for queue in queues:
        project = ((queue.get("metadata") or {}).get("labels") or {}).get(m.PROJECT_LABEL)
        allocated = (queue.get("status") or {}).get("allocated") or {}
        for resource, value in allocated.items():
            targets = owned.get((project or "", resource)) or []
            if len(targets) != 1:
                continue
            row = targets[0]
            used = _amount(resource, value)
            acc = per_project.setdefault((row.project.slug, row.flavor.name, resource), [Decimal(0), Decimal(0)])
            acc[0] += used
            acc[1] += max(Decimal(0), used - row.nominal)


QUOTA_KINDS = ("ClusterQueue", "Cohort")


def _nominals(obj: dict[str, Any] | None) -> dict[str, dict[str, str]]:
    """{flavor: {resource: nominal}} of a ClusterQueue's or Cohort's resourceGroups, in our units."""
    out: dict[str, dict[str, str]] = {}
    for group in ((obj or {}).get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                out.setdefault(str(flavor.get("name", "")), {})[str(res.get("name", ""))] = str(
                    _amount(str(res.get("name", "")), res.get("nominalQuota")).normalize())
    return out


def queues_confirm(cluster: Cluster, plan: Plan, started: Any) -> int:
    """After applying ``plan`` (begun at ``started``): stamp ``confirmed_at`` on each ClusterQueue and
    Cohort the cluster now holds as desired (unchanged, or written without error in this run), and keep
    the nominal quota the cluster has for each in ``live_quota`` (what we wrote when it succeeded, what
    was there before otherwise) so the quota pages can show when each figure was last confirmed and
    flag drift. Two or three queries; returns the number of objects confirmed."""
    items = {i.key: i for i in plan.items}
    rows = AppliedObject.objects.filter(cluster=cluster, kind__in=QUOTA_KINDS)
    confirmed: list[int] = []
    changed: list[AppliedObject] = []
    for row in rows:
        key = (row.api_version, row.kind, row.namespace, row.name)
        item = items.get(key)
        if item is None:
            if key not in plan.live_quota_objects:
                continue
            ok, source = True, plan.live_quota_objects[key]  # unchanged: the live object has what we want
        elif item.action == "delete":
            continue
        else:
            ok = row.error == "" and row.applied_at is not None and row.applied_at >= started
            source = item.desired if ok else item.live
        quota = _nominals(source)
        if ok:
            confirmed.append(row.pk)
        if row.live_quota != quota:
            row.live_quota = quota
            changed.append(row)
    if confirmed:
        AppliedObject.objects.filter(pk__in=confirmed).update(confirmed_at=timezone.now())
    if changed:
        AppliedObject.objects.bulk_update(changed, ["live_quota"])
    return len(confirmed)


# ----------------------------------------------------------------------------------------- entry points
def reconcile(cluster: Cluster, *, kube: Any = None) -> ApplyResult:
    """Bring ``cluster`` to the desired state (the periodic and on-change task). Idempotent."""
    from portal.kube import kube_for

    kube = kube or kube_for(cluster)
    plan = plan_build(cluster, kube=kube)
    started = timezone.now()
    result = plan_apply(plan, kube=kube) if not plan.empty else ApplyResult()
    shared = shared_queues_in_use(plan.live_cluster_queues)
    usage_readback(cluster, plan.live_cluster_queues,
                   workload_usage(kube.list(m.KUEUE, "Workload")[0], shared) if shared else None)
    queues_confirm(cluster, plan, started)
    Cluster.objects.filter(pk=cluster.pk).update(reconciled_at=timezone.now())
    return result


def export_yaml(cluster: Cluster, tenant: Tenant | str | None = None) -> str:
    """The desired state as multi-document YAML, for the cluster or one tenant's objects (for review in Git)."""
    objects = m.desired_state(cluster, snapshot_load(cluster))
    if tenant is not None:
        slug = tenant.slug if isinstance(tenant, Tenant) else tenant
        objects = [o for o in objects if m.owner_of(o)[0] == slug]
    return yaml.safe_dump_all([m.redacted(o) for o in objects], sort_keys=False)

"""A faithful-enough simulation of Kueue v1beta2 (what the portal observes), not a second Kueue.

One :meth:`Kueue.reconcile` pass does, in order:

1. **webhooks** — a batch/v1 Job with the label ``kueue.x-k8s.io/queue-name`` (or in a namespace with a LocalQueue
   named ``default``) is suspended on first sight, before the Job controller can create pods; plain Pods (and
   pods of non-Kueue owners such as Volcano Jobs, see docs/cluster-objects.md, "Kueue and Volcano together") that should be managed get the scheduling
   gate ``kueue.x-k8s.io/admission``. Pods created by the sandbox's Deployment/StatefulSet controllers are gated at
   creation through :meth:`Kueue.mutate_pod`.
2. **workloads** — one Workload per Job (``job-<name>-<hash5>``), per Deployment/plain pod (``pod-<name>-<hash5>``;
   Kueue's pod integration), per StatefulSet (pod group ``statefulset-<name>-<hash5>``) and per plain pod group
   (pods labelled ``kueue.x-k8s.io/pod-group-name`` with the annotation ``kueue.x-k8s.io/pod-group-total-count``:
   the Workload is named after the group, created once all ``total-count`` pods exist, carries the annotation
   ``kueue.x-k8s.io/is-group-workload: "true"``, a non-controller ownerReference to each pod and one podSet named by
   the pods' shape hash; its pods stay gated until it is admitted, then are un-gated together): ownerReference
   (controller) to the owner, label ``kueue.x-k8s.io/job-uid``, ``spec.queueName``, ``spec.podSets`` (``main``,
   count, template), ``spec.priorityClassRef``/``spec.priority`` from the ``kueue.x-k8s.io/priority-class`` label
   (WorkloadPriorityClass) or the pod's ``priorityClassName`` (PriorityClass). Finished owners set ``Finished=True``
   (reason ``Succeeded``/``Failed``), which releases the quota.
3. **scheduling** — pending workloads in priority order, then FIFO (creation time, then name): LocalQueue must
   exist, its ClusterQueue must exist, be active and select the namespace, else ``QuotaReserved=False`` reason
   ``Inadmissible`` (``LocalQueue x doesn't exist``, ``ClusterQueue x is inactive``...). Flavors are tried in
   order per resource group; the whole pod set must fit one flavor per group: nominal quota, else borrowing from
   the cohort (``borrowingLimit`` of the borrower, ``lendingLimit`` of the lenders, plus the quota of Cohort
   objects in the cohort tree). Flavor fungibility as Kueue v0.17's flavor assigner: a flavor the pod set's node
   selector or required node affinity rules out is skipped (only the label keys the flavor pins are compared);
   ``whenCanBorrow: MayStopSearch`` (default) takes the first flavor that fits with borrowing, ``TryNextFlavor``
   prefers a later flavor that fits without (else the first that fits by borrowing); ``whenCanPreempt:
   TryNextFlavor`` (default) tries the next flavor when this one needs preemption, ``MayStopSearch`` stops there and
   preempts (a flavor found before that fits by borrowing is preferred, as Kueue's ``BorrowingOverPreemption``).
   No fit: ``QuotaReserved=False`` reason ``Pending`` with Kueue's message (``couldn't assign flavors to pod set main: insufficient unused quota for
   nvidia.com/gpu in flavor h100-80gb, 4 more needed``) — unless preemption can make room:
   ``withinClusterQueue: LowerPriority | LowerOrNewerEqualPriority`` evicts lower-priority workloads of the same
   ClusterQueue; ``reclaimWithinCohort: Any | LowerPriority`` evicts workloads of other ClusterQueues that borrow,
   when the preemptor fits its own nominal quota. Victims: other queues' borrowers first, then lowest priority,
   then most recently admitted; a minimal set is kept.
   ``StrictFIFO`` blocks a ClusterQueue behind its first workload that does not fit.
   ``stopPolicy: Hold`` stops admissions, ``HoldAndDrain`` also evicts admitted workloads (ClusterQueue and
   LocalQueue). ``spec.active: false`` evicts/deactivates.
4. **enforcement** — admitted: the flavor's ``nodeLabels`` go into the pod template's nodeSelector and its
   ``tolerations`` are added, then the Job is un-suspended / the gates are removed. Evicted: ``Evicted=True``
   (``Preempted``, ``ClusterQueueStopped``, ``LocalQueueStopped``, ``Deactivated``), ``Preempted=True``
   (``InClusterQueue``/``InCohortReclamation``), the Job is suspended again with its original template (its pods
   deleted) or the pods are deleted, then ``Requeued``, ``QuotaReserved=False`` (reason ``Pending``), admission
   cleared: it waits in the queue again. Re-admission resets ``Evicted``/``Preempted`` to False ("Previously: ...").
5. **status** — ClusterQueue (``pendingWorkloads``, ``reservingWorkloads``, ``admittedWorkloads``,
   ``flavorsReservation``/``flavorsUsage`` with ``borrowed``, condition ``Active``) and LocalQueue (same counters and
   usage without ``borrowed``, condition ``Active``).

Quota is computed from the pod template's requests (limits when requests are missing) x count, after the Kueue
``resources.transformations`` of the HAMi recipe (``nvidia.com/gpumem`` x ``nvidia.com/gpu`` ->
``nvidia.com/total-gpumem``, same for ``gpucores``; override with the profile key ``kueue.transformations``).

Topology Aware Scheduling: a pod set whose flavor names a ``Topology`` is placed by ``sandbox/controllers/tas.py``
(one rack or block when its template asks ``kueue.x-k8s.io/podset-required-topology``, else waits with Kueue's
``topology "..." allows to fit only n out of m pod(s)``); the admission carries ``topologyAssignment`` and the Job's
pods are gated (``kueue.x-k8s.io/topology``) until each is given its host.

Not simulated: admission checks (treated as Ready), partial admission (``minCount``),
fair sharing, ``borrowWithinCohort`` preemption, flavor fungibility ``preference`` (and, under ``whenCanPreempt:
MayStopSearch``, Kueue's moving on when a flavor's preemption finds no candidates; Kueue compares a pod's node
affinity with the label keys of every flavor of the group, the sandbox with the keys of the flavor it tries),
``waitForPodsReady``, LimitRanges/RuntimeClass overhead, MultiKueue, the visibility API,
Cohort borrowing/lending limits (a Cohort object's own ``nominalQuota`` simply adds to the shared pool).
"""

from __future__ import annotations

import copy
import json
import threading
from collections import defaultdict
from decimal import Decimal

from sandbox.controllers import resources as R
from sandbox.controllers import tas
from sandbox.controllers.common import (
    ADMISSION_CHECK,
    CLUSTER_QUEUE,
    COHORT,
    JOB,
    LOCAL_QUEUE,
    MK_CONTROLLER,
    NAMESPACE,
    NODE,
    POD,
    PRIORITY_CLASS,
    RESOURCE_FLAVOR,
    STATEFULSET,
    WORKLOAD,
    WPC,
    condition_true,
    controller_ref,
    creation_key,
    find_condition,
    is_deleting,
    labels_of,
    owner_ref,
    set_condition,
    short_hash,
    uid_of,
)
from sandbox.controllers.scheduler import matches_node_selector_terms, tolerates
from sandbox.controllers.workloads import is_terminal, job_finished
from sandbox.patch import deep_copy
from sandbox.selectors import match_labels

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
GATE = "kueue.x-k8s.io/admission"
IN_USE_FINALIZER = "kueue.x-k8s.io/resource-in-use"  # on ClusterQueues: kept while a Workload holds quota in it
MANAGED_LABEL = "kueue.x-k8s.io/managed"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
GROUP_WL_ANNOTATION = "kueue.x-k8s.io/is-group-workload"
PLAIN_GROUP = "(pod group)"  # kind of the stand-in owner of a plain pod group's Workload (never stored)
CQ_LABEL = "kueue.x-k8s.io/cluster-queue-name"
LQ_LABEL = "kueue.x-k8s.io/local-queue-name"
PODSET_LABEL = "kueue.x-k8s.io/podset"
PREBUILT_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"  # a Job that takes an existing Workload (MultiKueue's copies)
COMPONENT = "kueue-admission"
JOB_COMPONENT = "kueue-job-controller"

# Kueue Configuration ``resources.transformations`` the sandbox applies (profile key ``kueue.transformations``
# overrides): by default the HAMi recipe of docs/cluster-objects.md, "HAMi" — per-vGPU memory/cores become totals.
DEFAULT_TRANSFORMATIONS = [
    {"input": "nvidia.com/gpucores", "strategy": "Replace", "multiplyBy": "nvidia.com/gpu",
     "outputs": {"nvidia.com/total-gpucores": "1"}},
    {"input": "nvidia.com/gpumem", "strategy": "Replace", "multiplyBy": "nvidia.com/gpu",
     "outputs": {"nvidia.com/total-gpumem": "1"}},
]


def transform(per_pod: dict, transformations: list[dict]) -> dict:
    """Apply Kueue resource transformations to one pod's requests."""
    out = dict(per_pod)
    for t in transformations or []:
        name = t.get("input")
        if name not in per_pod:
            continue
        value = per_pod[name]
        mult = t.get("multiplyBy")
        if mult:
            value = value * per_pod.get(mult, Decimal(1))
        if (t.get("strategy") or "Retain") == "Replace":
            out.pop(name, None)
        for oname, factor in (t.get("outputs") or {}).items():
            out[oname] = out.get(oname, Decimal(0)) + value * R.q(factor)
    return out


PREEMPTION_REASONS = {
    "InClusterQueue": "prioritization in the ClusterQueue",
    "InCohortReclamation": "reclamation within the cohort",
}


def wl_priority(wl: dict) -> int:
    try:
        return int((wl.get("spec") or {}).get("priority") or 0)
    except (TypeError, ValueError):
        return 0


def is_reserved(wl: dict) -> bool:
    return condition_true(wl, "QuotaReserved")


def is_admitted(wl: dict) -> bool:
    return condition_true(wl, "Admitted")


def is_finished(wl: dict) -> bool:
    return condition_true(wl, "Finished")


def is_active(wl: dict) -> bool:
    return (wl.get("spec") or {}).get("active", True) is not False


_USAGE_MEMO: dict[tuple, dict] = {}


def usage_of(wl: dict) -> dict[tuple[str, str], Decimal]:
    """(flavor, resource) -> amount reserved by an admitted workload (from ``status.admission``). READ-ONLY result,
    memoised per (uid, resourceVersion)."""
    m = wl.get("metadata") or {}
    key = (m.get("uid"), m.get("resourceVersion"))
    if key[0] and key[1]:
        hit = _USAGE_MEMO.get(key)
        if hit is not None:
            return hit
        if len(_USAGE_MEMO) > 50000:
            _USAGE_MEMO.clear()
        out = _USAGE_MEMO[key] = _usage_of(wl)
        return out
    return _usage_of(wl)


def _usage_of(wl: dict) -> dict[tuple[str, str], Decimal]:
    out: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    adm = (wl.get("status") or {}).get("admission") or {}
    for psa in adm.get("podSetAssignments") or []:
        flv = psa.get("flavors") or {}
        for r, v in (psa.get("resourceUsage") or {}).items():
            if r in flv:
                out[(flv[r], r)] += R.q(v)
    return dict(out)


def taint_str(t: dict) -> str:
    return f"{t.get('key')}={t.get('value') or ''}:{t.get('effect')}"


# ------------------------------------------------------------------------------------------------ quota model
class Quota:
    """Nominal/borrowing/lending quota and usage of every ClusterQueue, with cohort pools."""

    def __init__(self, cqs: dict[str, dict], cohorts: dict[str, dict], parsed: dict | None = None):
        """``parsed``: optional cache name -> ((uid, generation), nominal, borrowing, lending) kept by the caller."""
        self.cqs = cqs
        self.nominal: dict[str, dict] = {}
        self.blimit: dict[str, dict] = {}
        self.llimit: dict[str, dict] = {}
        self.usage: dict[str, dict] = _usage_map()
        self.mutations = 0  # bumped by every usage change: keys the flavor-assignment memo of a pass
        self.root: dict[str, str | None] = {}
        self.members: dict[str, list[str]] = defaultdict(list)
        self.cohort_quota: dict[str, dict] = defaultdict(lambda: defaultdict(Decimal))
        for name, cq in cqs.items():
            m = cq.get("metadata") or {}
            pkey = (m.get("uid"), m.get("generation"))
            hit = parsed.get(name) if parsed is not None else None
            if hit is not None and hit[0] == pkey and pkey[0]:
                nom, bl, ll = hit[1], hit[2], hit[3]
            else:
                nom, bl, ll = {}, {}, {}
                for g in (cq.get("spec") or {}).get("resourceGroups") or []:
                    for f in g.get("flavors") or []:
                        for r in f.get("resources") or []:
                            fr = (f.get("name"), r.get("name"))
                            nom[fr] = R.q(r.get("nominalQuota", 0))
                            bl[fr] = R.q(r["borrowingLimit"]) if r.get("borrowingLimit") is not None else None
                            ll[fr] = R.q(r["lendingLimit"]) if r.get("lendingLimit") is not None else None
                if parsed is not None:
                    parsed[name] = (pkey, nom, bl, ll)
            self.nominal[name], self.blimit[name], self.llimit[name] = nom, bl, ll
            cohort = (cq.get("spec") or {}).get("cohortName")
            root = self._root_of(cohort, cohorts) if cohort else None
            self.root[name] = root
            if root:
                self.members[root].append(name)
        for cname, co in cohorts.items():
            root = self._root_of(cname, cohorts)
            for g in (co.get("spec") or {}).get("resourceGroups") or []:
                for f in g.get("flavors") or []:
                    for r in f.get("resources") or []:
                        self.cohort_quota[root][(f.get("name"), r.get("name"))] += R.q(r.get("nominalQuota", 0))

    @staticmethod
    def _root_of(name: str, cohorts: dict[str, dict]) -> str:
        seen = set()
        while name in cohorts and name not in seen:
            seen.add(name)
            parent = (cohorts[name].get("spec") or {}).get("parentName")
            if not parent:
                break
            name = parent
        return name

    def n(self, cq, fr) -> Decimal:
        return self.nominal[cq].get(fr, Decimal(0))

    def u(self, cq, fr) -> Decimal:
        return self.usage[cq][fr]

    def lendable(self, cq, fr) -> Decimal:
        nom = self.n(cq, fr)
        ll = self.llimit[cq].get(fr)
        return min(ll, nom) if ll is not None else nom

    def guaranteed(self, cq, fr) -> Decimal:
        return self.n(cq, fr) - self.lendable(cq, fr)

    def pool_capacity(self, root, fr) -> Decimal:
        return sum((self.lendable(m, fr) for m in self.members[root]), Decimal(0)) + self.cohort_quota[root][fr]

    def pool_used(self, root, fr) -> Decimal:
        return sum((max(Decimal(0), self.u(m, fr) - self.guaranteed(m, fr)) for m in self.members[root]), Decimal(0))

    def available(self, cq, fr) -> Decimal:
        nom, used = self.n(cq, fr), self.u(cq, fr)
        root = self.root.get(cq)
        if not root:
            return nom - used
        avail = max(Decimal(0), self.guaranteed(cq, fr) - used) + self.pool_capacity(root, fr) - self.pool_used(root, fr)
        bl = self.blimit[cq].get(fr)
        if bl is not None:
            avail = min(avail, nom + bl - used)
        return avail

    def potential(self, cq, fr) -> Decimal:
        nom = self.n(cq, fr)
        root = self.root.get(cq)
        if not root:
            return nom
        pot = self.guaranteed(cq, fr) + self.pool_capacity(root, fr)
        bl = self.blimit[cq].get(fr)
        if bl is not None:
            pot = min(pot, nom + bl)
        return pot

    def borrowed(self, cq, fr) -> Decimal:
        return max(Decimal(0), self.u(cq, fr) - self.n(cq, fr))

    def add(self, cq, usage: dict, sign: int = 1) -> None:
        if cq not in self.nominal:
            return
        self.mutations += 1
        for fr, v in usage.items():
            self.usage[cq][fr] += v * sign

    def snapshot(self):
        return {cq: dict(u) for cq, u in self.usage.items()}

    def restore(self, snap) -> None:
        self.mutations += 1
        self.usage = _usage_map({cq: defaultdict(Decimal, u) for cq, u in snap.items()})

    def fresh(self) -> Quota:
        """The same quotas with no usage (the quota part is shared: read-only)."""
        q = copy.copy(self)
        q.usage = _usage_map()
        q.mutations = 0
        return q


def _usage_map(init: dict | None = None) -> defaultdict:
    return defaultdict(lambda: defaultdict(Decimal), init or {})


# ------------------------------------------------------------------------------------------------ controller
class Kueue:
    """Incremental: the full pass runs only when one of ``watches`` changed (see :class:`Controllers`); within it,
    admission is re-run only for the quota groups (a cohort tree, or a ClusterQueue without cohort) whose inputs
    changed since the last pass — their Workloads, ClusterQueues, LocalQueues, namespaces, or any ResourceFlavor/
    Cohort — and ClusterQueue/LocalQueue status is rebuilt only when its inputs (object version, counters, usage)
    differ from those of the status last written. A clean group's pass would be a no-op: admission is a deterministic
    function of those inputs."""

    name = "kueue"
    watches = (NAMESPACE, LOCAL_QUEUE, CLUSTER_QUEUE, RESOURCE_FLAVOR, COHORT, WPC, PRIORITY_CLASS, WORKLOAD, JOB,
               POD, STATEFULSET, ADMISSION_CHECK)

    def __init__(self, ctx):
        self.ctx = ctx
        self._dlock = threading.Lock()
        self._d_all = True  # the first pass looks at everything
        self._d_cqs: set[str] = set()
        self._d_cohorts: set[str] = set()
        self._d_lqs: set[tuple] = set()
        self._d_ns: set[str] = set()
        # status: ClusterQueues/LocalQueues whose status inputs may have changed
        self._s_cqs: set[str] = set()
        self._s_lqs: set[tuple] = set()
        self._s_lq_cqs: set[str] = set()  # ClusterQueues whose spec changed: refresh their LocalQueues
        self._s_all = False
        self._lqs_of: defaultdict = defaultdict(set)  # ClusterQueue name -> LocalQueue keys (rebuilt on full passes)
        self._epoch = None
        self._full = True
        self._parsed: dict = {}  # Quota parse cache
        self._spec_gen = 0  # bumped on every ClusterQueue/Cohort spec change
        self._quota_base: tuple | None = None
        self._cq_keys: dict[str, tuple] = {}  # inputs of the ClusterQueue status last written
        self._lq_keys: dict[tuple, tuple] = {}
        self._wl_names: dict[str, str] = {}
        self._shapes: dict[tuple, str] = {}
        ctx.informer.listen(self._on_change)

    # -------------------------------------------------------------------------------------------- dirty sets
    def _on_change(self, gvk, etype: str, new: dict, old: dict | None) -> None:
        if gvk == WORKLOAD:
            with self._dlock:
                for o in (old, new):
                    if o is None:
                        continue
                    cq = ((o.get("status") or {}).get("admission") or {}).get("clusterQueue")
                    if cq:
                        self._d_cqs.add(cq)
                        self._s_cqs.add(cq)
                    lqk = ((o.get("metadata") or {}).get("namespace") or "", (o.get("spec") or {}).get("queueName"))
                    self._d_lqs.add(lqk)
                    self._s_lqs.add(lqk)
            return
        if gvk not in (CLUSTER_QUEUE, LOCAL_QUEUE, RESOURCE_FLAVOR, COHORT, NAMESPACE):
            return
        with self._dlock:  # status inputs: any change, status included
            if gvk == CLUSTER_QUEUE:
                name = (new.get("metadata") or {}).get("name")
                self._s_cqs.add(name)
                if etype == "ADDED" or old is None or old.get("spec") != new.get("spec") or etype == "DELETED":
                    self._s_lq_cqs.add(name)
            elif gvk == LOCAL_QUEUE:
                m = new.get("metadata") or {}
                lqk = (m.get("namespace") or "", m.get("name"))
                self._s_lqs.add(lqk)
                for o in (old, new):
                    if o is not None and (o.get("spec") or {}).get("clusterQueue"):
                        self._s_cqs.add(o["spec"]["clusterQueue"])
                if old is not None:
                    self._lqs_of[(old.get("spec") or {}).get("clusterQueue")].discard(lqk)
                if etype != "DELETED":
                    self._lqs_of[(new.get("spec") or {}).get("clusterQueue")].add(lqk)
            elif gvk == RESOURCE_FLAVOR:
                self._s_all = True
        if etype != "DELETED" and old is not None and is_deleting(old) == is_deleting(new):
            if gvk == NAMESPACE:
                if labels_of(old) == labels_of(new):
                    return
            elif old.get("spec") == new.get("spec"):
                return  # a status-only change
        with self._dlock:
            if gvk in (CLUSTER_QUEUE, COHORT):
                self._spec_gen += 1
            if gvk in (RESOURCE_FLAVOR, COHORT):
                self._d_all = True
            elif gvk == NAMESPACE:
                self._d_ns.add((new.get("metadata") or {}).get("name"))
            else:
                for o in (old, new):
                    if o is None:
                        continue
                    spec = o.get("spec") or {}
                    if gvk == CLUSTER_QUEUE:
                        self._d_cqs.add((o.get("metadata") or {}).get("name"))
                        if spec.get("cohortName"):
                            self._d_cohorts.add(spec["cohortName"])
                    elif spec.get("clusterQueue"):
                        self._d_cqs.add(spec["clusterQueue"])

    def _take_dirty(self) -> None:
        """Admission inputs changed so far (taken right before scheduling, so that the Workloads created and the
        Jobs suspended earlier in this pass count)."""
        with self._dlock:
            epoch = self.ctx.informer.epoch
            full = self._d_all or epoch != self._epoch
            self._cur = (full, self._d_cqs, self._d_cohorts, self._d_lqs, self._d_ns)
            self._full = full
            self._epoch = epoch
            self._d_all = False
            self._d_cqs, self._d_cohorts, self._d_lqs, self._d_ns = set(), set(), set(), set()

    def _take_status_dirty(self) -> None:
        """Status inputs changed so far (taken right before the status step: this pass's admissions count)."""
        with self._dlock:
            full = self._full or self._s_all or self.ctx.informer.epoch != self._epoch
            self._cur_s = (full, self._s_cqs, self._s_lqs, self._s_lq_cqs)
            self._s_all = False
            self._s_cqs, self._s_lqs, self._s_lq_cqs = set(), set(), set()
        if full:
            self._cq_keys.clear()
            self._lq_keys.clear()

    # -------------------------------------------------------------------------------------------- helpers
    def _load(self) -> None:
        ctx = self.ctx
        inf = ctx.informer
        inf.list(NAMESPACE)  # make sure the kinds are loaded
        inf.list(LOCAL_QUEUE)
        inf.list(CLUSTER_QUEUE)
        # the informer's own (ns, name) -> object maps, READ-ONLY; nothing else writes them during a tick
        self.namespaces = inf.objs[NAMESPACE]
        self.lqs = inf.objs[LOCAL_QUEUE]
        # Terminating ClusterQueues stay: their admitted Workloads still use quota (and show in their status) until
        # they finish; they admit nothing new (``_cq_problem``) and go once empty (``_finalizers``).
        self.cqs = {k[1]: q for k, q in inf.objs[CLUSTER_QUEUE].items()}
        self.flavors = {f["metadata"]["name"]: f for f in ctx.list_items(RESOURCE_FLAVOR)}
        self.topologies = ({t["metadata"]["name"]: t for t in ctx.list_items(tas.TOPOLOGY)}
                           if any((f.get("spec") or {}).get("topologyName") for f in self.flavors.values()) else {})
        self._tas = None  # TAS node state of this pass, built when a pod set needs it (``_tas_state``)
        self.cohorts = {c["metadata"]["name"]: c for c in ctx.list_items(COHORT)}
        self.wpcs = {w["metadata"]["name"]: w for w in ctx.list_items(WPC)}
        self.pcs = {p["metadata"]["name"]: p for p in ctx.list_items(PRIORITY_CLASS)}
        self.acs = {a["metadata"]["name"]: a for a in ctx.list_items(ADMISSION_CHECK)}

    def mk_checks(self, cqn: str | None) -> list[str]:
        """The ClusterQueue's admission checks run by MultiKueue (``spec.admissionChecksStrategy``, or the older
        ``spec.admissionChecks`` list). Checks of other controllers count as Ready (nothing runs them here)."""
        spec = (self.cqs.get(cqn or "") or {}).get("spec") or {}
        names = list(spec.get("admissionChecks") or [])
        names += [c.get("name") for c in ((spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or [])]
        return [n for n in dict.fromkeys(names)
                if n and ((self.acs.get(n) or {}).get("spec") or {}).get("controllerName") == MK_CONTROLLER]

    def _lq_cq(self, ns: str, lq: str | None) -> str | None:
        return ((self.lqs.get((ns, lq)) or {}).get("spec") or {}).get("clusterQueue")

    def _requests(self, pod_spec: dict | None) -> dict:
        """One pod's requests as Kueue accounts them (after the configured resource transformations)."""
        cfg = (self.ctx.profile or {}).get("kueue") or {}
        tr = cfg.get("transformations", DEFAULT_TRANSFORMATIONS)
        return transform(R.pod_requests(pod_spec), tr)

    def queue_name(self, obj: dict, namespace: str | None = None) -> str | None:
        q = labels_of(obj).get(QUEUE_LABEL)
        if q:
            return q
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        if ns and ns != "kube-system" and (ns, "default") in getattr(self, "lqs", {}):
            return "default"
        return None

    def _pod_group_name(self, sts: dict) -> str:
        return f"statefulset-{sts['metadata']['name']}-{short_hash(sts['metadata']['name'] + '/' + uid_of(sts))}"

    def _plain_groups(self) -> dict[tuple[str, str], list[dict]]:
        """(namespace, group name) -> live pods of the plain pod groups Kueue manages (oldest first)."""
        groups: dict[tuple[str, str], list[dict]] = {}
        for pod in self.ctx.list_items(POD):
            g = labels_of(pod).get(POD_GROUP_LABEL)
            if not g or is_deleting(pod):
                continue
            ref = controller_ref(pod)
            if ref and ref.get("kind") in ("StatefulSet", "Job"):
                continue
            ns = pod["metadata"]["namespace"]
            if not self.queue_name(pod, ns):
                continue
            groups.setdefault((ns, g), []).append(pod)
        for pods in groups.values():
            pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
        return groups

    @staticmethod
    def _group_total(pods: list[dict]) -> int:
        for p in pods:
            raw = ((p.get("metadata") or {}).get("annotations") or {}).get(POD_GROUP_TOTAL)
            try:
                n = int(str(raw))
            except (TypeError, ValueError):
                continue
            if n > 0:
                return n
        return 0

    @staticmethod
    def _group_owner(ns: str, name: str, pods: list[dict]) -> dict:
        """The stand-in owner of a plain pod group (its oldest pod's labels; never written to the store)."""
        return {"apiVersion": "v1", "kind": PLAIN_GROUP,
                "metadata": {"name": name, "namespace": ns, "uid": f"pod-group/{ns}/{name}",
                             "labels": dict(labels_of(pods[0]) if pods else {})},
                "pods": pods}

    # -------------------------------------------------------------------------------------------- pod webhook
    def mutate_pod(self, pod: dict, owner: dict) -> None:
        """Gate pods that Kueue manages as they are created by the sandbox controllers."""
        if not hasattr(self, "lqs"):
            self._load()
        kind = owner.get("kind")
        api = owner.get("apiVersion") or ""
        if kind == "Job" and api.startswith("batch/"):
            return
        ns = pod["metadata"].get("namespace")
        if kind in ("Deployment", "StatefulSet"):
            q = self.queue_name(owner, ns)
        else:
            q = self.queue_name(pod, ns)
        if not q:
            return
        labels = pod["metadata"].setdefault("labels", {})
        labels[QUEUE_LABEL] = q
        labels[MANAGED_LABEL] = "true"
        prio = labels_of(owner).get(PRIORITY_LABEL)
        if prio:
            labels.setdefault(PRIORITY_LABEL, prio)
        if kind == "StatefulSet":
            labels[POD_GROUP_LABEL] = self._pod_group_name(owner)
            pod["metadata"].setdefault("annotations", {})[POD_GROUP_TOTAL] = str(
                (owner.get("spec") or {}).get("replicas", 1))
        gates = pod["spec"].setdefault("schedulingGates", [])
        if not any(g.get("name") == GATE for g in gates):
            gates.append({"name": GATE})

    # -------------------------------------------------------------------------------------------- reconcile
    def reconcile(self) -> None:
        # Kueue is purely state driven (no timers): Controllers skips this pass when none of ``watches`` changed
        self._load()
        self._webhooks()
        self._sync_workloads()
        self._take_dirty()
        self._schedule()
        self._checks()
        self._enforce()
        self._finalizers()
        self._take_status_dirty()
        self._status()

    # 1. webhooks -------------------------------------------------------------------------------------
    def _webhooks(self) -> None:
        ctx = self.ctx
        self.wls = ctx.list_items(WORKLOAD)
        self.wl_by_owner = {}
        for wl in self.wls:
            uid = labels_of(wl).get(JOB_UID_LABEL)
            if uid:
                self.wl_by_owner[uid] = wl
            elif ((wl.get("metadata") or {}).get("annotations") or {}).get(GROUP_WL_ANNOTATION) == "true":
                self.wl_by_owner[f"pod-group/{wl['metadata']['namespace']}/{wl['metadata']['name']}"] = wl
        by_name = None
        for job in ctx.list_items(JOB):  # a Job naming a prebuilt Workload (MultiKueue's copy on a worker) takes it
            pre = labels_of(job).get(PREBUILT_LABEL)
            if pre and uid_of(job) not in self.wl_by_owner:
                if by_name is None:
                    by_name = {(w["metadata"]["namespace"], w["metadata"]["name"]): w for w in self.wls}
                wl = by_name.get((job["metadata"]["namespace"], pre))
                if wl is not None:
                    self.wl_by_owner[uid_of(job)] = wl
        self.groups = self._plain_groups()
        for pods in self.groups.values():
            for pod in pods:
                if labels_of(pod).get(MANAGED_LABEL) or (pod.get("spec") or {}).get("nodeName") or is_terminal(pod):
                    continue
                new = deep_copy(pod)
                self.mutate_pod(new, {"kind": "Pod", "apiVersion": "v1", "metadata": pod["metadata"]})
                ctx.update(new)
        for job in ctx.list_items(JOB):
            if is_deleting(job) or uid_of(job) in self.wl_by_owner or job_finished(job):
                continue
            q = self.queue_name(job)
            if not q:
                continue
            spec = job.get("spec") or {}
            # Kueue's defaulting webhook: a Job in a ClusterQueue with a MultiKueue check is managed by MultiKueue
            # (the built-in Job controller leaves it alone; its status is the worker's copy's)
            mk = (spec.get("managedBy") in (None, "kubernetes.io/job-controller")
                  and not labels_of(job).get(PREBUILT_LABEL)
                  and bool(self.mk_checks(self._lq_cq(job["metadata"]["namespace"], q))))
            if spec.get("suspend") and labels_of(job).get(QUEUE_LABEL) == q and not mk:
                continue
            new = deep_copy(job)
            new["metadata"].setdefault("labels", {})[QUEUE_LABEL] = q
            new["spec"]["suspend"] = True
            if mk:
                new["spec"]["managedBy"] = MK_CONTROLLER
            ctx.update(new)
        for pod in ctx.list_items(POD):
            if not self._manages_pod_individually(pod):
                continue
            if labels_of(pod).get(MANAGED_LABEL) or (pod.get("spec") or {}).get("nodeName") or is_terminal(pod):
                continue
            new = deep_copy(pod)
            self.mutate_pod(new, {"kind": "Pod", "apiVersion": "v1", "metadata": pod["metadata"]})
            ctx.update(new)

    def _manages_pod_individually(self, pod: dict) -> bool:
        if is_deleting(pod) or labels_of(pod).get(POD_GROUP_LABEL):
            return False
        ref = controller_ref(pod)
        if ref and ref.get("kind") == "Job" and (ref.get("apiVersion") or "").startswith("batch/"):
            return False
        if ref and ref.get("kind") == "StatefulSet":
            return False
        if ref and ref.get("kind") == "Deployment":
            return bool(labels_of(pod).get(QUEUE_LABEL))
        return bool(self.queue_name(pod))

    # 2. workloads ------------------------------------------------------------------------------------
    def _priority(self, obj: dict, template: dict) -> tuple[dict | None, int, str | None]:
        wpc = labels_of(obj).get(PRIORITY_LABEL)
        if wpc:
            w = self.wpcs.get(wpc)
            if w is None:
                return None, 0, f'workloadpriorityclasses.kueue.x-k8s.io "{wpc}" not found'
            return {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": wpc}, int(w.get("value", 0)), None
        pcn = ((template or {}).get("spec") or {}).get("priorityClassName")
        if pcn:
            pc = self.pcs.get(pcn)
            if pc is None:
                return None, 0, f'priorityclasses.scheduling.k8s.io "{pcn}" not found'
            return {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": pcn}, int(pc.get("value", 0)), None
        for pc in self.pcs.values():
            if pc.get("globalDefault"):
                return None, int(pc.get("value", 0)), None
        return None, 0, None

    @staticmethod
    def _clean_template(t: dict) -> dict:
        t = deep_copy(t or {})
        meta = t.get("metadata") or {}
        out_meta = {k: meta[k] for k in ("labels", "annotations") if meta.get(k)}
        spec = t.get("spec") or {}
        spec.pop("nodeName", None)
        spec.pop("schedulingGates", None)
        return {"metadata": out_meta, "spec": spec}

    def _owners(self) -> list[tuple[dict, str, str, int, dict]]:
        """(owner, workload name, queue, count, template) for every Kueue-managed owner."""
        ctx = self.ctx
        out = []
        for job in ctx.list_items(JOB):
            if is_deleting(job):
                continue
            q = self.queue_name(job)
            if not q:
                continue
            spec = job.get("spec") or {}
            par = int(spec.get("parallelism", 1) if spec.get("parallelism") is not None else 1)
            comp = spec.get("completions")
            count = min(par, int(comp)) if comp is not None else par
            name = self._wl_name("job", job)
            out.append((job, name, q, count, spec.get("template") or {}))
        for pod in ctx.list_items(POD):
            if not self._manages_pod_individually(pod):
                continue
            q = self.queue_name(pod)
            name = self._wl_name("pod", pod)
            out.append((pod, name, q, 1, {"metadata": pod.get("metadata"), "spec": pod.get("spec")}))
        for sts in ctx.list_items(STATEFULSET):
            if is_deleting(sts):
                continue
            q = self.queue_name(sts)
            if not q:
                continue
            count = int((sts.get("spec") or {}).get("replicas", 1) or 0)
            out.append((sts, self._pod_group_name(sts), q, count, (sts.get("spec") or {}).get("template") or {}))
        for (ns, g), pods in getattr(self, "groups", {}).items():
            total = self._group_total(pods)
            if total <= 0:
                continue
            first = pods[0]
            out.append((self._group_owner(ns, g, pods), g, self.queue_name(first, ns), total,
                        {"metadata": first.get("metadata"), "spec": first.get("spec")}))
        return out

    def _wl_name(self, prefix: str, owner: dict) -> str:
        n, uid = owner["metadata"]["name"], uid_of(owner)
        key = f"{prefix}/{n}/{uid}"
        name = self._wl_names.get(key)
        if name is None:
            if len(self._wl_names) > 100000:
                self._wl_names.clear()
            name = self._wl_names[key] = f"{prefix}-{n}-{short_hash(n + '/' + uid)}"
        return name

    def _finished(self, owner: dict) -> tuple[str, str] | None:
        kind = owner.get("kind")
        if kind == "Job":
            f = job_finished(owner)
            if f == "Complete":
                return "Succeeded", "Job finished successfully"
            if f == "Failed":
                c = find_condition((owner.get("status") or {}).get("conditions"), "Failed") or {}
                return "Failed", c.get("message") or "Job failed"
        elif kind == PLAIN_GROUP:
            pods = owner.get("pods") or []
            total = self._group_total(pods)
            succeeded = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded")
            if total and succeeded >= total:
                return "Succeeded", f"Pods succeeded: {succeeded}/{total}."
            if pods and len(pods) >= total and all(is_terminal(p) for p in pods):
                return "Failed", f"Pods succeeded: {succeeded}/{total}."
        elif kind == "Pod":
            phase = (owner.get("status") or {}).get("phase")
            if phase == "Succeeded":
                return "Succeeded", "Pod finished successfully"
            if phase == "Failed":
                return "Failed", "Pod failed"
        return None

    def _sync_workloads(self) -> None:
        ctx = self.ctx
        now = ctx.ts()
        for owner, wname, q, count, template in self._owners():
            wl = self.wl_by_owner.get(uid_of(owner))
            fin = self._finished(owner)
            group = owner.get("kind") == PLAIN_GROUP
            if wl is None:
                if fin is not None or count <= 0 or labels_of(owner).get(PREBUILT_LABEL):
                    continue  # (a Job naming a prebuilt Workload waits for it)
                if group and len(owner["pods"]) < count:
                    continue  # Kueue waits for every pod of the group
                subject = owner["pods"][0] if group else owner  # what Events are about
                ref, prio, err = self._priority(owner, template)
                if err:
                    ctx.event(subject, "Warning", "ErrWorkloadCompose", err, JOB_COMPONENT, min_interval=60)
                    continue
                ns = owner["metadata"]["namespace"]
                clean = self._clean_template(template)
                ps_name = "main"
                meta: dict = {"name": wname, "namespace": ns, "labels": {JOB_UID_LABEL: uid_of(owner)},
                              "ownerReferences": [owner_ref(owner)]}
                if group:
                    ps_name = short_hash(json.dumps(clean.get("spec"), sort_keys=True), 8)  # Kueue's role hash
                    meta = {"name": wname, "namespace": ns, "annotations": {GROUP_WL_ANNOTATION: "true"},
                            "ownerReferences": [owner_ref(p, controller=False) for p in owner["pods"]]}
                wl = {
                    "apiVersion": WORKLOAD[0], "kind": "Workload", "metadata": meta,
                    "spec": {"active": True, "queueName": q, "priority": prio,
                             "podSets": [{"name": ps_name, "count": count, "template": clean}]},
                }
                if ref:
                    wl["spec"]["priorityClassRef"] = ref
                created = ctx.create(wl)
                if created is not None:
                    per_pod = self._requests((template or {}).get("spec"))
                    ctx.write_status(created, {"resourceRequests": [
                        {"name": ps_name, "resources": R.fmt_list(R.scale(per_pod, count))}]})
                    ctx.event(subject, "Normal", "CreatedWorkload", f"Created Workload: {ns}/{wname}", JOB_COMPONENT)
                continue
            if controller_ref(wl) is None and owner.get("kind") == "Job":  # adopt the prebuilt Workload
                new = deep_copy(wl)
                new["metadata"].setdefault("ownerReferences", []).append(owner_ref(owner))
                wl = ctx.update(new) or wl
            if fin is not None and not is_finished(wl):
                status = deep_copy(wl.get("status") or {})
                conds = status.setdefault("conditions", [])
                set_condition(conds, "Finished", "True", fin[0], fin[1], now, observedGeneration=wl["metadata"].get("generation", 1))
                ctx.write_status(wl, status)
                continue
            # keep count (StatefulSet scale while pending) and priority (label change) in sync
            if not is_finished(wl):
                spec = wl.get("spec") or {}
                ref, prio, err = self._priority(owner, template)
                prio_changed = not err and (spec.get("priority") != prio or spec.get("priorityClassRef") != ref)
                count_changed = ((spec.get("podSets") or [{}])[0].get("count") != count and not is_reserved(wl)
                                 and count > 0)
                if prio_changed or count_changed:
                    new = deep_copy(wl)
                    if prio_changed:
                        new["spec"]["priority"] = prio
                        if ref:
                            new["spec"]["priorityClassRef"] = ref
                        else:
                            new["spec"].pop("priorityClassRef", None)
                    if count_changed:
                        new["spec"]["podSets"][0]["count"] = count
                    ctx.update(new)
        self.wls = ctx.list_items(WORKLOAD)

    # 3. scheduling -----------------------------------------------------------------------------------
    def _cq_problem(self, cq: dict) -> str | None:
        if is_deleting(cq):
            return "Terminating"
        missing = [f.get("name") for g in (cq.get("spec") or {}).get("resourceGroups") or []
                   for f in g.get("flavors") or [] if f.get("name") not in self.flavors]
        if missing:
            return "FlavorNotFound"
        if (cq.get("spec") or {}).get("stopPolicy") in ("Hold", "HoldAndDrain"):
            return "Stopped"
        return None

    def _ns_labels(self, ns: str) -> dict:
        n = self.namespaces.get(("", ns))
        labels = dict(labels_of(n)) if n else {}
        labels.setdefault("kubernetes.io/metadata.name", ns)
        return labels

    def _queue_check(self, wl: dict) -> tuple[str | None, str | None, str | None]:
        """(cq name, reason, message): reason/message set when the workload cannot be considered."""
        ns = wl["metadata"]["namespace"]
        qn = (wl.get("spec") or {}).get("queueName")
        lq = self.lqs.get((ns, qn))
        if lq is None:
            return None, "Inadmissible", f"LocalQueue {qn} doesn't exist"
        cqn = (lq.get("spec") or {}).get("clusterQueue")
        cq = self.cqs.get(cqn)
        if cq is None:
            return None, "Inadmissible", f"ClusterQueue {cqn} doesn't exist"
        if (lq.get("spec") or {}).get("stopPolicy") in ("Hold", "HoldAndDrain"):
            return cqn, "Inadmissible", f"LocalQueue {qn} is inactive"
        if self._cq_problem(cq):
            return cqn, "Inadmissible", f"ClusterQueue {cqn} is inactive"
        if not match_labels((cq.get("spec") or {}).get("namespaceSelector"), self._ns_labels(ns)):
            return cqn, "Inadmissible", "Workload namespace doesn't match ClusterQueue selector"
        return cqn, None, None

    def _flavor_compatible(self, flavor: dict, template: dict) -> str | None:
        fname = flavor["metadata"]["name"]
        fspec = flavor.get("spec") or {}
        pspec = (template or {}).get("spec") or {}
        tolerations = list(pspec.get("tolerations") or []) + list(fspec.get("tolerations") or [])
        for t in fspec.get("nodeTaints") or []:
            if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t):
                return f"untolerated taint {taint_str(t)} in flavor {fname}"
        nl = {k: str(v) for k, v in (fspec.get("nodeLabels") or {}).items()}
        for k, v in (pspec.get("nodeSelector") or {}).items():
            if k in nl and nl[k] != str(v):
                return f"flavor {fname} doesn't match node affinity"
        req = (((pspec.get("affinity") or {}).get("nodeAffinity") or {})
               .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = req.get("nodeSelectorTerms")
        if terms:
            # only the keys the flavor pins are checked (as Kueue does)
            restricted = []
            for term in terms:
                exprs = [e for e in term.get("matchExpressions") or [] if e.get("key") in nl]
                restricted.append({"matchExpressions": exprs} if exprs else None)
            if all(t is not None for t in restricted) and not matches_node_selector_terms(restricted, nl, ""):
                return f"flavor {fname} doesn't match node affinity"
        return None

    def _assign(self, wl: dict, cqn: str, quota: Quota):
        """Try to assign flavors. Returns (assignment, mode, message, candidates) where assignment is
        {"flavors": {res: flavor}, "usage": {(flavor, res): amount}, "podsets": [...]}; mode "fit"/"borrow" or None."""
        cq = self.cqs[cqn]
        spec = wl.get("spec") or {}
        groups = (cq.get("spec") or {}).get("resourceGroups") or []
        fung = (cq.get("spec") or {}).get("flavorFungibility") or {}
        try_next_on_borrow = fung.get("whenCanBorrow") == "TryNextFlavor"
        stop_on_preempt = fung.get("whenCanPreempt") == "MayStopSearch"
        podsets_out = []
        total_usage: dict = defaultdict(Decimal)
        overall_mode = "fit"
        preempt_options = []  # (podset index, group index, flavor) where preemption might help
        for ps in spec.get("podSets") or []:
            count = int(ps.get("count", 1))
            per_pod = self._requests((ps.get("template") or {}).get("spec"))
            req = R.scale(per_pod, count)
            flavors_for: dict[str, str] = {}
            for r in sorted(req):
                if not any(r in (g.get("coveredResources") or []) for g in groups):
                    return None, None, f"couldn't assign flavors to pod set {ps.get('name', 'main')}: resource {r} unavailable in ClusterQueue", []
            reasons = []
            for g in groups:
                greq = {r: v for r, v in req.items() if r in (g.get("coveredResources") or [])}
                if not greq:
                    continue
                chosen = None
                borrow_pick = None
                for f in g.get("flavors") or []:
                    fname = f.get("name")
                    fobj = self.flavors.get(fname)
                    if fobj is None:
                        continue
                    why = tas.flavor_match(
                        template=ps.get("template"), flavor=fobj, topologies=self.topologies,
                        covered=list(g.get("coveredResources") or []), requested=per_pod,
                        tas_only=all(((self.flavors.get(x.get("name")) or {}).get("spec") or {}).get("topologyName")
                                     for gg in groups for x in gg.get("flavors") or [])) \
                        or self._flavor_compatible(fobj, ps.get("template"))
                    if why:
                        reasons.append(why)
                        continue
                    mode = "fit"
                    msgs = []
                    for r, v in greq.items():
                        fr = (fname, r)
                        val = total_usage[fr] + v
                        if val > quota.potential(cqn, fr):
                            msgs.append(
                                f"insufficient quota for {r} in flavor {fname}, previously considered podsets requests "
                                f"({R.fmt(r, total_usage[fr])}) + current podset request ({R.fmt(r, v)}) > maximum "
                                f"capacity ({R.fmt(r, quota.potential(cqn, fr))})")
                            mode = None
                            continue
                        avail = quota.available(cqn, fr)
                        if val > avail:
                            msgs.append(f"insufficient unused quota for {r} in flavor {fname}, {R.fmt(r, val - avail)} more needed")
                            if mode is not None:
                                mode = "preempt"
                        elif quota.u(cqn, fr) + val > quota.n(cqn, fr) and mode == "fit":
                            mode = "borrow"
                    if mode == "fit":
                        chosen = (fname, "fit")
                        break
                    if mode == "borrow":
                        if not try_next_on_borrow:
                            chosen = (fname, "borrow")
                            break
                        if borrow_pick is None:
                            borrow_pick = (fname, "borrow")
                        continue
                    if mode == "preempt":
                        preempt_options.append((fname, greq))
                    reasons.extend(msgs)
                    if mode == "preempt" and stop_on_preempt:
                        break  # whenCanPreempt: MayStopSearch: this flavor, by preemption (a borrowing fit before wins)
                if chosen is None:
                    chosen = borrow_pick
                if chosen is None:
                    return None, None, (f"couldn't assign flavors to pod set {ps.get('name', 'main')}: "
                                        + ", ".join(sorted(reasons))), preempt_options  # sorted, as Kueue's
                fname, mode = chosen
                if mode == "borrow":
                    overall_mode = "borrow"
                for r, v in greq.items():
                    flavors_for[r] = fname
                    total_usage[(fname, r)] += v
            out = {"name": ps.get("name", "main"), "flavors": flavors_for, "resourceUsage": R.fmt_list(req),
                   "count": count}
            tas_flavor = next((self.flavors[f] for f in dict.fromkeys(flavors_for.values())
                               if ((self.flavors.get(f) or {}).get("spec") or {}).get("topologyName")), None)
            if tas_flavor is not None:
                topology = self.topologies.get(tas_flavor["spec"]["topologyName"])
                if topology is None:
                    return None, None, (f"couldn't assign flavors to pod set {ps.get('name', 'main')}: flavor "
                                        f"{tas_flavor['metadata']['name']} information missing in TAS cache"), []
                assignment, why = tas.assign(topology=topology, flavor=tas_flavor, template=ps.get("template") or {},
                                             count=count, per_pod=per_pod, state=self._tas_state())
                if assignment is None:
                    return None, None, f"couldn't assign flavors to pod set {ps.get('name', 'main')}: {why}", []
                out["topologyAssignment"] = assignment
            podsets_out.append(out)
        return {"podsets": podsets_out, "usage": dict(total_usage)}, overall_mode, "", []

    def _tas_state(self) -> tas.NodeState:
        if self._tas is None:
            reserved = [w for w in self.wls if is_reserved(w) and not is_finished(w)]
            self._tas = tas.NodeState(self.ctx.list_items(NODE), self.ctx.list_items(POD), reserved, self._requests)
        return self._tas

    def _is_tas(self, wl: dict) -> bool:
        """Might be placed by topology (its pod sets may land on a flavor with a Topology): node capacity, which no
        quota group tracks, decides, so it is looked at on every pass."""
        return bool(self.topologies)

    def _assign_memo(self, wl: dict, cqn: str, quota: Quota, memo: dict):
        """:meth:`_assign`, shared by the workloads of one shape (pod sets) while the quota usage does not change
        (a long queue of identical jobs is evaluated once per admission, not once per job). Read-only results."""
        m = wl["metadata"]
        skey = (m.get("uid"), m.get("generation"))
        shape = self._shapes.get(skey)
        if shape is None:
            if len(self._shapes) > 50000:
                self._shapes.clear()
            shape = self._shapes[skey] = json.dumps((wl.get("spec") or {}).get("podSets"), sort_keys=True, default=str)
        key = (cqn, quota.mutations, shape)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = self._assign(wl, cqn, quota)
        return hit

    def _preemption_targets(self, wl: dict, cqn: str, quota: Quota, options, admitted: list[dict]):
        """A minimal list of (victim, reason) whose eviction lets ``wl`` fit, or None."""
        cq = self.cqs[cqn]
        pol = (cq.get("spec") or {}).get("preemption") or {}
        within = pol.get("withinClusterQueue") or "Never"
        reclaim = pol.get("reclaimWithinCohort") or "Never"
        if within == "Never" and reclaim == "Never":
            return None
        prio = wl_priority(wl)
        wl_key = creation_key(wl)
        root = quota.root.get(cqn)
        for fname, greq in options:
            frs = [(fname, r) for r in greq]
            cands = []
            for v in admitted:
                vcq = ((v.get("status") or {}).get("admission") or {}).get("clusterQueue")
                vuse = usage_of(v)
                if not any(fr in vuse for fr in frs):
                    continue
                vp = wl_priority(v)
                if vcq == cqn:
                    if (within == "LowerPriority" and vp < prio) or (
                            within == "LowerOrNewerEqualPriority" and (vp < prio or (vp == prio and creation_key(v) > wl_key))):
                        cands.append((v, "InClusterQueue"))
                elif root and quota.root.get(vcq) == root and reclaim != "Never":  # noqa: SIM102 the inner test has its own comment
                    # the preemptor must fit its own nominal quota; the victim's queue must be borrowing
                    if (all(quota.u(cqn, fr) + greq[fr[1]] <= quota.n(cqn, fr) for fr in frs)
                            and any(quota.borrowed(vcq, fr) > 0 for fr in frs if fr in vuse)
                            and (reclaim == "Any" or vp < prio)):
                        cands.append((v, "InCohortReclamation"))
            if not cands:
                continue

            def order(c):
                v, reason = c
                adm = find_condition((v.get("status") or {}).get("conditions"), "QuotaReserved") or {}
                t = adm.get("lastTransitionTime") or ""
                return (0 if reason == "InCohortReclamation" else 1, wl_priority(v),
                        "".join(chr(0x10FFFF - ord(ch)) for ch in t))

            cands.sort(key=order)
            snap = quota.snapshot()

            def fits(greq=greq, fname=fname) -> bool:  # bound now: called only in this iteration
                return all(greq[r] <= quota.available(cqn, (fname, r)) for r in greq)

            chosen = []
            for c in cands:
                quota.add(((c[0].get("status") or {}).get("admission") or {}).get("clusterQueue"), usage_of(c[0]), -1)
                chosen.append(c)
                if fits():
                    break
            if not fits():
                quota.restore(snap)
                continue
            # minimise: put back victims that are not needed
            for c in list(reversed(chosen)):
                vcq = ((c[0].get("status") or {}).get("admission") or {}).get("clusterQueue")
                quota.add(vcq, usage_of(c[0]), 1)
                if fits():
                    chosen.remove(c)
                else:
                    quota.add(vcq, usage_of(c[0]), -1)
            quota.restore(snap)
            return chosen
        return None

    def _quota(self) -> Quota:
        """A Quota with no usage; the parsed quotas are reused while no ClusterQueue/Cohort spec changed."""
        key = (self._spec_gen, self.ctx.informer.epoch, id(self.cqs))
        if self._quota_base is None or self._quota_base[0] != key[:2] or self._quota_base[2] != len(self.cqs):
            self._quota_base = (key[:2], Quota(self.cqs, self.cohorts, self._parsed), len(self.cqs))
        return self._quota_base[1].fresh()

    def _dirty_groups(self, quota: Quota) -> set | None:
        """Quota groups to re-run admission for (None: all)."""
        all_dirty, d_cqs, d_cohorts, d_lqs, _ = self._cur
        if all_dirty:
            return None
        out = set()
        for lqk in d_lqs:
            lq = self.lqs.get(lqk)
            if lq is not None:
                d_cqs.add((lq.get("spec") or {}).get("clusterQueue"))
        for c in d_cqs:
            out.add(_group(quota, c))
        for co in d_cohorts:
            out.add(("co", Quota._root_of(co, self.cohorts)))
        return out

    def _schedule(self) -> None:
        quota = self._quota()
        dirty = self._dirty_groups(quota)
        dirty_ns = self._cur[4]
        admitted = []
        for wl in self.wls:
            if is_reserved(wl) and not is_finished(wl):
                cqn = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue")
                quota.add(cqn, usage_of(wl))
                admitted.append(wl)
        # drain / deactivate
        for wl in list(admitted):
            if is_deleting(wl):
                continue
            cqn = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue")
            cq = self.cqs.get(cqn)
            lq = self.lqs.get((wl["metadata"]["namespace"], (wl.get("spec") or {}).get("queueName")))
            why = None
            if not is_active(wl):
                why = ("Deactivated", "The workload is deactivated")
            elif cq is not None and (cq.get("spec") or {}).get("stopPolicy") == "HoldAndDrain":
                why = ("ClusterQueueStopped", "The ClusterQueue is stopped")
            elif lq is not None and (lq.get("spec") or {}).get("stopPolicy") == "HoldAndDrain":
                why = ("LocalQueueStopped", "The LocalQueue is stopped")
            if why:
                self._evict(wl, why[0], why[1], None)
                quota.add(cqn, usage_of(wl), -1)
                admitted.remove(wl)
        # requeue workloads whose stop reason went away
        for wl in self.wls:
            self._maybe_requeue(wl)
        pending = [wl for wl in self.wls
                   if not is_reserved(wl) and not is_finished(wl) and is_active(wl) and not is_deleting(wl)]
        pending.sort(key=lambda w: (-wl_priority(w), creation_key(w)))
        blocked_cqs: set[str] = set()
        memo: dict = {}
        for wl in pending:
            cqn, reason, msg = self._queue_check(wl)
            if reason:
                self._set_pending(wl, reason, msg)
                continue
            if dirty is not None and _group(quota, cqn) not in dirty and wl["metadata"]["namespace"] not in dirty_ns \
                    and not self._is_tas(wl):
                continue  # nothing this group's admission depends on changed since the last pass
            if cqn in blocked_cqs:
                continue
            assignment, mode, msg, options = self._assign_memo(wl, cqn, quota, memo)
            if assignment is None and options:
                targets = self._preemption_targets(wl, cqn, quota, options, admitted)
                if targets:
                    for victim, preason in targets:
                        vcq = ((victim.get("status") or {}).get("admission") or {}).get("clusterQueue")
                        message = (f"Preempted to accommodate a workload (UID: {uid_of(wl)}, JobUID: "
                                   f"{labels_of(wl).get(JOB_UID_LABEL) or 'UNKNOWN'}) due to "
                                   f"{PREEMPTION_REASONS[preason]}; preemptor path: {self._path(cqn)}; "
                                   f"preemptee path: {self._path(vcq)}")
                        self._evict(victim, "Preempted", message, preason)
                        quota.add(vcq, usage_of(victim), -1)
                        admitted = [a for a in admitted if uid_of(a) != uid_of(victim)]
                        if self._tas is not None:
                            self._tas.add_workload(victim, -1)
                    assignment, mode, msg, options = self._assign(wl, cqn, quota)
            if assignment is None:
                self._set_pending(wl, "Pending", msg)
                if ((self.cqs[cqn].get("spec") or {}).get("queueingStrategy") == "StrictFIFO"):
                    blocked_cqs.add(cqn)
                continue
            admitted_wl = self._admit(wl, cqn, assignment)
            if admitted_wl is not None:
                quota.add(cqn, assignment["usage"])
                admitted.append(admitted_wl)
                if self._tas is not None:
                    self._tas.add_workload(admitted_wl)

    def _path(self, cqn: str | None) -> str:
        cq = self.cqs.get(cqn or "")
        cohort = ((cq or {}).get("spec") or {}).get("cohortName")
        parts = []
        seen = set()
        while cohort and cohort not in seen:
            seen.add(cohort)
            parts.insert(0, cohort)
            cohort = ((self.cohorts.get(cohort) or {}).get("spec") or {}).get("parentName")
        return "/" + "/".join(parts + [cqn or ""])

    def _set_pending(self, wl: dict, reason: str, message: str) -> None:
        ctx = self.ctx
        prev = find_condition((wl.get("status") or {}).get("conditions"), "QuotaReserved")
        if prev is not None and prev.get("status") == "False" and prev.get("reason") == reason and \
                prev.get("message") == message and \
                prev.get("observedGeneration") == wl["metadata"].get("generation", 1):
            return  # already says so: no write, no event
        status = deep_copy(wl.get("status") or {})
        conds = status.setdefault("conditions", [])
        prev = find_condition(conds, "QuotaReserved")
        changed_msg = prev is None or prev.get("message") != message or prev.get("reason") != reason
        set_condition(conds, "QuotaReserved", "False", reason, message, ctx.ts(),
                      observedGeneration=wl["metadata"].get("generation", 1))
        if ctx.write_status(wl, status) is not None and changed_msg:
            ctx.event(wl, "Warning" if reason == "Inadmissible" else "Normal", reason, message, COMPONENT)

    def _admit(self, wl: dict, cqn: str, assignment: dict) -> dict | None:
        ctx = self.ctx
        now = ctx.ts()
        gen = wl["metadata"].get("generation", 1)
        status = deep_copy(wl.get("status") or {})
        status["admission"] = {"clusterQueue": cqn, "podSetAssignments": assignment["podsets"]}
        conds = status.setdefault("conditions", [])
        set_condition(conds, "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cqn}", now,
                      observedGeneration=gen)
        checks = self.mk_checks(cqn)
        if checks:  # admitted once every check is Ready (``_checks``); MultiKueue runs these
            states = status.setdefault("admissionChecks", [])
            for name in checks:
                if not any(c.get("name") == name for c in states):
                    states.append({"name": name, "state": "Pending", "message": "", "lastTransitionTime": now})
        if checks and not all(c.get("state") == "Ready" for c in status["admissionChecks"] if c.get("name") in checks):
            set_condition(conds, "Admitted", "False", "UnsatisfiedChecks", "The workload has not all checks ready",
                          now, observedGeneration=gen)
        else:
            set_condition(conds, "Admitted", "True", "Admitted", "The workload is admitted", now,
                          observedGeneration=gen)
        for ctype in ("Evicted", "Preempted"):
            c = find_condition(conds, ctype)
            if c is not None and c.get("status") == "True":
                set_condition(conds, ctype, "False", "QuotaReserved", "Previously: " + (c.get("message") or ""), now,
                              observedGeneration=gen)
        res = ctx.write_status(wl, status)
        if res is None:
            return None
        queued = find_condition(conds, "Requeued")
        since = ctx.since((queued or {}).get("lastTransitionTime") if queued and queued.get("status") == "True"
                          else wl["metadata"].get("creationTimestamp")) or 0
        ctx.event(res, "Normal", "QuotaReserved",
                  f"Quota reserved in ClusterQueue {cqn}, wait time since queued was {max(0, int(since))}s", COMPONENT)
        if is_admitted(res):
            ctx.event(res, "Normal", "Admitted",
                      f"Admitted by ClusterQueue {cqn}, wait time since reservation was 0s", COMPONENT)
        return res

    def _checks(self) -> None:
        """A Workload holding quota is admitted once all its admission checks are Ready (Kueue's
        ``SyncAdmittedCondition``); MultiKueue (:mod:`.multikueue`) moves its checks."""
        ctx = self.ctx
        for wl in ctx.list_items(WORKLOAD):
            st = wl.get("status") or {}
            if not st.get("admissionChecks") or not is_reserved(wl) or is_admitted(wl) or is_finished(wl):
                continue
            if not all(c.get("state") == "Ready" for c in st["admissionChecks"]):
                continue
            status = deep_copy(st)
            now = ctx.ts()
            set_condition(status.setdefault("conditions", []), "Admitted", "True", "Admitted",
                          "The workload is admitted", now, observedGeneration=wl["metadata"].get("generation", 1))
            res = ctx.write_status(wl, status)
            if res is not None:
                cqn = (st.get("admission") or {}).get("clusterQueue")
                reserved = find_condition(st.get("conditions"), "QuotaReserved") or {}
                waited = ctx.since(reserved.get("lastTransitionTime")) or 0
                ctx.event(res, "Normal", "Admitted",
                          f"Admitted by ClusterQueue {cqn}, wait time since reservation was {max(0, int(waited))}s",
                          COMPONENT)

    def _evict(self, wl: dict, reason: str, message: str, preempted_reason: str | None) -> None:
        """Evict an admitted workload: conditions, stop its owner, release the quota, requeue."""
        ctx = self.ctx
        now = ctx.ts()
        gen = wl["metadata"].get("generation", 1)
        status = deep_copy(wl.get("status") or {})
        conds = status.setdefault("conditions", [])
        set_condition(conds, "Evicted", "True", reason, message, now, observedGeneration=gen)
        if preempted_reason:
            set_condition(conds, "Preempted", "True", preempted_reason, message, now, observedGeneration=gen)
        self._stop_owner(wl, message)
        # the owner is stopped synchronously here: clear the reservation (Kueue's second eviction phase)
        set_condition(conds, "Requeued", "True" if reason == "Preempted" else "False", reason, message, now,
                      observedGeneration=gen)
        set_condition(conds, "QuotaReserved", "False", "Pending", message, now, observedGeneration=gen)
        set_condition(conds, "Admitted", "False", "NoReservation", "The workload has no reservation", now,
                      observedGeneration=gen)
        status.pop("admission", None)
        for check in status.get("admissionChecks") or []:  # Kueue resets the checks of an evicted Workload
            if check.get("state") != "Pending":
                check.update(state="Pending", message="Reset to Pending after eviction. Previously: "
                             + str(check.get("state")), lastTransitionTime=now)
        stats = status.setdefault("schedulingStats", {}).setdefault("evictions", [])
        for e in stats:
            if e.get("reason") == reason:
                e["count"] = int(e.get("count", 0)) + 1
                break
        else:
            stats.append({"reason": reason, "underlyingCause": "", "count": 1})
        ctx.write_status(wl, status)
        ctx.event(wl, "Normal", f"EvictedDue{reason}" if reason != "Preempted" else "EvictedDueToPreempted", message,
                  COMPONENT)
        if preempted_reason:
            ctx.event(wl, "Normal", "Preempted", message, COMPONENT)

    def _maybe_requeue(self, wl: dict) -> None:
        """Requeued=True once the reason of a non-preemption eviction is gone."""
        c = find_condition((wl.get("status") or {}).get("conditions"), "Requeued")
        if c is None or c.get("status") != "False" or is_reserved(wl) or is_finished(wl):
            return
        reason = c.get("reason")
        lq = self.lqs.get((wl["metadata"]["namespace"], (wl.get("spec") or {}).get("queueName")))
        cq = self.cqs.get(((lq or {}).get("spec") or {}).get("clusterQueue", ""))
        new_reason = None
        if reason == "ClusterQueueStopped" and cq is not None and \
                (cq.get("spec") or {}).get("stopPolicy") in (None, "", "None"):
            new_reason = ("ClusterQueueRestarted", "The ClusterQueue was restarted after being stopped")
        elif reason == "LocalQueueStopped" and lq is not None and \
                (lq.get("spec") or {}).get("stopPolicy") in (None, "", "None"):
            new_reason = ("LocalQueueRestarted", "The LocalQueue was restarted after being stopped")
        elif reason == "Deactivated" and is_active(wl):
            new_reason = ("Reactivated", "The workload was reactivated")
        if new_reason:
            status = deep_copy(wl.get("status") or {})
            set_condition(status["conditions"], "Requeued", "True", new_reason[0], new_reason[1], self.ctx.ts(),
                          observedGeneration=wl["metadata"].get("generation", 1))
            res = self.ctx.write_status(wl, status)
            if res is not None:
                wl.clear()
                wl.update(res)

    # 4. enforcement ----------------------------------------------------------------------------------
    def _owner_of(self, wl: dict) -> dict | None:
        ref = controller_ref(wl)
        if ref is None:
            if ((wl.get("metadata") or {}).get("annotations") or {}).get(GROUP_WL_ANNOTATION) == "true":
                ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
                pods = getattr(self, "groups", {}).get((ns, name))
                return self._group_owner(ns, name, pods) if pods else None
            return None
        gvk = {"Job": JOB, "Pod": POD, "StatefulSet": STATEFULSET}.get(ref.get("kind"))
        if gvk is None or (ref.get("kind") == "Job" and not (ref.get("apiVersion") or "").startswith("batch/")):
            return None
        obj = self.ctx.informer.get(gvk, ref["name"], wl["metadata"]["namespace"])  # READ-ONLY
        if obj is None or uid_of(obj) != ref.get("uid"):
            return None
        return obj

    def _group_pods(self, wl: dict, owner: dict) -> list[dict]:
        if owner.get("kind") == "Pod":
            return [owner]
        if owner.get("kind") == PLAIN_GROUP:
            ns = wl["metadata"]["namespace"]
            return [p for p in self.ctx.list_items(POD, ns) if labels_of(p).get(POD_GROUP_LABEL) == wl["metadata"]["name"]
                    and not is_deleting(p) and (controller_ref(p) or {}).get("kind") not in ("StatefulSet", "Job")]
        if owner.get("kind") == "StatefulSet":
            ns = wl["metadata"]["namespace"]
            return [p for p in self.ctx.list_items(POD, ns) if labels_of(p).get(POD_GROUP_LABEL) == wl["metadata"]["name"]
                    and not is_deleting(p)]
        return []

    def _stop_owner(self, wl: dict, message: str) -> None:
        ctx = self.ctx
        owner = self._owner_of(wl)
        if owner is None:
            return
        if owner.get("kind") == "Job":
            new = deep_copy(owner)
            new["spec"]["suspend"] = True
            orig = ((wl.get("spec") or {}).get("podSets") or [{}])[0].get("template") or {}
            tspec = new["spec"].setdefault("template", {}).setdefault("spec", {})
            for k in ("nodeSelector", "tolerations", "schedulingGates"):
                if (orig.get("spec") or {}).get(k) is not None:
                    tspec[k] = deep_copy(orig["spec"][k])
                else:
                    tspec.pop(k, None)
            tl = new["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})
            for k in (CQ_LABEL, LQ_LABEL, PODSET_LABEL):
                tl.pop(k, None)
            ctx.update(new)
            ctx.event(owner, "Normal", "Stopped", message, JOB_COMPONENT)
        else:
            for p in self._group_pods(wl, owner):
                ctx.delete(POD, p["metadata"]["name"], p["metadata"]["namespace"])
            ctx.event(wl if owner.get("kind") == PLAIN_GROUP else owner, "Normal", "Stopped", message, JOB_COMPONENT)

    def _enforce(self) -> None:
        ctx = self.ctx
        for wl in ctx.list_items(WORKLOAD):
            if not is_admitted(wl) or is_finished(wl) or is_deleting(wl):
                continue
            adm = (wl.get("status") or {}).get("admission") or {}
            owner = self._owner_of(wl)
            if owner is None:
                continue
            psa = (adm.get("podSetAssignments") or [{}])[0]
            node_labels: dict = {}
            tolerations: list = []
            for fname in dict.fromkeys((psa.get("flavors") or {}).values()):
                fspec = (self.flavors.get(fname) or {}).get("spec") or {}
                node_labels.update({k: str(v) for k, v in (fspec.get("nodeLabels") or {}).items()})
                tolerations.extend(fspec.get("tolerations") or [])
            cqn = adm.get("clusterQueue")
            if owner.get("kind") == "Job":
                if not (owner.get("spec") or {}).get("suspend"):
                    if psa.get("topologyAssignment"):
                        self._tas_ungate(wl, owner, psa["topologyAssignment"])
                    continue
                new = deep_copy(owner)
                tmpl = new["spec"].setdefault("template", {})
                tspec = tmpl.setdefault("spec", {})
                _inject(tspec, node_labels, tolerations)
                if psa.get("topologyAssignment"):  # Kueue's TAS: pods wait for their host (``_tas_ungate``)
                    gates = tspec.setdefault("schedulingGates", [])
                    if not any(g.get("name") == tas.GATE for g in gates):
                        gates.append({"name": tas.GATE})
                tl = tmpl.setdefault("metadata", {}).setdefault("labels", {})
                tl[CQ_LABEL] = cqn
                tl[LQ_LABEL] = (wl.get("spec") or {}).get("queueName")
                tl[PODSET_LABEL] = psa.get("name", "main")
                new["spec"]["suspend"] = False
                if ctx.update(new) is not None:
                    ctx.event(owner, "Normal", "Started", f"Admitted by clusterQueue {cqn}", JOB_COMPONENT)
            else:
                for p in self._group_pods(wl, owner):
                    gates = (p.get("spec") or {}).get("schedulingGates") or []
                    if not any(g.get("name") == GATE for g in gates) or (p.get("spec") or {}).get("nodeName"):
                        continue
                    new = deep_copy(p)
                    new["spec"]["schedulingGates"] = [g for g in gates if g.get("name") != GATE]
                    if not new["spec"]["schedulingGates"]:
                        del new["spec"]["schedulingGates"]
                    _inject(new["spec"], node_labels, tolerations)
                    pl = new["metadata"].setdefault("labels", {})
                    pl[CQ_LABEL] = cqn
                    pl[LQ_LABEL] = (wl.get("spec") or {}).get("queueName")
                    ctx.update(new)

    def _tas_ungate(self, wl: dict, job: dict, assignment: dict) -> None:
        """Kueue's topology ungater: each gated pod of the Job gets the next host of the assignment that has room
        left (a ``kubernetes.io/hostname`` node selector), the ``kueue.x-k8s.io/tas`` label, and loses the gate."""
        ctx = self.ctx
        pods = [p for p in ctx.list_items(POD, job["metadata"]["namespace"])
                if (controller_ref(p) or {}).get("uid") == uid_of(job) and not is_deleting(p)]
        gated = [p for p in pods if any(g.get("name") == tas.GATE for g in (p.get("spec") or {}).get("schedulingGates") or [])]
        if not gated:
            return
        room = {values[-1]: count for values, count in tas.decode(assignment)}
        for p in pods:
            host = ((p.get("spec") or {}).get("nodeSelector") or {}).get(tas.HOSTNAME)
            if p not in gated and host in room and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                room[host] -= 1
        for p in sorted(gated, key=lambda x: x["metadata"]["name"]):
            host = next((h for h in sorted(room) if room[h] > 0), None)
            if host is None:
                return
            room[host] -= 1
            new = deep_copy(p)
            new["spec"]["schedulingGates"] = [g for g in new["spec"]["schedulingGates"] if g.get("name") != tas.GATE]
            if not new["spec"]["schedulingGates"]:
                del new["spec"]["schedulingGates"]
            new["spec"].setdefault("nodeSelector", {})[tas.HOSTNAME] = host
            ctx.update(new)

    # 4b. finalizers ----------------------------------------------------------------------------------
    def _finalizers(self) -> None:
        """Kueue's ``kueue.x-k8s.io/resource-in-use`` finalizer: added to every ClusterQueue it sees; on a deleted
        one, removed once no Workload holds a reservation in it (pending ones do not count), so the ClusterQueue
        stays Terminating while admitted work runs in it."""
        ctx = self.ctx
        deleting = [n for n, cq in self.cqs.items() if is_deleting(cq)]
        for name, cq in list(self.cqs.items()):
            if not is_deleting(cq) and IN_USE_FINALIZER not in (cq["metadata"].get("finalizers") or []):
                new = deep_copy(cq)
                new["metadata"]["finalizers"] = [*(cq["metadata"].get("finalizers") or []), IN_USE_FINALIZER]
                res = ctx.update(new)
                if res is not None:
                    self.cqs[name] = res  # the status step writes over this version
        if not deleting:
            return
        in_use = {((wl.get("status") or {}).get("admission") or {}).get("clusterQueue")
                  for wl in ctx.list_items(WORKLOAD) if is_reserved(wl) and not is_finished(wl)}
        for name in deleting:
            cq = self.cqs[name]
            held = cq["metadata"].get("finalizers") or []
            if name in in_use or IN_USE_FINALIZER not in held:
                continue
            new = deep_copy(cq)
            new["metadata"]["finalizers"] = [f for f in held if f != IN_USE_FINALIZER]
            ctx.update(new)  # the last finalizer gone: the store removes the ClusterQueue

    # 5. status ---------------------------------------------------------------------------------------
    def _status(self) -> None:
        ctx = self.ctx
        now = ctx.ts()
        wls = ctx.list_items(WORKLOAD)
        quota = self._quota()
        flavor_sig = tuple(sorted(self.flavors))
        admitted_use: dict[str, dict] = defaultdict(lambda: defaultdict(Decimal))
        counts = defaultdict(lambda: {"pending": 0, "reserving": 0, "admitted": 0})
        lq_counts = defaultdict(lambda: {"pending": 0, "reserving": 0, "admitted": 0})
        lq_use: dict = defaultdict(lambda: defaultdict(Decimal))
        lq_adm_use: dict = defaultdict(lambda: defaultdict(Decimal))
        for wl in wls:
            if is_finished(wl):
                continue
            lqk = (wl["metadata"]["namespace"], (wl.get("spec") or {}).get("queueName"))
            lq = self.lqs.get(lqk)
            if is_reserved(wl):
                cqn = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue")
                use = usage_of(wl)
                quota.add(cqn, use)
                counts[cqn]["reserving"] += 1
                lq_counts[lqk]["reserving"] += 1
                for fr, v in use.items():
                    lq_use[lqk][fr] += v
                if is_admitted(wl):
                    counts[cqn]["admitted"] += 1
                    lq_counts[lqk]["admitted"] += 1
                    for fr, v in use.items():
                        admitted_use[cqn][fr] += v
                        lq_adm_use[lqk][fr] += v
            elif is_active(wl) and lq is not None:
                counts[(lq.get("spec") or {}).get("clusterQueue")]["pending"] += 1
                lq_counts[lqk]["pending"] += 1
        s_all, s_cqs, s_lqs, s_lq_cqs = self._cur_s
        if s_all:
            cq_names, lq_keys = sorted(self.cqs), sorted(self.lqs)
            self._lqs_of = defaultdict(set)
            for k, lq in self.lqs.items():
                self._lqs_of[(lq.get("spec") or {}).get("clusterQueue")].add(k)
        else:
            cq_names = set(s_cqs)
            lq_keys = set(s_lqs)
            for lqk in s_lqs:
                cqn = ((self.lqs.get(lqk) or {}).get("spec") or {}).get("clusterQueue")
                if cqn:
                    cq_names.add(cqn)
            for cqn in s_lq_cqs:
                lq_keys.update(self._lqs_of.get(cqn, ()))
            cq_names = sorted(n for n in cq_names if n in self.cqs)
            lq_keys = sorted(k for k in lq_keys if k in self.lqs)
        for cqn in cq_names:
            cq = self.cqs[cqn]
            key = (cq["metadata"].get("resourceVersion"), flavor_sig, tuple(counts[cqn].values()),
                   _ukey(quota.usage.get(cqn)), _ukey(admitted_use.get(cqn)))
            if self._cq_keys.get(cqn) == key:
                continue  # same inputs as the status last written
            status = deep_copy(cq.get("status") or {})
            res_list, use_list = [], []
            for g in (cq.get("spec") or {}).get("resourceGroups") or []:
                for f in g.get("flavors") or []:
                    fname = f.get("name")
                    rl, ul = [], []
                    for r in f.get("resources") or []:
                        fr = (fname, r.get("name"))
                        u = quota.u(cqn, fr)
                        au = admitted_use[cqn][fr]
                        rl.append({"name": r.get("name"), "total": R.fmt(r.get("name"), u),
                                   "borrowed": R.fmt(r.get("name"), max(Decimal(0), u - quota.n(cqn, fr)))})
                        ul.append({"name": r.get("name"), "total": R.fmt(r.get("name"), au),
                                   "borrowed": R.fmt(r.get("name"), max(Decimal(0), au - quota.n(cqn, fr)))})
                    res_list.append({"name": fname, "resources": rl})
                    use_list.append({"name": fname, "resources": ul})
            status["flavorsReservation"] = res_list
            status["flavorsUsage"] = use_list
            status["pendingWorkloads"] = counts[cqn]["pending"]
            status["reservingWorkloads"] = counts[cqn]["reserving"]
            status["admittedWorkloads"] = counts[cqn]["admitted"]
            conds = status.setdefault("conditions", [])
            problem = self._cq_problem(cq)
            gen = cq["metadata"].get("generation", 1)
            if problem == "FlavorNotFound":
                missing = sorted({f.get("name") for g in (cq.get("spec") or {}).get("resourceGroups") or []
                                  for f in g.get("flavors") or [] if f.get("name") not in self.flavors})
                set_condition(conds, "Active", "False", "FlavorNotFound",
                              f"Can't admit new workloads: references missing ResourceFlavor(s): {', '.join(missing)}.",
                              now, observedGeneration=gen)
            elif problem == "Terminating":
                set_condition(conds, "Active", "False", "Terminating",
                              "Can't admit new workloads; clusterQueue is terminating", now, observedGeneration=gen)
            elif problem == "Stopped":
                set_condition(conds, "Active", "False", "Stopped", "Can't admit new workloads: is stopped.", now,
                              observedGeneration=gen)
            else:
                set_condition(conds, "Active", "True", "Ready", "Can admit new workloads", now, observedGeneration=gen)
            res = ctx.write_status(cq, status)
            if res is not None:
                self._cq_keys[cqn] = (res["metadata"].get("resourceVersion"),) + key[1:]
        for lqk in lq_keys:
            lq = self.lqs[lqk]
            cqn = (lq.get("spec") or {}).get("clusterQueue")
            cq = self.cqs.get(cqn)
            cqm = (cq or {}).get("metadata") or {}
            key = (lq["metadata"].get("resourceVersion"), (cqm.get("uid"), cqm.get("generation")) if cq else None,
                   flavor_sig, tuple(lq_counts[lqk].values()), _ukey(lq_use.get(lqk)), _ukey(lq_adm_use.get(lqk)))
            if self._lq_keys.get(lqk) == key:
                continue
            status = deep_copy(lq.get("status") or {})
            res_list, use_list = [], []
            for g in ((cq or {}).get("spec") or {}).get("resourceGroups") or []:
                for f in g.get("flavors") or []:
                    fname = f.get("name")
                    res_list.append({"name": fname, "resources": [
                        {"name": r.get("name"), "total": R.fmt(r.get("name"), lq_use[lqk][(fname, r.get("name"))])}
                        for r in f.get("resources") or []]})
                    use_list.append({"name": fname, "resources": [
                        {"name": r.get("name"), "total": R.fmt(r.get("name"), lq_adm_use[lqk][(fname, r.get("name"))])}
                        for r in f.get("resources") or []]})
            status["flavorsReservation"] = res_list
            status["flavorsUsage"] = use_list
            status["pendingWorkloads"] = lq_counts[lqk]["pending"]
            status["reservingWorkloads"] = lq_counts[lqk]["reserving"]
            status["admittedWorkloads"] = lq_counts[lqk]["admitted"]
            conds = status.setdefault("conditions", [])
            gen = lq["metadata"].get("generation", 1)
            if (lq.get("spec") or {}).get("stopPolicy") in ("Hold", "HoldAndDrain"):
                set_condition(conds, "Active", "False", "Stopped", "LocalQueue is stopped", now, observedGeneration=gen)
            elif cq is None:
                set_condition(conds, "Active", "False", "ClusterQueueDoesNotExist",
                              "Can't submit new workloads to clusterQueue", now, observedGeneration=gen)
            elif self._cq_problem(cq):
                set_condition(conds, "Active", "False", "ClusterQueueIsInactive",
                              "Can't submit new workloads to clusterQueue", now, observedGeneration=gen)
            else:
                set_condition(conds, "Active", "True", "Ready", "Can submit new workloads to localQueue", now,
                              observedGeneration=gen)
            res = ctx.write_status(lq, status)
            if res is not None:
                self._lq_keys[lqk] = (res["metadata"].get("resourceVersion"),) + key[1:]


def _ukey(usage: dict | None) -> tuple:
    return tuple(sorted((fr, v) for fr, v in (usage or {}).items() if v))


def _group(quota: Quota, cqn: str | None) -> tuple:
    """The quota group of a ClusterQueue: its cohort tree's root, or the queue itself without a cohort."""
    root = quota.root.get(cqn)
    return ("co", root) if root else ("cq", cqn)


def _inject(pod_spec: dict, node_labels: dict, tolerations: list) -> None:
    if node_labels:
        sel = pod_spec.setdefault("nodeSelector", {})
        sel.update(node_labels)
    if tolerations:
        tl = pod_spec.setdefault("tolerations", [])
        for t in tolerations:
            if t not in tl:
                tl.append(deep_copy(t))

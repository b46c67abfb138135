"""Shared plumbing of the simulated controllers: store access, conditions, owners, names, durations.

Every controller gets one :class:`Ctx`. It wraps the :class:`sandbox.store.Store` so that

* reads return plain dicts (``list_items``/``get``), ``None`` when the object is gone;
* writes never raise: an ``ApiError`` (the object vanished, a conflicting client write, a validation error) is
  recorded in ``ctx.errors`` and the write returns ``None`` — the next tick tries again;
* ``ctx.writes`` counts successful writes, so ``Controllers.settle()`` knows when the cluster is stable;
* status is written through the ``status`` subresource when the kind has one, and only when it changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import re
import threading
from collections import defaultdict, deque
from datetime import datetime

from sandbox.clock import format_time, parse_time

# ---------------------------------------------------------------------------------------------------- constants
SANDBOX = "sandbox.gpuportal.dev/"
DURATION_ANNOTATION = SANDBOX + "duration"
OUTCOME_ANNOTATION = SANDBOX + "outcome"
FIELD_MANAGER = "sandbox-controllers"

POD = ("v1", "Pod")
NODE = ("v1", "Node")
NAMESPACE = ("v1", "Namespace")
EVENT = ("v1", "Event")
PVC = ("v1", "PersistentVolumeClaim")
SERVICE = ("v1", "Service")
PRIORITY_CLASS = ("scheduling.k8s.io/v1", "PriorityClass")
JOB = ("batch/v1", "Job")
DEPLOYMENT = ("apps/v1", "Deployment")
STATEFULSET = ("apps/v1", "StatefulSet")
KUEUE = "kueue.x-k8s.io/v1beta2"
WORKLOAD = (KUEUE, "Workload")
CLUSTER_QUEUE = (KUEUE, "ClusterQueue")
LOCAL_QUEUE = (KUEUE, "LocalQueue")
RESOURCE_FLAVOR = (KUEUE, "ResourceFlavor")
COHORT = (KUEUE, "Cohort")
WPC = (KUEUE, "WorkloadPriorityClass")
ADMISSION_CHECK = (KUEUE, "AdmissionCheck")
MK_CONFIG = (KUEUE, "MultiKueueConfig")
MK_CLUSTER = (KUEUE, "MultiKueueCluster")
SECRET = ("v1", "Secret")
MK_CONTROLLER = "kueue.x-k8s.io/multikueue"  # an AdmissionCheck's controllerName, and a Job's spec.managedBy
VC_JOB = ("batch.volcano.sh/v1alpha1", "Job")
VC_QUEUE = ("scheduling.volcano.sh/v1beta1", "Queue")
VC_PODGROUP = ("scheduling.volcano.sh/v1beta1", "PodGroup")
VC_COMMAND = ("bus.volcano.sh/v1alpha1", "Command")

_RAND_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand


# ---------------------------------------------------------------------------------------------------- helpers
def meta(obj: dict) -> dict:
    return obj.setdefault("metadata", {})


def labels_of(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("labels") or {}


def annotations_of(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("annotations") or {}


def key_of(obj: dict) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return (m.get("namespace") or "", m.get("name") or "")


def uid_of(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("uid") or ""


def is_deleting(obj: dict) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def owner_ref(obj: dict, *, controller: bool = True, block: bool = True) -> dict:
    ref = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"].get("uid", ""),
    }
    if controller:
        ref["controller"] = True
    if block:
        ref["blockOwnerDeletion"] = True
    return ref


def controller_ref(obj: dict) -> dict | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def owned_by(obj: dict, owner: dict) -> bool:
    uid = uid_of(owner)
    return any(r.get("uid") == uid for r in (obj.get("metadata") or {}).get("ownerReferences") or [])


def short_hash(text: str, n: int = 5) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:n]


def parse_duration(value) -> float | None:
    """``"300"``, ``"90s"``, ``"30m"``, ``"8h"``, ``"1h30m"``, ``"1.5h"``, ``"2d"`` -> seconds; None if unparsable."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    s = str(value).strip().lower()
    if not s:
        return None
    try:
        return float(s)
    except ValueError:
        pass
    total = 0.0
    pos = 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", s):
        if m.start() != pos:
            return None
        pos = m.end()
        n = float(m.group(1))
        total += n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    return total if pos == len(s) and pos > 0 else None


def find_condition(conds: list | None, ctype: str) -> dict | None:
    for c in conds or []:
        if c.get("type") == ctype:
            return c
    return None


def condition_true(obj_or_conds, ctype: str) -> bool:
    conds = obj_or_conds
    if isinstance(obj_or_conds, dict):
        conds = (obj_or_conds.get("status") or {}).get("conditions")
    c = find_condition(conds, ctype)
    return bool(c and c.get("status") == "True")


def set_condition(conds: list, ctype: str, status: str, reason: str, message: str, now: str, **extra) -> bool:
    """Upsert a condition; keeps ``lastTransitionTime`` when the status does not change. Returns True if changed."""
    c = find_condition(conds, ctype)
    if c is None:
        c = {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}
        c.update(extra)
        conds.append(c)
        return True
    changed = False
    if c.get("status") != status:
        c["status"] = status
        c["lastTransitionTime"] = now
        changed = True
    stamps = {k: v for k, v in extra.items() if k in _STAMPS}
    for k, v in (("reason", reason), ("message", message), *((k, v) for k, v in extra.items() if k not in _STAMPS)):
        if c.get(k) != v:
            c[k] = v
            changed = True
    if changed:  # probe/update stamps only move when the condition itself changed (no write on every pass)
        c.update(stamps)
    return changed


_STAMPS = ("lastProbeTime", "lastUpdateTime", "lastHeartbeatTime")


def remove_condition(conds: list, ctype: str) -> bool:
    before = len(conds)
    conds[:] = [c for c in conds if c.get("type") != ctype]
    return len(conds) != before


def effective_annotation(obj: dict, template: dict | None, key: str):
    """An annotation read from the pod template first, then from the top-level object."""
    for src in (template or {}, obj):
        v = ((src.get("metadata") or {}).get("annotations") or {}).get(key)
        if v is not None:
            return v
    return None


def sandbox_annotations(obj: dict, template: dict | None = None) -> dict:
    """The sandbox.* annotations a pod created for ``obj`` inherits (template values win)."""
    out = {}
    for src in (obj, template or {}):
        for k, v in ((src.get("metadata") or {}).get("annotations") or {}).items():
            if k.startswith(SANDBOX):
                out[k] = v
    return out


def creation_key(obj: dict) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return (m.get("creationTimestamp") or "", m.get("name") or "")


# ---------------------------------------------------------------------------------------------------- informer
class Informer:
    """A read cache of the store fed by its change subscription (like client-go informers).

    ``list`` returns the cached objects themselves — callers must treat them as read-only and deep-copy before
    changing anything (every controller does). A kind is loaded with one ``store.list`` on first use; afterwards only
    change notifications update it. ``check()`` compares the highest resourceVersion seen with the store's; when they
    differ it first lets notifications still in flight arrive (``Store.drain_notifications``) and reloads everything
    only if that does not close the gap (``Store.load`` does not notify).

    Bookkeeping for incremental controllers: ``version[gvk]`` counts the changes seen per kind (loaded or not),
    ``epoch`` counts full reloads, and ``listen(fn)`` registers ``fn(gvk, etype, new, old)`` called after each change
    is applied (``old`` is the previously cached object, None when unknown). Sorted lists are cached per kind and per
    (kind, namespace) until that kind/namespace changes."""

    def __init__(self, store):
        self.store = store
        self.lock = threading.Lock()
        self.objs: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}
        self.seen_rv = 0
        self.reloads = 0
        self.epoch = 0
        self.version: dict[tuple[str, str], int] = defaultdict(int)
        self.listeners: list = []
        self._sorted: dict[tuple[str, str], list] = {}
        self._sorted_ns: dict[tuple, list] = {}
        store.subscribe(self.on_event)

    def listen(self, fn) -> None:
        self.listeners.append(fn)

    def on_event(self, etype: str, obj: dict) -> None:
        key = (obj.get("apiVersion"), obj.get("kind"))
        m = obj.get("metadata") or {}
        old = None
        try:
            rv = int(m.get("resourceVersion") or 0)
        except ValueError:
            rv = 0
        with self.lock:
            bucket = self.objs.get(key)
            k = (m.get("namespace") or "", m.get("name") or "")
            if bucket is not None:
                old = bucket.get(k)
                if etype != "DELETED" and old is not None and _rv(old) > rv:
                    self.seen_rv = max(self.seen_rv, rv)
                    return  # a late notification for an older version
                if etype == "DELETED":
                    bucket.pop(k, None)
                else:
                    bucket[k] = obj
                self._sorted.pop(key, None)
                self._sorted_ns.pop((key, k[0]), None)
            self.version[key] += 1
        for fn in self.listeners:
            fn(key, etype, obj, old)
        with self.lock:  # only now: check() trusts that everything up to seen_rv has reached the listeners
            self.seen_rv = max(self.seen_rv, rv)

    def _load(self, gvk: tuple[str, str]) -> dict:
        res = self.store.list(gvk[0], gvk[1])
        bucket = {((o.get("metadata") or {}).get("namespace") or "", o["metadata"]["name"]): o for o in res["items"]}
        with self.lock:
            self.objs[gvk] = bucket
            self._sorted.pop(gvk, None)
            for k in [k for k in self._sorted_ns if k[0] == gvk]:
                del self._sorted_ns[k]
            self.version[gvk] += 1
            with contextlib.suppress(ValueError):
                self.seen_rv = max(self.seen_rv, int(res["metadata"].get("resourceVersion") or 0))
        return bucket

    def _stale(self) -> tuple[bool, int]:
        try:
            rv = int(self.store.resource_version())
        except (TypeError, ValueError):
            return False, 0
        with self.lock:
            return rv != self.seen_rv, rv

    def check(self) -> None:
        stale, rv = self._stale()
        if stale:  # most often a writer that has committed but not notified yet: let it finish
            drain = getattr(self.store, "drain_notifications", None)
            if drain is not None:
                drain()
                stale, rv = self._stale()
        if stale:
            with self.lock:
                kinds = list(self.objs)
            self.reloads += 1
            self.epoch += 1
            for gvk in kinds:
                self._load(gvk)
            with self.lock:
                self.seen_rv = max(self.seen_rv, rv)

    def get(self, gvk: tuple[str, str], name: str, namespace: str | None = None) -> dict | None:
        """The cached object (READ-ONLY) or None."""
        bucket = self.objs.get(gvk)
        if bucket is None:
            bucket = self._load(gvk)
        return bucket.get((namespace or "", name))

    def list(self, gvk: tuple[str, str], namespace: str | None = None, label_selector: str | None = None) -> list[dict]:
        with self.lock:
            bucket = self.objs.get(gvk)
        if bucket is None:
            bucket = self._load(gvk)
        with self.lock:
            if namespace:
                out = self._sorted_ns.get((gvk, namespace))
                if out is None:
                    out = self._sorted.get(gvk)
                    if out is not None:
                        out = [o for o in out if (o.get("metadata") or {}).get("namespace") == namespace]
                    else:
                        out = [o for (ns, _), o in sorted(bucket.items()) if ns == namespace]
                    self._sorted_ns[(gvk, namespace)] = out
            else:
                out = self._sorted.get(gvk)
                if out is None:
                    out = self._sorted[gvk] = [o for _, o in sorted(bucket.items())]
            out = list(out)
        if label_selector:
            from sandbox.selectors import parse_label_selector

            sel = parse_label_selector(label_selector)
            out = [o for o in out if sel.matches((o.get("metadata") or {}).get("labels") or {})]
        return out


def _rv(obj: dict) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


# ---------------------------------------------------------------------------------------------------- context
class Ctx:
    """What every controller gets: the store, the clock, the event recorder, pod logs and a seeded RNG."""

    def __init__(self, store, clock, profile: dict | None, *, seed: int = 0):
        from sandbox.controllers.events import EventRecorder

        self.store = store
        self.clock = clock
        self.profile = profile or {}
        self.rng = random.Random(seed)
        self.writes = 0
        self.error_count = 0  # errors recorded so far (``errors`` keeps only the last 500)
        self.errors: deque = deque(maxlen=500)
        self.logs: dict[tuple[str, str], list[str]] = {}
        self.events = EventRecorder(self)
        self._status_sub: dict[tuple[str, str], bool] = {}
        self.informer = Informer(store)

    # time ------------------------------------------------------------------------------------------------
    def now(self) -> datetime:
        return self.clock.now()

    def ts(self) -> str:
        return format_time(self.clock.now())

    def since(self, stamp: str | None) -> float | None:
        """Simulated seconds elapsed since a timestamp string (None if missing)."""
        t = parse_time(stamp)
        if t is None:
            return None
        return (self.clock.now() - t).total_seconds()

    def rand5(self) -> str:
        return "".join(self.rng.choice(_RAND_ALPHABET) for _ in range(5))

    # reads -----------------------------------------------------------------------------------------------
    def list_items(self, gvk: tuple[str, str], namespace: str | None = None, label_selector: str | None = None) -> list[dict]:
        """Objects of a kind from the informer cache, sorted by (namespace, name). READ-ONLY: deep-copy to change."""
        try:
            return self.informer.list(gvk, namespace, label_selector)
        except Exception as exc:  # unknown kind (e.g. CRDs not loaded) or store error
            self._error("list", gvk, "", exc)
            return []

    def get(self, gvk: tuple[str, str], name: str, namespace: str | None = None) -> dict | None:
        try:
            return self.store.get(gvk[0], gvk[1], name, namespace)
        except Exception:
            return None

    # writes ----------------------------------------------------------------------------------------------
    def _error(self, op: str, gvk, name: str, exc: Exception) -> None:
        self.error_count += 1
        self.errors.append(f"{self.ts()} {op} {gvk[1] if gvk else '?'} {name}: {exc}")

    def _done(self, res):
        self.writes += 1
        return res

    def create(self, obj: dict) -> dict | None:
        obj.setdefault("metadata", {})
        try:
            return self._done(self.store.create(obj, field_manager=FIELD_MANAGER))
        except Exception as exc:
            self._error("create", (obj.get("apiVersion"), obj.get("kind")), obj["metadata"].get("name", ""), exc)
            return None

    def update(self, obj: dict) -> dict | None:
        try:
            return self._done(self.store.update(obj, field_manager=FIELD_MANAGER))
        except Exception as exc:
            self._error("update", (obj.get("apiVersion"), obj.get("kind")), key_of(obj)[1], exc)
            return None

    def has_status_subresource(self, api_version: str, kind: str) -> bool:
        k = (api_version, kind)
        if k not in self._status_sub:
            try:
                rt = self.store.registry.by_kind(api_version, kind)
                self._status_sub[k] = "status" in (rt.subresources or ())
            except Exception:
                self._status_sub[k] = False
        return self._status_sub[k]

    def write_status(self, obj: dict, status: dict) -> dict | None:
        """Replace ``obj.status`` with ``status`` if it differs (through the status subresource when there is one)."""
        if obj.get("status") == status:
            return obj
        new = dict(obj)  # the store copies what it is given: a shallow copy is enough
        new["status"] = status
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        try:
            if self.has_status_subresource(api_version, kind):
                res = self.store.update(new, subresource="status", field_manager=FIELD_MANAGER)
            else:
                res = self.store.update(new, field_manager=FIELD_MANAGER)
            return self._done(res)
        except Exception as exc:
            self._error("update-status", (api_version, kind), key_of(obj)[1], exc)
            return None

    def patch(self, gvk: tuple[str, str], name: str, namespace: str | None, patch: dict,
              subresource: str | None = None) -> dict | None:
        try:
            return self._done(self.store.patch(gvk[0], gvk[1], name, namespace, patch, "merge",
                                               subresource=subresource, field_manager=FIELD_MANAGER))
        except Exception as exc:
            self._error("patch", gvk, name, exc)
            return None

    def delete(self, gvk: tuple[str, str], name: str, namespace: str | None = None, *,
               propagation_policy: str | None = "Background") -> bool:
        try:
            self.store.delete(gvk[0], gvk[1], name, namespace, propagation_policy=propagation_policy)
            self.writes += 1
            return True
        except Exception as exc:
            self._error("delete", gvk, name, exc)
            return False

    # events & logs ---------------------------------------------------------------------------------------
    def event(self, obj: dict, etype: str, reason: str, message: str, component: str, *,
              host: str | None = None, min_interval: float = 0.0) -> None:
        self.events.record(obj, etype, reason, message, component, host=host, min_interval=min_interval)

    def log(self, namespace: str, pod: str, line: str, at: datetime | None = None) -> None:
        """Append a simulated container log line (prefixed with the simulated time it was written)."""
        lines = self.logs.setdefault((namespace, pod), [])
        lines.append(f"{(at or self.clock.now()).strftime('%Y-%m-%d %H:%M:%S')} {line}")
        if len(lines) > 5000:
            del lines[: len(lines) - 5000]

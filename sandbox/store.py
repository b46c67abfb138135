"""In-memory object store with Kubernetes API semantics (see CONTRACT.md).

Stored objects are never mutated in place: every write builds a new dict, so the watch history, the
watchers' queues and the store itself can share references; callers always get copies.
"""

from __future__ import annotations

import base64
import contextlib
import json
import queue
import random
import threading
import time
import uuid
from collections import deque
from datetime import datetime, UTC
from collections.abc import Callable

from . import validation as V
from . import webhooks as W
from .patch import (
    PatchError,
    deep_copy,
    json_patch,
    merge_patch,
    record_update,
    server_side_apply,
    ssa_conflict_causes,
    strategic_merge_patch,
)
from .registry import Registry, ResourceType, default_registry
from .selectors import parse_field_selector, parse_label_selector

copy_obj = deep_copy


# ================================================================================================ errors
_HTTP_REASON = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}



_uid_lock = threading.Lock()
_uid_last = [0, 0]  # [milliseconds, counter] of the last uid handed out


def new_uid() -> str:
    """A time-ordered UUID (version 7: 48 bits of Unix milliseconds, a 12-bit counter, 62 random bits).

    Still an opaque UUID to every client; what it adds is that sorting by uid is sorting by creation. Volcano and
    Kueue order work of one priority by creation timestamp and break a tie (the API keeps whole seconds) by uid, so
    objects created in the same second are taken in the order they were created here, not by chance."""
    with _uid_lock:
        ms, counter = time.time_ns() // 1_000_000, 0
        if ms <= _uid_last[0]:
            ms, counter = _uid_last[0], _uid_last[1] + 1
            if counter > 0xFFF:
                ms, counter = ms + 1, 0
        _uid_last[:] = [ms, counter]
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | random.getrandbits(62)
    return str(uuid.UUID(int=value))

class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, *, causes: list[dict] | None = None,
                 details: dict | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason or _HTTP_REASON.get(code, "")
        self.message = message
        self.causes = causes
        self.details = details
        self.retry_after = retry_after

    def status(self) -> dict:
        st = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
              "reason": self.reason, "code": self.code}
        details = dict(self.details or {})
        if self.causes:
            details["causes"] = self.causes
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        if details:
            st["details"] = details
        return st

    def __repr__(self):
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"


def _details(rt: ResourceType, name: str, **extra) -> dict:
    d = {"name": name, "group": rt.group, "kind": rt.plural}
    d.update(extra)
    return d


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.resource} "{name}" not found', details=_details(rt, name))


def conflict(rt: ResourceType, name: str, why: str = "the object has been modified; please apply your changes to the latest version and try again") -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rt.resource} "{name}": {why}', details=_details(rt, name))


def invalid(rt: ResourceType, name: str, causes: list[dict]) -> ApiError:
    return ApiError(422, "Invalid", V.summarize(rt.qualified_kind, name, causes), causes=causes,
                    details={"name": name, "group": rt.group, "kind": rt.kind})


def bad_request(message: str, causes=None) -> ApiError:
    return ApiError(400, "BadRequest", message, causes=causes)


SMP_UNSUPPORTED = ("the body of the request was in an unknown format - accepted media types include: "
                   "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")


# ================================================================================================ watch
class Watcher:
    """One watch stream. ``next(timeout)`` -> (type, object copy) or None on timeout / when closed."""

    def __init__(self, store: Store, rt: ResourceType, match: Callable[[dict], bool], namespace: str | None,
                 allow_bookmarks: bool):
        self._store = store
        self.rt = rt
        self._match = match
        self.namespace = namespace
        self.allow_bookmarks = allow_bookmarks
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self.closed = False
        self.last_rv = "0"

    # called by the store under its lock
    def _offer(self, etype: str, obj: dict, old: dict | None) -> None:
        if self.closed:
            return
        if self.namespace is not None and (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return
        now = self._match(obj)
        if etype == "MODIFIED" and old is not None:
            was = self._match(old)
            if was and not now:
                self._q.put(("DELETED", obj))
                return
            if now and not was:
                self._q.put(("ADDED", obj))
                return
        if now:
            self._q.put((etype, obj))

    def next(self, timeout: float | None = None):
        if self.closed and self._q.empty():
            return None
        try:
            item = self._q.get(timeout=timeout) if timeout is None or timeout > 0 else self._q.get_nowait()
        except queue.Empty:
            return None
        if item is None:
            return None
        etype, obj = item
        self.last_rv = (obj.get("metadata") or {}).get("resourceVersion", self.last_rv)
        return etype, copy_obj(obj)

    def bookmark(self) -> dict:
        """A BOOKMARK object carrying the store's current resourceVersion."""
        return {"kind": self.rt.kind, "apiVersion": self.rt.api_version,
                "metadata": {"resourceVersion": self._store.resource_version()}}

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._store._remove_watcher(self)
            self._q.put(None)

    def __iter__(self):
        while not self.closed:
            ev = self.next(timeout=None)
            if ev is None:
                return
            yield ev


# ================================================================================================ field selectors
def _involved(field: str) -> Callable[[dict], object]:
    return lambda o: str((o.get("involvedObject") or {}).get(field, ""))


_FIELD_GETTERS: dict[tuple[str, str], dict[str, Callable[[dict], object]]] = {
    ("", "Pod"): {
        "spec.nodeName": lambda o: (o.get("spec") or {}).get("nodeName", ""),
        "spec.restartPolicy": lambda o: (o.get("spec") or {}).get("restartPolicy", ""),
        "spec.schedulerName": lambda o: (o.get("spec") or {}).get("schedulerName", ""),
        "spec.serviceAccountName": lambda o: (o.get("spec") or {}).get("serviceAccountName", ""),
        "spec.hostNetwork": lambda o: str(bool((o.get("spec") or {}).get("hostNetwork", False))).lower(),
        "status.phase": lambda o: (o.get("status") or {}).get("phase", ""),
        "status.podIP": lambda o: (o.get("status") or {}).get("podIP", ""),
        "status.nominatedNodeName": lambda o: (o.get("status") or {}).get("nominatedNodeName", ""),
    },
    ("", "Node"): {"spec.unschedulable": lambda o: str(bool((o.get("spec") or {}).get("unschedulable", False))).lower()},
    ("", "Namespace"): {"status.phase": lambda o: (o.get("status") or {}).get("phase", "")},
    ("", "Secret"): {"type": lambda o: o.get("type", "")},
    ("batch", "Job"): {"status.successful": lambda o: str((o.get("status") or {}).get("succeeded", 0))},
    ("", "Event"): {
        **{f"involvedObject.{f}": _involved(f)
           for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
        "reason": lambda o: o.get("reason", ""),
        "reportingComponent": lambda o: o.get("reportingComponent", ""),
        "source": lambda o: (o.get("source") or {}).get("component", ""),
        "type": lambda o: o.get("type", ""),
    },
}


def _field_getter(rt: ResourceType, field: str):
    if field == "metadata.name":
        return lambda o: o["metadata"].get("name", "")
    if field == "metadata.namespace":
        return lambda o: o["metadata"].get("namespace", "")
    g = _FIELD_GETTERS.get((rt.group, rt.kind), {}).get(field)
    if g is None:
        raise bad_request(f'field label not supported: {field}')
    return g


def make_matcher(rt: ResourceType, label_selector: str | None, field_selector: str | None) -> Callable[[dict], bool]:
    try:
        lsel = parse_label_selector(label_selector) if label_selector else None
    except ValueError as exc:
        raise bad_request(f"unable to parse requirement: {exc}") from None
    try:
        fsel = parse_field_selector(field_selector) if field_selector else []
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    fchecks = [(_field_getter(rt, f), op, v) for f, op, v in fsel]
    if lsel is None and not fchecks:
        return lambda o: True

    def match(o: dict) -> bool:
        if lsel is not None and not lsel.matches((o.get("metadata") or {}).get("labels")):
            return False
        for getter, op, v in fchecks:
            got = getter(o)
            if (str(got) == v) != (op == "="):
                return False
        return True

    return match


# ================================================================================================ store
def _rand_suffix(n: int = 5) -> str:
    return "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=n))


_SPEC_EXCLUDE = ("metadata", "status", "apiVersion", "kind")


def _spec_part(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in _SPEC_EXCLUDE}


_STATUS_KEPT_ON_CREATE = {("", "Node")}
DEFAULT_MANAGER = "unknown"


class Store:
    def __init__(self, registry: Registry | None = None, *, history: int = 20000, clock=None):
        self.registry = registry or default_registry()
        self.lock = threading.RLock()
        self.clock = clock  # anything with .now() -> aware datetime; None = wall clock
        self._data: dict[ResourceType, dict[str, dict[str, dict]]] = {}
        self._rv = 0
        self._history: deque = deque(maxlen=max(1, history))
        self._evicted_rv = 0
        self._watchers: dict[ResourceType, list[Watcher]] = {}
        self._subs: list[Callable[[str, dict], None]] = []
        self._outbox: deque = deque()
        self._flush_lock = threading.Lock()
        self._by_uid: dict[str, tuple[ResourceType, str, str]] = {}
        self._dependents: dict[str, set[tuple[ResourceType, str, str]]] = {}
        self._cluster_ips: set[str] = set()
        self._depth = 0

    # ------------------------------------------------------------------ basics
    def _now(self) -> str:
        now = self.clock.now() if self.clock is not None else datetime.now(UTC)
        return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def resource_version(self) -> str:
        return str(self._rv)

    def _rt(self, api_version: str, kind: str) -> ResourceType:
        try:
            return self.registry.by_kind(api_version, kind)
        except KeyError:
            raise ApiError(404, "NotFound", f'the server could not find the requested resource (no kind "{kind}" is registered for version "{api_version}")') from None

    def resolve(self, api_version: str, kind: str) -> ResourceType:
        return self._rt(api_version, kind)

    def _table(self, rt: ResourceType) -> dict[str, dict[str, dict]]:
        t = self._data.get(rt)
        if t is None:
            t = self._data[rt] = {}
        return t

    def _ns_key(self, rt: ResourceType, namespace: str | None) -> str:
        if rt.namespaced:
            if not namespace:
                raise bad_request("the namespace of the provided object does not match the namespace sent on the request" if namespace == "" else "an empty namespace may not be set when a resource name is provided")
            return namespace
        return ""

    def _lookup(self, rt: ResourceType, name: str, namespace: str | None) -> dict | None:
        ns = namespace if rt.namespaced else ""
        t = self._data.get(rt)
        if t is None:
            return None
        bucket = t.get(ns or "")
        return bucket.get(name) if bucket else None

    class _Locked:
        __slots__ = ("s",)

        def __init__(self, s):
            self.s = s

        def __enter__(self):
            self.s.lock.acquire()
            self.s._depth += 1

        def __exit__(self, *a):
            self.s._depth -= 1
            depth = self.s._depth
            self.s.lock.release()
            if depth == 0:
                self.s._flush()

    def _locked(self):
        return Store._Locked(self)

    def _flush(self):
        if not self._subs or not self._outbox:
            self._outbox.clear() if not self._subs else None
            return
        with self._flush_lock:
            self._deliver()

    def _deliver(self):  # with _flush_lock held
        while True:
            try:
                etype, obj = self._outbox.popleft()
            except IndexError:
                break
            for fn in list(self._subs):
                with contextlib.suppress(Exception):
                    fn(etype, copy_obj(obj))

    def drain_notifications(self) -> None:
        """Deliver now the change notifications still in flight (a writer that has committed and released the lock
        but not yet called the subscribers); returns once they are all delivered. Must not be called from a
        subscriber."""
        with self._flush_lock:  # waits for a writer that is delivering
            if self._subs:
                self._deliver()
            else:
                self._outbox.clear()

    def subscribe(self, fn: Callable[[str, dict], None]) -> None:
        with self.lock:
            self._subs.append(fn)

    def unsubscribe(self, fn) -> None:
        with self.lock:
            if fn in self._subs:
                self._subs.remove(fn)

    # ------------------------------------------------------------------ commit
    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _commit(self, rt: ResourceType, etype: str, obj: dict, old: dict | None) -> None:
        """Store (or remove for DELETED) ``obj`` whose resourceVersion is already set; record history; notify."""
        meta = obj["metadata"]
        ns = meta.get("namespace", "") if rt.namespaced else ""
        name = meta["name"]
        table = self._table(rt)
        if etype == "DELETED":
            bucket = table.get(ns)
            if bucket is not None:
                bucket.pop(name, None)
                if not bucket:
                    del table[ns]
            self._by_uid.pop(meta.get("uid"), None)
            self._index_owners(rt, ns, name, old, None)
            if rt.group == "" and rt.kind == "Service":
                ip = (obj.get("spec") or {}).get("clusterIP")
                self._cluster_ips.discard(ip)
        else:
            table.setdefault(ns, {})[name] = obj
            self._by_uid[meta["uid"]] = (rt, ns, name)
            self._index_owners(rt, ns, name, old, obj)
        rv = int(meta["resourceVersion"])
        if len(self._history) == self._history.maxlen:
            self._evicted_rv = self._history[0][0]
        self._history.append((rv, rt, etype, obj, old))
        for w in self._watchers.get(rt, ()):
            w._offer(etype, obj, old)
        if self._subs:
            self._outbox.append((etype, obj))

    def _index_owners(self, rt, ns, name, old, new):
        def refs(o):
            if o is None:
                return set()
            return {r.get("uid") for r in (o.get("metadata") or {}).get("ownerReferences") or [] if isinstance(r, dict) and r.get("uid")}

        before, after = refs(old), refs(new)
        if before == after:
            return
        key = (rt, ns, name)
        for uid in before - after:
            s = self._dependents.get(uid)
            if s is not None:
                s.discard(key)
                if not s:
                    del self._dependents[uid]
        for uid in after - before:
            self._dependents.setdefault(uid, set()).add(key)

    # ------------------------------------------------------------------ read
    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict:
        rt = self._rt(api_version, kind)
        obj = self._lookup(rt, name, namespace)
        if obj is None:
            raise not_found(rt, name)
        return copy_obj(obj)

    def try_get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        rt = self._rt(api_version, kind)
        obj = self._lookup(rt, name, namespace)
        return copy_obj(obj) if obj is not None else None

    def _iter(self, rt: ResourceType, namespace: str | None):
        t = self._data.get(rt)
        if not t:
            return []
        if rt.namespaced and namespace:
            b = t.get(namespace)
            return [(namespace, n, o) for n, o in b.items()] if b else []
        return [(ns, n, o) for ns, b in t.items() for n, o in b.items()]

    def list(self, api_version: str, kind: str, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None, continue_token: str | None = None) -> dict:
        rt = self._rt(api_version, kind)
        match = make_matcher(rt, label_selector, field_selector)
        start = None
        if continue_token:
            try:
                tok = json.loads(base64.urlsafe_b64decode(continue_token.encode() + b"==").decode())
                start = (tok["ns"], tok["name"])
            except Exception:
                raise bad_request("continue key is not valid: illegal base64 data") from None
        with self.lock:
            rv = self.resource_version()
            entries = self._iter(rt, namespace)
            entries.sort(key=lambda e: (e[0], e[1]))
            items = []
            remaining = 0
            last = None
            for ns, name, obj in entries:
                if start is not None and (ns, name) <= start:
                    continue
                if not match(obj):
                    continue
                if limit and limit > 0 and len(items) >= limit:
                    remaining += 1
                    continue
                items.append(obj)
                last = (ns, name)
            out_items = [copy_obj(o) for o in items]
        meta = {"resourceVersion": rv}
        if remaining and last is not None:
            meta["continue"] = base64.urlsafe_b64encode(json.dumps({"rv": rv, "ns": last[0], "name": last[1]}).encode()).decode().rstrip("=")
            meta["remainingItemCount"] = remaining
        return {"apiVersion": rt.api_version, "kind": rt.list_kind, "metadata": meta, "items": out_items}

    def count(self, api_version: str, kind: str, namespace: str | None = None) -> int:
        rt = self._rt(api_version, kind)
        return len(self._iter(rt, namespace))

    # ------------------------------------------------------------------ helpers for writes
    def _check_namespace_for_create(self, rt: ResourceType, ns: str, name: str) -> None:
        if not rt.namespaced:
            return
        nsrt = self.registry.by_kind("v1", "Namespace")
        nso = self._lookup(nsrt, ns, None)
        if nso is None:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', details={"name": ns, "group": "", "kind": "namespaces"})
        if nso["metadata"].get("deletionTimestamp") or (nso.get("status") or {}).get("phase") == "Terminating":
            raise ApiError(403, "Forbidden",
                           f'{rt.resource} "{name}" is forbidden: unable to create new content in namespace {ns} because it is being terminated',
                           details=_details(rt, name),
                           causes=[{"reason": "NamespaceTerminating", "message": f"namespace {ns} is being terminated",
                                    "field": "metadata.namespace"}])

    def _validate(self, rt: ResourceType, obj: dict, old: dict | None, field_validation: str, warnings: list | None,
                  subresource: str | None = None) -> None:
        name = obj["metadata"].get("name", "")
        errors: list[dict] = []
        meta = obj["metadata"]
        volcano_job = W.is_volcano_job(rt) and subresource is None
        if volcano_job and old is None:
            W.mutate_volcano_job(obj)  # mutating admission runs before the schema validation
        res = V.validate(rt, obj, old=old, subresource=subresource)
        if not rt.crd:
            V.builtin_defaults(rt, obj, old)
        errors.extend(res.errors)
        if old is None:
            errors[:0] = V.check_name(name, label=V.name_is_label(rt))
        errors.extend(V.check_labels(meta.get("labels")))
        errors.extend(V.check_annotations(meta.get("annotations")))
        if not rt.crd:
            errors.extend(V.builtin_checks(rt, obj, old))
        else:
            errors.extend(V.crd_checks(rt, obj, old))
        if res.unknown:
            fv = (field_validation or "Strict")
            if fv == "Strict":
                msgs = [f'unknown field "{p}"' for p in res.unknown]
                raise ApiError(400, "BadRequest",
                               f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: ' + ", ".join(msgs),
                               causes=[{"reason": "FieldValueInvalid", "message": m, "field": p} for m, p in zip(msgs, res.unknown, strict=True)])
            if fv == "Warn" and warnings is not None:
                for p in res.unknown:
                    warnings.append(f'unknown field "{p}"')
        if errors:
            seen, uniq = set(), []
            for e in errors:
                k = (e.get("field"), e.get("reason"))
                if k not in seen:
                    seen.add(k)
                    uniq.append(e)
            raise invalid(rt, name, uniq)
        if volcano_job:  # validating admission runs last
            msg = (W.volcano_job_create_errors(obj, self._volcano_queue, self._volcano_queue_has_children) if old is None
                   else W.volcano_job_update_error(old, obj))
            if msg:
                raise W.denied(W.VALIDATE_JOB_WEBHOOK, msg)
        if subresource is None and W.is_kueue_job(rt, obj):
            msg = W.kueue_job_tas_errors(obj)
            if msg:
                raise W.kueue_denied(W.KUEUE_JOB_WEBHOOK, msg)

    def _volcano_queue(self, name: str) -> dict | None:
        try:
            rt = self.registry.by_kind(*W.QUEUE_API)
        except KeyError:
            return None
        return self._lookup(rt, name, None)

    def _volcano_queue_has_children(self, name: str) -> bool:
        try:
            rt = self.registry.by_kind(*W.QUEUE_API)
        except KeyError:
            return False
        return any(((q.get("spec") or {}).get("parent") == name) for _ns, _n, q in self._iter(rt, None))

    def _alloc_cluster_ip(self) -> str:
        for _ in range(100000):
            ip = f"10.96.{random.randint(0, 255)}.{random.randint(1, 254)}"
            if ip not in self._cluster_ips:
                self._cluster_ips.add(ip)
                return ip
        raise ApiError(500, "InternalError", "no cluster IPs left")

    @staticmethod
    def _clean_meta(meta: dict) -> None:
        for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "generation", "selfLink"):
            meta.pop(k, None)

    # ------------------------------------------------------------------ create
    def create(self, obj: dict, *, dry_run: bool = False, field_validation: str = "Strict",
               field_manager: str | None = None, warnings: list[str] | None = None) -> dict:
        if not isinstance(obj, dict):
            raise bad_request("the body of the request must be a JSON object")
        rt = self._rt(obj.get("apiVersion", ""), obj.get("kind", ""))
        with self._locked():
            out = self._create(rt, copy_obj(obj), dry_run=dry_run, field_validation=field_validation,
                               field_manager=field_manager, warnings=warnings, managed=False)
        return copy_obj(out)

    def _create(self, rt, obj, *, dry_run, field_validation, field_manager, warnings, managed: bool) -> dict:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        self._clean_meta(meta)
        if not meta.get("name"):
            gn = meta.get("generateName")
            if gn:
                for _ in range(20):
                    cand = gn + _rand_suffix()
                    if self._lookup(rt, cand, meta.get("namespace")) is None:
                        break
                meta["name"] = cand
            else:
                raise invalid(rt, "", [V.err_required("metadata.name", "name or generateName is required")])
        name = meta["name"]
        if rt.namespaced:
            ns = meta.get("namespace")
            if not ns:
                raise bad_request("the server could not find the requested resource: a namespace is required for namespaced kind " + rt.kind)
            self._check_namespace_for_create(rt, ns, name)
        else:
            meta.pop("namespace", None)
        if self._lookup(rt, name, meta.get("namespace")) is not None:
            raise ApiError(409, "AlreadyExists", f'{rt.resource} "{name}" already exists', details=_details(rt, name))
        if "status" in rt.subresources and (rt.group, rt.kind) not in _STATUS_KEPT_ON_CREATE:
            obj.pop("status", None)
        meta["uid"] = new_uid()
        meta["creationTimestamp"] = self._now()
        meta["generation"] = 1
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        self._validate(rt, obj, None, field_validation, warnings)
        if rt.group == "" and rt.kind == "Service":
            spec = obj.setdefault("spec", {})
            if spec.get("type") != "ExternalName" and not spec.get("clusterIP"):
                spec["clusterIP"] = self._alloc_cluster_ip() if not dry_run else "10.96.0.1"
            if spec.get("clusterIP") and spec.get("clusterIP") != "None":
                self._cluster_ips.add(spec["clusterIP"])
                spec.setdefault("clusterIPs", [spec["clusterIP"]])
        if not managed:
            record_update(None, obj, field_manager or DEFAULT_MANAGER, V.schema_for(rt), api_version=rt.api_version,
                          now=meta["creationTimestamp"], status_subresource="status" in rt.subresources)
        if dry_run:
            return obj
        meta["resourceVersion"] = self._next_rv()
        _order_meta(obj)
        self._commit(rt, "ADDED", obj, None)
        return obj

    # ------------------------------------------------------------------ update
    def update(self, obj: dict, *, subresource: str | None = None, dry_run: bool = False,
               field_validation: str = "Strict", field_manager: str | None = None,
               warnings: list[str] | None = None) -> dict:
        if not isinstance(obj, dict):
            raise bad_request("the body of the request must be a JSON object")
        rt = self._rt(obj.get("apiVersion", ""), obj.get("kind", ""))
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            raise invalid(rt, "", [V.err_required("metadata.name", "name or generateName is required")])
        with self._locked():
            old = self._lookup(rt, name, meta.get("namespace"))
            if old is None:
                raise not_found(rt, name)
            new = copy_obj(obj)
            rv = (new.get("metadata") or {}).get("resourceVersion")
            if not rv and rt.crd:
                raise invalid(rt, name, [V.err_invalid("metadata.resourceVersion", 0, "must be specified for an update")])
            out = self._update(rt, old, new, subresource=subresource, dry_run=dry_run,
                               field_validation=field_validation, field_manager=field_manager, warnings=warnings,
                               managed=False)
        return copy_obj(out)

    def _merge_for_subresource(self, rt, old: dict, new: dict, subresource: str | None) -> dict:
        """Apply status-subresource rules: the result is a fresh object."""
        if subresource == "status":
            out = copy_obj(old)
            if "status" in new:
                out["status"] = new["status"]
            else:
                out.pop("status", None)
            # metadata changes are ignored on /status except the client's resourceVersion (precondition)
            nmeta = new.get("metadata") or {}
            if "resourceVersion" in nmeta:
                out["metadata"]["resourceVersion"] = nmeta["resourceVersion"]
            if "managedFields" in nmeta:
                out["metadata"]["managedFields"] = nmeta["managedFields"]
            return out
        if "status" in rt.subresources:
            if "status" in old:
                new["status"] = copy_obj(old["status"])
            else:
                new.pop("status", None)
        return new

    def _update(self, rt, old, new, *, subresource, dry_run, field_validation, field_manager, warnings,
                managed: bool, precondition_rv: bool = True) -> dict:
        name = old["metadata"]["name"]
        if subresource not in (None, "", "status"):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({subresource})")
        if subresource == "status" and "status" not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        new.setdefault("metadata", {})
        if not isinstance(new["metadata"], dict):
            raise bad_request("metadata must be an object")
        new = self._merge_for_subresource(rt, old, new, subresource)
        meta = new["metadata"]
        ometa = old["metadata"]
        rv = meta.get("resourceVersion")
        if precondition_rv and rv and rv != ometa["resourceVersion"]:
            raise conflict(rt, name)
        if meta.get("uid") and meta["uid"] != ometa["uid"]:
            raise conflict(rt, name, f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {ometa['uid']}")
        # immutable system metadata
        for k in ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds", "name"):
            if k in ometa:
                meta[k] = ometa[k]
            else:
                meta.pop(k, None)
        if rt.namespaced:
            meta["namespace"] = ometa.get("namespace")
        else:
            meta.pop("namespace", None)
        if "managedFields" not in meta and "managedFields" in ometa:
            meta["managedFields"] = ometa["managedFields"]
        meta["resourceVersion"] = ometa["resourceVersion"]
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        if ometa.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(ometa.get("finalizers") or [])
            if added:
                raise invalid(rt, name, [V.err_forbidden("metadata.finalizers", f"no new finalizers can be added if the object is being deleted, found new finalizers {sorted(added)!r}")])
        if rt.group == "" and rt.kind == "Service":
            ospec, nspec = old.get("spec") or {}, new.get("spec")
            if isinstance(nspec, dict) and ospec.get("clusterIP") and not nspec.get("clusterIP"):
                nspec["clusterIP"] = ospec["clusterIP"]
                nspec.setdefault("clusterIPs", ospec.get("clusterIPs") or [ospec["clusterIP"]])
        if rt.group == "" and rt.kind == "Namespace" and subresource != "status":
            new["status"] = copy_obj(old.get("status") or {})
        self._validate(rt, new, old, field_validation, warnings, subresource)
        if _spec_part(new) != _spec_part(old) and subresource != "status":
            meta["generation"] = ometa.get("generation", 1) + 1
        now = self._now()
        if not managed:
            record_update(old, new, field_manager or DEFAULT_MANAGER, V.schema_for(rt), api_version=rt.api_version,
                          now=now, subresource=subresource, status_subresource="status" in rt.subresources)
        if _same_ignoring_mf_time(new, old):
            return old
        if dry_run:
            return new
        meta["resourceVersion"] = self._next_rv()
        _order_meta(new)
        if ometa.get("deletionTimestamp") and not meta.get("finalizers"):
            self._finalize_remove(rt, new, old)
            return new
        self._commit(rt, "MODIFIED", new, old)
        return new

    # ------------------------------------------------------------------ patch
    def patch(self, api_version: str, kind: str, name: str, namespace: str | None, patch, patch_type: str, *,
              subresource: str | None = None, field_manager: str | None = None, force: bool = False,
              dry_run: bool = False, field_validation: str = "Strict", warnings: list[str] | None = None) -> dict:
        rt = self._rt(api_version, kind)
        pt = {"application/json-patch+json": "json", "application/merge-patch+json": "merge",
              "application/strategic-merge-patch+json": "strategic", "application/apply-patch+yaml": "apply",
              "application/apply-patch+cbor": "apply"}.get(patch_type, patch_type)
        if pt not in ("json", "merge", "strategic", "apply"):
            raise ApiError(415, "UnsupportedMediaType", SMP_UNSUPPORTED)
        if pt == "strategic" and rt.crd:
            raise ApiError(415, "UnsupportedMediaType", SMP_UNSUPPORTED)
        if pt == "apply" and not field_manager:
            raise bad_request("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch")
        if subresource == "scale":
            return self._patch_scale(rt, name, namespace, patch, pt, dry_run=dry_run, field_manager=field_manager)
        with self._locked():
            old = self._lookup(rt, name, namespace)
            if pt == "apply":
                out = self._apply(rt, name, namespace, old, patch, subresource=subresource, field_manager=field_manager,
                                  force=force, dry_run=dry_run, field_validation=field_validation, warnings=warnings)
                return copy_obj(out)
            if old is None:
                raise not_found(rt, name)
            try:
                if pt == "json":
                    new = json_patch(old, patch)
                elif pt == "merge":
                    if not isinstance(patch, dict):
                        raise PatchError("merge patch must be a JSON object", 400)
                    new = merge_patch(old, patch)
                else:
                    new = strategic_merge_patch(old, patch, V.schema_for(rt))
            except PatchError as exc:
                if exc.code == 400:
                    raise bad_request(exc.message) from None
                raise ApiError(422, "Invalid", exc.message, details={"name": name, "group": rt.group, "kind": rt.kind}) from None
            if not isinstance(new, dict):
                raise bad_request("patched object must be a JSON object")
            out = self._update(rt, old, new, subresource=subresource, dry_run=dry_run,
                               field_validation=field_validation, field_manager=field_manager, warnings=warnings,
                               managed=False)
        return copy_obj(out)

    def _apply(self, rt, name, namespace, old, applied, *, subresource, field_manager, force, dry_run,
               field_validation, warnings):
        if not isinstance(applied, dict):
            raise bad_request("apply patch must be a YAML or JSON object")
        if not applied.get("kind") or not applied.get("apiVersion"):
            raise bad_request(f"invalid object type: {applied.get('apiVersion', '')}, Kind={applied.get('kind', '')}")
        if applied.get("apiVersion") != rt.api_version or applied.get("kind") != rt.kind:
            raise bad_request(f"the API version in the data ({applied.get('apiVersion')}) does not match the expected API version ({rt.api_version})"
                              if applied.get("apiVersion") != rt.api_version else f"the kind in the data ({applied.get('kind')}) does not match the expected kind ({rt.kind})")
        ameta = applied.get("metadata") or {}
        if ameta.get("name") and ameta["name"] != name:
            raise bad_request(f"the name of the object ({ameta['name']}) does not match the name on the URL ({name})")
        if rt.namespaced and ameta.get("namespace") and namespace and ameta["namespace"] != namespace:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        applied = copy_obj(applied)
        applied.setdefault("metadata", {})
        applied["metadata"]["name"] = name
        if rt.namespaced:
            applied["metadata"]["namespace"] = namespace
        node = V.schema_for(rt)
        now = self._now()
        status_sub = "status" in rt.subresources
        if old is None:
            if subresource == "status":
                raise not_found(rt, name)
            base = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": {"name": name}}
            if rt.namespaced:
                base["metadata"]["namespace"] = namespace
            new, conflicts = server_side_apply(base, applied, field_manager, node, force=force, api_version=rt.api_version,
                                               now=now, subresource=subresource, status_subresource=status_sub)
            for k in ("generateName",):
                new["metadata"].pop(k, None)
            return self._create(rt, new, dry_run=dry_run, field_validation=field_validation,
                                field_manager=field_manager, warnings=warnings, managed=True)
        rv = ameta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt, name)
        live = copy_obj(old)
        new, conflicts = server_side_apply(live, applied, field_manager, node, force=force, api_version=rt.api_version,
                                           now=now, subresource=subresource, status_subresource=status_sub)
        if conflicts:
            msg, causes = ssa_conflict_causes(conflicts, lambda key: rt.api_version)
            raise ApiError(409, "Conflict", msg, causes=causes, details=_details(rt, name))
        if subresource == "status":
            return self._update_status_apply(rt, old, new, dry_run=dry_run, field_validation=field_validation,
                                             warnings=warnings)
        return self._update(rt, old, new, subresource=None, dry_run=dry_run, field_validation=field_validation,
                            field_manager=field_manager, warnings=warnings, managed=True, precondition_rv=False)

    def _update_status_apply(self, rt, old, new, *, dry_run, field_validation, warnings):
        merged = copy_obj(old)
        if "status" in new:
            merged["status"] = new["status"]
        else:
            merged.pop("status", None)
        merged["metadata"]["managedFields"] = new["metadata"].get("managedFields", [])
        if not merged["metadata"]["managedFields"]:
            merged["metadata"].pop("managedFields")
        return self._update(rt, old, merged, subresource="status", dry_run=dry_run, field_validation=field_validation,
                            field_manager=None, warnings=warnings, managed=True, precondition_rv=False)

    # ------------------------------------------------------------------ scale subresource
    def get_scale(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict:
        rt = self._rt(api_version, kind)
        if "scale" not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        obj = self._lookup(rt, name, namespace)
        if obj is None:
            raise not_found(rt, name)
        return self._to_scale(rt, obj)

    def _scale_paths(self, rt):
        if rt.scale:
            return (rt.scale.get("specReplicasPath", ".spec.replicas"), rt.scale.get("statusReplicasPath", ".status.replicas"),
                    rt.scale.get("labelSelectorPath"))
        return ".spec.replicas", ".status.replicas", None

    @staticmethod
    def _dig(obj, path):
        cur = obj
        for p in path.strip(".").split("."):
            if not isinstance(cur, dict):
                return None
            cur = cur.get(p)
        return cur

    def _to_scale(self, rt, obj) -> dict:
        sp, stp, selp = self._scale_paths(rt)
        from .selectors import selector_to_string

        sel = (obj.get("status") or {}).get("selector") if rt.crd is False else (self._dig(obj, selp) if selp else None)
        if not sel and not rt.crd:
            sel = selector_to_string((obj.get("spec") or {}).get("selector"))
        m = obj["metadata"]
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": m["name"], "namespace": m.get("namespace"), "uid": m["uid"],
                             "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]},
                "spec": {"replicas": self._dig(obj, sp) or 0},
                "status": {"replicas": self._dig(obj, stp) or 0, **({"selector": sel} if sel else {})}}

    def update_scale(self, api_version: str, kind: str, name: str, namespace: str | None, scale: dict, *,
                     dry_run: bool = False, field_manager: str | None = None) -> dict:
        rt = self._rt(api_version, kind)
        with self._locked():
            obj = self._lookup(rt, name, namespace)
            if obj is None:
                raise not_found(rt, name)
            rv = (scale.get("metadata") or {}).get("resourceVersion")
            if rv and rv != obj["metadata"]["resourceVersion"]:
                raise conflict(rt, name)
            replicas = (scale.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0',
                               causes=[V.err_invalid("spec.replicas", replicas, "must be greater than or equal to 0")])
            new = copy_obj(obj)
            sp = self._scale_paths(rt)[0].strip(".").split(".")
            cur = new
            for p in sp[:-1]:
                cur = cur.setdefault(p, {})
            cur[sp[-1]] = replicas
            out = self._update(rt, obj, new, subresource=None, dry_run=dry_run, field_validation="Ignore",
                               field_manager=field_manager, warnings=None, managed=False)
            return self._to_scale(rt, out)

    def _patch_scale(self, rt, name, namespace, patch, pt, *, dry_run, field_manager):
        if "scale" not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        with self._locked():
            cur = self.get_scale(rt.api_version, rt.kind, name, namespace)
            new = json_patch(cur, patch) if pt == "json" else merge_patch(cur, patch)
            return self.update_scale(rt.api_version, rt.kind, name, namespace, new, dry_run=dry_run, field_manager=field_manager)

    # ------------------------------------------------------------------ delete
    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
               propagation_policy: str | None = None, preconditions: dict | None = None, dry_run: bool = False) -> dict:
        rt = self._rt(api_version, kind)
        with self._locked():
            obj = self._lookup(rt, name, namespace)
            if obj is None:
                raise not_found(rt, name)
            if preconditions:
                uid = preconditions.get("uid")
                if uid and uid != obj["metadata"]["uid"]:
                    raise conflict(rt, name, f"Precondition failed: UID in precondition: {uid}, UID in object meta: {obj['metadata']['uid']}")
                prv = preconditions.get("resourceVersion")
                if prv and prv != obj["metadata"]["resourceVersion"]:
                    raise conflict(rt, name, f"Precondition failed: ResourceVersion in precondition: {prv}, ResourceVersion in object meta: {obj['metadata']['resourceVersion']}")
            if propagation_policy not in (None, "", "Background", "Foreground", "Orphan"):
                raise invalid(rt, name, [V.err_not_supported("propagationPolicy", propagation_policy, ["Foreground", "Background", "Orphan", "nil"])])
            if dry_run:
                out = copy_obj(obj)
                if obj["metadata"].get("finalizers") or (propagation_policy == "Foreground" and self._dependents.get(obj["metadata"]["uid"])):
                    out["metadata"]["deletionTimestamp"] = self._now()
                    out["metadata"]["deletionGracePeriodSeconds"] = 0
                return out
            out = self._delete(rt, obj, propagation_policy or "Background")
        return copy_obj(out)

    def _delete(self, rt, obj, policy: str) -> dict:
        meta = obj["metadata"]
        uid = meta["uid"]
        if rt.group == "" and rt.kind == "Namespace":
            return self._delete_namespace(rt, obj)
        if policy == "Orphan":
            self._orphan_dependents(uid)
        if meta.get("deletionTimestamp"):
            if policy == "Foreground" and "foregroundDeletion" not in (meta.get("finalizers") or []) and self._dependents.get(uid):
                new = copy_obj(obj)
                new["metadata"]["finalizers"] = list(meta.get("finalizers") or []) + ["foregroundDeletion"]
                new["metadata"]["resourceVersion"] = self._next_rv()
                self._commit(rt, "MODIFIED", new, obj)
                self._delete_dependents(uid)
                return self._lookup(rt, meta["name"], meta.get("namespace")) or new
            return obj
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and self._dependents.get(uid):
            finalizers.append("foregroundDeletion")
        if finalizers:
            new = copy_obj(obj)
            new["metadata"]["deletionTimestamp"] = self._now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"]["finalizers"] = finalizers
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._commit(rt, "MODIFIED", new, obj)
            if "foregroundDeletion" in finalizers:
                self._delete_dependents(uid)
                cur = self._lookup(rt, meta["name"], meta.get("namespace"))
                return cur if cur is not None else new
            return new
        new = copy_obj(obj)
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._finalize_remove(rt, new, obj)
        return new

    def _finalize_remove(self, rt, final: dict, old: dict) -> None:
        """Really remove an object (DELETED event), then run GC for its dependents and waiting owners."""
        self._commit(rt, "DELETED", final, old)
        meta = final["metadata"]
        uid = meta["uid"]
        # dependents: delete (background) unless they have other live owners
        for drt, dns, dname in sorted(self._dependents.get(uid, set()), key=lambda k: (k[1], k[2])):
            dep = self._lookup(drt, dname, dns or None)
            if dep is None:
                continue
            refs = [r for r in dep["metadata"].get("ownerReferences") or [] if isinstance(r, dict)]
            others = [r for r in refs if r.get("uid") != uid and r.get("uid") in self._by_uid]
            if others:
                new = copy_obj(dep)
                new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                new["metadata"]["resourceVersion"] = self._next_rv()
                self._commit(drt, "MODIFIED", new, dep)
            else:
                self._delete(drt, dep, "Background")
        self._dependents.pop(uid, None)
        # owners waiting in foreground deletion
        for r in meta.get("ownerReferences") or []:
            if not isinstance(r, dict):
                continue
            loc = self._by_uid.get(r.get("uid"))
            if loc is None:
                continue
            ort, ons, oname = loc
            owner = self._lookup(ort, oname, ons or None)
            if owner is None:
                continue
            om = owner["metadata"]
            if om.get("deletionTimestamp") and "foregroundDeletion" in (om.get("finalizers") or []) and not self._dependents.get(om["uid"]):
                self._drop_finalizer(ort, owner, "foregroundDeletion")
        if rt.namespaced:
            self._maybe_finish_namespace(meta.get("namespace"))

    def _drop_finalizer(self, rt, obj, finalizer: str) -> None:
        new = copy_obj(obj)
        new["metadata"]["finalizers"] = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]
        if not new["metadata"]["finalizers"]:
            del new["metadata"]["finalizers"]
        new["metadata"]["resourceVersion"] = self._next_rv()
        if not new["metadata"].get("finalizers"):
            self._finalize_remove(rt, new, obj)
        else:
            self._commit(rt, "MODIFIED", new, obj)

    def _delete_dependents(self, uid: str) -> None:
        for drt, dns, dname in sorted(self._dependents.get(uid, set()), key=lambda k: (k[1], k[2])):
            dep = self._lookup(drt, dname, dns or None)
            if dep is not None and not dep["metadata"].get("deletionTimestamp"):
                self._delete(drt, dep, "Foreground")
        # if nothing is left, release the owner now
        if not self._dependents.get(uid):
            loc = self._by_uid.get(uid)
            if loc is not None:
                ort, ons, oname = loc
                owner = self._lookup(ort, oname, ons or None)
                if owner is not None and "foregroundDeletion" in (owner["metadata"].get("finalizers") or []):
                    self._drop_finalizer(ort, owner, "foregroundDeletion")

    def _orphan_dependents(self, uid: str) -> None:
        for drt, dns, dname in sorted(self._dependents.get(uid, set()), key=lambda k: (k[1], k[2])):
            dep = self._lookup(drt, dname, dns or None)
            if dep is None:
                continue
            new = copy_obj(dep)
            refs = [r for r in dep["metadata"].get("ownerReferences") or [] if not (isinstance(r, dict) and r.get("uid") == uid)]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences", None)
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._commit(drt, "MODIFIED", new, dep)

    def _delete_namespace(self, rt, obj) -> dict:
        meta = obj["metadata"]
        ns = meta["name"]
        cur = obj
        if not meta.get("deletionTimestamp"):
            new = copy_obj(obj)
            new["metadata"]["deletionTimestamp"] = self._now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new.setdefault("status", {})["phase"] = "Terminating"
            new["status"]["conditions"] = [
                {"type": "NamespaceDeletionContentFailure", "status": "False", "reason": "ContentDeleted",
                 "message": "All content successfully deleted, may be waiting on finalization",
                 "lastTransitionTime": self._now()}]
            new.setdefault("spec", {})["finalizers"] = list((obj.get("spec") or {}).get("finalizers") or ["kubernetes"])
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._commit(rt, "MODIFIED", new, obj)
            cur = new
        # delete every namespaced object in it
        for trt in list(self._data.keys()):
            if not trt.namespaced:
                continue
            bucket = self._data.get(trt, {}).get(ns)
            if not bucket:
                continue
            for name in sorted(bucket.keys()):
                o = bucket.get(name)
                if o is not None and not o["metadata"].get("deletionTimestamp"):
                    self._delete(trt, o, "Background")
        self._maybe_finish_namespace(ns)
        after = self._lookup(rt, ns, None)
        return after if after is not None else cur

    def _maybe_finish_namespace(self, ns: str | None) -> None:
        if not ns:
            return
        nsrt = self.registry.by_kind("v1", "Namespace")
        nso = self._lookup(nsrt, ns, None)
        if nso is None or not nso["metadata"].get("deletionTimestamp"):
            return
        for trt, table in self._data.items():
            if trt.namespaced and table.get(ns):
                return
        final = copy_obj(nso)
        final.setdefault("spec", {})["finalizers"] = []
        final["metadata"]["resourceVersion"] = self._next_rv()
        if final["metadata"].get("finalizers"):
            self._commit(nsrt, "MODIFIED", final, nso)
            return
        self._finalize_remove(nsrt, final, nso)

    def delete_collection(self, api_version: str, kind: str, namespace: str | None = None, *,
                          label_selector: str | None = None, field_selector: str | None = None,
                          propagation_policy: str | None = None, dry_run: bool = False) -> dict:
        rt = self._rt(api_version, kind)
        match = make_matcher(rt, label_selector, field_selector)
        with self._locked():
            targets = sorted(((ns, n, o) for ns, n, o in self._iter(rt, namespace) if match(o)), key=lambda e: (e[0], e[1]))
            items = []
            for ns, n, _ in targets:
                cur = self._lookup(rt, n, ns or None)
                if cur is None:
                    continue
                if dry_run:
                    items.append(copy_obj(cur))
                else:
                    items.append(copy_obj(self._delete(rt, cur, propagation_policy or "Background")))
            rv = self.resource_version()
        return {"apiVersion": rt.api_version, "kind": rt.list_kind, "metadata": {"resourceVersion": rv}, "items": items}

    # ------------------------------------------------------------------ watch
    def watch(self, api_version: str, kind: str, namespace: str | None = None, *, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              allow_bookmarks: bool = False) -> Watcher:
        rt = self._rt(api_version, kind)
        match = make_matcher(rt, label_selector, field_selector)
        ns = namespace if rt.namespaced and namespace else None
        with self.lock:
            w = Watcher(self, rt, match, ns, allow_bookmarks)
            if resource_version in (None, "", "0"):
                entries = sorted(self._iter(rt, ns), key=lambda e: (e[0], e[1]))
                for _, _, o in entries:
                    if match(o):
                        w._q.put(("ADDED", o))
            else:
                try:
                    since = int(resource_version)
                except ValueError:
                    raise bad_request(f'invalid resource version "{resource_version}"') from None
                if since < self._evicted_rv:
                    raise ApiError(410, "Expired", f"too old resource version: {since} ({self._rv})")
                for rv, hrt, etype, obj, old in self._history:
                    if rv > since and hrt is rt:
                        w._offer(etype, obj, old)
            self._watchers.setdefault(rt, []).append(w)
        return w

    def _remove_watcher(self, w: Watcher) -> None:
        with self.lock:
            lst = self._watchers.get(w.rt)
            if lst and w in lst:
                lst.remove(w)

    def close_watchers(self) -> None:
        """Close every open watch (simulated restart)."""
        with self.lock:
            ws = [w for lst in self._watchers.values() for w in lst]
        for w in ws:
            w.close()

    # ------------------------------------------------------------------ state file
    def dump(self) -> dict:
        with self.lock:
            objs = []
            for table in self._data.values():
                for ns in sorted(table):
                    for name in sorted(table[ns]):
                        objs.append(table[ns][name])
            return {"resourceVersion": self._rv, "objects": json.loads(json.dumps(objs))}

    def load(self, data: dict) -> None:
        with self._locked():
            self._data.clear()
            self._by_uid.clear()
            self._dependents.clear()
            self._cluster_ips.clear()
            self._history.clear()
            maxrv = int(data.get("resourceVersion") or 0)
            for obj in data.get("objects") or []:
                try:
                    rt = self.registry.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
                except KeyError:
                    continue
                meta = obj["metadata"]
                ns = meta.get("namespace", "") if rt.namespaced else ""
                self._table(rt).setdefault(ns, {})[meta["name"]] = obj
                self._by_uid[meta["uid"]] = (rt, ns, meta["name"])
                self._index_owners(rt, ns, meta["name"], None, obj)
                if rt.group == "" and rt.kind == "Service" and (obj.get("spec") or {}).get("clusterIP"):
                    self._cluster_ips.add(obj["spec"]["clusterIP"])
                with contextlib.suppress(ValueError):
                    maxrv = max(maxrv, int(meta.get("resourceVersion") or 0))
            self._rv = maxrv
            self._evicted_rv = maxrv


_META_ORDER = ("name", "generateName", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
               "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences",
               "finalizers", "managedFields")


def _order_meta(obj: dict) -> None:
    meta = obj["metadata"]
    out = {k: meta[k] for k in _META_ORDER if k in meta}
    for k, v in meta.items():
        if k not in out:
            out[k] = v
    obj["metadata"] = out


def _same_ignoring_mf_time(a: dict, b: dict) -> bool:
    if a == b:
        return True
    ma, mb = a.get("metadata") or {}, b.get("metadata") or {}
    if {k: v for k, v in a.items() if k != "metadata"} != {k: v for k, v in b.items() if k != "metadata"}:
        return False
    if {k: v for k, v in ma.items() if k != "managedFields"} != {k: v for k, v in mb.items() if k != "managedFields"}:
        return False

    def strip(mf):
        return [{k: v for k, v in e.items() if k != "time"} for e in (mf or []) if isinstance(e, dict)]

    return strip(ma.get("managedFields")) == strip(mb.get("managedFields"))

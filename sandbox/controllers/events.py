"""core/v1 Events, as ``kubectl describe`` shows them.

:class:`EventRecorder` writes an Event in the involved object's namespace (``default`` for cluster-scoped objects)
named ``<object>.<16 hex>``; repeating the same (object, type, reason, message) bumps ``count`` and
``lastTimestamp`` of the existing Event instead, like the client-go event correlator. ``min_interval`` lets a
caller that reports a state on every pass (the scheduler's ``FailedScheduling``) bump the count at most that often in
simulated time. :meth:`EventRecorder.gc` removes Events whose ``lastTimestamp`` is older than one simulated hour
(the apiserver's default event TTL).
"""

from __future__ import annotations

import hashlib

from sandbox.clock import parse_time

EVENT_TTL_SECONDS = 3600.0


class EventRecorder:
    def __init__(self, ctx):
        self.ctx = ctx
        # (uid or kind/ns/name, type, reason, message) -> [event name, namespace, last simulated time]
        self._seen: dict[tuple, list] = {}
        self._seq = 0
        self._last_gc = None

    def record(self, obj: dict, etype: str, reason: str, message: str, component: str, *,
               host: str | None = None, min_interval: float = 0.0) -> None:
        ctx = self.ctx
        m = obj.get("metadata") or {}
        ns = m.get("namespace") or "default"
        ident = m.get("uid") or f"{obj.get('kind')}/{ns}/{m.get('name')}"
        key = (ident, etype, reason, message)
        now = ctx.now()
        ts = ctx.ts()
        seen = self._seen.get(key)
        if seen is not None:
            name, ens, last = seen
            if min_interval and (now - last).total_seconds() < min_interval:
                return
            ev = ctx.get(("v1", "Event"), name, ens)
            if ev is not None:
                ev["count"] = int(ev.get("count") or 1) + 1
                ev["lastTimestamp"] = ts
                if ctx.update(ev) is not None:
                    seen[2] = now
                    return
        self._seq += 1
        name = f"{m.get('name')}.{hashlib.sha1(f'{ident}/{self._seq}/{ts}'.encode()).hexdigest()[:16]}"
        involved = {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": m.get("name"),
            "uid": m.get("uid"),
        }
        if m.get("namespace"):
            involved["namespace"] = m["namespace"]
        if m.get("resourceVersion"):
            involved["resourceVersion"] = m["resourceVersion"]
        source = {"component": component}
        if host:
            source["host"] = host
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": etype,
            "count": 1,
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "source": source,
            "reportingComponent": component,
            "reportingInstance": host or component,
        }
        if ctx.create(ev) is not None:
            self._seen[key] = [name, ns, now]

    def gc(self) -> None:
        """Delete Events older than the TTL (checked once per simulated minute)."""
        ctx = self.ctx
        now = ctx.now()
        if self._last_gc is not None and (now - self._last_gc).total_seconds() < 60:
            return
        self._last_gc = now
        for ev in ctx.list_items(("v1", "Event")):
            t = parse_time(ev.get("lastTimestamp") or ev.get("eventTime") or
                           (ev.get("metadata") or {}).get("creationTimestamp"))
            if t is not None and (now - t).total_seconds() > EVENT_TTL_SECONDS:
                ctx.delete(("v1", "Event"), ev["metadata"]["name"], ev["metadata"].get("namespace"))
        stale = [k for k, v in self._seen.items() if (now - v[2]).total_seconds() > EVENT_TTL_SECONDS]
        for k in stale:
            del self._seen[k]

    def for_object(self, obj: dict) -> list[dict]:
        """Events about ``obj`` (handy in tests)."""
        m = obj.get("metadata") or {}
        ns = m.get("namespace") or "default"
        out = []
        for ev in self.ctx.list_items(("v1", "Event"), ns):
            io = ev.get("involvedObject") or {}
            if io.get("name") == m.get("name") and io.get("kind") == obj.get("kind"):
                out.append(ev)
        return out

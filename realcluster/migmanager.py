"""A stand-in NVIDIA MIG manager for the real control plane: no GPU operator runs here, so nobody would act on a node's
``nvidia.com/mig.config`` label and a MIG layout change would wait forever.

It runs the sandbox's own MIG manager (``sandbox.controllers.nodes.NodeController``: state ``pending``, GPU operands
paused and GPU capacity at 0, then the new ``nvidia.com/mig-<profile>`` capacity and labels with state ``success``,
or ``failed`` with the previous layout kept when GPUs are busy or the layout is unknown) against the real API
server, through :class:`ApiContext`, every second. Time is real here: a change takes ``seconds`` (default 5 s,
where the sandbox's profile says 45 simulated seconds).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def _stamp(at: _dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiContext:
    """The part of the sandbox's controller context the MIG manager uses, served by the real API server."""

    def __init__(self, cp: Any, profile: dict) -> None:
        self.cp = cp
        self.profile = profile

    def ts(self) -> str:
        return _stamp(_now())

    def since(self, stamp: str | None) -> float | None:
        if not stamp:
            return None
        try:
            at = _dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.UTC)
        except ValueError:
            return None
        return (_now() - at).total_seconds()

    @staticmethod
    def _path(gvk: tuple[str, str]) -> str:
        return {("v1", "Node"): "/api/v1/nodes", ("v1", "Pod"): "/api/v1/pods"}[gvk]

    def list_items(self, gvk: tuple[str, str], namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict]:
        status, body = self.cp._request("GET", self._path(gvk))
        if status != 200:
            return []
        kind = gvk[1]
        return [{"apiVersion": "v1", "kind": kind, **item} for item in body.get("items") or []]

    def get(self, gvk: tuple[str, str], name: str, namespace: str | None = None) -> dict | None:
        status, body = self.cp._request("GET", f"{self._path(gvk)}/{name}")
        return body if status == 200 else None

    def update(self, obj: dict) -> dict | None:
        status, body = self.cp._request("PUT", f"/api/v1/nodes/{obj['metadata']['name']}", obj)
        return body if status == 200 else None  # 409: changed meanwhile; the next pass reads it again

    def write_status(self, obj: dict, status_body: dict) -> dict | None:
        if obj.get("status") == status_body:
            return obj
        status, body = self.cp._request("PUT", f"/api/v1/nodes/{obj['metadata']['name']}/status",
                                        {**obj, "status": status_body})
        return body if status == 200 else None

    def event(self, obj: dict, etype: str, reason: str, message: str, component: str, *,
              host: str | None = None, min_interval: float = 0.0) -> None:
        meta = obj["metadata"]
        now = _stamp(_now())
        self.cp._request("POST", "/api/v1/namespaces/default/events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta.get("uid", "")},
            "type": etype, "reason": reason, "message": message, "source": {"component": component, "host": host or ""},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1})


def start_mig_manager(cp: Any, profile_path: Path | None = None, *, seconds: float = 5.0,
                      interval: float = 1.0) -> threading.Event:
    """Run the MIG manager every ``interval`` seconds until the returned event is set."""
    sys.path.insert(0, str(ROOT))
    from sandbox.controllers.nodes import NodeController
    from sandbox.profile import load_profile

    profile = dict(load_profile(profile_path or ROOT / "sandbox" / "profiles" / "demo.yaml"))
    profile["migReconfigureSeconds"] = seconds
    controller = NodeController(ApiContext(cp, profile))
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            # The API server restarting, or a node changed under us: the next pass reads again.
            with contextlib.suppress(OSError, KeyError, ValueError):
                controller.reconcile()

    threading.Thread(target=loop, name="realcluster-mig-manager", daemon=True).start()
    return stop

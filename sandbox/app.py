"""The sandbox cluster as one object: Registry + Store + Clock + Controllers + HTTP server.

    with Sandbox(kubeconfig="kubeconfig.yaml") as sb:
        print(sb.url)            # https://127.0.0.1:PORT (bearer token required; plain http also answers)
        sb.advance(60)           # move simulated time and reconcile

``python -m sandbox`` wraps this class (see ``sandbox/__main__.py``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import tempfile
import threading
from pathlib import Path

import yaml

from .clock import Clock, format_precise, latest_timestamp, parse_time
from .controllers import Controllers
from .dcgm import Dcgm
from .faults import Faults
from .inference import optional_types
from .profile import load_profile
from .registry import default_registry
from .server import SandboxServer
from .store import ApiError, Store

MAX_STABLE_TICKS = 100
# ... and Kueue's namespace, where a real installation runs it (MultiKueue reads its clusters' Secrets there)
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", "kueue-system")


def write_kubeconfig(path: str | os.PathLike, url: str, token: str | None, context: str = "sandbox",
                     ca_pem: bytes | None = None) -> None:
    """Write a kubeconfig for ``url`` (bearer token; CA data when https) with ``context`` as current-context."""
    user: dict = {"token": token} if token else {}
    cluster: dict = {"server": url}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": f"{context}-user", "user": user}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": f"{context}-user", "namespace": "default"}}],
        "current-context": context,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        yaml.safe_dump(cfg, fh, sort_keys=False)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class Sandbox:
    """A running sandbox cluster (loopback HTTP API + simulated controllers).

    ``token=None`` picks a random bearer token, ``token=""`` turns authentication off. With ``tls=True`` (default)
    the kubeconfig points at ``https://`` with the CA of a throwaway certificate, because kubectl (client-go
    clientcmd) never sends a bearer token to a plain-http server; the same port also answers plain http
    (``http_url``). ``controllers=False`` or ``tick_interval=0`` keep the simulation still (``tick``/``advance``
    still work when controllers exist).
    """

    def __init__(self, port: int = 0, kubeconfig: str | os.PathLike | None = None, profile: str | os.PathLike | dict | None = None,
                 speed: float = 1.0, state_file: str | os.PathLike | None = None, token: str | None = None, *,
                 host: str = "127.0.0.1", controllers: bool = True, tick_interval: float = 0.2, store: Store | None = None,
                 tls: bool = True):
        self.host = host
        self.kubeconfig = str(kubeconfig) if kubeconfig is not None else None
        self.kubecache: str | None = None  # a private KUBECACHEDIR for kubectl (set by sandbox.testing)
        self.state_file = str(state_file) if state_file is not None else None
        self.token = token if token is not None else secrets.token_urlsafe(24)
        self.tick_interval = tick_interval
        self.registry = store.registry if store is not None else default_registry()
        self.store = store if store is not None else Store(self.registry)
        self.clock = Clock(speed)
        if self.store.clock is None:
            self.store.clock = self.clock  # timestamps in simulated time
        self.faults = Faults()
        self.logs: dict[tuple[str, str], list[str]] = {}
        if isinstance(profile, dict):
            self.profile = profile
        else:
            self.profile = load_profile(str(profile) if profile is not None else None)
        for optional in optional_types(self.profile):  # the profile's ``apis``: Gateway API, KEDA (sandbox/inference.py)
            self.registry.add(optional)
        self.dcgm = Dcgm(self.store, self.clock, self.profile)  # /dcgm/<node>/metrics and /prometheus/api/v1/*
        self.controllers = None
        if controllers:
            self.controllers = Controllers(self.store, self.clock, self.profile)
            self.controllers.logs = self.logs  # shared with the server's pods/log endpoint
        self.server = SandboxServer(self.store, host=host, port=port, token=self.token, faults=self.faults,
                                    clock=self.clock, logs=self.logs, hooks=self, tls=tls)
        self._control_lock = threading.RLock()
        self._started = False

    # -- lifecycle ------------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.server.url

    @property
    def http_url(self) -> str:
        """Plain http on the same port (the server sniffs TLS); kubectl only sends the token over https."""
        return self.server.http_url

    @property
    def ca_pem(self) -> bytes | None:
        return self.server.ca_pem

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> Sandbox:
        if self._started:
            return self
        if self.state_file and os.path.exists(self.state_file) and os.path.getsize(self.state_file) > 0:
            with open(self.state_file) as fh:
                data = json.load(fh)
            self.store.load(data)
            self.resume_clock(data)
        self.seed_namespaces()
        if self.controllers is not None:
            self.controllers.seed()
        self.server.start()
        if self.kubeconfig:
            write_kubeconfig(self.kubeconfig, self.url, self.token, ca_pem=self.server.ca_pem)
        if self.controllers is not None and self.tick_interval and self.tick_interval > 0:
            self.controllers.start(self.tick_interval)
        self._started = True
        return self

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self.controllers is not None:
            with contextlib.suppress(Exception):
                self.controllers.stop()
        self.server.stop()
        if self.state_file:
            self.save_state()

    def resume_clock(self, data: dict) -> None:
        """Continue the simulated clock from a state file: from its saved ``clock.now``, and never earlier than the
        latest timestamp of its objects (older files have no clock) — else a cluster run at ``--speed`` > 1 or moved
        by ``/sandbox/advance`` would restart at wall time, with its objects created in the future (AGE
        ``<invalid>``). When the wall clock is later than both (a cluster stopped for longer than it ran ahead),
        time simply passed while it was down."""
        saved = parse_time(((data.get("clock") or {}) if isinstance(data.get("clock"), dict) else {}).get("now"))
        latest = latest_timestamp(data.get("objects") or [])
        for t in (saved, latest):
            if t is not None:
                self.clock.resume(t)

    def seed_namespaces(self) -> None:
        """Create the namespaces every cluster has (idempotent)."""
        for name in DEFAULT_NAMESPACES:
            try:
                self.store.get("v1", "Namespace", name)
            except ApiError as e:
                if e.code != 404:
                    raise
                self.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                                  field_manager="sandbox")

    def state_data(self) -> dict:
        """What the state file keeps (also ``GET /sandbox/state``): the objects and the simulated clock."""
        with self.store.lock:
            data = self.store.dump()
            data["clock"] = {"now": format_precise(self.clock.now()), "speed": self.clock.speed}
        return data

    def save_state(self, path: str | os.PathLike | None = None) -> None:
        path = Path(path or self.state_file)
        data = self.state_data()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- control hooks (also reachable over HTTP: /sandbox/advance, /sandbox/tick, /sandbox/restart) ------------------
    def tick(self) -> dict:
        with self._control_lock:
            if self.controllers is not None:
                self.controllers.tick()
            return {"now": self.clock.timestamp(), "resourceVersion": self.store.resource_version()}

    def settle(self, max_ticks: int = MAX_STABLE_TICKS) -> int:
        """Tick until a tick changes nothing (or ``max_ticks``); returns the number of ticks run."""
        with self._control_lock:
            if self.controllers is None:
                return 0
            if hasattr(self.controllers, "settle"):
                return int(self.controllers.settle(max_ticks))
            n = 0
            for n in range(1, max_ticks + 1):  # noqa: B007 the count of ticks is returned after the loop
                before = self.store.resource_version()
                self.controllers.tick()
                if self.store.resource_version() == before:
                    break
            return n

    def advance(self, seconds: float) -> dict:
        with self._control_lock:
            if seconds:
                self.clock.advance(float(seconds))
            ticks = self.settle()
            return {"now": self.clock.timestamp(), "resourceVersion": self.store.resource_version(), "ticks": ticks}

    def restart(self) -> None:
        """Simulated API server crash and restart: connections and watches drop, state and port are kept."""
        self.server.restart()

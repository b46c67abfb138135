"""The simulated cluster's controllers.

``Controllers(store, clock, profile)`` wires every controller to one :class:`~sandbox.controllers.common.Ctx`.
:meth:`Controllers.tick` runs one deterministic pass of all of them, in this fixed order:

1. ``nodes``        — NVIDIA MIG manager (``nvidia.com/mig.config`` label flow), :mod:`.nodes`
2. ``kueue``        — webhooks, Workloads, admission/preemption, Job un-suspend/pod un-gating, queue status, :mod:`.kueue`
3. ``jobs``         — batch/v1 Job controller, :mod:`.workloads`
4. ``deployments``  — Deployment controller (pods owned directly, no ReplicaSet)
5. ``statefulsets`` — StatefulSet controller (+ PVCs)
6. ``volcano``      — Volcano Commands, Job controller, gang scheduler, Queue status, :mod:`.volcano`
7. ``scheduler``    — kube-scheduler + HAMi extender, :mod:`.scheduler`
8. ``kubelet``      — pod lifecycle in simulated time, pod logs
9. ``gc``           — orphans, stale logs, old Events

Each controller object has a ``reconcile()`` method; a failing controller is recorded in ``errors`` and does not stop
the others. :meth:`Controllers.settle` ticks until a pass writes nothing. :meth:`Controllers.start` runs ticks in a
background thread every ``interval`` seconds, and sooner when the store reports a change (the store subscription sets
a "dirty" flag). Time comes only from the :class:`~sandbox.clock.Clock`; pod logs are in
``Controllers.logs[(namespace, pod)]``.
"""

from __future__ import annotations

import threading
import traceback

from sandbox.controllers.common import VC_QUEUE, Ctx
from sandbox.controllers.kueue import Kueue
from sandbox.controllers.nodes import NodeController
from sandbox.controllers.scheduler import Scheduler
from sandbox.controllers.volcano import Volcano
from sandbox.controllers.workloads import (
    DeploymentController,
    GarbageCollector,
    JobController,
    Kubelet,
    StatefulSetController,
)

__all__ = ["Controllers"]


class _EventGC:
    name = "event-gc"

    def __init__(self, ctx):
        self.ctx = ctx

    def reconcile(self) -> None:
        self.ctx.events.gc()


class Controllers:
    def __init__(self, store, clock, profile: dict | None = None, *, seed: int = 0,
                 start_delay: float | None = None):
        self.store = store
        self.clock = clock
        self.profile = profile
        self.ctx = Ctx(store, clock, profile, seed=seed)
        self.nodes = NodeController(self.ctx)
        self.kueue = Kueue(self.ctx)
        self.jobs = JobController(self.ctx)
        self.deployments = DeploymentController(self.ctx)
        self.statefulsets = StatefulSetController(self.ctx)
        self.volcano = Volcano(self.ctx)
        self.scheduler = Scheduler(self.ctx)
        self.kubelet = Kubelet(self.ctx) if start_delay is None else Kubelet(self.ctx, start_delay)
        self.gc = GarbageCollector(self.ctx)
        self.ctx.pod_mutators = [self.kueue.mutate_pod]
        self.order = [self.nodes, self.kueue, self.jobs, self.deployments, self.statefulsets, self.volcano,
                      self.scheduler, self.kubelet, self.gc, _EventGC(self.ctx)]
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()
        self.ticks = 0
        store.subscribe(self._on_change)

    # ------------------------------------------------------------------------------------------ state
    @property
    def logs(self) -> dict:
        return self.ctx.logs

    @logs.setter
    def logs(self, value: dict) -> None:
        value.update(self.ctx.logs)
        self.ctx.logs = value

    @property
    def errors(self):
        return self.ctx.errors

    @property
    def events(self):
        return self.ctx.events

    def _on_change(self, etype: str, obj: dict) -> None:
        self._dirty.set()

    # ------------------------------------------------------------------------------------------ passes
    def seed(self) -> None:
        """Create the profile's Nodes and Volcano's ``default``/``root`` Queues (idempotent)."""
        with self.store.lock:
            self.nodes.seed()
            try:
                self.store.registry.by_kind(*VC_QUEUE)
            except KeyError:
                return
            self.volcano.seed()

    def tick(self) -> None:
        """One reconcile pass of every controller, in the fixed order."""
        with self._tick_lock, self.store.lock:
            self.ticks += 1
            self.ctx.informer.check()
            for c in self.order:
                try:
                    c.reconcile()
                except Exception:  # a broken controller must not stop the others
                    self.ctx.errors.append(f"{self.ctx.ts()} {getattr(c, 'name', c)}: {traceback.format_exc(limit=4)}")

    def settle(self, max_ticks: int = 50) -> int:
        """Tick until a pass writes nothing (or ``max_ticks``); returns the number of passes run."""
        for n in range(1, max_ticks + 1):
            before = self.ctx.writes
            self.tick()
            if self.ctx.writes == before:
                return n
        return max_ticks

    def advance(self, seconds: float) -> int:
        """Move the clock forward and settle (tests)."""
        self.clock.advance(seconds)
        return self.settle()

    # ------------------------------------------------------------------------------------------ background loop
    def start(self, interval: float = 0.2) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()

        def loop():
            while not self._stop.is_set():
                self._dirty.wait(interval)
                if self._stop.is_set():
                    break
                self._dirty.clear()
                self.tick()

        self._thread = threading.Thread(target=loop, name="sandbox-controllers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

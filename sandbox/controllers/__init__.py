"""The simulated cluster's controllers.

``Controllers(store, clock, profile)`` wires every controller to one :class:`~sandbox.controllers.common.Ctx`.
:meth:`Controllers.tick` runs one deterministic pass of all of them, in this fixed order:

1. ``nodes``        — NVIDIA MIG manager (``nvidia.com/mig.config`` label flow), :mod:`.nodes`
2. ``kueue``        — webhooks, Workloads, admission/preemption, Job un-suspend/pod un-gating, queue status, :mod:`.kueue`;
   then ``multikueue`` — MultiKueueClusters, MultiKueue admission checks, Workloads dispatched to worker clusters,
   :mod:`.multikueue` (it calls the workers' APIs, so it runs every pass)
3. ``jobs``         — batch/v1 Job controller, :mod:`.workloads`
4. ``hpa``          — HorizontalPodAutoscaler on the model servers' request rate, :mod:`sandbox.inference`
5. ``deployments``  — Deployment controller (pods owned directly, no ReplicaSet; ``maxUnavailable: 0`` rolls)
6. ``statefulsets`` — StatefulSet controller (+ PVCs)
7. ``volcano``      — Volcano Commands, Job controller, gang scheduler, Queue status, :mod:`.volcano`
8. ``scheduler``    — kube-scheduler + HAMi extender, :mod:`.scheduler`
9. ``kubelet``      — pod lifecycle in simulated time, pod logs
10. ``gc``          — orphans, stale logs, old Events

Each controller object has a ``reconcile()`` method; a failing controller is recorded in ``errors`` and does not stop
the others. :meth:`Controllers.settle` ticks until a pass writes nothing. :meth:`Controllers.start` runs ticks in a
background thread every ``interval`` seconds, and sooner when the store reports a change (an informer listener sets
a "dirty" flag); a tick that took ``d`` seconds is followed by a pause of ``min(d, interval)`` so that writers always
get the store lock at least half of the time (changes arriving meanwhile are coalesced into the next tick). Time
comes only from the :class:`~sandbox.clock.Clock`; pod logs are in ``Controllers.logs[(namespace, pod)]``.

Incremental passes: a controller may declare ``watches`` (the kinds it reads) and ``timed`` (whether its outcome
also depends on simulated time). Such a controller is skipped when none of those kinds changed since its last
successful pass (per-kind change counters of the informer, its own writes included) and — if ``timed`` — the clock
has not moved; skipping is safe because every controller is a deterministic function of the store, the clock and
its own bookkeeping. Controllers also keep finer dirty sets of their own (Kueue: per ClusterQueue/cohort; Job
controller: per Job; kubelet: per pod plus a heap of due times).
"""

from __future__ import annotations

import threading
import time
import traceback

from sandbox.controllers.common import VC_QUEUE, Ctx
from sandbox.controllers.kueue import Kueue
from sandbox.controllers.multikueue import MultiKueue
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
from sandbox.inference import HorizontalPodAutoscalerController, InferenceLoad, KedaController

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
        self.multikueue = MultiKueue(self.ctx)
        self.jobs = JobController(self.ctx)
        self.deployments = DeploymentController(self.ctx)
        # Model servers' request load (written by the service proxy) and the HPA that follows it (sandbox/inference.py).
        self.inference_load = InferenceLoad(clock)
        self.hpa = HorizontalPodAutoscalerController(self.ctx, self.inference_load)
        self.keda = KedaController(self.ctx)  # only where the profile serves keda.sh (sandbox/inference.py)
        self.statefulsets = StatefulSetController(self.ctx)
        self.volcano = Volcano(self.ctx)
        self.scheduler = Scheduler(self.ctx)
        self.kubelet = Kubelet(self.ctx) if start_delay is None else Kubelet(self.ctx, start_delay)
        self.gc = GarbageCollector(self.ctx)
        self.ctx.pod_mutators = [self.kueue.mutate_pod]
        self.order = [self.nodes, self.kueue, self.multikueue, self.jobs, self.keda, self.hpa, self.deployments, self.statefulsets, self.volcano,
                      self.scheduler, self.kubelet, self.gc, _EventGC(self.ctx)]
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()
        self.ticks = 0
        self.skipped = 0  # controller passes skipped because nothing they read changed
        self._last: dict[str, tuple] = {}
        self.ctx.informer.listen(self._on_change)

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

    def _on_change(self, gvk, etype: str, obj: dict, old) -> None:
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
            inf = self.ctx.informer
            inf.check()
            now = self.clock.now()
            for c in self.order:
                name = getattr(c, "name", str(c))
                watches = getattr(c, "watches", None)
                sig = None
                if watches is not None:
                    sig = (inf.epoch, tuple(inf.version[k] for k in watches),
                           now if getattr(c, "timed", False) else None)
                    if self._last.get(name) == sig:
                        self.skipped += 1
                        continue
                errors_before = self.ctx.error_count
                try:
                    c.reconcile()
                except Exception:  # a broken controller must not stop the others
                    self.ctx.error_count += 1
                    self.ctx.errors.append(f"{self.ctx.ts()} {name}: {traceback.format_exc(limit=4)}")
                if sig is not None:
                    if self.ctx.error_count == errors_before:
                        self._last[name] = sig
                    else:  # a failed write or sync: try again on the next pass
                        self._last.pop(name, None)

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
                t0 = time.perf_counter()
                self.tick()
                # coalesce: after an expensive tick leave the store to the writers for as long again
                gap = min(interval, time.perf_counter() - t0)
                if gap > 0.001:
                    self._stop.wait(gap)

        self._thread = threading.Thread(target=loop, name="sandbox-controllers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

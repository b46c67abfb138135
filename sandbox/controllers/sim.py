"""In-process harness for tests: Store + frozen Clock + Controllers, and small manifest builders.

::

    sim = Sim()                          # demo profile, time frozen at 2026-01-01T00:00:00Z
    sim.namespace("team-a", labels={"tenant": "a"})
    sim.create(sim.job("train", "team-a", gpus=8, queue="lq"))
    sim.settle()                         # tick until nothing changes
    sim.advance(300)                     # move simulated time and settle
    sim.get("batch/v1", "Job", "train", "team-a")

No HTTP is involved; everything is deterministic (seeded random names, ``speed=0`` clock).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sandbox.clock import Clock
from sandbox.controllers import Controllers
from sandbox.controllers.common import KUEUE
from sandbox.profile import load_profile

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


class Sim:
    def __init__(self, profile: dict | str | None = "demo", *, start: datetime | None = None, seed: int = 0):
        from sandbox.store import Store

        if profile == "demo":
            profile = load_profile(None)
        elif isinstance(profile, str):
            profile = load_profile(profile)
        self.clock = Clock(speed=0, start=start or datetime(2026, 1, 1, tzinfo=UTC))
        self.store = Store(clock=self.clock)
        self.controllers = Controllers(self.store, self.clock, profile, seed=seed)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.namespace(ns)
        self.controllers.seed()

    # -- time ------------------------------------------------------------------------------------------
    def tick(self) -> None:
        self.controllers.tick()

    def settle(self) -> int:
        return self.controllers.settle()

    def advance(self, seconds: float) -> int:
        return self.controllers.advance(seconds)

    # -- store shortcuts -------------------------------------------------------------------------------
    def create(self, obj: dict) -> dict:
        return self.store.create(obj)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict:
        return self.store.get(api_version, kind, name, namespace)

    def items(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None):
        return self.store.list(api_version, kind, namespace, label_selector=label_selector)["items"]

    def patch(self, api_version: str, kind: str, name: str, namespace: str | None, patch: dict) -> dict:
        return self.store.patch(api_version, kind, name, namespace, patch, "merge")

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict:
        return self.store.delete(api_version, kind, name, namespace)

    def namespace(self, name: str, labels: dict | None = None) -> dict:
        return self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})

    def pods(self, namespace: str | None = None, label_selector: str | None = None) -> list[dict]:
        return self.items("v1", "Pod", namespace, label_selector)

    def events(self, namespace: str | None = None, reason: str | None = None) -> list[dict]:
        return [e for e in self.items("v1", "Event", namespace) if reason is None or e.get("reason") == reason]

    def workload_of(self, owner: dict) -> dict | None:
        uid = owner["metadata"]["uid"]
        ns = owner["metadata"]["namespace"]
        for wl in self.items(KUEUE, "Workload", ns):
            if (wl["metadata"].get("labels") or {}).get("kueue.x-k8s.io/job-uid") == uid:
                return wl
        return None

    @property
    def logs(self) -> dict:
        return self.controllers.logs

    # -- manifests -------------------------------------------------------------------------------------
    @staticmethod
    def container(requests: dict | None = None, *, image: str = "registry.example/train:1") -> dict:
        res = {k: str(v) for k, v in (requests or {}).items()}
        return {"name": "main", "image": image, "resources": {"requests": dict(res), "limits": dict(res)} if res else {}}

    @classmethod
    def pod_template(cls, requests: dict | None = None, *, tolerations: list | None = None, restart: str | None = None,
                     annotations: dict | None = None, labels: dict | None = None, node_selector: dict | None = None,
                     scheduler: str | None = None) -> dict:
        spec = {"containers": [cls.container(requests)]}
        if restart:
            spec["restartPolicy"] = restart
        if tolerations:
            spec["tolerations"] = tolerations
        if node_selector:
            spec["nodeSelector"] = node_selector
        if scheduler:
            spec["schedulerName"] = scheduler
        meta = {}
        if annotations:
            meta["annotations"] = annotations
        if labels:
            meta["labels"] = labels
        return {"metadata": meta, "spec": spec}

    @classmethod
    def job(cls, name: str, namespace: str, *, requests: dict | None = None, parallelism: int = 1,
            completions: int | None = None, queue: str | None = None, priority_class: str | None = None,
            duration: str | None = None, outcome: str | None = None, tolerations: list | None = None,
            indexed: bool = False, backoff_limit: int | None = None) -> dict:
        labels = {}
        if queue:
            labels["kueue.x-k8s.io/queue-name"] = queue
        if priority_class:
            labels["kueue.x-k8s.io/priority-class"] = priority_class
        ann = {}
        if duration is not None:
            ann["sandbox.gpuportal.dev/duration"] = str(duration)
        if outcome:
            ann["sandbox.gpuportal.dev/outcome"] = outcome
        spec = {"parallelism": parallelism, "completions": completions if completions is not None else parallelism,
                "template": cls.pod_template(requests, tolerations=tolerations, restart="Never")}
        if indexed:
            spec["completionMode"] = "Indexed"
        if backoff_limit is not None:
            spec["backoffLimit"] = backoff_limit
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": ann},
                "spec": spec}

    # -- Kueue objects ---------------------------------------------------------------------------------
    @staticmethod
    def flavor(name: str, node_labels: dict | None = None, tolerations: list | None = None,
               taints: list | None = None) -> dict:
        spec: dict = {}
        if node_labels:
            spec["nodeLabels"] = node_labels
        if tolerations:
            spec["tolerations"] = tolerations
        if taints:
            spec["nodeTaints"] = taints
        return {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}

    @staticmethod
    def cluster_queue(name: str, flavors: dict[str, dict], *, cohort: str | None = None, preemption: dict | None = None,
                      stop: str | None = None, strategy: str | None = None, borrowing: dict | None = None,
                      lending: dict | None = None, fungibility: dict | None = None,
                      namespace_selector: dict | None = None) -> dict:
        """``flavors``: flavor name -> {resource: nominalQuota}; ``borrowing``/``lending``: flavor -> {res: limit}."""
        covered: list[str] = []
        for quotas in flavors.values():
            for r in quotas:
                if r not in covered:
                    covered.append(r)
        fl = []
        for fname, quotas in flavors.items():
            res = []
            for r in covered:
                entry = {"name": r, "nominalQuota": str(quotas.get(r, 0))}
                if borrowing and r in (borrowing.get(fname) or {}):
                    entry["borrowingLimit"] = str(borrowing[fname][r])
                if lending and r in (lending.get(fname) or {}):
                    entry["lendingLimit"] = str(lending[fname][r])
                res.append(entry)
            fl.append({"name": fname, "resources": res})
        spec = {"namespaceSelector": namespace_selector if namespace_selector is not None else {},
                "resourceGroups": [{"coveredResources": covered, "flavors": fl}]}
        if cohort:
            spec["cohortName"] = cohort
        if preemption:
            spec["preemption"] = preemption
        if stop:
            spec["stopPolicy"] = stop
        if strategy:
            spec["queueingStrategy"] = strategy
        if fungibility:
            spec["flavorFungibility"] = fungibility
        return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}

    @staticmethod
    def local_queue(name: str, namespace: str, cluster_queue: str) -> dict:
        return {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue}}

    @staticmethod
    def priority_class(name: str, value: int) -> dict:
        return {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}

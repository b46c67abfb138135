"""Kueue's MultiKueue, as small as upstream's behaviour for a batch/v1 Job needs (Kueue v0.17,
``pkg/controller/admissionchecks/multikueue``).

On a **manager** cluster: ``MultiKueueCluster`` objects name a worker's kubeconfig (``spec.clusterSource.kubeConfig``,
a Secret's ``kubeconfig`` key in Kueue's namespace ``kueue-system``, or a file path); each gets ``Active`` True
("Active"/"Connected") when that kubeconfig reaches a cluster serving Kueue's Workloads, else False (``BadKubeConfig``
"load client config failed: ..." when the kubeconfig cannot be had, ``ClientConnectionFailed`` when the cluster does
not answer). An ``AdmissionCheck`` with ``controllerName: kueue.x-k8s.io/multikueue`` whose parameters name a
``MultiKueueConfig`` is Active when all its clusters are ("SomeActiveClusters" when some are, else False
"NoUsableClusters", "BadConfig" without its config).

A Workload that got quota in a ClusterQueue with such a check (Kueue leaves it ``Admitted`` False,
``UnsatisfiedChecks``, its check ``Pending``) is copied to every active worker (``nominatedClusterNames``; the copy
carries the label ``kueue.x-k8s.io/multikueue-origin``). The first worker whose Kueue admits its copy wins: the copies
on the others are deleted, the manager's Job is created there (suspended, with ``kueue.x-k8s.io/prebuilt-workload-name``
so the worker's Kueue takes the copy, and without ``managedBy``), the check becomes Ready with "The workload got
reservation on "<worker>"", ``status.clusterName`` names the worker, and the manager's Kueue admits its Workload. The
manager's Job (``spec.managedBy: kueue.x-k8s.io/multikueue``, left alone by the Job controller) then mirrors the
worker's Job status. The worker's Workload finishing finishes the manager's; the manager's Workload finishing, losing
its quota or going away deletes the worker's Job and Workload.

The remote calls are plain HTTPS to the other clusters' API (the other sandbox processes, or any API server), made
during the controller pass with short timeouts.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

from sandbox.controllers.common import (
    ADMISSION_CHECK,
    JOB,
    KUEUE,
    MK_CLUSTER,
    MK_CONFIG,
    MK_CONTROLLER,
    SECRET,
    WORKLOAD,
    condition_true,
    find_condition,
    is_deleting,
    set_condition,
)
from sandbox.patch import deep_copy

NAMESPACE = "kueue-system"  # where Kueue runs: its MultiKueueCluster Secrets live here
ORIGIN = "multikueue"  # Kueue's default ``multiKueue.origin``
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
PREBUILT_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
COMPONENT = "kueue-multikueue"
RECHECK_SECONDS = 5.0  # wall seconds between two connection checks of an Active cluster
TIMEOUT = 2.0
# labels the Job controller puts on a Job's pod template (Kueue's ``cleanLabels`` drops them from the copy)
TEMPLATE_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid", "job-name", "batch.kubernetes.io/job-name")


class RemoteError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class Remote:
    """A worker cluster's API, from a kubeconfig (its current context: server, bearer token, CA data)."""

    def __init__(self, kubeconfig: bytes):
        cfg = yaml.safe_load(kubeconfig) or {}
        if not isinstance(cfg, dict):
            raise ValueError("the kubeconfig is not a mapping")
        current = cfg.get("current-context")
        ctxs = {c.get("name"): c.get("context") or {} for c in cfg.get("contexts") or []}
        ctx = ctxs.get(current) or (next(iter(ctxs.values())) if ctxs else {})
        clusters = {c.get("name"): c.get("cluster") or {} for c in cfg.get("clusters") or []}
        users = {u.get("name"): u.get("user") or {} for u in cfg.get("users") or []}
        cluster = clusters.get(ctx.get("cluster")) or (next(iter(clusters.values())) if clusters else {})
        if not cluster.get("server"):
            raise ValueError("no server in the kubeconfig")
        self.server = cluster["server"].rstrip("/")
        self.token = (users.get(ctx.get("user")) or {}).get("token")
        self.ssl = None
        if self.server.startswith("https://"):
            ca = cluster.get("certificate-authority-data")
            self.ssl = ssl.create_default_context(cadata=base64.b64decode(ca).decode() if ca else None)
            if cluster.get("insecure-skip-tls-verify"):
                self.ssl.check_hostname = False
                self.ssl.verify_mode = ssl.CERT_NONE

    def call(self, method: str, path: str, body: dict | None = None, *, query: dict | None = None) -> dict | None:
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT, context=self.ssl) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw).get("message") or str(e)
            except (ValueError, AttributeError):
                message = str(e)
            raise RemoteError(e.code, message) from None
        except (OSError, ValueError) as e:  # refused, timed out, TLS
            raise RemoteError(0, f"{type(e).__name__}: {e}") from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> dict | None:
        """The object, or None when it does not exist."""
        try:
            return self.call("GET", path)
        except RemoteError as e:
            if e.code == 404:
                return None
            raise

    def delete(self, path: str) -> None:
        try:
            self.call("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
        except RemoteError as e:
            if e.code != 404:
                raise


def wl_path(ns: str, name: str = "") -> str:
    return f"/apis/{KUEUE}/namespaces/{ns}/workloads" + (f"/{name}" if name else "")


def job_path(ns: str, name: str = "") -> str:
    return f"/apis/batch/v1/namespaces/{ns}/jobs" + (f"/{name}" if name else "")


class MultiKueue:
    name = "multikueue"

    def __init__(self, ctx):
        self.ctx = ctx
        self.remotes: dict[str, tuple[bytes, Remote | None, float, str | None]] = {}  # cluster -> (config, client, checked, error)
        self.dispatched: dict[tuple[str, str], set[str]] = {}  # local Workload (ns, name) -> workers holding a copy
        self.errors: list[str] = []  # remote calls that failed (last 100)

    # ------------------------------------------------------------------------------------------ clusters
    def _kubeconfig(self, mkc: dict) -> bytes:
        kc = (((mkc.get("spec") or {}).get("clusterSource") or {}).get("kubeConfig")) or {}
        location, kind = kc.get("location") or "", kc.get("locationType") or "Secret"
        if not kc:
            raise ValueError("kubeconfig reference is nil")
        if kind == "Path":
            with open(location, "rb") as fh:
                return fh.read()
        secret = self.ctx.get(SECRET, location, NAMESPACE)
        if secret is None:
            raise ValueError(f'Secret "{location}" not found')  # controller-runtime's cached client
        data = (secret.get("data") or {}).get("kubeconfig")
        if data is None:
            raise ValueError(f'key "kubeconfig" not found in secret "{location}"')
        return base64.b64decode(data)

    @staticmethod
    def _insecure(raw: bytes) -> str | None:
        """Kueue's ``validateKubeconfig`` (MultiKueueAllowInsecureKubeconfigs off): why it refuses the kubeconfig."""
        try:
            cfg = yaml.safe_load(raw) or {}
        except yaml.YAMLError as e:
            return f"failed to parse kubeconfig(apiconfig): {e}"
        for user in cfg.get("users") or []:
            if (user.get("user") or {}).get("tokenFile"):
                return "tokenFile is not allowed"
        for c in cfg.get("clusters") or []:
            cluster, name = c.get("cluster") or {}, c.get("name")
            if cluster.get("insecure-skip-tls-verify"):
                return f"insecure TLS verification is not allowed for cluster {name}"
            if cluster.get("certificate-authority"):
                return f"certificate-authority file paths are not allowed, use certificate-authority-data for cluster {name}"
            if not cluster.get("server"):
                return f"server URL is required for cluster {name}"
        return None

    def _cluster(self, mkc: dict) -> tuple[Remote | None, str, str]:
        """(client or None, reason, message) for the MultiKueueCluster's Active condition."""
        name = mkc["metadata"]["name"]
        try:
            raw = self._kubeconfig(mkc)
        except (OSError, ValueError) as e:
            self.remotes.pop(name, None)
            return None, "BadKubeConfig", f"load client config failed: {e}"
        insecure = self._insecure(raw)
        if insecure:
            self.remotes.pop(name, None)
            return None, "InsecureKubeConfig", f"load client config failed: {insecure}"
        prev = self.remotes.get(name)
        if prev and prev[0] == raw and prev[1] is not None and time.monotonic() - prev[2] < RECHECK_SECONDS:
            return prev[1], "Active", "Connected"
        try:
            remote = Remote(raw)
            remote.call("GET", f"/apis/{KUEUE}/workloads", query={"limit": "1"})  # upstream watches Workloads
        except (RemoteError, ValueError, TypeError) as e:
            self.remotes[name] = (raw, None, time.monotonic(), str(e))
            return None, "ClientConnectionFailed", str(e)
        self.remotes[name] = (raw, remote, time.monotonic(), None)
        return remote, "Active", "Connected"

    def _set_condition(self, obj: dict, ctype: str, active: bool, reason: str, message: str) -> None:
        status = deep_copy(obj.get("status") or {})
        conds = status.setdefault("conditions", [])
        old = find_condition(conds, ctype)
        want = "True" if active else "False"
        if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (want, reason, message):
            return
        set_condition(conds, ctype, want, reason, message, self.ctx.ts(),
                      observedGeneration=obj["metadata"].get("generation", 1))
        self.ctx.write_status(obj, status)

    # ------------------------------------------------------------------------------------------ the pass
    def reconcile(self) -> None:
        ctx = self.ctx
        try:
            mkcs = ctx.informer.list(MK_CLUSTER)
            configs = {c["metadata"]["name"]: c for c in ctx.informer.list(MK_CONFIG)}
            acs = [a for a in ctx.informer.list(ADMISSION_CHECK)
                   if ((a.get("spec") or {}).get("controllerName")) == MK_CONTROLLER]
        except Exception:  # Kueue's MultiKueue kinds not served
            return
        if not mkcs and not acs and not self.dispatched and not self.remotes:
            return  # not a manager: nothing to do (the common case, every pass)
        active: dict[str, Remote] = {}
        for mkc in mkcs:
            if is_deleting(mkc):
                continue
            remote, reason, message = self._cluster(mkc)
            self._set_condition(mkc, "Active", remote is not None, reason, message)
            if remote is not None:
                active[mkc["metadata"]["name"]] = remote
        known = {m["metadata"]["name"] for m in mkcs}
        for name in list(self.remotes):
            if name not in known:
                del self.remotes[name]
        check_clusters: dict[str, list[str] | None] = {}
        for ac in acs:
            params = (ac.get("spec") or {}).get("parameters") or {}
            cfg = configs.get(params.get("name") or "") if params.get("kind") == "MultiKueueConfig" else None
            if cfg is None:
                check_clusters[ac["metadata"]["name"]] = None
                why = (f'MultiKueueConfig.kueue.x-k8s.io "{params.get("name")}" not found' if params
                       else "admission check parameters are missing")
                self._set_condition(ac, "Active", False, "BadConfig",
                                    f"Cannot load the AdmissionChecks parameters: {why}")
                continue
            names = list((cfg.get("spec") or {}).get("clusters") or [])
            check_clusters[ac["metadata"]["name"]] = names
            missing = [n for n in names if n not in known]
            inactive = [n for n in names if n in known and n not in active]
            reason, message, ok = "Active", "The admission check is active", True
            if missing or inactive:
                parts = ([f"Missing clusters: [{' '.join(missing)}]"] if missing else []) + \
                        ([f"Inactive clusters: [{' '.join(inactive)}]"] if inactive else [])
                message = ", ".join(parts)
                reason, ok = ("SomeActiveClusters", True) if len(missing) + len(inactive) < len(names) else \
                    ("NoUsableClusters", False)
            self._set_condition(ac, "Active", ok, reason, message)
        if not check_clusters and not self.dispatched:
            return
        seen: set[tuple[str, str]] = set()
        for wl in ctx.informer.list(WORKLOAD):
            checks = [c for c in (wl.get("status") or {}).get("admissionChecks") or [] if c.get("name") in check_clusters]
            if not checks:
                continue
            key = (wl["metadata"]["namespace"], wl["metadata"]["name"])
            seen.add(key)
            clusters = check_clusters.get(checks[0]["name"]) or []
            workers = {n: active[n] for n in clusters if n in active}
            try:
                self._workload(wl, checks[0], workers)
            except RemoteError as e:
                self._error(f"{key[0]}/{key[1]}: {e}")
        for key in [k for k in self.dispatched if k not in seen]:  # the manager's Workload went away
            for name in sorted(self.dispatched.pop(key)):
                remote = active.get(name)
                if remote is not None:
                    try:
                        self._remove(remote, *key)
                    except RemoteError as e:
                        self._error(f"{key[0]}/{key[1]} on {name}: {e}")
                        self.dispatched.setdefault(key, set()).add(name)

    def _error(self, text: str) -> None:
        self.errors = (self.errors + [f"{self.ctx.ts()} {text}"])[-100:]

    def _remove(self, remote: Remote, ns: str, name: str, job: str | None = None) -> None:
        """Delete the worker's Job (first: GC may already have removed its Workload) and Workload."""
        if job:
            remote.delete(job_path(ns, job))
        rwl = remote.get(wl_path(ns, name))
        if rwl is None:
            return
        if job is None:
            for ref in rwl["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Job":
                    remote.delete(job_path(ns, ref["name"]))
        remote.delete(wl_path(ns, name))

    def _workload(self, wl: dict, check: dict, workers: dict[str, Remote]) -> None:
        ctx = self.ctx
        ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
        key = (ns, name)
        owner = next((r for r in wl["metadata"].get("ownerReferences") or []
                      if r.get("controller") and r.get("kind") == "Job"), None)
        job = ctx.informer.get(JOB, owner["name"], ns) if owner else None
        jname = owner["name"] if owner else None
        done = condition_true(wl, "Finished") or not condition_true(wl, "QuotaReserved") or is_deleting(wl)
        if done and not self.dispatched.get(key):
            self.dispatched.pop(key, None)
            return  # nothing of it on a worker (the common case for the Workloads that ended: no remote call)
        mine = self.dispatched.setdefault(key, set())
        remotes = {n: r.get(wl_path(ns, name)) for n, r in workers.items()}
        for n, rwl in remotes.items():
            if rwl is not None:
                mine.add(n)
        # the manager's Workload finished or lost its quota: the copies go
        if done:
            for n, rwl in remotes.items():
                if rwl is not None:
                    self._remove(workers[n], ns, name, jname)
                    mine.discard(n)
            for n in list(mine):  # those we could not ask (inactive now) keep their entry
                if n in workers:
                    mine.discard(n)
            return
        if owner is None or job is None:
            if check.get("state") == "Pending":
                self._set_check(wl, check, "Rejected", "No multikueue adapter found")
            return
        if ((job.get("spec") or {}).get("managedBy")) != MK_CONTROLLER:
            if check.get("state") == "Pending":
                self._set_check(wl, check, "Rejected", "The owner is not managed by Kueue: Expecting spec.managedBy "
                                f'to be "{MK_CONTROLLER}" not "{(job.get("spec") or {}).get("managedBy") or ""}"')
            return
        # a copy that finished: mirror the Job, finish the manager's Workload
        for n in sorted(remotes):
            rwl = remotes[n]
            fin = find_condition(((rwl or {}).get("status") or {}).get("conditions"), "Finished")
            if fin is not None and fin.get("status") == "True":
                self._sync_job(job, workers[n], force=True)
                status = deep_copy(wl.get("status") or {})
                set_condition(status.setdefault("conditions", []), "Finished", "True", fin.get("reason") or "",
                              fin.get("message") or "", ctx.ts(), observedGeneration=wl["metadata"].get("generation", 1))
                ctx.write_status(wl, status)
                return
        # the first copy admitted wins (MultiKueueWaitForWorkloadAdmitted, on by default in Kueue v0.17)
        admitted = sorted((((find_condition(r["status"]["conditions"], "Admitted") or {}).get("lastTransitionTime")
                            or ""), n) for n, r in remotes.items()
                          if r is not None and condition_true(r, "Admitted"))
        if admitted:
            winner = admitted[0][1]
            for n, rwl in remotes.items():
                if rwl is not None and n != winner:
                    self._remove(workers[n], ns, name, jname)
                    mine.discard(n)
            self._sync_job(job, workers[winner], workload=name)
            if check.get("state") not in ("Ready", "Retry", "Rejected") or \
                    (wl.get("status") or {}).get("clusterName") != winner:
                status = deep_copy(wl.get("status") or {})
                message = f'The workload got reservation on "{winner}"'
                for c in status.get("admissionChecks") or []:
                    if c.get("name") == check["name"]:
                        c.update(state="Ready", message=message, lastTransitionTime=ctx.ts())
                status.setdefault("clusterName", winner)
                status.pop("nominatedClusterNames", None)
                if ctx.write_status(wl, status) is not None:
                    ctx.event(wl, "Normal", "MultiKueue", message, COMPONENT)
            return
        if check.get("state") == "Ready":
            return  # the reserving worker went quiet: upstream waits workerLostTimeout (15 min) before a retry
        # nominate every active worker and put a copy on each
        nominated = sorted(workers)
        if (wl.get("status") or {}).get("nominatedClusterNames") != nominated and nominated:
            status = deep_copy(wl.get("status") or {})
            status["nominatedClusterNames"] = nominated
            ctx.write_status(wl, status)
        for n in nominated:
            if remotes[n] is None:
                meta = wl["metadata"]
                clone = {"apiVersion": KUEUE, "kind": "Workload",
                         "metadata": {"name": name, "namespace": ns,
                                      "labels": {**(meta.get("labels") or {}), ORIGIN_LABEL: ORIGIN},
                                      **({"annotations": dict(meta["annotations"])} if meta.get("annotations") else {})},
                         "spec": deep_copy(wl.get("spec") or {})}
                try:
                    workers[n].call("POST", wl_path(ns), clone)
                    mine.add(n)
                except RemoteError as e:
                    self._error(f"{ns}/{name}: creating the copy on {n}: {e}")

    def _set_check(self, wl: dict, check: dict, state: str, message: str) -> None:
        status = deep_copy(wl.get("status") or {})
        for c in status.get("admissionChecks") or []:
            if c.get("name") == check["name"]:
                c.update(state=state, message=message, lastTransitionTime=self.ctx.ts())
        self.ctx.write_status(wl, status)

    def _sync_job(self, job: dict, remote: Remote, *, workload: str | None = None, force: bool = False) -> None:
        """Kueue's ``SyncJob``: create the worker's Job from the manager's, or mirror the worker's Job status back."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        rjob = remote.get(job_path(ns, name))
        if rjob is None:
            if workload is None:
                return
            meta = job["metadata"]
            spec = deep_copy(job.get("spec") or {})
            spec.pop("selector", None)
            spec.pop("managedBy", None)  # the worker's Job controller takes over
            tl = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            for k in TEMPLATE_LABELS:
                tl.pop(k, None)
            labels = {**(meta.get("labels") or {}), PREBUILT_LABEL: workload, ORIGIN_LABEL: ORIGIN}
            remote.call("POST", job_path(ns), {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": ns, "labels": labels,
                             **({"annotations": dict(meta["annotations"])} if meta.get("annotations") else {})},
                "spec": spec})
            return
        if (job.get("spec") or {}).get("suspend") and not force and not (job.get("status") or {}).get("active"):
            return  # "Skipping the sync since the local job is still suspended"
        status = rjob.get("status") or {}
        if (job.get("status") or {}) != status:
            self.ctx.write_status(job, deep_copy(status))


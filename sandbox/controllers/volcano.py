"""Volcano v1.15 as the portal sees it: Job controller, gang scheduler, Queues and bus Commands.

* **Job controller** (batch.volcano.sh/v1alpha1 Job): creates the PodGroup ``<job>-<job uid>`` (``minMember`` =
  ``spec.minAvailable`` (default: sum of task replicas), ``minTaskMember``, ``minResources`` of the first
  ``minAvailable`` pods, ``queue``, ``priorityClassName``) and, once the PodGroup is ``Inqueue``, one pod per task
  replica ``<job>-<task>-<index>`` with Volcano's labels/annotations (``volcano.sh/job-name``,
  ``volcano.sh/task-spec``, ``volcano.sh/task-index``, ``volcano.sh/queue-name``, ``scheduling.k8s.io/group-name``
  ...), ``schedulerName`` ``volcano`` by default. Plugins: ``env`` (``VC_TASK_INDEX``/``VK_TASK_INDEX``), ``svc``
  (headless Service ``<job>``, pod hostname/subdomain), ``pytorch`` (``MASTER_ADDR``, ``MASTER_PORT``,
  ``WORLD_SIZE``, ``RANK``; implies ``svc``). Phases: Pending -> Running (>= minAvailable pods running) ->
  Completing -> Completed (all pods done and >= minSuccess/minAvailable succeeded, or a ``TaskCompleted``/
  ``CompleteJob`` policy) or Failed; ``PodFailed``/``PodEvicted`` policies ``RestartJob`` (Restarting, retryCount+1,
  Failed after ``maxRetry``), ``AbortJob`` (Aborting -> Aborted), ``TerminateJob`` (Terminating -> Terminated),
  ``CompleteJob``. Pods deleted by someone else are recreated while the job runs. ``ttlSecondsAfterFinished``.
* **Commands** (bus.volcano.sh/v1alpha1): ``AbortJob``, ``ResumeJob`` (Aborted -> Restarting -> Pending; like the
  real controller it counts as a retry, volcano#3067), ``RestartJob``, ``TerminateJob``, ``CompleteJob`` on a Job;
  ``OpenQueue``/``CloseQueue`` on a Queue (``Closing`` while it still has running/inqueue PodGroups, then
  ``Closed``). The Command is deleted once executed.
* **Scheduler** (``schedulerName: volcano``): *enqueue* moves a Pending PodGroup to ``Inqueue`` when its Queue is
  ``Open`` and ``allocated + inqueue + minResources <= capability``; *allocate* places pods all-or-nothing: at least
  ``minMember`` pods of the gang must fit on nodes (same filters as kube-scheduler: taints, node
  affinity/selector, resources; no HAMi — Volcano uses its own vGPU resources) and within the queue capability, or
  none is bound (PodGroup condition ``Unschedulable``/``NotEnoughResources``, ``FailedScheduling`` events). Pods with
  ``schedulerName: volcano`` and no PodGroup annotation are placed one by one (no PodGroup object is created for
  them). No preemption/reclaim between queues, no ``proportion``/``capacity`` sharing beyond ``capability``.
* **Queues**: ``default`` (and ``root``) exist from seeding; ``status.state`` defaults to Open; counters
  ``pending``/``inqueue``/``running``/``completed`` (PodGroups by phase) and ``allocated``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from decimal import Decimal

from sandbox.controllers import hypernodes as HN
from sandbox.controllers import resources as R
from sandbox.controllers.common import (
    NODE,
    POD,
    SERVICE,
    VC_COMMAND,
    VC_JOB,
    VC_PODGROUP,
    VC_QUEUE,
    find_condition,
    is_deleting,
    owner_ref,
    uid_of,
)
from sandbox.controllers.scheduler import account, bind, filter_node, is_gated, node_infos, pod_priority
from sandbox.controllers.workloads import build_pod, is_terminal, owned_pods, pod_phase, pods_by_owner
from sandbox.patch import deep_copy

GROUP_ANN = "scheduling.k8s.io/group-name"
TERMINAL = ("Completed", "Failed", "Terminated", "Aborted")
COMPONENT = "vc-controller-manager"
SCHED = "volcano"


def _go_duration(seconds: float) -> str:
    s = int(max(0, seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m}m{sec}s"
    if m:
        return f"{m}m{sec}s"
    return f"{sec}s"


def min_available(job: dict) -> int:
    spec = job.get("spec") or {}
    if spec.get("minAvailable") is not None:
        return int(spec["minAvailable"])
    return sum(int(t.get("minAvailable", t.get("replicas", 1)) or 0) for t in spec.get("tasks") or [])


def task_list(job: dict) -> list[tuple[str, int, dict]]:
    out = []
    for i, t in enumerate((job.get("spec") or {}).get("tasks") or []):
        out.append((t.get("name") or f"default{i}", int(t.get("replicas", 1) or 0), t))
    return out


class Volcano:
    name = "volcano"

    def __init__(self, ctx):
        self.ctx = ctx
        self._domains: tuple[list[dict], dict[str, set[str]]] = ([], {})  # HyperNodes and their nodes, per pass

    def seed(self) -> None:
        ctx = self.ctx
        for name, spec in (("root", {"weight": 1, "reclaimable": False}), ("default", {"weight": 1, "reclaimable": True})):
            if ctx.get(VC_QUEUE, name) is None:
                created = ctx.create({"apiVersion": VC_QUEUE[0], "kind": "Queue", "metadata": {"name": name},
                                      "spec": spec})
                if created is not None:
                    ctx.write_status(created, {"state": "Open", "allocated": {}})

    def reconcile(self) -> None:
        self._commands()
        self._jobs()
        self._schedule()
        self._queue_status()
        self._hypernode_status()

    # ------------------------------------------------------------------------------------------ commands
    def _commands(self) -> None:
        ctx = self.ctx
        for cmd in ctx.list_items(VC_COMMAND):
            target = cmd.get("target") or {}
            action = cmd.get("action") or ""
            ns = cmd["metadata"].get("namespace")
            if target.get("kind") == "Queue":
                q = ctx.get(VC_QUEUE, target.get("name", ""))
                if q is not None and action in ("OpenQueue", "CloseQueue"):
                    status = deep_copy(q.get("status") or {})
                    if action == "OpenQueue":
                        status["state"] = "Open"
                    else:
                        status["state"] = "Closing" if self._queue_busy(q["metadata"]["name"]) else "Closed"
                    ctx.write_status(q, status)
            elif target.get("kind") == "Job":
                job = ctx.get(VC_JOB, target.get("name", ""), ns)
                if job is not None and (not target.get("uid") or target.get("uid") == uid_of(job)):
                    ctx.event(job, "Normal", "CommandIssued",
                              f"Start to execute command {action}, and clean it up to make sure executed not more than once.",
                              COMPONENT)
                    self._apply_action(job, action, cmd.get("reason") or "", cmd.get("message") or "")
            ctx.delete(VC_COMMAND, cmd["metadata"]["name"], ns)

    def _queue_busy(self, qname: str) -> bool:
        for pg in self.ctx.list_items(VC_PODGROUP):
            if (pg.get("spec") or {}).get("queue", "default") == qname and \
                    (pg.get("status") or {}).get("phase") in ("Running", "Inqueue"):
                return True
        return False

    def _apply_action(self, job: dict, action: str, reason: str = "", message: str = "") -> None:
        phase = ((job.get("status") or {}).get("state") or {}).get("phase") or "Pending"
        target = {
            "AbortJob": "Aborting", "TerminateJob": "Terminating", "CompleteJob": "Completing",
            "RestartJob": "Restarting",
        }.get(action)
        if action == "ResumeJob":
            if phase in ("Aborted", "Aborting"):
                target = "Restarting"
            else:
                return
        if target is None or phase in ("Completed", "Failed", "Terminated") or (phase == "Aborted" and target != "Restarting"):
            return
        self._set_phase(job, target, reason or action, message or f"Job {target.lower()} by {action}")

    # ------------------------------------------------------------------------------------------ job controller
    def _set_phase(self, job: dict, phase: str, reason: str = "", message: str = "", **extra) -> dict | None:
        ctx = self.ctx
        status = deep_copy(job.get("status") or {})
        state = status.setdefault("state", {})
        if state.get("phase") == phase and not extra:
            return job
        now = ctx.ts()
        if state.get("phase") != phase:
            state.update({"phase": phase, "reason": reason, "message": message, "lastTransitionTime": now})
            status.setdefault("conditions", []).append({"status": phase, "lastTransitionTime": now})
        status.update(extra)
        res = ctx.write_status(job, status)
        if res is not None:
            job.clear()
            job.update(res)
        return res

    def _jobs(self) -> None:
        ctx = self.ctx
        pods = pods_by_owner(ctx.list_items(POD))
        pgs = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in ctx.list_items(VC_PODGROUP)}
        # the controller's work queue takes jobs as they come: their PodGroups are made in the jobs' order
        for job in sorted(ctx.list_items(VC_JOB), key=lambda j: (j["metadata"].get("creationTimestamp") or "", uid_of(j))):
            if is_deleting(job):
                continue
            try:
                self._sync_job(job, owned_pods(pods, job), pgs)
            except Exception as exc:
                ctx._error("vcjob-sync", VC_JOB, job["metadata"]["name"], exc)

    def _pg_name(self, job: dict) -> str:
        return f"{job['metadata']['name']}-{uid_of(job)}"

    def _ensure_podgroup(self, job: dict, pgs: dict) -> dict | None:
        ctx = self.ctx
        ns, name = job["metadata"]["namespace"], self._pg_name(job)
        pg = pgs.get((ns, name))
        if pg is not None:
            return pg
        spec = job.get("spec") or {}
        mina = min_available(job)
        min_task = {}
        min_res: dict[str, Decimal] = {}
        left = mina
        for tname, replicas, t in task_list(job):
            if t.get("minAvailable") is not None:
                min_task[tname] = int(t["minAvailable"])
            per = R.pod_requests((t.get("template") or {}).get("spec"))
            take = min(replicas, max(0, left))
            left -= take
            min_res = R.add(min_res, R.scale(per, take))
        pg = {
            "apiVersion": VC_PODGROUP[0], "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner_ref(job)],
                         "annotations": {"scheduling.k8s.io/group-name": name}},
            "spec": {"minMember": mina, "queue": spec.get("queue") or "default",
                     "minResources": R.fmt_list(min_res)},
            "status": {"phase": "Pending"},
        }
        if min_task:
            pg["spec"]["minTaskMember"] = min_task
        if spec.get("priorityClassName"):
            pg["spec"]["priorityClassName"] = spec["priorityClassName"]
        if isinstance(spec.get("networkTopology"), dict):  # as the job controller does: the scheduler reads the PodGroup
            pg["spec"]["networkTopology"] = deep_copy(spec["networkTopology"])
        res = ctx.create(pg)
        if res is not None:
            if (res.get("status") or {}).get("phase") != "Pending":
                res = ctx.write_status(res, {"phase": "Pending"}) or res
            pgs[(ns, name)] = res
        return res

    def _sync_job(self, job: dict, pods: list[dict], pgs: dict) -> None:
        ctx = self.ctx
        ns, jname = job["metadata"]["namespace"], job["metadata"]["name"]
        spec = job.get("spec") or {}
        phase = ((job.get("status") or {}).get("state") or {}).get("phase")
        mina = min_available(job)
        if not phase:
            self._set_phase(job, "Pending", "", "", minAvailable=mina, version=0, retryCount=0)
            phase = "Pending"
        live = [p for p in pods if not is_deleting(p)]
        active = [p for p in live if not is_terminal(p)]
        if phase in ("Aborting", "Terminating", "Restarting", "Completing"):
            for p in (live if phase in ("Restarting", "Aborting") else active):
                ctx.delete(POD, p["metadata"]["name"], ns)
            if phase == "Restarting":
                retry = int((job.get("status") or {}).get("retryCount", 0)) + 1
                version = int((job.get("status") or {}).get("version", 0)) + 1
                if retry >= int(spec.get("maxRetry", 3) if spec.get("maxRetry") is not None else 3):
                    self._set_phase(job, "Failed", "", f"Job failed after {retry} retries", retryCount=retry,
                                    version=version)
                else:
                    self._drop_podgroup(job, pgs)
                    self._set_phase(job, "Pending", "", "", retryCount=retry, version=version)
            elif phase == "Aborting":
                self._drop_podgroup(job, pgs)
                self._set_phase(job, "Aborted", "", "Job aborted")
            elif phase == "Terminating":
                self._drop_podgroup(job, pgs)
                self._set_phase(job, "Terminated", "", "Job terminated")
            else:
                self._set_phase(job, "Completed", "", "Job completed")
            self._write_counters(job, owned_pods(ctx.list_items(POD, ns), job))
            return
        if phase in TERMINAL:
            for p in active:
                ctx.delete(POD, p["metadata"]["name"], ns)
            pg = pgs.get((ns, self._pg_name(job)))
            if pg is not None and phase == "Completed" and (pg.get("status") or {}).get("phase") != "Completed":
                st = deep_copy(pg.get("status") or {})
                st["phase"] = "Completed"
                ctx.write_status(pg, st)
            self._write_counters(job, [p for p in live if p not in active])
            self._ttl(job)
            return
        # Pending / Running
        pg = self._ensure_podgroup(job, pgs)
        if pg is None:
            return
        pg_phase = (pg.get("status") or {}).get("phase") or "Pending"
        if pg_phase in ("Inqueue", "Running"):
            existing = {p["metadata"]["name"] for p in live}
            for tname, replicas, t in task_list(job):
                for i in range(replicas):
                    pname = f"{jname}-{tname}-{i}"
                    if pname in existing:
                        continue
                    self._create_pod(job, tname, i, t, pg)
            live = owned_pods(ctx.list_items(POD, ns), job)
            active = [p for p in live if not is_terminal(p) and not is_deleting(p)]
        # policies on failed pods
        failed = [p for p in live if pod_phase(p) == "Failed"]
        if failed:
            action = self._policy_action(job, failed, "PodFailed")
            if action:
                self._apply_action(job, action, "PodFailed", f"Pod {failed[0]['metadata']['name']} failed")
                self._write_counters(job, live)
                return
        running = sum(1 for p in live if pod_phase(p) == "Running")
        succeeded = sum(1 for p in live if pod_phase(p) == "Succeeded")
        total = sum(r for _, r, _ in task_list(job))
        if phase == "Pending" and running + succeeded >= mina and running > 0:
            self._set_phase(job, "Running", "", "")
            phase = "Running"
        if phase == "Running":
            # TaskCompleted -> CompleteJob
            for tname, replicas, t in task_list(job):
                tpods = [p for p in live if (p["metadata"].get("annotations") or {}).get("volcano.sh/task-spec") == tname]
                if replicas and len(tpods) == replicas and all(pod_phase(p) == "Succeeded" for p in tpods):
                    act = self._policy_action(job, [], "TaskCompleted", task=t)
                    if act:
                        self._apply_action(job, act, "TaskCompleted", f"Task {tname} completed")
                        self._write_counters(job, live)
                        return
            done = [p for p in live if is_terminal(p)]
            if total and len(done) >= total:
                need = int(spec["minSuccess"]) if spec.get("minSuccess") is not None else mina
                if succeeded >= need:
                    self._set_phase(job, "Completing", "", "")
                else:
                    self._set_phase(job, "Failed", "", f"{len(failed)} pod(s) failed")
            elif spec.get("minSuccess") is not None and succeeded >= int(spec["minSuccess"]):
                self._set_phase(job, "Completing", "", "")
        self._write_counters(job, live)

    def _policy_action(self, job: dict, failed: list[dict], event: str, task: dict | None = None) -> str | None:
        policies = []
        if task is not None:
            policies += task.get("policies") or []
        else:
            by_task = {t.get("name"): t for _, _, t in task_list(job)}
            for p in failed:
                t = by_task.get((p["metadata"].get("annotations") or {}).get("volcano.sh/task-spec"))
                if t:
                    policies += t.get("policies") or []
        policies += (job.get("spec") or {}).get("policies") or []
        codes = set()
        for p in failed:
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                code = ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
                if code is not None:
                    codes.add(int(code))
        for pol in policies:
            events = ([pol["event"]] if pol.get("event") else []) + list(pol.get("events") or [])
            if event in events or "*" in events:
                return pol.get("action")
            if event == "PodFailed" and pol.get("exitCode") is not None and int(pol["exitCode"]) in codes:
                return pol.get("action")
        return None

    def _drop_podgroup(self, job: dict, pgs: dict) -> None:
        ns, name = job["metadata"]["namespace"], self._pg_name(job)
        if (ns, name) in pgs:
            self.ctx.delete(VC_PODGROUP, name, ns)
            pgs.pop((ns, name), None)

    def _create_pod(self, job: dict, tname: str, index: int, task: dict, pg: dict) -> None:
        ctx = self.ctx
        spec = job.get("spec") or {}
        jname, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        queue = spec.get("queue") or "default"
        version = str((job.get("status") or {}).get("version", 0))
        template = deep_copy(task.get("template") or {})
        tspec = template.setdefault("spec", {})
        tspec.setdefault("schedulerName", spec.get("schedulerName") or "volcano")
        if spec.get("priorityClassName") and not tspec.get("priorityClassName"):
            tspec["priorityClassName"] = spec["priorityClassName"]
        pname = f"{jname}-{tname}-{index}"
        labels = {"volcano.sh/job-name": jname, "volcano.sh/job-namespace": ns, "volcano.sh/queue-name": queue,
                  "volcano.sh/task-spec": tname, "volcano.sh/job-version": version, "volcano.sh/task-index": str(index)}
        ann = {GROUP_ANN: pg["metadata"]["name"], "scheduling.volcano.sh/group-name": pg["metadata"]["name"],
               "volcano.sh/job-name": jname, "volcano.sh/task-spec": tname, "volcano.sh/task-index": str(index),
               "volcano.sh/job-version": version, "volcano.sh/queue-name": queue,
               "volcano.sh/template-uid": f"{jname}-{tname}"}
        pod = build_pod(ctx, job, template, pname, labels=labels, annotations=ann)
        plugins = spec.get("plugins") or {}
        tasks = task_list(job)
        env_add = []
        if "env" in plugins:
            env_add += [{"name": "VC_TASK_INDEX", "value": str(index)}, {"name": "VK_TASK_INDEX", "value": str(index)}]
        if "pytorch" in plugins:
            master = next((n for n, _, _ in tasks if n == "master"), tasks[0][0] if tasks else "master")
            world = sum(r for _, r, _ in tasks)
            rank = index if tname == master else 1 + index
            port = "23456"
            for a in plugins.get("pytorch") or []:
                if str(a).startswith("--port="):
                    port = str(a).split("=", 1)[1]
            env_add += [{"name": "MASTER_ADDR", "value": f"{jname}-{master}-0.{jname}"},
                        {"name": "MASTER_PORT", "value": port}, {"name": "WORLD_SIZE", "value": str(world)},
                        {"name": "RANK", "value": str(rank)}]
        for c in pod["spec"].get("containers") or []:
            env = c.setdefault("env", [])
            have = {e.get("name") for e in env}
            env.extend(e for e in env_add if e["name"] not in have)
            if not env:
                c.pop("env")
        if any(p in plugins for p in ("svc", "pytorch", "mpi", "tensorflow", "ray")):
            pod["spec"].setdefault("hostname", pname)
            pod["spec"].setdefault("subdomain", jname)
            self._ensure_service(job)
        if ctx.create(pod) is not None:
            pass

    def _ensure_service(self, job: dict) -> None:
        ctx = self.ctx
        ns, jname = job["metadata"]["namespace"], job["metadata"]["name"]
        if ctx.get(SERVICE, jname, ns) is not None:
            return
        ctx.create({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": jname, "namespace": ns, "ownerReferences": [owner_ref(job)]},
                    "spec": {"clusterIP": "None", "selector": {"volcano.sh/job-name": jname,
                                                              "volcano.sh/job-namespace": ns},
                             "publishNotReadyAddresses": True,
                             "ports": [{"name": "placeholder-volcano", "port": 1, "protocol": "TCP", "targetPort": 1}]}})

    def _write_counters(self, job: dict, pods: list[dict] | None) -> None:
        ctx = self.ctx
        pods = pods or []
        cur = self.ctx.get(VC_JOB, job["metadata"]["name"], job["metadata"]["namespace"]) or job
        status = deep_copy(cur.get("status") or {})
        counts = Counter(pod_phase(p) for p in pods if not is_deleting(p))
        status["pending"] = counts.get("Pending", 0)
        status["running"] = counts.get("Running", 0)
        status["succeeded"] = counts.get("Succeeded", 0)
        status["failed"] = counts.get("Failed", 0)
        status["terminating"] = 0
        status["unknown"] = 0
        status["minAvailable"] = min_available(cur)
        tsc: dict = defaultdict(lambda: {"phase": {}})
        for p in pods:
            t = (p["metadata"].get("annotations") or {}).get("volcano.sh/task-spec")
            if t:
                ph = tsc[t]["phase"]
                ph[pod_phase(p)] = ph.get(pod_phase(p), 0) + 1
        status["taskStatusCount"] = dict(tsc) if tsc else {}
        plugins = (cur.get("spec") or {}).get("plugins") or {}
        if plugins:
            status["controlledResources"] = {f"plugin-{k}": k for k in sorted(plugins)}
        first_run = next((c.get("lastTransitionTime") for c in status.get("conditions") or []
                          if c.get("status") == "Running"), None)
        unchanged = {k: v for k, v in status.items() if k != "runningDuration"} == \
            {k: v for k, v in (cur.get("status") or {}).items() if k != "runningDuration"}
        if first_run and not unchanged:  # like Volcano: refreshed with other status updates, not on every pass
            end = None
            st = status.get("state") or {}
            if st.get("phase") in TERMINAL:
                end = st.get("lastTransitionTime")
            since = ctx.since(first_run) if end is None else (ctx.since(first_run) - (ctx.since(end) or 0))
            status["runningDuration"] = _go_duration(since or 0)
        ctx.write_status(cur, status)

    def _ttl(self, job: dict) -> None:
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        st = ((job.get("status") or {}).get("state") or {})
        if st.get("phase") not in ("Completed", "Failed", "Terminated"):
            return
        since = self.ctx.since(st.get("lastTransitionTime"))
        if since is not None and since >= float(ttl):
            self.ctx.delete(VC_JOB, job["metadata"]["name"], job["metadata"]["namespace"])

    # ------------------------------------------------------------------------------------------ scheduler
    def _queues(self) -> dict[str, dict]:
        out = {}
        for listed in self.ctx.list_items(VC_QUEUE):
            q = listed
            if not (q.get("status") or {}).get("state"):
                st = deep_copy(q.get("status") or {})
                st["state"] = "Open"
                q = self.ctx.write_status(q, st) or q
            out[q["metadata"]["name"]] = q
        return out

    def _schedule(self) -> None:
        ctx = self.ctx
        queues = self._queues()
        pods = ctx.list_items(POD)
        pgs = [pg for pg in ctx.list_items(VC_PODGROUP) if not is_deleting(pg)]
        nodes = ctx.list_items(NODE)
        infos = node_infos(nodes, pods)
        hypernodes = ctx.list_items(HN.HYPERNODE)
        self._domains = (hypernodes, HN.members_of(hypernodes, {n["metadata"]["name"]: n["metadata"].get("labels") or {}
                                                                for n in nodes}) if hypernodes else {})
        by_group: dict[tuple, list[dict]] = defaultdict(list)
        loose = []
        for p in pods:
            if (p.get("spec") or {}).get("schedulerName") != SCHED or is_deleting(p):
                continue
            g = (p["metadata"].get("annotations") or {}).get(GROUP_ANN)
            if g:
                by_group[(p["metadata"]["namespace"], g)].append(p)
            elif not (p.get("spec") or {}).get("nodeName") and not is_gated(p) and not is_terminal(p):
                loose.append(p)
        # queue usage: requests of bound, active volcano pods per queue
        allocated: dict[str, dict] = defaultdict(dict)
        inqueue_res: dict[str, dict] = defaultdict(dict)
        pg_queue = {(pg["metadata"]["namespace"], pg["metadata"]["name"]): (pg.get("spec") or {}).get("queue") or "default"
                    for pg in pgs}
        for key, members in by_group.items():
            q = pg_queue.get(key, "default")
            for p in members:
                if (p.get("spec") or {}).get("nodeName") and not is_terminal(p):
                    allocated[q] = R.add(allocated[q], R.pod_requests(p.get("spec")))
        for pg in pgs:
            if (pg.get("status") or {}).get("phase") == "Inqueue":
                key = (pg["metadata"]["namespace"], pg["metadata"]["name"])
                if not any((p.get("spec") or {}).get("nodeName") for p in by_group.get(key, [])):
                    q = pg_queue[key]
                    inqueue_res[q] = R.add(inqueue_res[q], R.parse_list((pg.get("spec") or {}).get("minResources")))
        # Volcano's job order: priority, then creation, a tie within the second broken by uid (creation order here)
        pgs.sort(key=lambda pg: (-int((pg.get("spec") or {}).get("priority") or 0),
                                 pg["metadata"].get("creationTimestamp") or "", uid_of(pg)))
        for pg in pgs:
            key = (pg["metadata"]["namespace"], pg["metadata"]["name"])
            phase = (pg.get("status") or {}).get("phase") or "Pending"
            qname = pg_queue[key]
            queue = queues.get(qname)
            cap = R.parse_list(((queue or {}).get("spec") or {}).get("capability"))
            if phase == "Completed":
                continue
            if phase == "Pending":
                if queue is None:
                    self._pg_unschedulable(pg, "NotEnoughResources", f"queue <{qname}> does not exist")
                    continue
                if (queue.get("status") or {}).get("state", "Open") != "Open":
                    self._pg_unschedulable(pg, "NotEnoughResources", f"queue <{qname}> is {(queue.get('status') or {}).get('state')}, podgroup cannot be enqueued")
                    continue
                need = R.parse_list((pg.get("spec") or {}).get("minResources"))
                used = R.add(allocated[qname], inqueue_res[qname])
                over = [r for r in cap if R.add(used, need).get(r, Decimal(0)) > cap[r]]
                if over:
                    self._pg_unschedulable(pg, "NotEnoughResources", "queue resource quota insufficient")
                    continue
                inqueue_res[qname] = R.add(inqueue_res[qname], need)
                st = deep_copy(pg.get("status") or {})
                st["phase"] = "Inqueue"
                ctx.write_status(pg, st)
                continue  # pods are created by the job controller on the next pass
            members = [p for p in by_group.get(key, []) if not is_deleting(p)]
            self._allocate(pg, members, infos, allocated, qname, cap)
        for p in sorted(loose, key=lambda p: (-pod_priority(p), p["metadata"].get("creationTimestamp") or "")):
            self._allocate_loose(p, infos)

    def _allocate(self, pg: dict, members: list[dict], infos: dict, allocated: dict, qname: str, cap: dict) -> None:
        ctx = self.ctx
        min_member = int((pg.get("spec") or {}).get("minMember", 1) or 0)
        bound = [p for p in members if (p.get("spec") or {}).get("nodeName") and not is_terminal(p)]
        done = [p for p in members if pod_phase(p) == "Succeeded"]
        pending = [p for p in members if not (p.get("spec") or {}).get("nodeName") and not is_gated(p)
                   and not is_terminal(p)]
        pending.sort(key=lambda p: (-pod_priority(p), p["metadata"]["name"]))
        if pending:
            plan, first_fail, topology_msg = self._plan_in_topology(pg, pending, infos, allocated, qname, cap,
                                                                    len(bound) + len(done), min_member)
            ready_gang = len(bound) + len(done) + len(plan) >= min_member
            if ready_gang and plan:
                for p, node in plan:
                    if bind(ctx, p, node, None, SCHED) is not None:
                        account(infos[node], p, [])
                        allocated[qname] = R.add(allocated[qname], R.pod_requests(p.get("spec")))
                bound = bound + [p for p, _ in plan]
            elif not ready_gang:
                unsched = len(pending) - len(plan)
                msg = topology_msg or (
                    f"{len(pending) - len(plan)}/{len(pending)} tasks in gang unschedulable: pod group is not ready, "
                    f"{len(pending)} Pending, {min_member} minAvailable; Pending: {unsched} Unschedulable, "
                    f"{len(plan)} Schedulable")
                self._pg_unschedulable(pg, "NetworkTopologyUnsatisfied" if topology_msg else "NotEnoughResources",
                                       msg, node_msg=topology_msg or first_fail)
                for p in pending:
                    _mark_pod(ctx, p, msg)
                return
        self._pg_status(pg, members, bound, done, min_member)

    def _plan_in_topology(self, pg: dict, pending: list[dict], infos: dict, allocated: dict, qname: str, cap: dict,
                          placed: int, min_member: int) -> tuple[list, str | None, str]:
        """The gang's plan: anywhere, or within one HyperNode when its PodGroup asks for a network topology
        (sandbox/controllers/hypernodes.py). Returns (plan, first node failure, the topology's unsatisfied words)."""
        asked = HN.wanted(pg)
        if asked is None:
            plan, first_fail = self._plan(pending, infos, allocated, qname, cap, None)
            return plan, first_fail, ""
        mode, highest = asked
        hypernodes, members = self._domains
        domains = HN.candidates(hypernodes, members, highest)
        tried: list[tuple[str, int, Decimal, int]] = []
        fits = []
        for tier, name, names in domains:
            plan, _fail = self._plan(pending, infos, allocated, qname, cap, names)
            # Free GPUs on the nodes the gang could use (a node refused only for want of room counts).
            usable = {n for n in names if n in infos and all(
                r.startswith("Insufficient ") for r in filter_node(pending[0], infos[n], hami=False)[0])}
            free, _resource = HN.free_gpus(infos, usable)
            if placed + len(plan) >= min_member:
                fits.append((tier, free, name, plan))
            tried.append((name, tier, free, len(plan)))
        if fits:
            fits.sort(key=lambda f: (f[0], f[1], f[2]))  # lowest tier, then the fullest that fits (binpack)
            return fits[0][3], None, ""
        if mode == "soft":
            plan, first_fail = self._plan(pending, infos, allocated, qname, cap, None)
            return plan, first_fail, ""
        need: dict[str, Decimal] = {}
        for p in pending:
            need = R.add(need, R.pod_requests(p.get("spec")))
        gpu = next(((k, v) for k, v in need.items() if R.is_gpu_resource(k)), ("nvidia.com/gpu", Decimal(0)))
        emptiest = max(tried, key=lambda t: (t[2], t[3], -t[1])) if tried else None
        return [], None, HN.unsatisfied_message(pods=len(pending), gpus=gpu[1], highest=highest, emptiest=emptiest,
                                                resource=gpu[0])

    def _plan(self, pending: list[dict], infos: dict, allocated: dict, qname: str, cap: dict,
              only: set[str] | None) -> tuple[list, str | None]:
        """Where each pending pod of a gang would go (on ``only`` those nodes, when given), without binding."""
        sim = {n: ni.clone() for n, ni in infos.items() if only is None or n in only}
        plan = []
        first_fail = None
        use = dict(allocated[qname])
        for p in pending:
            req = R.pod_requests(p.get("spec"))
            if any(R.add(use, req).get(r, Decimal(0)) > cap[r] for r in cap):
                first_fail = first_fail or "queue resource quota insufficient"
                continue
            reasons: Counter = Counter()
            chosen = None
            for ni in sorted(sim.values(), key=lambda n: n.name):
                why, _ = filter_node(p, ni, hami=False)
                if why:
                    for r in why:
                        reasons[r] += 1
                # binpack-ish: fill the fullest feasible node first (Volcano's binpack plugin)
                elif chosen is None or _fill(ni) > _fill(chosen):
                    chosen = ni
            if chosen is None:
                if first_fail is None:
                    parts = sorted(f"{n} {r}" for r, n in reasons.items())
                    first_fail = f"0/{len(sim)} nodes are unavailable: {', '.join(parts)}."
                continue
            account(chosen, p, [])
            use = R.add(use, req)
            plan.append((p, chosen.name))
        return plan, first_fail

    def _pg_status(self, pg: dict, members: list[dict], bound: list[dict], done: list[dict], min_member: int) -> None:
        ctx = self.ctx
        running = sum(1 for p in members if pod_phase(p) == "Running")
        st = deep_copy(pg.get("status") or {})
        phase = st.get("phase") or "Pending"
        if len(bound) + len(done) >= min_member > 0:
            phase = "Running"
            conds = st.setdefault("conditions", [])
            c = find_condition(conds, "Unschedulable")
            if c is not None and c.get("status") == "True":
                c.update({"status": "False", "lastTransitionTime": ctx.ts()})
            if find_condition(conds, "Scheduled") is None:
                conds.append({"type": "Scheduled", "status": "True", "reason": "tasks in gang are ready to be scheduled",
                              "message": "", "lastTransitionTime": ctx.ts(), "transitionID": uid_of(pg)})
        st["phase"] = phase
        st["running"] = running
        st["succeeded"] = len(done)
        st["failed"] = sum(1 for p in members if pod_phase(p) == "Failed")
        for k in ("running", "succeeded", "failed"):
            if not st[k]:
                st.pop(k)
        ctx.write_status(pg, st)

    def _allocate_loose(self, pod: dict, infos: dict) -> None:
        reasons: Counter = Counter()
        chosen = None
        for ni in sorted(infos.values(), key=lambda n: n.name):
            why, _ = filter_node(pod, ni, hami=False)
            if why:
                for r in why:
                    reasons[r] += 1
            elif chosen is None or _fill(ni) > _fill(chosen):
                chosen = ni
        if chosen is None:
            parts = sorted(f"{n} {r}" for r, n in reasons.items())
            _mark_pod(self.ctx, pod, f"0/{len(infos)} nodes are unavailable: {', '.join(parts)}.")
            return
        if bind(self.ctx, pod, chosen.name, None, SCHED) is not None:
            account(chosen, pod, [])

    def _pg_unschedulable(self, pg: dict, reason: str, message: str, node_msg: str | None = None) -> None:
        ctx = self.ctx
        st = deep_copy(pg.get("status") or {})
        st.setdefault("phase", "Pending")
        conds = st.setdefault("conditions", [])
        c = find_condition(conds, "Unschedulable")
        if c is None:
            c = {"type": "Unschedulable"}
            conds.append(c)
        if c.get("status") != "True" or c.get("message") != message:
            c.update({"status": "True", "reason": reason, "message": message, "lastTransitionTime": ctx.ts(),
                      "transitionID": uid_of(pg)})
        ctx.write_status(pg, st)
        ctx.event(pg, "Warning", "Unschedulable", node_msg or message, SCHED, min_interval=30.0)

    # ------------------------------------------------------------------------------------------ hypernodes
    def _hypernode_status(self) -> None:
        """``status.nodeCount`` of each HyperNode: the nodes it holds, recursively (sandbox/controllers/hypernodes.py)."""
        hypernodes = self.ctx.list_items(HN.HYPERNODE)
        if not hypernodes:
            return
        nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in self.ctx.list_items(NODE)}
        members = HN.members_of(hypernodes, nodes)
        for h in hypernodes:
            count = len(members.get(h["metadata"]["name"], ()))
            if (h.get("status") or {}).get("nodeCount") != count:
                st = deep_copy(h.get("status") or {})
                st["nodeCount"] = count
                self.ctx.write_status(h, st)

    # ------------------------------------------------------------------------------------------ queue status
    def _queue_status(self) -> None:
        ctx = self.ctx
        pgs = ctx.list_items(VC_PODGROUP)
        pods = ctx.list_items(POD)
        pg_by_key = {(pg["metadata"]["namespace"], pg["metadata"]["name"]): pg for pg in pgs}
        alloc: dict[str, dict] = defaultdict(dict)
        for p in pods:
            g = (p["metadata"].get("annotations") or {}).get(GROUP_ANN)
            pg = pg_by_key.get((p["metadata"]["namespace"], g)) if g else None
            if pg is None or not (p.get("spec") or {}).get("nodeName") or is_terminal(p):
                continue
            q = (pg.get("spec") or {}).get("queue") or "default"
            alloc[q] = R.add(alloc[q], R.pod_requests(p.get("spec")))
        for q in ctx.list_items(VC_QUEUE):
            name = q["metadata"]["name"]
            counts = Counter((pg.get("status") or {}).get("phase") or "Pending" for pg in pgs
                             if ((pg.get("spec") or {}).get("queue") or "default") == name)
            st = deep_copy(q.get("status") or {})
            st.setdefault("state", "Open")
            if st["state"] == "Closing" and not (counts.get("Running") or counts.get("Inqueue")):
                st["state"] = "Closed"
            st["pending"] = counts.get("Pending", 0)
            st["inqueue"] = counts.get("Inqueue", 0)
            st["running"] = counts.get("Running", 0)
            st["completed"] = counts.get("Completed", 0)
            st["unknown"] = counts.get("Unknown", 0)
            for k in ("pending", "inqueue", "running", "completed", "unknown"):
                if not st[k]:
                    st.pop(k)
            st["allocated"] = R.fmt_list(alloc.get(name, {}))
            ctx.write_status(q, st)


def _fill(ni) -> Decimal:
    a = ni.allocatable.get("cpu", Decimal(1)) or Decimal(1)
    return ni.requested.get("cpu", Decimal(0)) / a + sum(ni.requested.get(k, Decimal(0)) for k in ni.requested
                                                         if R.is_gpu_resource(k))


def _mark_pod(ctx, pod: dict, message: str) -> None:
    from sandbox.controllers.scheduler import mark_unschedulable

    mark_unschedulable(ctx, pod, message, component=SCHED)


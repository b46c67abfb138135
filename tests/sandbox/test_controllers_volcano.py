"""Volcano simulation: gang scheduling, Job phases, Commands, Queue state and capability."""

from __future__ import annotations

import pytest

from sandbox.controllers.sim import GPU_TOLERATION, Sim
from sandbox.store import ApiError

VCJOB = "batch.volcano.sh/v1alpha1"
SCHED = "scheduling.volcano.sh/v1beta1"
BUS = "bus.volcano.sh/v1alpha1"
ONLINE_TOL = {"key": "gpuportal.dev/pool", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.namespace("t")
    return s


def vcjob(name: str, *, replicas: int = 4, gpus: int = 8, queue: str = "default", min_available: int | None = None,
          tolerations: list | None = None, duration: str | None = None, outcome: str | None = None,
          plugins: dict | None = None, policies: list | None = None, max_retry: int | None = None) -> dict:
    tmpl = Sim.pod_template({"nvidia.com/gpu": gpus, "cpu": 8}, tolerations=tolerations or [GPU_TOLERATION],
                            restart="OnFailure", node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    ann = {}
    if duration:
        ann["sandbox.gpuportal.dev/duration"] = duration
    if outcome:
        ann["sandbox.gpuportal.dev/outcome"] = outcome
    spec = {"schedulerName": "volcano", "queue": queue, "minAvailable": min_available if min_available is not None else replicas,
            "tasks": [{"name": "worker", "replicas": replicas, "template": tmpl}]}
    if plugins:
        spec["plugins"] = plugins
    if policies:
        spec["policies"] = policies
    if max_retry is not None:
        spec["maxRetry"] = max_retry
    return {"apiVersion": VCJOB, "kind": "Job", "metadata": {"name": name, "namespace": "t", "annotations": ann},
            "spec": spec}


def phase(sim: Sim, name: str) -> str:
    return sim.get(VCJOB, "Job", name, "t")["status"]["state"]["phase"]


def podgroup(sim: Sim, name: str) -> dict:
    job = sim.get(VCJOB, "Job", name, "t")
    return sim.get(SCHED, "PodGroup", f"{name}-{job['metadata']['uid']}", "t")


def command(sim: Sim, name: str, action: str, target: dict, ns: str = "t") -> None:
    sim.create({"apiVersion": BUS, "kind": "Command", "metadata": {"name": name, "namespace": ns}, "action": action,
                "target": {"apiVersion": target["apiVersion"], "kind": target["kind"],
                           "name": target["metadata"]["name"], "uid": target["metadata"]["uid"], "controller": True}})


def test_default_queues_exist(sim):
    qs = {q["metadata"]["name"]: q for q in sim.items(SCHED, "Queue")}
    assert set(qs) == {"default", "root"} and qs["default"]["status"]["state"] == "Open"


def test_gang_all_or_nothing_with_three_free_nodes(sim):
    # only gpu-h100-1..3 are usable: gpu-h100-0 carries the online taint
    sim.create(vcjob("gang"))
    sim.settle()
    pg = podgroup(sim, "gang")
    assert pg["spec"]["minMember"] == 4 and pg["spec"]["queue"] == "default"
    assert pg["spec"]["minResources"] == {"cpu": "32", "nvidia.com/gpu": "32"}
    assert pg["status"]["phase"] == "Inqueue"
    pods = sim.pods("t")
    assert sorted(p["metadata"]["name"] for p in pods) == [f"gang-worker-{i}" for i in range(4)]
    assert all(not p["spec"].get("nodeName") for p in pods)
    un = next(c for c in pg["status"]["conditions"] if c["type"] == "Unschedulable")
    assert un["status"] == "True" and un["reason"] == "NotEnoughResources"
    assert "1/4 tasks in gang unschedulable" in un["message"]
    p0 = pods[0]
    assert p0["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == pg["metadata"]["name"]
    assert p0["metadata"]["labels"]["volcano.sh/job-name"] == "gang"
    assert p0["metadata"]["annotations"]["volcano.sh/task-spec"] == "worker"
    assert p0["spec"]["schedulerName"] == "volcano"
    c = next(c for c in p0["status"]["conditions"] if c["type"] == "PodScheduled")
    assert c["reason"] == "Unschedulable"
    assert any(e["reason"] == "FailedScheduling" for e in sim.events("t"))
    assert any(e["reason"] == "Unschedulable" and e["involvedObject"]["kind"] == "PodGroup" for e in sim.events("t"))
    sim.advance(100)
    assert phase(sim, "gang") == "Pending"
    assert all(not p["spec"].get("nodeName") for p in sim.pods("t"))


def test_gang_starts_when_four_nodes_fit(sim):
    sim.create(vcjob("gang", tolerations=[GPU_TOLERATION, ONLINE_TOL], duration="600"))
    sim.settle()
    pods = sim.pods("t")
    assert len({p["spec"]["nodeName"] for p in pods}) == 4
    sim.advance(2)
    assert phase(sim, "gang") == "Running"
    pg = podgroup(sim, "gang")
    assert pg["status"]["phase"] == "Running" and pg["status"]["running"] == 4
    st = sim.get(VCJOB, "Job", "gang", "t")["status"]
    assert st["running"] == 4 and st["minAvailable"] == 4
    assert st["taskStatusCount"] == {"worker": {"phase": {"Running": 4}}}
    q = sim.get(SCHED, "Queue", "default")["status"]
    assert q["running"] == 1 and q["allocated"]["nvidia.com/gpu"] == "32"
    sim.advance(600)
    assert phase(sim, "gang") == "Completed"
    st = sim.get(VCJOB, "Job", "gang", "t")["status"]
    assert st["succeeded"] == 4
    assert [c["status"] for c in st["conditions"]] == ["Pending", "Running", "Completing", "Completed"]
    assert st["runningDuration"] == "10m0s"


def test_gang_of_a_second_job_waits_for_the_first(sim):
    tol = [GPU_TOLERATION, ONLINE_TOL]
    sim.create(vcjob("a", replicas=3, tolerations=tol, duration="100"))
    sim.settle()
    sim.create(vcjob("b", replicas=2, tolerations=tol, duration="100"))
    sim.settle()
    assert all(p["spec"].get("nodeName") for p in sim.pods("t", "volcano.sh/job-name=a"))
    assert not any(p["spec"].get("nodeName") for p in sim.pods("t", "volcano.sh/job-name=b"))  # 1 node left, needs 2
    sim.advance(2)
    sim.advance(100)
    assert phase(sim, "a") == "Completed"
    assert all(p["spec"].get("nodeName") for p in sim.pods("t", "volcano.sh/job-name=b"))


def test_failed_pods_fail_the_job_and_restart_policy(sim):
    tol = [GPU_TOLERATION, ONLINE_TOL]
    sim.create(vcjob("bad", replicas=1, tolerations=tol, duration="10", outcome="Failed"))
    sim.create(vcjob("retry", replicas=1, tolerations=tol, duration="10", outcome="Failed", max_retry=2,
                     policies=[{"event": "PodFailed", "action": "RestartJob"}]))
    sim.settle()
    sim.advance(2)
    sim.advance(10)
    assert phase(sim, "bad") == "Failed"
    for _ in range(4):
        sim.advance(2)
        sim.advance(10)
    st = sim.get(VCJOB, "Job", "retry", "t")["status"]
    assert st["state"]["phase"] == "Failed" and st["retryCount"] == 2


def test_abort_and_resume_commands(sim):
    tol = [GPU_TOLERATION, ONLINE_TOL]
    sim.create(vcjob("job", replicas=2, tolerations=tol, duration="1000"))
    sim.settle()
    sim.advance(2)
    job = sim.get(VCJOB, "Job", "job", "t")
    assert job["status"]["state"]["phase"] == "Running"
    command(sim, "abort", "AbortJob", job)
    sim.settle()
    assert phase(sim, "job") == "Aborted"
    assert sim.pods("t") == []
    assert sim.items(BUS, "Command", "t") == []  # executed commands are deleted
    assert any(e["reason"] == "CommandIssued" for e in sim.events("t"))
    q = sim.get(SCHED, "Queue", "default")["status"]
    assert "allocated" in q and q["allocated"].get("nvidia.com/gpu") in (None, "0")
    command(sim, "resume", "ResumeJob", sim.get(VCJOB, "Job", "job", "t"))
    sim.settle()
    sim.advance(2)
    st = sim.get(VCJOB, "Job", "job", "t")["status"]
    assert st["state"]["phase"] == "Running"
    assert st["retryCount"] == 1  # resuming counts as a retry (volcano#3067)
    assert len(sim.pods("t")) == 2


def test_close_and_open_queue(sim):
    sim.create({"apiVersion": SCHED, "kind": "Queue", "metadata": {"name": "team"}, "spec": {"weight": 1}})
    sim.settle()
    queue = sim.get(SCHED, "Queue", "team")
    assert queue["status"]["state"] == "Open"
    command(sim, "close", "CloseQueue", queue, ns="default")
    sim.settle()
    assert sim.get(SCHED, "Queue", "team")["status"]["state"] == "Closed"
    with pytest.raises(ApiError) as ei:  # Volcano's job webhook takes jobs for Open queues only
        sim.create(vcjob("late", replicas=1, queue="team", tolerations=[GPU_TOLERATION, ONLINE_TOL]))
    assert ei.value.code == 400 and "queue `team` status is `Closed`" in ei.value.message
    command(sim, "open", "OpenQueue", queue, ns="default")
    sim.settle()
    assert sim.get(SCHED, "Queue", "team")["status"]["state"] == "Open"
    sim.create(vcjob("late", replicas=1, queue="team", tolerations=[GPU_TOLERATION, ONLINE_TOL]))
    sim.settle()
    assert len(sim.pods("t")) == 1 and sim.pods("t")[0]["spec"].get("nodeName")


def test_close_queue_with_running_jobs_goes_closing_then_closed(sim):
    tol = [GPU_TOLERATION, ONLINE_TOL]
    sim.create(vcjob("run", replicas=1, tolerations=tol, duration="50"))
    sim.settle()
    sim.advance(2)
    command(sim, "close", "CloseQueue", sim.get(SCHED, "Queue", "default"), ns="default")
    sim.settle()
    assert sim.get(SCHED, "Queue", "default")["status"]["state"] == "Closing"
    sim.advance(50)
    assert phase(sim, "run") == "Completed"
    assert sim.get(SCHED, "Queue", "default")["status"]["state"] == "Closed"


def test_queue_capability(sim):
    sim.create({"apiVersion": SCHED, "kind": "Queue", "metadata": {"name": "capped"},
                "spec": {"capability": {"nvidia.com/gpu": "16"}}})
    tol = [GPU_TOLERATION, ONLINE_TOL]
    sim.create(vcjob("one", replicas=2, queue="capped", tolerations=tol, duration="100"))
    sim.settle()
    sim.clock.advance(1)
    sim.create(vcjob("two", replicas=1, queue="capped", tolerations=tol, duration="100"))
    sim.settle()
    assert podgroup(sim, "one")["status"]["phase"] in ("Inqueue", "Running")
    assert podgroup(sim, "two")["status"]["phase"] == "Pending"
    un = next(c for c in podgroup(sim, "two")["status"]["conditions"] if c["type"] == "Unschedulable")
    assert un["message"] == "queue resource quota insufficient"
    sim.advance(2)
    sim.advance(100)
    assert phase(sim, "one") == "Completed"
    sim.settle()
    assert podgroup(sim, "two")["status"]["phase"] in ("Inqueue", "Running")


def test_jobs_of_one_second_are_enqueued_in_the_order_they_came_not_by_name(sim):
    # Volcano orders jobs of one priority by creation and breaks a tie within the (whole) second by uid; the
    # sandbox's uids are time-ordered, so the job that came first is enqueued first even when its name sorts last.
    sim.create({"apiVersion": SCHED, "kind": "Queue", "metadata": {"name": "capped"},
                "spec": {"capability": {"nvidia.com/gpu": "8"}}})
    tol = [GPU_TOLERATION, ONLINE_TOL]
    sim.create(vcjob("req-98", replicas=1, gpus=1, queue="capped", tolerations=tol, duration="100"))
    sim.create(vcjob("req-100", replicas=1, gpus=8, queue="capped", tolerations=tol, duration="100"))
    first, second = (sim.get(VCJOB, "Job", n, "t")["metadata"] for n in ("req-98", "req-100"))
    assert first["creationTimestamp"] == second["creationTimestamp"] and first["uid"] < second["uid"]
    sim.settle()
    assert podgroup(sim, "req-98")["status"]["phase"] in ("Inqueue", "Running")
    assert podgroup(sim, "req-100")["status"]["phase"] == "Pending"
    sim.advance(2)
    assert phase(sim, "req-98") == "Running" and phase(sim, "req-100") == "Pending"


def test_sandbox_uids_are_uuids_in_creation_order(sim):
    import uuid

    names = [f"cm-{i}" for i in range(300)]
    for n in reversed(names):
        sim.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": "t"}})
    uids = [sim.get("v1", "ConfigMap", n, "t")["metadata"]["uid"] for n in reversed(names)]
    assert uids == sorted(uids) and len(set(uids)) == 300
    assert {uuid.UUID(u).version for u in uids} == {7}


def test_plugins_env_svc_pytorch(sim):
    job = vcjob("ddp", replicas=2, tolerations=[GPU_TOLERATION, ONLINE_TOL], plugins={"pytorch": ["--port=29500"], "env": []})
    job["spec"]["tasks"] = [
        {"name": "master", "replicas": 1, "template": job["spec"]["tasks"][0]["template"]},
        {"name": "worker", "replicas": 2, "template": job["spec"]["tasks"][0]["template"]},
    ]
    job["spec"]["minAvailable"] = 3
    sim.create(job)
    sim.settle()
    pods = {p["metadata"]["name"]: p for p in sim.pods("t")}
    assert set(pods) == {"ddp-master-0", "ddp-worker-0", "ddp-worker-1"}
    env = {e["name"]: e.get("value") for e in pods["ddp-worker-1"]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "ddp-master-0.ddp" and env["MASTER_PORT"] == "29500"
    assert env["WORLD_SIZE"] == "3" and env["RANK"] == "2" and env["VC_TASK_INDEX"] == "1"
    assert pods["ddp-worker-1"]["spec"]["hostname"] == "ddp-worker-1" and pods["ddp-worker-1"]["spec"]["subdomain"] == "ddp"
    svc = sim.get("v1", "Service", "ddp", "t")
    assert svc["spec"]["clusterIP"] == "None"

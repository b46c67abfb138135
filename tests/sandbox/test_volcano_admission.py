"""Volcano's job admission webhooks (mutatejob / validatejob.volcano.sh): defaults and refusals at create time."""

from __future__ import annotations

import json

import pytest

from sandbox.controllers.sim import GPU_TOLERATION, Sim
from sandbox.store import ApiError
from sandbox.testing import control, kubectl

VCJOB = "batch.volcano.sh/v1alpha1"
SCHED = "scheduling.volcano.sh/v1beta1"
BUS = "bus.volcano.sh/v1alpha1"
DENIED = 'admission webhook "validatejob.volcano.sh" denied the request: '


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.namespace("t")
    return s


def task(name: str | None = "worker", replicas: int = 2, **extra) -> dict:
    t = {"replicas": replicas, "template": Sim.pod_template({"cpu": 1}, tolerations=[GPU_TOLERATION], restart="Never"),
         **extra}
    if name is not None:
        t["name"] = name
    return t


def job(name: str = "j", *, tasks: list | None = None, ns: str = "t", **spec) -> dict:
    return {"apiVersion": VCJOB, "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"tasks": tasks if tasks is not None else [task()], **spec}}


def refused(sim: Sim, obj: dict) -> str:
    with pytest.raises(ApiError) as ei:
        sim.create(obj)
    assert ei.value.code == 400, ei.value
    assert ei.value.message.startswith(DENIED), ei.value.message
    return ei.value.message[len(DENIED):]


def test_min_available_greater_than_total_replicas_is_refused(sim):
    msg = refused(sim, job(minAvailable=5, tasks=[task("a", 2), task("b", 2)]))
    assert "job 'minAvailable' should not be greater than total replicas in tasks" in msg
    with pytest.raises(ApiError):
        sim.get(VCJOB, "Job", "j", "t")
    sim.create(job(minAvailable=4, tasks=[task("a", 2), task("b", 2)]))  # equal is fine


def test_mutating_webhook_defaults(sim):
    created = sim.create(job(tasks=[task(None, 3), task("ps", 1, minAvailable=0)], plugins={"pytorch": []}))
    spec = created["spec"]
    assert spec["queue"] == "default" and spec["schedulerName"] == "volcano" and spec["maxRetry"] == 3
    assert [t["name"] for t in spec["tasks"]] == ["default0", "ps"]
    assert [t["minAvailable"] for t in spec["tasks"]] == [3, 0]
    assert spec["minAvailable"] == 3  # sum of the tasks' minAvailable
    assert set(spec["plugins"]) == {"pytorch", "svc"}


@pytest.mark.parametrize(("spec", "expected"), [
    ({"tasks": [task("a", 2, minAvailable=3)]}, "'minAvailable' is greater than 'replicas' in task: a, job: j"),
    ({"tasks": [task("a"), task("a")]}, "duplicated task name a"),
    ({"plugins": {"horovod": []}}, "unable to find job plugin: horovod"),
    ({"queue": "nope"}, 'unable to find job queue: queues.scheduling.volcano.sh "nope" not found'),
    ({"policies": [{"event": "PodFailed", "action": "Explode"}]}, "invalid policy action"),
    # internal events are in the CRD's enum but not allowed in policies
    ({"policies": [{"event": "JobUpdated", "action": "RestartJob"}]}, "invalid policy event"),
    ({"policies": [{"event": "PodFailed", "action": "RestartJob"}, {"event": "PodFailed", "action": "AbortJob"}]},
     "duplicate event PodFailed across different policy"),
    ({"policies": [{"event": "*", "action": "RestartJob"}, {"event": "PodFailed", "action": "AbortJob"}]},
     "if there's * here, no other policy should be here"),
    ({"policies": [{"action": "RestartJob"}]}, "either event and exitCode should be specified"),
    ({"policies": [{"event": "PodFailed", "exitCode": 3, "action": "RestartJob"}]},
     "must not specify event and exitCode simultaneously"),
    ({"policies": [{"exitCode": 0, "action": "RestartJob"}]}, "0 is not a valid error code"),
    ({"policies": [{"exitCode": 3, "action": "RestartJob"}, {"exitCode": 3, "action": "AbortJob"}]},
     "duplicate exitCode 3"),
    ({"tasks": [task("a", 1, policies=[{"event": "PodFailed", "action": "Nope"}])]}, "invalid policy action"),
])
def test_validating_webhook_rules(sim, spec, expected):
    assert expected in refused(sim, job(**spec))


@pytest.mark.parametrize(("spec", "field"), [
    ({"minAvailable": -1}, "spec.minAvailable"),
    ({"maxRetry": -1}, "spec.maxRetry"),
    ({"ttlSecondsAfterFinished": -5}, "spec.ttlSecondsAfterFinished"),
    ({"tasks": [task("a", -1)]}, "spec.tasks[0].replicas"),
    ({"tasks": [task("a", 2, minAvailable=-1)]}, "spec.tasks[0].minAvailable"),
    ({"tasks": []}, "spec.tasks"),
    ({"tasks": [task("Bad_Name")]}, "spec.tasks[0].name"),
    ({"policies": [{"event": "PodBoom", "action": "RestartJob"}]}, "spec.policies[0].event"),
])
def test_negative_counts_are_refused_by_the_crd_schema_first(sim, spec, field):
    """The API server validates the CRD schema (minimum: 0) before calling validating webhooks: 422 Invalid."""
    with pytest.raises(ApiError) as ei:
        sim.create(job(**spec))
    assert ei.value.code == 422 and ei.value.reason == "Invalid"
    assert any(c["field"] == field for c in ei.value.causes), ei.value.causes


def test_queue_must_be_open_and_a_leaf(sim):
    sim.create({"apiVersion": SCHED, "kind": "Queue", "metadata": {"name": "parent"}, "spec": {"weight": 1}})
    sim.create({"apiVersion": SCHED, "kind": "Queue", "metadata": {"name": "child"}, "spec": {"weight": 1, "parent": "parent"}})
    sim.settle()
    assert "can only submit job to leaf queue" in refused(sim, job(queue="parent"))
    q = sim.get(SCHED, "Queue", "child")
    sim.create({"apiVersion": BUS, "kind": "Command", "metadata": {"name": "close", "namespace": "default"},
                "action": "CloseQueue", "target": {"apiVersion": SCHED, "kind": "Queue", "name": "child",
                                                   "uid": q["metadata"]["uid"], "controller": True}})
    sim.settle()
    assert sim.get(SCHED, "Queue", "child")["status"]["state"] == "Closed"
    assert "can only submit job to queue with state `Open`, queue `child` status is `Closed`" in \
        refused(sim, job(queue="child"))


def test_updates_may_change_only_min_available_replicas_and_priority(sim):
    sim.create(job(tasks=[task("a", 2)]))
    cur = sim.get(VCJOB, "Job", "j", "t")
    cur["spec"]["tasks"][0]["replicas"] = 3
    sim.store.update(cur)  # allowed
    cur = sim.get(VCJOB, "Job", "j", "t")
    cur["spec"]["tasks"].append(task("b", 1))
    with pytest.raises(ApiError) as ei:
        sim.store.update(cur)
    assert ei.value.code == 400 and "job updates may not add or remove tasks" in ei.value.message
    cur = sim.get(VCJOB, "Job", "j", "t")
    cur["spec"]["minAvailable"] = 10
    with pytest.raises(ApiError) as ei:
        sim.store.update(cur)
    assert "job 'minAvailable' must not be greater than total replicas" in ei.value.message
    cur = sim.get(VCJOB, "Job", "j", "t")
    cur["spec"]["maxRetry"] = 7
    with pytest.raises(ApiError) as ei:
        sim.store.update(cur)
    assert "job updates may not change fields other than" in ei.value.message


def test_refusal_over_http_and_kubectl(sandbox_cluster):
    ns = "vc-admission"
    kubectl(sandbox_cluster, "create", "namespace", ns, "--dry-run=client", "-o", "json")  # kubectl is there
    control(sandbox_cluster, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": ns}})
    body = job("too-big", ns=ns, minAvailable=3, tasks=[task("a", 1)])
    status, _, payload = control(sandbox_cluster, "POST", f"/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs", body)
    assert status == 400 and payload["kind"] == "Status" and payload["status"] == "Failure"
    assert payload["message"] == DENIED + "job 'minAvailable' should not be greater than total replicas in tasks;"
    proc = kubectl(sandbox_cluster, "create", "-f", "-", input=json.dumps(body), check=False)
    assert proc.returncode != 0
    assert "job 'minAvailable' should not be greater than total replicas in tasks" in proc.stderr

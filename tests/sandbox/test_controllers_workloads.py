"""Job / Deployment / StatefulSet controllers and the simulated kubelet (no Kueue involved)."""

from __future__ import annotations

import pytest

from sandbox.controllers.common import parse_duration
from sandbox.controllers.sim import GPU_TOLERATION, Sim

TOL = [GPU_TOLERATION]


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.namespace("t")
    return s


def cond(obj: dict, ctype: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def phases(sim: Sim, selector: str) -> list[str]:
    return sorted(p["status"].get("phase") for p in sim.pods("t", selector))


def test_job_lifecycle_parallelism_completions(sim):
    sim.create(sim.job("train", "t", requests={"cpu": 1}, parallelism=2, completions=3, duration="60",
                       tolerations=TOL))
    sim.settle()
    job = sim.get("batch/v1", "Job", "train", "t")
    pods = sim.pods("t", "job-name=train")
    assert len(pods) == 2 and job["status"]["active"] == 2
    for p in pods:
        assert p["metadata"]["name"].startswith("train-") and len(p["metadata"]["name"]) == len("train-") + 5
        ref = p["metadata"]["ownerReferences"][0]
        assert ref["kind"] == "Job" and ref["controller"] is True
        assert p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "train"
        assert p["metadata"]["labels"]["controller-uid"] == job["metadata"]["uid"]
        assert p["status"]["phase"] == "Pending" and p["spec"]["nodeName"]
    sim.advance(2)
    assert phases(sim, "job-name=train") == ["Running", "Running"]
    p = sim.pods("t", "job-name=train")[0]
    assert p["status"]["podIP"].startswith("10.244.") and p["status"]["containerStatuses"][0]["ready"] is True
    assert cond(p, "Ready")["status"] == "True"
    assert sim.get("batch/v1", "Job", "train", "t")["status"]["ready"] == 2
    sim.advance(60)
    job = sim.get("batch/v1", "Job", "train", "t")
    assert job["status"]["succeeded"] == 2 and job["status"]["active"] == 1
    sim.advance(2)
    sim.advance(60)
    job = sim.get("batch/v1", "Job", "train", "t")
    assert job["status"]["succeeded"] == 3 and "active" not in job["status"]
    assert cond(job, "Complete")["status"] == "True" and cond(job, "Complete")["reason"] == "CompletionsReached"
    assert job["status"]["completionTime"] == "2026-01-01T00:02:04Z"
    term = sim.pods("t", "job-name=train")[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    reasons = [e["reason"] for e in sim.events("t") if e["involvedObject"]["kind"] == "Job"]
    assert reasons.count("SuccessfulCreate") == 3 and "Completed" in reasons
    pod_reasons = {e["reason"] for e in sim.events("t") if e["involvedObject"]["kind"] == "Pod"}
    assert {"Scheduled", "Pulling", "Pulled", "Created", "Started"} <= pod_reasons


def test_indexed_job(sim):
    sim.create(sim.job("idx", "t", requests={"cpu": 1}, parallelism=3, completions=3, indexed=True, duration="10",
                       tolerations=TOL))
    sim.settle()
    pods = sim.pods("t", "job-name=idx")
    idx = sorted(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods)
    assert idx == ["0", "1", "2"]
    for p in pods:
        i = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        assert p["metadata"]["name"].startswith(f"idx-{i}-")
        assert p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == i
    sim.advance(2)
    sim.advance(10)
    job = sim.get("batch/v1", "Job", "idx", "t")
    assert job["status"]["completedIndexes"] == "0-2" and cond(job, "Complete")["status"] == "True"


def test_job_backoff_limit(sim):
    sim.create(sim.job("flaky", "t", requests={"cpu": 1}, duration="5", outcome="Failed", backoff_limit=1,
                       tolerations=TOL))
    sim.settle()
    for _ in range(3):
        sim.advance(2)
        sim.advance(5)
    job = sim.get("batch/v1", "Job", "flaky", "t")
    assert job["status"]["failed"] == 2
    assert cond(job, "Failed")["reason"] == "BackoffLimitExceeded"
    assert cond(job, "Failed")["message"] == "Job has reached the specified backoff limit"
    assert cond(job, "FailureTarget")["status"] == "True"
    assert len(sim.pods("t", "job-name=flaky")) == 2
    p = sim.pods("t", "job-name=flaky")[0]
    assert p["status"]["phase"] == "Failed"
    assert p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    assert any(e["reason"] == "BackoffLimitExceeded" and e["type"] == "Warning" for e in sim.events("t"))


def test_suspended_job_creates_no_pods_and_resumes(sim):
    job = sim.job("s", "t", requests={"cpu": 1}, tolerations=TOL)
    job["spec"]["suspend"] = True
    sim.create(job)
    sim.settle()
    assert sim.pods("t") == []
    j = sim.get("batch/v1", "Job", "s", "t")
    assert cond(j, "Suspended")["status"] == "True" and cond(j, "Suspended")["reason"] == "JobSuspended"
    sim.patch("batch/v1", "Job", "s", "t", {"spec": {"suspend": False}})
    sim.settle()
    j = sim.get("batch/v1", "Job", "s", "t")
    assert cond(j, "Suspended")["status"] == "False" and cond(j, "Suspended")["reason"] == "JobResumed"
    assert len(sim.pods("t")) == 1 and j["status"]["startTime"]
    # suspending again deletes the active pod
    sim.patch("batch/v1", "Job", "s", "t", {"spec": {"suspend": True}})
    sim.settle()
    assert sim.pods("t") == []


def test_active_deadline_and_ttl(sim):
    job = sim.job("dl", "t", requests={"cpu": 1}, duration="1000", tolerations=TOL)
    job["spec"]["activeDeadlineSeconds"] = 30
    job["spec"]["ttlSecondsAfterFinished"] = 60
    sim.create(job)
    sim.settle()
    sim.advance(31)
    j = sim.get("batch/v1", "Job", "dl", "t")
    assert cond(j, "Failed")["reason"] == "DeadlineExceeded"
    assert sim.pods("t") == []
    sim.advance(61)
    assert sim.items("batch/v1", "Job", "t") == []


def test_default_duration_and_logs(sim):
    sim.create(sim.job("d", "t", requests={"cpu": 1, "nvidia.com/gpu": 1}, tolerations=TOL))
    sim.settle()
    sim.advance(2)
    name = sim.pods("t")[0]["metadata"]["name"]
    lines = sim.logs[("t", name)]
    assert any("container started on node" in ln for ln in lines)
    assert any("visible GPU resources nvidia.com/gpu=1" in ln for ln in lines)
    sim.advance(179)
    assert sim.pods("t")[0]["status"]["phase"] == "Running"
    sim.advance(1)
    assert sim.pods("t")[0]["status"]["phase"] == "Succeeded"
    lines = sim.logs[("t", name)]
    assert lines[-1].endswith("work finished, exiting with code 0")
    assert sum(" step " in ln for ln in lines) == 6
    # logs vanish with the pod
    sim.delete("batch/v1", "Job", "d", "t")
    sim.settle()
    assert ("t", name) not in sim.logs


def test_eight_hour_job_finishes_with_fast_clock(sim):
    sim.create(sim.job("long", "t", requests={"cpu": 1}, duration="8h", tolerations=TOL))
    sim.settle()
    sim.advance(2)
    sim.advance(8 * 3600)
    job = sim.get("batch/v1", "Job", "long", "t")
    assert cond(job, "Complete")["status"] == "True"
    assert job["status"]["completionTime"] == "2026-01-01T08:00:02Z"


def deployment(name: str, replicas: int, requests: dict | None = None, annotations: dict | None = None) -> dict:
    tmpl = Sim.pod_template(requests or {"cpu": 1}, tolerations=TOL, labels={"app": name}, annotations=annotations)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "t"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": tmpl}}


def test_deployment_scale_and_status(sim):
    sim.create(deployment("web", 3))
    sim.settle()
    pods = sim.pods("t", "app=web")
    assert len(pods) == 3
    h = pods[0]["metadata"]["labels"]["pod-template-hash"]
    assert all(p["metadata"]["name"].startswith(f"web-{h}-") for p in pods)
    assert all(p["metadata"]["ownerReferences"][0]["kind"] == "Deployment" for p in pods)
    sim.advance(2)
    d = sim.get("apps/v1", "Deployment", "web", "t")
    assert d["status"]["readyReplicas"] == 3 and d["status"]["availableReplicas"] == 3
    assert d["status"]["updatedReplicas"] == 3 and d["status"]["replicas"] == 3
    assert cond(d, "Available")["status"] == "True" and cond(d, "Progressing")["reason"] == "NewReplicaSetAvailable"
    assert f"Scaled up replica set web-{h} from 0 to 3" in [e["message"] for e in sim.events("t", "ScalingReplicaSet")]
    sim.advance(10000)  # no duration annotation: runs until deleted (and Events older than 1 h are gone)
    assert sim.events("t", "ScalingReplicaSet") == []
    assert phases(sim, "app=web") == ["Running"] * 3
    sim.store.update_scale("apps/v1", "Deployment", "web", "t", {"spec": {"replicas": 5}}) \
        if hasattr(sim.store, "update_scale") else sim.patch("apps/v1", "Deployment", "web", "t", {"spec": {"replicas": 5}})
    sim.settle()
    assert len(sim.pods("t", "app=web")) == 5
    sim.patch("apps/v1", "Deployment", "web", "t", {"spec": {"replicas": 1}})
    sim.settle()
    assert len(sim.pods("t", "app=web")) == 1
    sim.advance(2)
    d = sim.get("apps/v1", "Deployment", "web", "t")
    assert d["status"]["replicas"] == 1 and d["status"]["readyReplicas"] == 1
    msgs = [e["message"] for e in sim.events("t", "ScalingReplicaSet")]
    assert f"Scaled up replica set web-{h} from 3 to 5" in msgs
    assert f"Scaled down replica set web-{h} from 5 to 1" in msgs


def test_a_recreate_deployment_is_available_only_when_all_its_replicas_are(sim):
    """Kubernetes allows no unavailable replica outside RollingUpdate: a Recreate Deployment's Available condition
    waits for every replica (it said True at once, with none ready)."""
    recreate = deployment("beat", 1)
    recreate["spec"]["strategy"] = {"type": "Recreate"}
    sim.create(recreate)
    sim.settle()
    d = sim.get("apps/v1", "Deployment", "beat", "t")
    assert "availableReplicas" not in d["status"] and cond(d, "Available")["status"] == "False"
    sim.advance(2)
    d = sim.get("apps/v1", "Deployment", "beat", "t")
    assert d["status"]["availableReplicas"] == 1 and cond(d, "Available")["status"] == "True"



def test_deployment_template_change_replaces_pods(sim):
    sim.create(deployment("api", 2))
    sim.settle()
    old = {p["metadata"]["name"] for p in sim.pods("t", "app=api")}
    sim.patch("apps/v1", "Deployment", "api", "t",
              {"spec": {"template": {"spec": {"containers": [Sim.container({"cpu": 2}, image="registry.example/api:2")]}}}})
    sim.settle()
    new = sim.pods("t", "app=api")
    assert len(new) == 2 and not ({p["metadata"]["name"] for p in new} & old)


def test_deployment_pod_with_duration_is_replaced(sim):
    sim.create(deployment("short", 1, annotations={"sandbox.gpuportal.dev/duration": "30"}))
    sim.settle()
    first = sim.pods("t", "app=short")[0]["metadata"]["name"]
    sim.advance(2)
    sim.advance(30)
    pods = sim.pods("t", "app=short")
    assert len(pods) == 1 and pods[0]["metadata"]["name"] != first


def test_statefulset_with_pvcs(sim):
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "nb", "namespace": "t"},
           "spec": {"replicas": 2, "serviceName": "nb", "selector": {"matchLabels": {"app": "nb"}},
                    "template": Sim.pod_template({"cpu": 1}, tolerations=TOL, labels={"app": "nb"}),
                    "volumeClaimTemplates": [{"metadata": {"name": "home"},
                                              "spec": {"accessModes": ["ReadWriteOnce"],
                                                       "resources": {"requests": {"storage": "10Gi"}}}}]}}
    sim.create(sts)
    sim.settle()
    pods = {p["metadata"]["name"]: p for p in sim.pods("t", "app=nb")}
    assert set(pods) == {"nb-0", "nb-1"}
    p0 = pods["nb-0"]
    assert p0["spec"]["hostname"] == "nb-0" and p0["spec"]["subdomain"] == "nb"
    assert {"name": "home", "persistentVolumeClaim": {"claimName": "home-nb-0"}} in p0["spec"]["volumes"]
    assert p0["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == "nb-0"
    pvcs = {c["metadata"]["name"]: c for c in sim.items("v1", "PersistentVolumeClaim", "t")}
    assert set(pvcs) == {"home-nb-0", "home-nb-1"}
    assert pvcs["home-nb-0"]["status"]["phase"] == "Bound"
    assert pvcs["home-nb-0"]["status"]["capacity"] == {"storage": "10Gi"}
    sim.advance(2)
    s = sim.get("apps/v1", "StatefulSet", "nb", "t")["status"]
    assert s["replicas"] == 2 and s["readyReplicas"] == 2 and s["currentReplicas"] == 2 and s["availableReplicas"] == 2
    sim.patch("apps/v1", "StatefulSet", "nb", "t", {"spec": {"replicas": 1}})
    sim.settle()
    assert [p["metadata"]["name"] for p in sim.pods("t", "app=nb")] == ["nb-0"]
    assert len(sim.items("v1", "PersistentVolumeClaim", "t")) == 2  # claims are retained
    # a deleted pod comes back with the same name and claim
    sim.delete("v1", "Pod", "nb-0", "t")
    sim.settle()
    assert [p["metadata"]["name"] for p in sim.pods("t", "app=nb")] == ["nb-0"]


def test_deleting_owner_removes_pods(sim):
    sim.create(sim.job("gone", "t", requests={"cpu": 1}, tolerations=TOL))
    sim.settle()
    assert sim.pods("t")
    sim.delete("batch/v1", "Job", "gone", "t")
    sim.settle()
    assert sim.pods("t") == []


def test_parse_duration():
    assert parse_duration("300") == 300
    assert parse_duration("90s") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("8h") == 28800
    assert parse_duration("1h30m") == 5400
    assert parse_duration("1.5h") == 5400
    assert parse_duration("soon") is None


def test_pod_with_node_name_skips_the_scheduler(sim):
    sim.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pinned", "namespace": "t"},
                "spec": {"nodeName": "gpu-h100-2", "containers": [Sim.container({"cpu": 1})]}})
    sim.settle()
    sim.advance(2)
    p = sim.get("v1", "Pod", "pinned", "t")
    assert p["status"]["phase"] == "Running"
    assert cond(p, "PodScheduled")["status"] == "True"
    assert not sim.events("t", "Scheduled")

"""Kueue simulation: admission within quota, borrowing/reclaim, preemption, stop policies, ordering, integrations."""

from __future__ import annotations

import pytest

from sandbox.controllers.sim import GPU_TOLERATION, Sim

KUEUE = "kueue.x-k8s.io/v1beta2"
TOL = [GPU_TOLERATION]


def cond(obj: dict, ctype: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return None


def is_true(obj: dict, ctype: str) -> bool:
    c = cond(obj, ctype)
    return bool(c and c["status"] == "True")


def wl(sim: Sim, job_name: str, ns: str = "t") -> dict:
    job = sim.get("batch/v1", "Job", job_name, ns)
    w = sim.workload_of(job)
    assert w is not None, f"no workload for {job_name}"
    return w


def admitted_jobs(sim: Sim, ns: str = "t") -> set[str]:
    out = set()
    for w in sim.items(KUEUE, "Workload", ns):
        if is_true(w, "Admitted") and not is_true(w, "Finished"):
            out.add(w["metadata"]["ownerReferences"][0]["name"])
    return out


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.namespace("t")
    s.create(s.flavor("default"))
    return s


def cpu_setup(sim: Sim, cq: str = "cq", quota: int = 9, **kw) -> None:
    sim.create(sim.cluster_queue(cq, {"default": {"cpu": quota}}, **kw))
    sim.create(sim.local_queue("lq" if cq == "cq" else f"lq-{cq}", "t", cq))


# ------------------------------------------------------------------------------------------------ quota
def test_five_jobs_of_three_pods_only_three_admitted(sim):
    cpu_setup(sim)
    for i in range(5):
        sim.create(sim.job(f"j{i}", "t", requests={"cpu": 1}, parallelism=3, queue="lq", tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"j0", "j1", "j2"}
    for name in ("j3", "j4"):
        job = sim.get("batch/v1", "Job", name, "t")
        assert job["spec"]["suspend"] is True
        c = cond(wl(sim, name), "QuotaReserved")
        assert c["status"] == "False" and c["reason"] == "Pending"
        assert c["message"] == ("couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor "
                                "default, 3 more needed")
    # pods exist only for admitted jobs, 3 each; the job controller never created pods for suspended jobs
    pods = sim.pods("t")
    assert len(pods) == 9
    assert {p["metadata"]["labels"]["job-name"] for p in pods} == {"j0", "j1", "j2"}
    cq = sim.get(KUEUE, "ClusterQueue", "cq")["status"]
    assert cq["admittedWorkloads"] == 3 and cq["pendingWorkloads"] == 2 and cq["reservingWorkloads"] == 3
    assert cq["flavorsReservation"] == [{"name": "default", "resources": [{"name": "cpu", "total": "9", "borrowed": "0"}]}]
    assert cq["flavorsUsage"][0]["resources"][0]["total"] == "9"
    lq = sim.get(KUEUE, "LocalQueue", "lq", "t")["status"]
    assert lq["pendingWorkloads"] == 2 and lq["admittedWorkloads"] == 3
    assert cond(sim.get(KUEUE, "ClusterQueue", "cq"), "Active")["status"] == "True"


def test_single_cpu_jobs_never_exceed_quota_and_release_on_finish(sim):
    cpu_setup(sim)
    for i in range(12):
        sim.create(sim.job(f"j{i:02d}", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL, duration="100"))
    sim.settle()
    assert len(admitted_jobs(sim)) == 9
    sim.advance(5)   # pods running
    sim.advance(100)  # first nine finish -> quota released -> the remaining three are admitted
    finished = [w for w in sim.items(KUEUE, "Workload", "t") if is_true(w, "Finished")]
    assert len(finished) == 9
    assert all(cond(w, "Finished")["reason"] == "Succeeded" for w in finished)
    assert admitted_jobs(sim) == {"j09", "j10", "j11"}
    assert sim.get(KUEUE, "ClusterQueue", "cq")["status"]["flavorsReservation"][0]["resources"][0]["total"] == "3"


def test_finished_job_workload_has_finished_true_and_failed_reason(sim):
    cpu_setup(sim)
    sim.create(sim.job("ok", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL, duration="60"))
    sim.create(sim.job("bad", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL, duration="60", outcome="Failed",
                       backoff_limit=0))
    sim.settle()
    sim.advance(5)
    sim.advance(60)
    ok = wl(sim, "ok")
    assert is_true(ok, "Finished") and cond(ok, "Finished")["reason"] == "Succeeded"
    assert is_true(ok, "Admitted")  # Kueue keeps QuotaReserved/Admitted on finished workloads
    bad = wl(sim, "bad")
    assert is_true(bad, "Finished") and cond(bad, "Finished")["reason"] == "Failed"
    assert cond(bad, "Finished")["message"] == "Job has reached the specified backoff limit"
    status = sim.get(KUEUE, "ClusterQueue", "cq")["status"]
    assert status["admittedWorkloads"] == 0
    assert status["flavorsReservation"][0]["resources"][0]["total"] == "0"


def test_workload_shape(sim):
    sim.create(sim.priority_class("batch-high", 1000))
    sim.create(sim.cluster_queue("cq", {"default": {"cpu": 9, "memory": "64Gi"}}))
    sim.create(sim.local_queue("lq", "t", "cq"))
    sim.create(sim.job("train", "t", requests={"cpu": 2, "memory": "4Gi"}, parallelism=2, queue="lq",
                       priority_class="batch-high", tolerations=TOL))
    sim.settle()
    job = sim.get("batch/v1", "Job", "train", "t")
    w = wl(sim, "train")
    assert w["metadata"]["name"].startswith("job-train-") and len(w["metadata"]["name"]) == len("job-train-") + 5
    ref = w["metadata"]["ownerReferences"][0]
    assert ref["kind"] == "Job" and ref["uid"] == job["metadata"]["uid"] and ref["controller"] is True
    assert w["spec"]["queueName"] == "lq"
    assert w["spec"]["priority"] == 1000
    assert w["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                             "name": "batch-high"}
    ps = w["spec"]["podSets"][0]
    assert ps["name"] == "main" and ps["count"] == 2
    assert ps["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
    adm = w["status"]["admission"]
    assert adm["clusterQueue"] == "cq"
    assert adm["podSetAssignments"] == [{"name": "main", "flavors": {"cpu": "default", "memory": "default"},
                                         "resourceUsage": {"cpu": "4", "memory": "8Gi"}, "count": 2}]
    assert is_true(w, "QuotaReserved") and cond(w, "QuotaReserved")["message"] == "Quota reserved in ClusterQueue cq"
    reasons = {e["reason"] for e in sim.events("t")}
    assert {"QuotaReserved", "Admitted", "CreatedWorkload", "Started", "SuccessfulCreate"} <= reasons


def test_resource_not_covered_is_inadmissible(sim):
    cpu_setup(sim)
    sim.create(sim.job("gpu", "t", requests={"cpu": 1, "nvidia.com/gpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    c = cond(wl(sim, "gpu"), "QuotaReserved")
    assert c["status"] == "False"
    assert c["message"] == "couldn't assign flavors to pod set main: resource nvidia.com/gpu unavailable in ClusterQueue"


def test_missing_local_queue_and_inactive_cluster_queue(sim):
    sim.create(sim.job("nolq", "t", requests={"cpu": 1}, queue="nope", tolerations=TOL))
    sim.create(sim.cluster_queue("held", {"default": {"cpu": 4}}, stop="Hold"))
    sim.create(sim.local_queue("lq-held", "t", "held"))
    sim.create(sim.job("held", "t", requests={"cpu": 1}, queue="lq-held", tolerations=TOL))
    sim.create(sim.local_queue("lq-ghost", "t", "ghost"))
    sim.create(sim.job("ghost", "t", requests={"cpu": 1}, queue="lq-ghost", tolerations=TOL))
    sim.settle()
    c = cond(wl(sim, "nolq"), "QuotaReserved")
    assert (c["status"], c["reason"], c["message"]) == ("False", "Inadmissible", "LocalQueue nope doesn't exist")
    assert cond(wl(sim, "held"), "QuotaReserved")["message"] == "ClusterQueue held is inactive"
    assert cond(wl(sim, "ghost"), "QuotaReserved")["message"] == "ClusterQueue ghost doesn't exist"
    held = sim.get(KUEUE, "ClusterQueue", "held")
    assert cond(held, "Active")["status"] == "False" and cond(held, "Active")["reason"] == "Stopped"
    assert cond(sim.get(KUEUE, "LocalQueue", "lq-ghost", "t"), "Active")["reason"] == "ClusterQueueDoesNotExist"
    # creating the LocalQueue later lets the job in
    sim.create(sim.cluster_queue("cq", {"default": {"cpu": 4}}))
    sim.create(sim.local_queue("nope", "t", "cq"))
    sim.settle()
    assert "nolq" in admitted_jobs(sim)


def test_namespace_selector(sim):
    sim.namespace("other", labels={"tenant": "b"})
    sim.create(sim.cluster_queue("cq", {"default": {"cpu": 4}}, namespace_selector={"matchLabels": {"tenant": "a"}}))
    sim.create(sim.local_queue("lq", "other", "cq"))
    sim.create(sim.job("j", "other", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    c = cond(wl(sim, "j", "other"), "QuotaReserved")
    assert c["reason"] == "Inadmissible" and c["message"] == "Workload namespace doesn't match ClusterQueue selector"


# ------------------------------------------------------------------------------------------------ ordering
def test_priority_order_then_fifo(sim):
    sim.create(sim.priority_class("low", 10))
    sim.create(sim.priority_class("high", 100))
    cpu_setup(sim, quota=2)
    sim.create(sim.job("blocker", "t", requests={"cpu": 2}, queue="lq", tolerations=TOL, duration="50"))
    sim.settle()
    # queued while the blocker runs: creation order a(low), b(high), c(low), d(high)
    for name, prio in (("a", "low"), ("b", "high"), ("c", "low"), ("d", "high")):
        sim.clock.advance(1)
        sim.create(sim.job(name, "t", requests={"cpu": 2}, queue="lq", priority_class=prio, tolerations=TOL,
                           duration="50"))
        sim.settle()
    order = ["blocker"]
    for _ in range(5):
        sim.advance(60)
        order.extend(sorted(admitted_jobs(sim) - set(order)))
    assert order == ["blocker", "b", "d", "a", "c"]


def test_strict_fifo_blocks_behind_head(sim):
    cpu_setup(sim, quota=4, strategy="StrictFIFO")
    sim.create(sim.job("small0", "t", requests={"cpu": 3}, queue="lq", tolerations=TOL))
    sim.settle()
    sim.clock.advance(1)
    sim.create(sim.job("big", "t", requests={"cpu": 4}, queue="lq", tolerations=TOL))
    sim.settle()
    sim.clock.advance(1)
    sim.create(sim.job("small1", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"small0"}  # small1 would fit, but StrictFIFO waits for "big"


def test_best_effort_fifo_lets_smaller_jobs_pass(sim):
    cpu_setup(sim, quota=4)
    sim.create(sim.job("small0", "t", requests={"cpu": 3}, queue="lq", tolerations=TOL))
    sim.settle()
    sim.clock.advance(1)
    sim.create(sim.job("big", "t", requests={"cpu": 4}, queue="lq", tolerations=TOL))
    sim.clock.advance(1)
    sim.create(sim.job("small1", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"small0", "small1"}


# ------------------------------------------------------------------------------------------------ flavors
def test_flavors_tried_in_order_and_node_labels_injected(sim):
    sim.create(sim.flavor("h100", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpuportal.dev/pool": "offline"},
                          tolerations=[GPU_TOLERATION],
                          taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]))
    sim.create(sim.flavor("l40s", {"nvidia.com/gpu.product": "NVIDIA-L40S"}, tolerations=[GPU_TOLERATION]))
    sim.create(sim.cluster_queue("gpu", {"h100": {"cpu": 200, "nvidia.com/gpu": 8},
                                         "l40s": {"cpu": 200, "nvidia.com/gpu": 4}}))
    sim.create(sim.local_queue("lq", "t", "gpu"))
    sim.create(sim.job("first", "t", requests={"cpu": 1, "nvidia.com/gpu": 8}, queue="lq"))
    sim.create(sim.job("second", "t", requests={"cpu": 1, "nvidia.com/gpu": 4}, queue="lq"))
    sim.create(sim.job("third", "t", requests={"cpu": 1, "nvidia.com/gpu": 4}, queue="lq"))
    sim.settle()
    assert wl(sim, "first")["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == "h100"
    assert wl(sim, "second")["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == "l40s"
    msg = cond(wl(sim, "third"), "QuotaReserved")["message"]
    assert msg == ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor "
                   "h100, 4 more needed, insufficient unused quota for nvidia.com/gpu in flavor l40s, 4 more needed")
    job = sim.get("batch/v1", "Job", "first", "t")
    tspec = job["spec"]["template"]["spec"]
    assert tspec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpuportal.dev/pool": "offline"}
    assert GPU_TOLERATION in tspec["tolerations"]
    assert job["spec"]["suspend"] is False
    pod = sim.pods("t", "job-name=first")[0]
    assert pod["spec"]["nodeName"] in {"gpu-h100-1", "gpu-h100-2", "gpu-h100-3"}
    pod2 = sim.pods("t", "job-name=second")[0]
    assert pod2["spec"]["nodeName"].startswith("gpu-l40s-hami-")


def test_flavor_taint_not_tolerated_is_skipped(sim):
    sim.create(sim.flavor("tainted", {"a": "b"}, taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]))
    sim.create(sim.cluster_queue("cq", {"tainted": {"cpu": 4}}))
    sim.create(sim.local_queue("lq", "t", "cq"))
    sim.create(sim.job("j", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    assert cond(wl(sim, "j"), "QuotaReserved")["message"] == (
        "couldn't assign flavors to pod set main: untolerated taint dedicated=x:NoSchedule in flavor tainted")


# ------------------------------------------------------------------------------------------------ cohorts
def cohort_setup(sim: Sim, *, reclaim: str = "Any", lending_limit: int | None = None) -> None:
    sim.create(sim.cluster_queue("lender", {"default": {"cpu": 6}}, cohort="research",
                                 preemption={"reclaimWithinCohort": reclaim},
                                 lending={"default": {"cpu": lending_limit}} if lending_limit is not None else None))
    sim.create(sim.cluster_queue("borrower", {"default": {"cpu": 2}}, cohort="research"))
    sim.create(sim.local_queue("lq-lender", "t", "lender"))
    sim.create(sim.local_queue("lq-borrower", "t", "borrower"))


def test_borrowing_inside_cohort(sim):
    cohort_setup(sim)
    for i in range(3):
        sim.create(sim.job(f"b{i}", "t", requests={"cpu": 2}, queue="lq-borrower", tolerations=TOL))
    sim.create(sim.job("b3", "t", requests={"cpu": 4}, queue="lq-borrower", tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"b0", "b1", "b2"}  # 2 nominal + 4 borrowed; b3 needs 4 more
    st = sim.get(KUEUE, "ClusterQueue", "borrower")["status"]
    assert st["flavorsReservation"][0]["resources"][0] == {"name": "cpu", "total": "6", "borrowed": "4"}
    assert cond(wl(sim, "b3"), "QuotaReserved")["message"].endswith("insufficient unused quota for cpu in flavor default, 2 more needed")


def test_lending_and_borrowing_limits(sim):
    cohort_setup(sim, lending_limit=2)
    sim.create(sim.job("b0", "t", requests={"cpu": 3}, queue="lq-borrower", tolerations=TOL))
    sim.create(sim.job("b1", "t", requests={"cpu": 2}, queue="lq-borrower", tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"b0"}  # 2 own + at most 2 lent
    sim.create(sim.cluster_queue("capped", {"default": {"cpu": 1}}, cohort="research",
                                 borrowing={"default": {"cpu": 0}}))
    sim.create(sim.local_queue("lq-capped", "t", "capped"))
    sim.create(sim.job("c0", "t", requests={"cpu": 2}, queue="lq-capped", tolerations=TOL))
    sim.settle()
    assert "c0" not in admitted_jobs(sim)


def test_reclaim_lent_quota_evicts_borrower_and_requeues(sim):
    cohort_setup(sim)
    sim.create(sim.job("borrow", "t", requests={"cpu": 6}, queue="lq-borrower", tolerations=TOL, duration="1000"))
    sim.settle()
    sim.advance(10)
    assert admitted_jobs(sim) == {"borrow"}
    assert len(sim.pods("t", "job-name=borrow")) == 1
    sim.create(sim.job("owner", "t", requests={"cpu": 6}, queue="lq-lender", tolerations=TOL, duration="100"))
    sim.settle()
    assert admitted_jobs(sim) == {"owner"}
    victim = wl(sim, "borrow")
    ev = cond(victim, "Evicted")
    assert ev["status"] == "True" and ev["reason"] == "Preempted"
    assert ev["message"].startswith("Preempted to accommodate a workload (UID: ")
    assert "due to reclamation within the cohort" in ev["message"]
    assert cond(victim, "Preempted")["reason"] == "InCohortReclamation"
    rq = cond(victim, "Requeued")
    assert rq["status"] == "True" and rq["reason"] == "Preempted"
    assert cond(victim, "QuotaReserved")["status"] == "False" and "admission" not in victim["status"]
    assert cond(victim, "Admitted")["reason"] == "NoReservation"
    job = sim.get("batch/v1", "Job", "borrow", "t")
    assert job["spec"]["suspend"] is True
    assert "nodeSelector" not in job["spec"]["template"]["spec"]
    assert sim.pods("t", "job-name=borrow") == []
    assert {"EvictedDueToPreempted", "Preempted", "Stopped"} <= {e["reason"] for e in sim.events("t")}
    # lender's job finishes -> borrower re-admitted, Evicted/Preempted reset
    sim.advance(5)
    sim.advance(100)
    assert admitted_jobs(sim) == {"borrow"}
    again = wl(sim, "borrow")
    assert cond(again, "Evicted")["status"] == "False"
    assert cond(again, "Evicted")["message"].startswith("Previously: Preempted to accommodate")
    assert cond(again, "Preempted")["status"] == "False"
    assert again["status"]["schedulingStats"]["evictions"] == [{"reason": "Preempted", "underlyingCause": "", "count": 1}]


def test_no_reclaim_when_policy_never(sim):
    cohort_setup(sim, reclaim="Never")
    sim.create(sim.job("borrow", "t", requests={"cpu": 6}, queue="lq-borrower", tolerations=TOL))
    sim.settle()
    sim.create(sim.job("owner", "t", requests={"cpu": 6}, queue="lq-lender", tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"borrow"}


def test_cohort_object_quota_adds_to_pool(sim):
    sim.create({"apiVersion": KUEUE, "kind": "Cohort", "metadata": {"name": "pool"},
                "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                    {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "4"}]}]}]}})
    sim.create(sim.cluster_queue("solo", {"default": {"cpu": 1}}, cohort="pool"))
    sim.create(sim.local_queue("lq", "t", "solo"))
    sim.create(sim.job("j", "t", requests={"cpu": 5}, queue="lq", tolerations=TOL))
    sim.create(sim.job("k", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"j"}


# ------------------------------------------------------------------------------------------------ preemption
def test_preemption_within_cluster_queue_then_readmission(sim):
    sim.create(sim.priority_class("low", 10))
    sim.create(sim.priority_class("high", 1000))
    cpu_setup(sim, quota=4, preemption={"withinClusterQueue": "LowerPriority"})
    sim.create(sim.job("low", "t", requests={"cpu": 4}, queue="lq", priority_class="low", tolerations=TOL,
                       duration="1000"))
    sim.settle()
    sim.advance(10)
    sim.create(sim.job("high", "t", requests={"cpu": 4}, queue="lq", priority_class="high", tolerations=TOL,
                       duration="60"))
    sim.settle()
    assert admitted_jobs(sim) == {"high"}
    low = wl(sim, "low")
    assert cond(low, "Evicted")["reason"] == "Preempted"
    assert cond(low, "Preempted")["reason"] == "InClusterQueue"
    assert "due to prioritization in the ClusterQueue; preemptor path: /cq; preemptee path: /cq" in cond(low, "Evicted")["message"]
    assert is_true(low, "Requeued")
    assert not is_true(low, "Admitted")
    job = sim.get("batch/v1", "Job", "low", "t")
    assert job["spec"]["suspend"] is True and cond(job, "Suspended")["reason"] == "JobSuspended"
    sim.advance(5)
    sim.advance(60)  # high finishes
    assert admitted_jobs(sim) == {"low"}
    assert sim.get("batch/v1", "Job", "low", "t")["spec"]["suspend"] is False
    sim.advance(5)
    assert any(p["status"]["phase"] == "Running" for p in sim.pods("t", "job-name=low"))


def test_no_preemption_of_equal_or_higher_priority(sim):
    sim.create(sim.priority_class("high", 1000))
    cpu_setup(sim, quota=4, preemption={"withinClusterQueue": "LowerPriority"})
    sim.create(sim.job("first", "t", requests={"cpu": 4}, queue="lq", priority_class="high", tolerations=TOL))
    sim.settle()
    sim.create(sim.job("second", "t", requests={"cpu": 4}, queue="lq", priority_class="high", tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"first"}


def test_minimal_victim_set(sim):
    sim.create(sim.priority_class("high", 1000))
    cpu_setup(sim, quota=4, preemption={"withinClusterQueue": "LowerPriority"})
    for i in range(4):
        sim.clock.advance(1)
        sim.create(sim.job(f"small{i}", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL))
        sim.settle()
    sim.create(sim.job("urgent", "t", requests={"cpu": 2}, queue="lq", priority_class="high", tolerations=TOL))
    sim.settle()
    # the two most recently admitted are evicted, not all four
    assert admitted_jobs(sim) == {"small0", "small1", "urgent"}


# ------------------------------------------------------------------------------------------------ stop policies
def test_stop_policy_hold_keeps_running_work(sim):
    cpu_setup(sim, quota=4)
    sim.create(sim.job("running", "t", requests={"cpu": 2}, queue="lq", tolerations=TOL))
    sim.settle()
    sim.patch(KUEUE, "ClusterQueue", "cq", None, {"spec": {"stopPolicy": "Hold"}})
    sim.create(sim.job("new", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"running"}
    assert cond(wl(sim, "new"), "QuotaReserved")["message"] == "ClusterQueue cq is inactive"
    sim.patch(KUEUE, "ClusterQueue", "cq", None, {"spec": {"stopPolicy": "None"}})
    sim.settle()
    assert admitted_jobs(sim) == {"running", "new"}


def test_stop_policy_hold_and_drain_evicts_then_restarts(sim):
    cpu_setup(sim, quota=4)
    sim.create(sim.job("a", "t", requests={"cpu": 2}, queue="lq", tolerations=TOL))
    sim.settle()
    sim.patch(KUEUE, "ClusterQueue", "cq", None, {"spec": {"stopPolicy": "HoldAndDrain"}})
    sim.settle()
    assert admitted_jobs(sim) == set()
    w = wl(sim, "a")
    assert cond(w, "Evicted")["reason"] == "ClusterQueueStopped"
    assert cond(w, "Requeued")["status"] == "False"
    assert sim.get("batch/v1", "Job", "a", "t")["spec"]["suspend"] is True
    sim.patch(KUEUE, "ClusterQueue", "cq", None, {"spec": {"stopPolicy": "None"}})
    sim.settle()
    w = wl(sim, "a")
    assert is_true(w, "Admitted")
    assert cond(w, "Requeued")["reason"] == "ClusterQueueRestarted"


def test_local_queue_hold_and_drain(sim):
    cpu_setup(sim, quota=4)
    sim.create(sim.job("a", "t", requests={"cpu": 2}, queue="lq", tolerations=TOL))
    sim.settle()
    sim.patch(KUEUE, "LocalQueue", "lq", "t", {"spec": {"stopPolicy": "HoldAndDrain"}})
    sim.settle()
    assert cond(wl(sim, "a"), "Evicted")["reason"] == "LocalQueueStopped"
    assert cond(sim.get(KUEUE, "LocalQueue", "lq", "t"), "Active")["reason"] == "Stopped"


def test_deactivation(sim):
    cpu_setup(sim, quota=4)
    sim.create(sim.job("a", "t", requests={"cpu": 2}, queue="lq", tolerations=TOL))
    sim.settle()
    w = wl(sim, "a")
    sim.patch(KUEUE, "Workload", w["metadata"]["name"], "t", {"spec": {"active": False}})
    sim.settle()
    w = wl(sim, "a")
    assert cond(w, "Evicted")["reason"] == "Deactivated" and not is_true(w, "Admitted")
    sim.patch(KUEUE, "Workload", w["metadata"]["name"], "t", {"spec": {"active": True}})
    sim.settle()
    assert is_true(wl(sim, "a"), "Admitted")


# ------------------------------------------------------------------------------------------------ integrations
def test_deployment_pods_are_individual_workloads(sim):
    cpu_setup(sim, quota=2)
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "web", "namespace": "t", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
           "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                                 "spec": {"tolerations": TOL, "containers": [Sim.container({"cpu": 1})]}}}}
    sim.create(dep)
    sim.settle()
    pods = sim.pods("t", "app=web")
    assert len(pods) == 3
    wls = sim.items(KUEUE, "Workload", "t")
    assert len(wls) == 3 and all(w["metadata"]["name"].startswith("pod-web-") for w in wls)
    assert all(w["metadata"]["ownerReferences"][0]["kind"] == "Pod" for w in wls)
    gated = [p for p in pods if p["spec"].get("schedulingGates")]
    assert len(gated) == 1 and gated[0]["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    assert gated[0]["status"]["phase"] == "Pending" and not gated[0]["spec"].get("nodeName")
    assert sum(1 for p in pods if p["spec"].get("nodeName")) == 2
    # scaling down frees quota for the gated one (or removes it)
    sim.patch("apps/v1", "Deployment", "web", "t", {"spec": {"replicas": 2}})
    sim.settle()
    pods = sim.pods("t", "app=web")
    assert len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods)
    assert len(sim.items(KUEUE, "Workload", "t")) == 2


def test_statefulset_is_one_workload(sim):
    cpu_setup(sim, quota=4)
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "nb", "namespace": "t", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
           "spec": {"replicas": 2, "serviceName": "nb", "selector": {"matchLabels": {"app": "nb"}},
                    "template": {"metadata": {"labels": {"app": "nb"}},
                                 "spec": {"tolerations": TOL, "containers": [Sim.container({"cpu": 1})]}}}}
    sim.create(sts)
    sim.settle()
    wls = sim.items(KUEUE, "Workload", "t")
    assert len(wls) == 1
    w = wls[0]
    assert w["metadata"]["name"].startswith("statefulset-nb-") and w["spec"]["podSets"][0]["count"] == 2
    assert is_true(w, "Admitted")
    pods = sim.pods("t", "app=nb")
    assert {p["metadata"]["name"] for p in pods} == {"nb-0", "nb-1"}
    assert all(p["spec"].get("nodeName") and not p["spec"].get("schedulingGates") for p in pods)
    assert all(p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == w["metadata"]["name"] for p in pods)


def test_plain_pod_with_queue_label_is_gated_until_admitted(sim):
    cpu_setup(sim, quota=1)
    for name in ("p1", "p2"):
        sim.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": "t", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
                    "spec": {"tolerations": TOL, "containers": [Sim.container({"cpu": 1})]}})
        sim.clock.advance(1)
    sim.settle()
    p1, p2 = sim.get("v1", "Pod", "p1", "t"), sim.get("v1", "Pod", "p2", "t")
    assert p1["spec"].get("nodeName") and not p1["spec"].get("schedulingGates")
    assert not p2["spec"].get("nodeName") and p2["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    sim.advance(5)
    sim.advance(180)  # p1 finishes (default 180 s) -> p2 admitted
    assert sim.get("v1", "Pod", "p1", "t")["status"]["phase"] == "Succeeded"
    assert sim.get("v1", "Pod", "p2", "t")["spec"].get("nodeName")


def test_default_local_queue_manages_unlabelled_jobs(sim):
    cpu_setup(sim, quota=1)
    sim.create(sim.local_queue("default", "t", "cq"))
    sim.create(sim.job("a", "t", requests={"cpu": 1}, tolerations=TOL))
    sim.create(sim.job("b", "t", requests={"cpu": 1}, tolerations=TOL))
    sim.settle()
    assert admitted_jobs(sim) == {"a"}
    assert sim.get("batch/v1", "Job", "b", "t")["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"


def test_unknown_workload_priority_class_blocks_workload(sim):
    cpu_setup(sim)
    sim.create(sim.job("x", "t", requests={"cpu": 1}, queue="lq", priority_class="ghost", tolerations=TOL))
    sim.settle()
    assert sim.workload_of(sim.get("batch/v1", "Job", "x", "t")) is None
    assert sim.get("batch/v1", "Job", "x", "t")["spec"]["suspend"] is True
    assert any(e["reason"] == "ErrWorkloadCompose" for e in sim.events("t"))


def test_settles_quickly_and_stays_quiet(sim):
    cpu_setup(sim)
    for i in range(4):
        sim.create(sim.job(f"j{i}", "t", requests={"cpu": 3}, queue="lq", tolerations=TOL))
    assert sim.settle() <= 5
    rv = sim.store.resource_version()
    sim.tick()
    sim.tick()
    assert sim.store.resource_version() == rv
    assert not list(sim.controllers.errors)


def test_pending_event_only_when_message_changes(sim):
    cpu_setup(sim, quota=1)
    sim.create(sim.job("big", "t", requests={"cpu": 2}, queue="lq", tolerations=TOL))
    sim.settle()
    sim.advance(100)
    pend = [e for e in sim.events("t", "Pending") if e["involvedObject"]["kind"] == "Workload"]
    assert len(pend) == 1 and pend[0]["count"] == 1
    assert pend[0]["message"].startswith("couldn't assign flavors to pod set main: insufficient quota for cpu in "
                                         "flavor default, previously considered podsets requests (0) + current podset "
                                         "request (2) > maximum capacity (1)")


def test_volcano_pods_in_namespace_with_default_local_queue_are_gated_one_by_one(sim):
    """docs/cluster-objects.md, "Kueue and Volcano together": Kueue's pod integration gates every pod of a non-Kueue owner in such namespaces."""
    cpu_setup(sim, quota=1)
    sim.create(sim.local_queue("default", "t", "cq"))
    tmpl = Sim.pod_template({"cpu": 1}, tolerations=TOL)
    sim.create({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "vc", "namespace": "t"},
                "spec": {"minAvailable": 2, "tasks": [{"name": "w", "replicas": 2, "template": tmpl}]}})
    sim.settle()
    pods = sim.pods("t", "volcano.sh/job-name=vc")
    assert len(pods) == 2
    wls = [w for w in sim.items(KUEUE, "Workload", "t") if w["metadata"]["name"].startswith("pod-vc-")]
    assert len(wls) == 2  # the gang is split into single-pod workloads; only one fits the quota
    assert sum(1 for p in pods if p["spec"].get("schedulingGates")) == 1
    assert all(not p["spec"].get("nodeName") for p in pods)  # and the gang can never start


def test_hami_job_quota_uses_transformed_totals(sim):
    sim.create(sim.flavor("l40s-share", {"gpu": "on"}, tolerations=[GPU_TOLERATION]))
    sim.create(sim.cluster_queue("share", {"l40s-share": {"cpu": 16, "nvidia.com/gpu": 8, "nvidia.com/total-gpumem": 80000,
                                                          "nvidia.com/total-gpucores": 200}}))
    sim.create(sim.local_queue("lq", "t", "share"))
    req = {"cpu": 1, "nvidia.com/gpu": 2, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 50}
    sim.create(sim.job("a", "t", requests=req, queue="lq"))
    sim.create(sim.job("b", "t", requests=req, queue="lq"))
    sim.create(sim.job("c", "t", requests=req, queue="lq"))
    sim.settle()
    assert admitted_jobs(sim) == {"a", "b"}
    usage = wl(sim, "a")["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
    assert usage == {"cpu": "1", "nvidia.com/gpu": "2", "nvidia.com/total-gpucores": "100",
                     "nvidia.com/total-gpumem": "40k"}
    assert "total-gpucores" in cond(wl(sim, "c"), "QuotaReserved")["message"]
    pod = sim.pods("t", "job-name=a")[0]
    assert pod["spec"]["nodeName"].startswith("gpu-l40s-hami-")


# ------------------------------------------------------------------------------------------------ deletion
def _cq(sim: Sim, name: str = "cq") -> dict | None:
    return next((q for q in sim.items(KUEUE, "ClusterQueue") if q["metadata"]["name"] == name), None)


def test_a_cluster_queue_in_use_stays_terminating_until_its_workloads_finish(sim):
    """Kueue's ``kueue.x-k8s.io/resource-in-use`` finalizer: a deleted ClusterQueue that still holds admitted work
    stays (deletionTimestamp set, Active=False reason Terminating, usage still shown), admits nothing new, and goes
    once its last admitted Workload finished."""
    cpu_setup(sim, quota=4)
    sim.settle()
    assert "kueue.x-k8s.io/resource-in-use" in _cq(sim)["metadata"]["finalizers"]
    sim.create(sim.job("running", "t", requests={"cpu": 2}, queue="lq", tolerations=TOL, duration="120s"))
    sim.settle()
    assert admitted_jobs(sim) == {"running"}
    sim.delete(KUEUE, "ClusterQueue", "cq")
    sim.create(sim.job("new", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    cq = _cq(sim)
    assert cq is not None and cq["metadata"].get("deletionTimestamp")
    active = cond(cq, "Active")
    assert (active["status"], active["reason"]) == ("False", "Terminating")
    assert cq["status"]["admittedWorkloads"] == 1
    assert cq["status"]["flavorsReservation"][0]["resources"][0]["total"] == "2"
    assert admitted_jobs(sim) == {"running"}
    assert cond(wl(sim, "new"), "QuotaReserved")["message"] == "ClusterQueue cq is inactive"
    sim.advance(200)  # the running Job finishes
    sim.settle()
    assert _cq(sim) is None
    assert not is_true(wl(sim, "new"), "QuotaReserved")  # pending work does not keep a ClusterQueue


def test_an_unused_cluster_queue_goes_at_once(sim):
    cpu_setup(sim, quota=4)
    sim.settle()
    sim.delete(KUEUE, "ClusterQueue", "cq")
    sim.settle()
    assert _cq(sim) is None

"""Incremental controllers: skipped passes, dirty quota groups, status refresh, late notifications, webhook rules.

Behaviour must be the same as a full pass every tick; these tests poke at the places where skipping could go wrong.
(Speed is measured by ``tests/bench/sandbox_bench.py``, not here.)"""

from __future__ import annotations

import threading

import pytest

from sandbox.controllers.sim import GPU_TOLERATION, Sim
from sandbox.store import ApiError

KUEUE = "kueue.x-k8s.io/v1beta2"
TOL = [GPU_TOLERATION]


def cond(obj: dict, ctype: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return None


def admitted(sim: Sim, ns: str) -> set[str]:
    out = set()
    for w in sim.items(KUEUE, "Workload", ns):
        c, f = cond(w, "Admitted"), cond(w, "Finished")
        if c and c["status"] == "True" and not (f and f["status"] == "True"):
            out.add(w["metadata"]["ownerReferences"][0]["name"])
    return out


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.create(s.flavor("default"))
    return s


def test_idle_ticks_skip_controllers_and_write_nothing(sim):
    sim.namespace("t")
    sim.create(sim.cluster_queue("cq", {"default": {"cpu": 4}}))
    sim.create(sim.local_queue("lq", "t", "cq"))
    sim.settle()
    rv = sim.store.resource_version()
    skipped = sim.controllers.skipped
    for _ in range(3):
        sim.tick()
    assert sim.store.resource_version() == rv
    assert sim.controllers.skipped > skipped  # Kueue & co. were not run at all


def test_capacity_freed_in_one_queue_admits_a_borrower_of_another(sim):
    # two ClusterQueues of one cohort: a pending workload of cq-b must be re-evaluated when cq-a's job finishes
    sim.namespace("a")
    sim.namespace("b")
    sim.create(sim.cluster_queue("cq-a", {"default": {"cpu": 2}}, cohort="pool"))
    sim.create(sim.cluster_queue("cq-b", {"default": {"cpu": 2}}, cohort="pool"))
    sim.create(sim.local_queue("lq", "a", "cq-a"))
    sim.create(sim.local_queue("lq", "b", "cq-b"))
    sim.create(sim.job("big-a", "a", requests={"cpu": 3}, queue="lq", tolerations=TOL, duration="60s"))
    sim.settle()
    assert admitted(sim, "a") == {"big-a"}
    sim.create(sim.job("big-b", "b", requests={"cpu": 3}, queue="lq", tolerations=TOL, duration="60s"))
    sim.settle()
    assert admitted(sim, "b") == set()
    sim.advance(70)
    assert admitted(sim, "b") == {"big-b"}


def test_unrelated_queue_stays_untouched_and_counts_follow(sim):
    for i in range(3):
        sim.namespace(f"n{i}")
        sim.create(sim.cluster_queue(f"cq{i}", {"default": {"cpu": 1}}))
        sim.create(sim.local_queue("lq", f"n{i}", f"cq{i}"))
    sim.settle()
    other = sim.get(KUEUE, "ClusterQueue", "cq2")
    sim.create(sim.job("j0", "n0", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.create(sim.job("j1", "n0", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    cq0 = sim.get(KUEUE, "ClusterQueue", "cq0")
    assert cq0["status"]["reservingWorkloads"] == 1 and cq0["status"]["pendingWorkloads"] == 1
    lq0 = sim.get(KUEUE, "LocalQueue", "lq", "n0")
    assert lq0["status"]["pendingWorkloads"] == 1
    assert sim.get(KUEUE, "ClusterQueue", "cq2")["metadata"]["resourceVersion"] == other["metadata"]["resourceVersion"]
    # a LocalQueue recreated for another ClusterQueue (spec.clusterQueue is immutable) takes its workloads along
    sim.delete(KUEUE, "LocalQueue", "lq", "n0")
    sim.settle()
    assert sim.get(KUEUE, "ClusterQueue", "cq0")["status"]["pendingWorkloads"] == 0
    sim.create(sim.local_queue("lq", "n0", "cq1"))
    sim.settle()
    assert sim.get(KUEUE, "ClusterQueue", "cq0")["status"]["pendingWorkloads"] == 0
    assert sim.get(KUEUE, "ClusterQueue", "cq1")["status"]["reservingWorkloads"] == 1


def test_local_queue_created_before_its_cluster_queue_becomes_active(sim):
    sim.namespace("t")
    sim.create(sim.local_queue("lq", "t", "later"))
    sim.settle()
    assert cond(sim.get(KUEUE, "LocalQueue", "lq", "t"), "Active")["reason"] == "ClusterQueueDoesNotExist"
    sim.create(sim.cluster_queue("later", {"default": {"cpu": 1}}))
    sim.settle()
    assert cond(sim.get(KUEUE, "LocalQueue", "lq", "t"), "Active")["status"] == "True"


def test_namespace_label_change_re_runs_admission(sim):
    sim.namespace("t")
    sim.create(sim.cluster_queue("cq", {"default": {"cpu": 1}},
                                 namespace_selector={"matchLabels": {"team": "x"}}))
    sim.create(sim.local_queue("lq", "t", "cq"))
    sim.create(sim.job("j", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL))
    sim.settle()
    assert admitted(sim, "t") == set()
    sim.patch("v1", "Namespace", "t", None, {"metadata": {"labels": {"team": "x"}}})
    sim.settle()
    assert admitted(sim, "t") == {"j"}


def test_writes_from_another_thread_reach_the_informer_before_a_tick(sim):
    sim.namespace("t")
    sim.create(sim.cluster_queue("cq", {"default": {"cpu": 8}}))
    sim.create(sim.local_queue("lq", "t", "cq"))
    sim.settle()

    def writer():
        for i in range(20):
            sim.create(sim.job(f"j{i}", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL))

    th = threading.Thread(target=writer)
    th.start()
    while th.is_alive():
        sim.tick()
    th.join()
    sim.settle()
    assert len(admitted(sim, "t")) == 8
    assert sim.controllers.ctx.informer.reloads == 0  # in-flight notifications were drained, not reloaded


def test_job_pods_run_to_completion_with_coarse_clock_steps(sim):
    sim.namespace("t")
    sim.create(sim.cluster_queue("cq", {"default": {"cpu": 4}}))
    sim.create(sim.local_queue("lq", "t", "cq"))
    for i in range(6):
        sim.create(sim.job(f"j{i}", "t", requests={"cpu": 1}, queue="lq", tolerations=TOL, duration="30s"))
    sim.settle()
    for _ in range(4):
        sim.advance(40)
    for i in range(6):
        job = sim.get("batch/v1", "Job", f"j{i}", "t")
        assert cond(job, "Complete")["status"] == "True", job["status"]


@pytest.mark.parametrize("field", ["nominalQuota", "borrowingLimit", "lendingLimit"])
def test_negative_quota_is_rejected_naming_the_field(sim, field):
    cq = sim.cluster_queue("neg", {"default": {"nvidia.com/gpu": 4}}, cohort="c")
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0][field] = "-4"
    with pytest.raises(ApiError) as e:
        sim.create(cq)
    assert e.value.code == 422
    path = f"spec.resourceGroups[0].flavors[0].resources[0].{field}"
    assert [c["field"] for c in e.value.status()["details"]["causes"]] == [path]
    assert "must be greater than or equal to 0" in e.value.status()["message"]

"""Materialization against the sandbox cluster through the official client: apply, change, archive,
drift repair, a Job admitted within quota and borrowing, faults, a 422, architecture changes."""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal as D

import pytest
from django.utils import timezone

from portal.kube import ClusterUnavailable, Kube
from quotas import manifests as m
from quotas.demo import seed_quota_demo
from quotas.exceptions import PlanChanged
from quotas.models import AppliedObject, Cluster, Flavor, Quota
from quotas.architecture import architecture_change_apply, architecture_change_start
from quotas.reconcile import plan_apply, plan_build, plan_fingerprint, plan_for_architecture_change, reconcile, snapshot_load
from sandbox.testing import control, kubectl
from tenants.access import Actor
from tenants.models import AuditEntry, Project

pytestmark = pytest.mark.django_db
KUEUE = m.KUEUE
GPU = "nvidia.com/gpu"


@pytest.fixture
def demo(cast, fresh_sandbox, settings):
    """The demo cluster (B, flavors from discovery, the demo quotas) on a fresh sandbox, nothing applied yet."""
    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    summary = seed_quota_demo(architecture="B", reconcile_now=False)
    assert summary["flavors_created"] == 7 and summary["inventory"]["seen"] == 10  # 8 GPU + 2 CPU nodes
    cluster = Cluster.objects.get(name="sandbox")
    kube = Kube(kubeconfig_path=str(fresh_sandbox.kubeconfig))
    return cluster, kube, fresh_sandbox


def ours(kube: Kube, api_version: str, kind: str) -> list[dict]:
    return kube.list(api_version, kind, label_selector=f"{m.MANAGED_BY}={m.MANAGER}")[0]


def names(kube: Kube, api_version: str, kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in ours(kube, api_version, kind)}


def test_apply_from_scratch_then_a_noop_writes_nothing(demo) -> None:
    cluster, kube, sb = demo
    result = reconcile(cluster, kube=kube)
    assert result.ok and result.applied == len(m.desired_state(cluster, snapshot_load(cluster)))
    assert names(kube, KUEUE, "Cohort") == {"acme", "globex"}
    assert names(kube, KUEUE, "ClusterQueue") == {"acme-vision", "acme-nlp", "globex-llm"}
    # kubectl sees what the portal promised (the "kubectl get cohorts,clusterqueues,localqueues -A").
    out = json.loads(kubectl(sb, "get", "clusterqueues", "-o", "json").stdout)
    vision = next(i for i in out["items"] if i["metadata"]["name"] == "acme-vision")
    h100 = vision["spec"]["resourceGroups"][0]["flavors"][0]
    assert h100["name"] == "h100-80gb-offline" and h100["resources"][0]["nominalQuota"] == "6"
    lqs = kubectl(sb, "get", "localqueues", "-A", "-o", "name").stdout.split()
    assert sorted(lqs) == ["localqueue.kueue.x-k8s.io/acme-nlp", "localqueue.kueue.x-k8s.io/acme-vision",
                           "localqueue.kueue.x-k8s.io/globex-llm"]
    assert AppliedObject.objects.filter(cluster=cluster, error="").count() == result.applied
    # The no-op: only list calls (one per kind), no writes.
    before = Counter(kube.calls)
    again = reconcile(cluster, kube=kube)
    calls = Counter(kube.calls) - before
    assert again.applied == again.deleted == 0
    assert calls["apply"] == calls["delete"] == calls["get"] == 0
    assert calls["list"] == len(m.KIND_ORDER) - len(m.MULTIKUEUE_KINDS)  # no MultiKueue kinds off a manager


def test_changing_a_quota_plans_a_diff_and_applies_it(demo) -> None:
    cluster, kube, _ = demo
    reconcile(cluster, kube=kube)
    Quota.objects.filter(project__slug="acme-vision", flavor__name="h100-80gb-offline", resource=GPU).update(nominal=D(8))
    plan = plan_build(cluster, kube=kube)
    changed = {i.label for i in plan.changes}
    # The project's queue, its tenant's cohort (the unassigned pool shrinks 2 -> 0) and the guard rail.
    assert changed == {"ClusterQueue acme-vision", "Cohort acme", "ResourceQuota acme-vision/gpu-portal"}
    assert not plan.creates and not plan.deletes
    diff = next(i.diff for i in plan.changes if i.label == "ClusterQueue acme-vision")
    assert "-        nominalQuota: '6'" in diff and "+        nominalQuota: '8'" in diff
    assert plan_apply(plan, kube=kube).ok
    cq = kube.get(KUEUE, "ClusterQueue", "acme-vision")
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == "8"
    assert plan_build(cluster, kube=kube).empty


def test_archiving_a_project_deletes_its_objects(demo) -> None:
    cluster, kube, _ = demo
    reconcile(cluster, kube=kube)
    Project.objects.filter(slug="acme-nlp").update(status=Project.Status.ARCHIVED)
    plan = plan_build(cluster, kube=kube)
    # The namespace (and what users left in it) is retained until the retention period ends or ops confirm.
    assert {i.label for i in plan.deletes} == {"ClusterQueue acme-nlp", "LocalQueue acme-nlp/acme-nlp",
                                               "ResourceQuota acme-nlp/gpu-portal", "LimitRange acme-nlp/gpu-portal"}
    result = plan_apply(plan, kube=kube)
    assert result.ok and result.deleted == 4
    assert "acme-nlp" not in names(kube, KUEUE, "ClusterQueue")
    assert kube.get("v1", "Namespace", "acme-nlp") is not None
    Project.objects.filter(slug="acme-nlp").update(namespace_released_at=timezone.now())
    plan = plan_build(cluster, kube=kube)
    assert {i.label for i in plan.deletes} == {"Namespace acme-nlp"}
    assert plan_apply(plan, kube=kube).deleted == 1
    assert not AppliedObject.objects.filter(cluster=cluster, name="acme-nlp").exists()


def test_drift_deleted_or_edited_by_hand_is_restored(demo) -> None:
    cluster, kube, sb = demo
    reconcile(cluster, kube=kube)
    kubectl(sb, "delete", "localqueue", "acme-vision", "-n", "acme-vision")
    kubectl(sb, "patch", "clusterqueue", "globex-llm", "--type=json",
            "-p", '[{"op":"replace","path":"/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota","value":"99"}]')
    kubectl(sb, "delete", "cohort", "acme")
    plan = plan_build(cluster, kube=kube)
    assert {i.label for i in plan.creates} == {"LocalQueue acme-vision/acme-vision", "Cohort acme"}
    assert {i.label for i in plan.changes} == {"ClusterQueue globex-llm"}
    assert reconcile(cluster, kube=kube).ok
    assert kube.get(KUEUE, "LocalQueue", "acme-vision", "acme-vision")["spec"]["clusterQueue"] == "acme-vision"
    llm = kube.get(KUEUE, "ClusterQueue", "globex-llm")
    assert llm["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == "10"
    assert kube.get(KUEUE, "Cohort", "acme") is not None
    assert plan_build(cluster, kube=kube).empty


def _job(name: str, gpus: int) -> str:
    containers = [{"name": "main", "image": "busybox", "command": ["sleep", "3600"],
                   "resources": {"requests": {"cpu": "1", "memory": "1Gi", GPU: "1"}, "limits": {GPU: "1"}}}]
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": "acme-vision",
                        "labels": {"kueue.x-k8s.io/queue-name": "acme-vision", "kueue.x-k8s.io/priority-class": "batch"},
                        "annotations": {"sandbox.gpuportal.dev/duration": "2h"}},
           # the offline pool (acme-vision also has online H100s, which Kueue would try next)
           "spec": {"parallelism": gpus, "completions": gpus,
                    "template": {"spec": {"restartPolicy": "Never", "containers": containers,
                                          "nodeSelector": {"gpuportal.dev/pool": "offline"}}}}}
    return json.dumps(job)


def _workload_state(kube: Kube, job: str) -> tuple[bool, dict]:
    for wl in kube.list(KUEUE, "Workload", namespace="acme-vision")[0]:
        owners = [o.get("name") for o in wl["metadata"].get("ownerReferences") or []]
        if job in owners:
            conds = {c["type"]: c["status"] for c in (wl.get("status") or {}).get("conditions") or []}
            return conds.get("QuotaReserved") == "True", wl
    return False, {}


def test_jobs_are_admitted_within_quota_and_borrow_from_the_cohort(demo) -> None:
    cluster, kube, sb = demo
    assert reconcile(cluster, kube=kube).ok
    # acme: 12 offline H100s; acme-vision 6 nominal + borrowing limit 2; acme-nlp 4 (idle); 2 unassigned.
    kubectl(sb, "create", "-f", "-", input=_job("within", 6))
    kubectl(sb, "create", "-f", "-", input=_job("borrowing", 2))
    sb.advance(5)
    kubectl(sb, "create", "-f", "-", input=_job("too-much", 1))
    sb.advance(5)
    assert _workload_state(kube, "within")[0]
    admitted, wl = _workload_state(kube, "borrowing")
    assert admitted
    flavors = wl["status"]["admission"]["podSetAssignments"][0]["flavors"]
    assert flavors[GPU] == "h100-80gb-offline"
    assert not _workload_state(kube, "too-much")[0]  # 6 + 2 + 1 > nominal + borrowing limit
    cq = kube.get(KUEUE, "ClusterQueue", "acme-vision")
    usage = {(f["name"], r["name"]): r for f in cq["status"]["flavorsReservation"] for r in f["resources"]}
    assert usage[("h100-80gb-offline", GPU)]["total"] in ("8", 8)
    assert usage[("h100-80gb-offline", GPU)]["borrowed"] in ("2", 2)
    # The reconcile reads the queue status back into the quota rows.
    reconcile(cluster, kube=kube)
    row = Quota.objects.get(project__slug="acme-vision", flavor__name="h100-80gb-offline", resource=GPU)
    assert (row.used, row.borrowed) == (D(8), D(2))
    assert Quota.objects.get(tenant__slug="acme", project=None, flavor__name="h100-80gb-offline", resource=GPU).used == D(8)
    # A Job in the other project of the tenant gets only what is left: acme-nlp is still within its own quota.
    assert Quota.objects.get(project__slug="acme-nlp", flavor__name="h100-80gb-offline", resource=GPU).used == 0


def test_faults_still_converge_without_duplicates(demo) -> None:
    cluster, kube, sb = demo
    # A run against a cluster that answers nothing but errors fails (it never half-converges by luck).
    status, _, _ = control(sb, "PUT", "/sandbox/faults", {"error_rate": 1.0, "error_codes": [503], "retry_after": 0})
    assert status == 200
    with pytest.raises(ClusterUnavailable):
        reconcile(cluster, kube=kube)
    failed_runs = 1
    status, _, _ = control(sb, "PUT", "/sandbox/faults", {"error_rate": 0.15, "error_codes": [503, 429, 500], "retry_after": 0})
    assert status == 200
    # Each cluster call is made once per run (no retry loop inside the reconcile); what the Celery
    # task's retries and the next period do is to run it again, as this loop does. With 15 % of the
    # calls failing at random, runs fail part-way until one gets through.
    for _ in range(400):
        try:
            result = reconcile(cluster, kube=kube)
        except Exception:
            failed_runs += 1
            continue
        if result.ok:
            break
        failed_runs += 1
    control(sb, "PUT", "/sandbox/faults", {"error_rate": 0.0})
    assert result.ok and failed_runs > 0  # converged, after failed runs
    desired = m.desired_state(cluster, snapshot_load(cluster))
    for api_version, kind in m.KIND_ORDER:
        live = ours(kube, api_version, kind)
        keys = [m.object_key(o) for o in live]
        assert len(keys) == len(set(keys))
        assert sorted(keys) == sorted(m.object_key(o) for o in desired if (o["apiVersion"], o["kind"]) == (api_version, kind))
    assert plan_build(cluster, kube=kube).empty
    assert not AppliedObject.objects.filter(cluster=cluster).exclude(error="").exists()


def test_each_cluster_call_is_made_once_retries_are_the_tasks(demo) -> None:
    """One retry layer: the Celery task's. A plan (also what the ops page shows) is not held up by a
    retry loop of its own when the cluster is unavailable."""
    from portal.kube import ClusterUnavailable

    cluster, kube, sb = demo
    control(sb, "PUT", "/sandbox/faults", {"error_rate": 1.0, "error_codes": [503], "retry_after": 0})
    before = kube.calls["list"]
    try:
        with pytest.raises(ClusterUnavailable):
            plan_build(cluster, kube=kube)
    finally:
        control(sb, "PUT", "/sandbox/faults", {"error_rate": 0.0})
    assert kube.calls["list"] == before + 1


def test_a_422_is_recorded_with_the_object_and_field(demo) -> None:
    cluster, kube, _ = demo
    Flavor.objects.filter(cluster=cluster, name="h100-80gb-online").update(
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "Sometimes"}]
    )
    result = reconcile(cluster, kube=kube)
    assert not result.unavailable
    assert [label for label, _ in result.failed] == ["ResourceFlavor h100-80gb-online"]
    row = AppliedObject.objects.get(cluster=cluster, kind="ResourceFlavor", name="h100-80gb-online")
    assert row.error.startswith("422 Invalid") and "spec.nodeTaints" in row.error and row.error_at is not None
    # The cluster-wide unit stopped there; the tenants' units went on.
    assert names(kube, KUEUE, "ClusterQueue") == {"acme-vision", "acme-nlp", "globex-llm"}
    Flavor.objects.filter(cluster=cluster, name="h100-80gb-online").update(
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    )
    assert reconcile(cluster, kube=kube).ok
    row.refresh_from_db()
    assert row.error == "" and row.hash


@pytest.mark.parametrize("path", ["AB", "BCDEFA"])
def test_architecture_changes_are_planned_then_applied_and_audited(demo, path: str) -> None:
    cluster, kube, _ = demo
    Cluster.objects.filter(pk=cluster.pk).update(architecture=path[0])
    cluster.refresh_from_db()
    assert reconcile(cluster, kube=kube).ok
    for arch in path[1:]:
        plan = plan_for_architecture_change(cluster, arch, kube=kube)
        assert not plan.empty
        cluster.refresh_from_db()
        assert cluster.architecture != arch  # planning writes nothing
        change = architecture_change_start(actor=Actor(user=None), cluster=cluster, architecture=arch,
                                           fingerprint=plan_fingerprint(plan))
        change = architecture_change_apply(change.pk)
        assert change.state == "applied", change.state_reason
        cluster.refresh_from_db()
        assert cluster.architecture == arch
        assert plan_build(cluster, kube=kube).empty, f"{arch} not converged"
        if arch == "E":
            assert names(kube, m.VOLCANO_QUEUE, "Queue") == {"acme-vision", "acme-nlp", "globex-llm"}
            assert "h100-80gb-offline" not in names(kube, KUEUE, "ResourceFlavor")
        if arch == "A":
            assert names(kube, KUEUE, "ClusterQueue") == {"shared"} and not names(kube, KUEUE, "Cohort")
            lq = kube.get(KUEUE, "LocalQueue", "acme-vision", "acme-vision")
            assert lq["spec"]["clusterQueue"] == "shared"  # an immutable field: replaced, not patched
        if arch == "F":
            assert "acme-vision-online" in names(kube, KUEUE, "ClusterQueue")
    entries = AuditEntry.objects.filter(action="cluster.apply", target_id=str(cluster.pk))
    assert entries.count() == len(path) - 1
    with pytest.raises(ValueError):
        plan_apply(plan_for_architecture_change(cluster, path[0], kube=kube), kube=kube)  # only through the service


def test_a_reviewed_plan_holds_while_controllers_mark_what_it_deletes_and_not_when_its_writes_change(demo) -> None:
    """Kueue puts its in-use finalizer on a ClusterQueue a moment after it is made; a plan reviewed just before
    that (which deletes the queue) is still the plan applied. A changed flavor is a different plan."""
    cluster, kube, _ = demo
    assert reconcile(cluster, kube=kube).ok
    reviewed = plan_for_architecture_change(cluster, "A", kube=kube)
    assert "acme-vision" in {i.key[3] for i in reviewed.deletes if i.key[1] == "ClusterQueue"}
    kube.patch(KUEUE, "ClusterQueue", "acme-vision", {"metadata": {
        "finalizers": ["example.com/held"], "annotations": {"example.com/seen": "yes"}, "labels": {"team": "x"}}})
    again = plan_for_architecture_change(cluster, "A", kube=kube)
    assert again.text() != reviewed.text()  # the deletion shows the object as it is now
    assert plan_fingerprint(again) == plan_fingerprint(reviewed)
    Flavor.objects.filter(cluster=cluster, name="h100-80gb-online").update(
        taints=[{"key": "nvidia.com/gpu", "value": "online", "effect": "NoSchedule"}])
    assert plan_fingerprint(plan_for_architecture_change(cluster, "A", kube=kube)) != plan_fingerprint(reviewed)
    with pytest.raises(PlanChanged):
        architecture_change_start(actor=Actor(user=None), cluster=cluster, architecture="A",
                                  fingerprint=plan_fingerprint(reviewed))
    kube.patch(KUEUE, "ClusterQueue", "acme-vision", {"metadata": {"finalizers": None}})


def test_task_and_command(demo, capsys) -> None:
    from django.core.management import call_command

    from portal.kube import kube_cache_clear
    from quotas.tasks import reconcile_all_task, reconcile_cluster_task

    cluster, kube, _ = demo
    kube_cache_clear()
    call_command("reconcile", "sandbox", "plan")
    out = capsys.readouterr().out
    assert out.startswith("# plan for architecture B:") and "+++ desired/ClusterQueue/acme-vision" in out
    outcome = reconcile_cluster_task.apply(args=[cluster.pk]).get()
    assert outcome["failed"] == 0 and outcome["applied"] > 0
    assert reconcile_cluster_task.apply(args=[cluster.pk]).get() == {"applied": 0, "deleted": 0, "failed": 0}  # idempotent
    assert reconcile_cluster_task.apply(args=[10**9]).get() is None  # a deleted cluster is not an error
    call_command("reconcile", "sandbox", "export", "--tenant", "acme")
    exported = capsys.readouterr().out
    assert "kind: Cohort" in exported and "globex" not in exported
    call_command("reconcile", "sandbox", "apply", "--architecture", "C", "--yes")
    assert "applied" in capsys.readouterr().out
    cluster.refresh_from_db()
    assert cluster.architecture == "C"
    assert "a100-80gb-mig-1g.10gb" in names(kube, KUEUE, "ResourceFlavor")
    with pytest.MonkeyPatch.context() as mp:
        calls = []
        mp.setattr(reconcile_cluster_task, "delay", calls.append)
        assert reconcile_all_task.apply().get() == 1 and calls == [cluster.pk]

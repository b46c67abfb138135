"""A MIG change end to end against the sandbox cluster: propose (impact), approve, the window's steps through the
sandbox's MIG manager, and the automatic rollback when it fails."""

from __future__ import annotations

import pytest
from django.core import mail

from maintenance import services
from portal.exceptions import Invalid
from maintenance.models import MigChange
from quotas.models import Flavor, Node, Quota
from tenants.models import AuditEntry

from .conftest import drive, window

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(180)]
S = MigChange.Status
MIG_1G = "nvidia.com/mig-1g.10gb"


def _propose_and_approve(cast, ops2, demo, to_layout="all-1g.10gb", **kw) -> MigChange:
    change = services.mig_change_propose(actor=cast.actor("ops"), pool=demo.pool, to_layout=to_layout,
                                         reason="inference needs small slices", **(kw or window()))
    return services.mig_change_approve(actor=services.Actor(user=ops2), change=change, comment="go")


def test_impact_is_computed_before_approval(cast, demo) -> None:
    change = services.mig_change_propose(actor=cast.actor("ops"), pool=demo.pool, to_layout="all-1g.10gb", **window())
    assert change.status == S.PROPOSED and change.from_layout == "all-balanced"
    assert change.nodes == ["gpu-a100-mig-0", "gpu-a100-mig-1"] and change.gpus_per_node == 8
    capacity = {row["resource"]: (row["before"], row["after"]) for row in change.impact["capacity"]}
    assert capacity[MIG_1G] == ("32.000", "112.000")
    assert capacity["nvidia.com/mig-3g.40gb"] == ("16.000", "0.000")
    assert capacity["nvidia.com/mig-2g.20gb"] == ("16.000", "0.000")
    over = {row["resource"]: row for row in change.impact["quotas"]["over"]}
    assert over["nvidia.com/mig-3g.40gb"]["promised"] == "8.000" and over["nvidia.com/mig-3g.40gb"]["allowed"] == "0.000"
    plan = {(p["tenant"], p["project"], p["resource"]): p["new_nominal"] for p in change.impact["quotas"]["changes"]}
    assert plan == {("globex", None, "nvidia.com/mig-3g.40gb"): "0"}
    assert change.impact["running"] == [] and change.impact["running_known"]
    assert AuditEntry.objects.filter(action="mig_change.propose", target_id=str(change.pk)).exists()
    # nothing happened on the cluster yet
    assert all(n.labels["nvidia.com/mig.config"] == "all-balanced" for n in Node.objects.filter(name__in=change.nodes))


def test_a_change_runs_through_every_step(cast, ops2, demo, as_user) -> None:
    old_pool = demo.pool.name
    change = _propose_and_approve(cast, ops2, demo)
    assert change.status == S.APPROVED and change.approved_by == ops2
    change = drive(demo.sb, change, lambda c: c.status in ("succeeded", "rolled_back", "failed"))
    assert change.status == S.SUCCEEDED, change.status_reason
    assert change.progress == 100 and change.step == "done"
    nodes = {n.name: n for n in Node.objects.filter(cluster=demo.cluster, name__in=change.nodes)}
    for node in nodes.values():
        assert node.labels["nvidia.com/mig.config"] == "all-1g.10gb" and node.mig_config_state == "success"
        assert node.allocatable[MIG_1G] == "56"
    live = demo.sb.store.get("v1", "Node", "gpu-a100-mig-0")
    assert not (live.get("spec") or {}).get("unschedulable")  # uncordoned again
    # the quota that no longer fits was cut as planned
    three = Flavor.objects.get(cluster=demo.cluster, mig_profile="3g.40gb")
    assert Quota.objects.get(tenant=cast.globex, project=None, flavor=three).nominal == 0
    steps = [s for s, o in change.steps.filter(outcome="done").values_list("step", "outcome")]
    assert steps == ["cordon", "drain", "relabel", "reconfigure", "verify", "quotas", "uncordon"]
    log = list(change.steps.order_by("seq").values_list("step", "outcome"))
    assert log[-2:] == [("uncordon", "done"), ("done", "info")]  # the last step is done before the change is
    actions = set(AuditEntry.objects.filter(target_id=str(change.pk)).values_list("action", flat=True))
    assert {"mig_change.approved", "mig_change.running", "mig_change.step", "mig_change.succeeded"} <= actions
    assert AuditEntry.objects.filter(action="quota.set", actor_label="system").exists()
    # The nodes moved to the new layout's pool; the old one, now empty, is on neither the capacity page nor the review.
    assert old_pool == "a100-80gb-mig-all-balanced-online"
    capacity = as_user("ops").get("/ops/capacity/", {"cluster": demo.cluster.name}).content.decode()
    review = as_user("ops").get("/ops/architecture-review/").content.decode()
    for page in (capacity, review):
        assert "a100-80gb-mig-all-1g.10gb-online" in page and old_pool not in page, [
            page[max(0, i - 300):i + 100] for i in [page.find(old_pool)]]


def test_a_failed_change_rolls_back_by_itself(cast, ops2, demo, django_capture_on_commit_callbacks) -> None:
    # the sandbox's fault knob: the next layout change of this node fails although the layout is valid
    demo.sb.store.patch("v1", "Node", "gpu-a100-mig-1", None,
                        {"metadata": {"annotations": {"sandbox.gpuportal.dev/mig-fail-next": "true"}}}, "merge")
    change = _propose_and_approve(cast, ops2, demo)
    with django_capture_on_commit_callbacks(execute=True):
        change = drive(demo.sb, change, lambda c: c.status in ("succeeded", "rolled_back", "failed"))
    assert change.status == S.ROLLED_BACK, change.status_reason
    assert "failed on gpu-a100-mig-1" in change.status_reason and "all-balanced" in change.status_reason
    assert change.rollback["relabelled"] and change.rollback["layout"] == "all-balanced"
    for name in change.nodes:
        live = demo.sb.store.get("v1", "Node", name)
        assert live["metadata"]["labels"]["nvidia.com/mig.config"] == "all-balanced"
        assert live["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success"
        assert not (live.get("spec") or {}).get("unschedulable")
    three = Flavor.objects.get(cluster=demo.cluster, mig_profile="3g.40gb")
    assert Quota.objects.get(tenant=cast.globex, project=None, flavor=three).nominal == 8  # quotas untouched
    steps = list(change.steps.filter(outcome="done").values_list("step", flat=True))
    assert steps[-3:] == ["rollback_relabel", "rollback_wait", "rollback_uncordon"]
    log = list(change.steps.order_by("seq").values_list("step", "outcome"))
    assert log[-2] == ("rollback_uncordon", "done") and log[-1][1] == "info"  # then "Rolled back"
    assert AuditEntry.objects.filter(action="mig_change.rolling_back", target_id=str(change.pk)).exists()
    told = [m for m in mail.outbox if "rolled back" in m.subject]
    assert sorted(a for m in told for a in m.to) == sorted([cast.ops.email, ops2.email])  # proposer and approver


def test_the_demo_has_a_mig_pool_a_tenant_admin_may_propose_for(cast, fresh_sandbox, settings) -> None:
    """``make run``'s demo (architecture E, MIG on): alice proposes for the A100 pool her tenant uses, ops approve."""
    from portal.kube import kube_cache_clear
    from quotas.demo import seed_quota_demo
    from quotas.models import NodePool

    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    kube_cache_clear()
    seed_quota_demo()
    pools = services.selectors.mig_pools_for(actor=cast.actor("alice"))
    assert [p.name for p in pools] == [NodePool.objects.get(sharing="mig").name]
    # all-1g.10gb would cut globex's 3g.40gb quota: refused for a tenant admin, with the reason on the layout field
    with pytest.raises(Invalid) as refused:
        services.mig_change_propose(actor=cast.actor("alice"), pool=pools[0], to_layout="all-1g.10gb", **window())
    assert refused.value.field == "to_layout" and "not available to your tenant" in str(refused.value)
    assert "globex" not in str(refused.value)
    change = services.mig_change_propose(actor=cast.actor("alice"), pool=pools[0], to_layout="all-3g.40gb", **window())
    assert change.tenant == cast.acme and change.impact["capacity"]
    assert {c["tenant"] for c in change.impact["quotas"]["changes"]} <= {"acme"}
    assert services.mig_change_approve(actor=cast.actor("ops"), change=change).status == S.APPROVED
    assert services.selectors.mig_pools_for(actor=cast.actor("nobody")) == []

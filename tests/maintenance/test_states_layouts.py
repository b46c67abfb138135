"""The MIG change state machine (compare-and-set, audited), the layouts the portal offers (in step with the sandbox's
MIG manager), the quota plan as data, and the Celery tasks' idempotency."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.cache import cache
from django.utils import timezone

from maintenance import layouts, states
from maintenance.impact import quota_plan
from maintenance.models import MigChange
from maintenance.tasks import change_lock, mig_change_advance_task, mig_changes_sweep_task
from portal.exceptions import Invalid
from sandbox.profile import GPU_MODELS, mig_layout
from tenants.access import Actor
from tenants.models import AuditEntry

from ..quotas.factories import make_fleet
from ..quotas.test_concurrency import kinds, run_at_once

S = MigChange.Status
# the portal's model keys -> the sandbox's
SANDBOX_MODEL = {"a30-24gb": "A30-24GB", "a100-40gb": "A100-40GB", "a100-80gb": "A100-80GB", "h100-80gb": "H100-80GB",
                 "h200-141gb": "H200-141GB", "b200": "B200"}


def _change(cast, **fields) -> MigChange:
    now = timezone.now()
    values = {"cluster": fields.pop("cluster", None) or make_fleet().cluster, "pool_name": "a100", "nodes": ["n0", "n1"], "gpu_model": "a100-80gb",
              "gpus_per_node": 8, "from_layout": "all-balanced", "to_layout": "all-1g.10gb", "proposed_by": cast.ops,
              "window_start": now, "deadline": now + timedelta(hours=1)}
    return MigChange.objects.create(**(values | fields))


def test_every_layout_the_portal_offers_is_one_the_mig_manager_accepts_with_the_same_slices() -> None:
    for model, sandbox_model in SANDBOX_MODEL.items():
        offered = layouts.layouts_for(model)
        assert {"all-disabled", "all-balanced", "all-1g." + next(iter(offered["all-balanced"])).split(".", 1)[1]} <= set(offered)
        for name, per_gpu in offered.items():
            simulated = mig_layout(sandbox_model, name, 8)
            assert simulated is not None, (model, name)
            expected = [None] * 8 if name == "all-disabled" else [{p.replace(".me", "+me"): n for p, n in per_gpu.items()}] * 8
            assert simulated == expected, (model, name)
    assert set(SANDBOX_MODEL.values()) == {k for k, v in GPU_MODELS.items() if v["mig"]}
    assert layouts.layouts_for("l40s") == {}


def test_a_layout_the_model_does_not_have_is_refused_naming_the_choices() -> None:
    assert layouts.validate_layout("a100-80gb", " ALL-3g.40gb ") == "all-3g.40gb"
    with pytest.raises(Invalid) as refused:
        layouts.validate_layout("a100-80gb", "all-3g.20gb")
    assert refused.value.field == "to_layout" and "all-3g.40gb" in refused.value.message
    with pytest.raises(Invalid):
        layouts.validate_layout("l40s", "all-balanced")
    assert layouts.layout_resources("a100-80gb", "all-balanced", 8) == {
        "nvidia.com/mig-1g.10gb": 16, "nvidia.com/mig-2g.20gb": 8, "nvidia.com/mig-3g.40gb": 8}
    assert layouts.layout_resources("a100-80gb", "all-disabled", 8) == {"nvidia.com/gpu": 8}


def test_the_quota_plan_cuts_tenants_in_proportion_and_their_projects_below_them() -> None:
    capacity = [{"flavor": "mig-3g", "flavor_id": 1, "resource": "r", "before": "16", "after": "6", "change": "-10"},
                {"flavor": "mig-1g", "flavor_id": 2, "resource": "q", "before": "32", "after": "112", "change": "80"}]
    quotas = [
        {"id": 1, "tenant": "acme", "tenant_id": 1, "project": None, "flavor": "mig-3g", "flavor_id": 1, "resource": "r", "nominal": "8"},
        {"id": 2, "tenant": "globex", "tenant_id": 2, "project": None, "flavor": "mig-3g", "flavor_id": 1, "resource": "r", "nominal": "4"},
        {"id": 3, "tenant": "acme", "tenant_id": 1, "project": "acme-vision", "flavor": "mig-3g", "flavor_id": 1, "resource": "r", "nominal": "6"},
        {"id": 4, "tenant": "acme", "tenant_id": 1, "project": "acme-nlp", "flavor": "mig-3g", "flavor_id": 1, "resource": "r", "nominal": "2"},
        {"id": 5, "tenant": "acme", "tenant_id": 1, "project": None, "flavor": "mig-1g", "flavor_id": 2, "resource": "q", "nominal": "16"},
    ]
    plan = quota_plan(capacity, quotas, overcommit_percent=0)
    assert plan["over"] == [{"flavor": "mig-3g", "flavor_id": 1, "resource": "r", "promised": "12", "allowed": "6.000"}]
    assert {c["id"]: c["new_nominal"] for c in plan["changes"]} == {1: "4", 2: "2", 3: "3", 4: "1"}
    assert sum(Decimal(c["new_nominal"]) for c in plan["changes"] if c["project"] is None) <= 6
    # 50 % overcommit: 9 allowed, so less is cut (acme's projects, 8 together, still exceed its 6)
    assert {c["id"]: c["new_nominal"] for c in quota_plan(capacity, quotas, overcommit_percent=50)["changes"]} == {
        1: "6", 2: "3", 3: "4", 4: "1"}


def test_the_table() -> None:
    assert states.can_move(S.PROPOSED, S.APPROVED) and states.can_move(S.APPROVED, S.RUNNING)
    assert states.can_move(S.RUNNING, S.ROLLING_BACK) and states.can_move(S.ROLLING_BACK, S.ROLLED_BACK)
    assert not states.can_move(S.PROPOSED, S.RUNNING) and not states.can_move(S.RUNNING, S.CANCELLED)
    for final in states.FINAL:
        assert not any(states.can_move(final, to) for to in S.values)
    assert states.progress_of("cordon") == 0 and states.progress_of("uncordon") == 85 and states.progress_of("done") == 100


@pytest.mark.django_db
def test_moves_are_compare_and_set_and_audited(cast) -> None:
    change = _change(cast)
    assert not states.move(change, to=S.RUNNING, actor=Actor.system())  # not before an approval
    assert states.move(change, to=S.APPROVED, actor=cast.actor("ops"))
    assert states.move(change, to=S.RUNNING, actor=Actor.system(), step="cordon")
    change.refresh_from_db()
    assert (change.status, change.step, change.started_at is not None) == (S.RUNNING, "cordon", True)
    assert not states.step_to(change, step="relabel", actor=Actor.system(), expect_step="drain", message="x")
    assert states.step_to(change, step="drain", actor=Actor.system(), expect_step="cordon", message="cordoned")
    assert list(AuditEntry.objects.filter(target_id=str(change.pk), action__startswith="mig_change.").order_by("id")
                .values_list("action", flat=True)) == [
        "mig_change.approved", "mig_change.running", "mig_change.step"]
    assert list(change.steps.values_list("step", "outcome")) == [
        ("waiting", "info"), ("cordon", "info"), ("cordon", "done"), ("drain", "started")]


@pytest.mark.django_db(transaction=True)
def test_concurrent_steps_exactly_one_wins(cast) -> None:
    """Twenty workers handed the same change at the same step (a redelivered task): one moves it."""
    change = _change(cast)
    states.move(change, to=S.APPROVED, actor=Actor.system())
    states.move(change, to=S.RUNNING, actor=Actor.system(), step="cordon")
    outcomes = run_at_once(lambda i: states.step_to(MigChange.objects.get(pk=change.pk), step="drain",
                                                    actor=Actor.system(), expect_step="cordon", message="cordoned"))
    assert kinds(outcomes) == Counter({"ok": 20})
    assert [value for _, value in outcomes].count(True) == 1
    assert AuditEntry.objects.filter(target_id=str(change.pk), action="mig_change.step").count() == 1


@pytest.mark.django_db
def test_the_tasks_do_nothing_twice(cast) -> None:
    change = _change(cast, window_start=timezone.now() + timedelta(hours=1))
    assert mig_change_advance_task.apply(args=[change.pk]).get() == {"again_in": None}  # proposed: nothing to do
    states.move(change, to=S.APPROVED, actor=Actor.system())
    assert mig_change_advance_task.apply(args=[change.pk]).get() == {"again_in": None}  # the window is not open yet
    assert mig_changes_sweep_task.apply().get() == {"queued": 0}
    cache.add(change_lock(change.pk), "another run", 60)
    try:
        assert mig_change_advance_task.apply(args=[change.pk]).get() == {"skipped": True}
    finally:
        cache.delete(change_lock(change.pk))
    change.refresh_from_db()
    assert change.status == S.APPROVED and change.step == "waiting"
    assert mig_change_advance_task.apply(args=[999999]).get() == {"again_in": None}


@pytest.mark.django_db
def test_the_list_reads_a_bounded_number_of_queries(cast, api, django_assert_max_num_queries) -> None:
    cluster = make_fleet().cluster
    for i in range(30):
        _change(cast, cluster=cluster, tenant=cast.acme if i % 2 else None, proposed_by=cast.alice if i % 2 else cast.ops,
                pool_name=f"pool-{i}")
    client = api("ops")
    with django_assert_max_num_queries(12):
        body = client.get("/api/v1/mig-changes/", {"page_size": 50}).json()
    assert body["count"] == 30
    with django_assert_max_num_queries(12):
        assert client.get("/api/v1/mig-changes/", {"status": "proposed", "tenant": "acme"}).json()["count"] == 15
    assert len(api("alice").get("/api/v1/mig-changes/").json()["results"]) == 15
    assert api("erin").get("/api/v1/mig-changes/").json()["results"] == []

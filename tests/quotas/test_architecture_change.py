"""Architecture changes as a service: the state machine (``quotas/architecture_states.py``), the API,
the Celery task under the reconcile lock, and concurrent moves of which exactly one wins."""

from __future__ import annotations

from collections import Counter

import pytest
from django.core.cache import cache

from quotas import architecture_states as states
from quotas.architecture import architecture_change_apply, architecture_change_start
from quotas.demo import seed_quota_demo
from quotas.models import ArchitectureChange, Cluster
from quotas.reconcile import plan_fingerprint, plan_for_architecture_change
from quotas.tasks import architecture_change_apply_task, reconcile_lock
from tenants.access import Actor
from tenants.models import AuditEntry

from .factories import make_fleet
from .test_concurrency import kinds, run_at_once

pytestmark = pytest.mark.django_db
API = "/api/v1"
S = ArchitectureChange.State


@pytest.fixture
def demo(cast, fresh_sandbox, settings):
    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    seed_quota_demo(architecture="B", reconcile_now=False)
    return Cluster.objects.get(name="sandbox")


def _change(cluster: Cluster, **fields) -> ArchitectureChange:
    return ArchitectureChange.objects.create(cluster=cluster, from_architecture="B", to_architecture="A",
                                             fingerprint="0" * 64, **fields)


def test_the_table() -> None:
    assert states.can_move(S.REQUESTED, S.APPLYING) and states.can_move(S.APPLYING, S.APPLIED)
    assert states.can_move(S.REQUESTED, S.FAILED) and states.can_move(S.APPLYING, S.FAILED)
    assert not states.can_move(S.REQUESTED, S.APPLIED)
    for final in states.FINAL:
        assert not any(states.can_move(final, to) for to in S.values)
    with pytest.raises(ValueError):
        states.move(ArchitectureChange(pk=1), to=S.REQUESTED, actor=Actor.system())


@pytest.mark.django_db
def test_allowed_moves_are_timed_and_audited_refused_ones_write_nothing(cast) -> None:
    change = _change(make_fleet().cluster)
    assert not states.move(change, to=S.APPLIED, actor=Actor.system())  # not before it applies
    assert states.move(change, to=S.APPLYING, actor=cast.actor("ops"))
    assert change.started_at is not None and change.finished_at is None
    assert states.move(change, to=S.APPLIED, actor=cast.actor("ops"), reason="3 applied, 0 deleted.")
    change.refresh_from_db()
    assert (change.state, change.state_reason) == (S.APPLIED, "3 applied, 0 deleted.") and change.finished_at
    assert not states.move(change, to=S.FAILED, actor=Actor.system())
    actions = list(AuditEntry.objects.filter(target_id=str(change.pk), action__startswith="architecture_change.")
                   .order_by("id").values_list("action", "before", "actor_label"))
    assert actions == [("architecture_change.applying", {"state": "requested"}, "ops"),
                       ("architecture_change.applied", {"state": "applying"}, "ops")]


@pytest.mark.django_db(transaction=True)
def test_concurrent_moves_exactly_one_wins(cast) -> None:
    """Twenty workers handed the same change (a redelivered task): one starts applying it."""
    change = _change(make_fleet().cluster)
    outcomes = run_at_once(lambda i: states.move(ArchitectureChange.objects.get(pk=change.pk), to=S.APPLYING,
                                                 actor=Actor.system()))

    assert kinds(outcomes) == Counter({"ok": 20})
    assert [value for _, value in outcomes].count(True) == 1
    assert AuditEntry.objects.filter(target_id=str(change.pk), action__startswith="architecture_change.").count() == 1


def test_api_plan_start_and_progress(api, demo) -> None:
    url = f"{API}/clusters/{demo.pk}/architecture/"
    assert api("alice").get(url).status_code == 403
    assert api("alice").post(url, {"architecture": "A", "fingerprint": "0" * 64}, format="json").status_code == 403
    body = api("ops").get(url).json()
    assert body == {"change": None, "plan": None}
    plan = api("ops").get(url, {"architecture": "A"}).json()["plan"]
    assert plan["architecture"] == "A" and len(plan["fingerprint"]) == 64 and not plan["empty"]
    assert api("ops").get(url, {"architecture": "Z"}).status_code == 400

    bad = api("ops").post(url, {"architecture": "Z", "fingerprint": "x"}, format="json")
    assert bad.status_code == 400 and set(bad.json()["fields"]) == {"architecture", "fingerprint"}
    stale = api("ops").post(url, {"architecture": "A", "fingerprint": "0" * 64}, format="json")
    assert stale.status_code == 409 and "fingerprint" in stale.json()["fields"]
    assert not ArchitectureChange.objects.exists()

    started = api("ops").post(url, {"architecture": "A", "fingerprint": plan["fingerprint"]}, format="json")
    assert started.status_code == 202, started.content
    assert started.json()["state"] == "requested" and started.json()["requested_by"] == "ops"
    again = api("ops").post(url, {"architecture": "A", "fingerprint": plan["fingerprint"]}, format="json")
    assert again.status_code == 409  # one change of a cluster at a time
    assert Cluster.objects.get(pk=demo.pk).architecture == "B"  # the request only starts it

    architecture_change_apply_task.apply(args=[started.json()["id"]])
    change = api("ops").get(url).json()["change"]
    assert change["state"] == "applied" and change["result"]["applied"] > 0 and change["finished_at"]
    assert Cluster.objects.get(pk=demo.pk).architecture == "A"
    entry = AuditEntry.objects.get(action="cluster.apply")
    assert entry.actor_label == "ops" and entry.after["architecture"] == "A"
    assert AuditEntry.objects.filter(action="architecture_change.requested", actor_label="ops").count() == 1


def test_the_task_waits_for_a_running_reconcile(demo) -> None:
    plan = plan_for_architecture_change(demo, "A")
    change = architecture_change_start(actor=Actor.system(), cluster=demo, architecture="A",
                                       fingerprint=plan_fingerprint(plan))
    cache.add(reconcile_lock(demo.pk), "a reconcile", 60)
    try:
        outcome = architecture_change_apply_task.apply(args=[change.pk], retries=120)  # its last try: no more retries
        assert outcome.failed()
    finally:
        cache.delete(reconcile_lock(demo.pk))
    change.refresh_from_db()
    assert change.state == S.REQUESTED  # untouched while the lock was held
    assert architecture_change_apply_task.apply(args=[change.pk]).get() == {"state": "applied"}
    assert cache.add(reconcile_lock(demo.pk), "free again", 1)  # released after the apply


def test_a_plan_that_changed_before_the_worker_ran_fails_the_change(demo) -> None:
    plan = plan_for_architecture_change(demo, "A")
    change = architecture_change_start(actor=Actor.system(), cluster=demo, architecture="A",
                                       fingerprint=plan_fingerprint(plan), queue=False)
    ArchitectureChange.objects.filter(pk=change.pk).update(fingerprint="f" * 64)  # as if the data changed meanwhile
    change = architecture_change_apply(change.pk)
    assert change.state == S.FAILED and "plan changed" in change.state_reason
    assert Cluster.objects.get(pk=demo.pk).architecture == "B" and not AuditEntry.objects.filter(action="cluster.apply").exists()
    assert architecture_change_apply(change.pk) is None  # a redelivered task does nothing


def test_an_unexpected_error_fails_the_change_instead_of_leaving_it_applying(cast, settings) -> None:
    settings.KUBECONFIG = "/nonexistent/kubeconfig"  # a broken configuration: not a cluster error
    change = _change(make_fleet().cluster)
    with pytest.raises(Exception) as caught:
        architecture_change_apply(change.pk)
    change.refresh_from_db()
    assert change.state == S.FAILED and type(caught.value).__name__ in change.state_reason

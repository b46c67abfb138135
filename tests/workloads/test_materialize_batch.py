"""The batched materializer against the sandbox cluster: one run of the task applies several approved requests and
records them queued; running it again creates nothing twice; a claim held by a live run is left alone, a stale
one (a worker that died) is taken over. Materialization runs in the test (no worker)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from portal.kube import ClusterUnavailable
from tenants.models import AuditEntry
from workloads import hooks, materialize
from workloads.models import RequestEvent, RequestState, WorkloadRequest
from workloads.tasks import request_materialize_task

from .test_lifecycle import World, _world

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]


@pytest.fixture
def world(fresh_sandbox, cast, monkeypatch) -> World:
    # No Celery message on approval: the test runs the task itself, as a worker would.
    monkeypatch.setattr(hooks, "request_approved", lambda request_id: None)
    return _world(fresh_sandbox, cast, architecture="B")


def _submit(world: World, n: int) -> list[WorkloadRequest]:
    reqs = [world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1) for _ in range(n)]
    assert {r.state for r in reqs} == {S.APPROVED}
    return reqs


def _jobs(world: World, reqs: list[WorkloadRequest]) -> dict[int, str]:
    """Each request's Job uid in the cluster (a request without one is missing)."""
    store = world.sandbox.store
    out = {}
    for req in reqs:
        job = store.get("batch/v1", "Job", req.k8s_name, req.project.namespace)
        out[req.pk] = job["metadata"]["uid"]
    return out


def test_one_run_applies_several_and_a_second_run_creates_nothing(world: World) -> None:
    reqs = _submit(world, 5)
    out = request_materialize_task.apply(args=[reqs[2].pk]).get()
    assert out["claimed"] == 5 and out["queued"] == 5
    for req in reqs:
        req.refresh_from_db()
        assert req.state == S.QUEUED and req.claimed_at is None and req.attempts == 1 and req.applied_hash
        assert world.objects(req) == {"batch/v1/Job": 1}
        assert list(req.events.values_list("from_state", "to_state")) == [("", S.SUBMITTED), (S.SUBMITTED, S.APPROVED),
                                                                         (S.APPROVED, S.QUEUED)]
    uids = _jobs(world, reqs)
    events, audits = RequestEvent.objects.count(), AuditEntry.objects.filter(action="request.queued").count()
    assert audits == 5

    again = request_materialize_task.apply(args=[reqs[0].pk]).get()
    assert again["claimed"] == 0 and again["queued"] == 0
    assert _jobs(world, reqs) == uids  # the same objects, not new ones
    assert all(world.objects(r) == {"batch/v1/Job": 1} for r in reqs)
    assert RequestEvent.objects.count() == events
    assert AuditEntry.objects.filter(action="request.queued").count() == audits


def test_a_projects_requests_reach_its_queue_in_the_order_they_were_submitted(world: World) -> None:
    """One run applies a batch side by side, yet one project's requests are created in the order they came: Kueue and
    Volcano take work of one priority by creation, so a later request created first would hold the queue ahead of an
    earlier one (the demo's eight-GPU fine-tune did, ahead of the one-GPU job submitted before it). The sandbox's
    uids are time-ordered, so sorting the Jobs by uid sorts them by creation."""
    reqs = _submit(world, 12)
    out = request_materialize_task.apply(args=[reqs[0].pk]).get()
    assert out["claimed"] == 12 and out["queued"] == 12
    uids = _jobs(world, reqs)
    assert sorted(uids, key=uids.get) == [r.pk for r in reqs]


def test_an_outage_mid_batch_records_what_was_applied_and_keeps_the_order(world: World) -> None:
    """The cluster answers half its calls 503: each run records what it applied, releases the rest (a project's
    requests after the one that failed are not tried), and later runs apply them. In the end every request is queued
    once, with one Job each, created in the order they were submitted."""
    reqs = _submit(world, 10)
    pks = [r.pk for r in reqs]
    world.sandbox.faults.replace({"error_rate": 0.5, "error_codes": [503], "retry_after": 0})
    runs = unavailable = 0
    try:
        while WorkloadRequest.objects.filter(pk__in=pks, state=S.APPROVED).exists() and runs < 200:
            runs += 1
            try:
                materialize.requests_materialize()
            except ClusterUnavailable:
                unavailable += 1
    finally:
        world.sandbox.faults.replace({})
    assert unavailable, "no call failed: the outage path was not taken"
    assert set(WorkloadRequest.objects.filter(pk__in=pks).values_list("state", flat=True)) == {S.QUEUED}
    assert AuditEntry.objects.filter(action="request.queued").count() == 10
    assert all(world.objects(r) == {"batch/v1/Job": 1} for r in reqs)
    uids = _jobs(world, reqs)
    assert sorted(uids, key=uids.get) == pks


def test_a_live_claim_is_left_alone_and_a_stale_one_taken_over(world: World) -> None:
    live, stale, free = _submit(world, 3)
    now = timezone.now()
    WorkloadRequest.objects.filter(pk=live.pk).update(claimed_at=now)  # another run is applying it now
    WorkloadRequest.objects.filter(pk=stale.pk).update(claimed_at=now - materialize.CLAIM_LEASE - timedelta(seconds=1))

    out = materialize.requests_materialize(request_id=live.pk)
    assert out["claimed"] == 2 and out["queued"] == 2
    for req, state in ((live, S.APPROVED), (stale, S.QUEUED), (free, S.QUEUED)):
        req.refresh_from_db()
        assert req.state == state
    assert world.objects(live) == {}
    # The housekeeping sweep still finds the approved one once it is old enough, and a run then takes it on.
    WorkloadRequest.objects.filter(pk=live.pk).update(claimed_at=now - materialize.CLAIM_LEASE - timedelta(seconds=1),
                                                      approved_at=now - materialize.SWEEP_AFTER - timedelta(seconds=1))
    assert materialize.requests_sweep_approved() == [live.pk]
    assert materialize.requests_materialize(request_id=live.pk)["queued"] == 1
    assert world.objects(live) == {"batch/v1/Job": 1}


def test_batch_size_is_a_limit(world: World) -> None:
    reqs = _submit(world, 3)
    assert materialize.requests_materialize(limit=2)["queued"] == 2
    assert materialize.requests_materialize(limit=2)["queued"] == 1
    assert {r.state for r in WorkloadRequest.objects.filter(pk__in=[r.pk for r in reqs])} == {S.QUEUED}


# ------------------------------------------------------------------------------------------------ coalesced runs
@pytest.fixture
def world_hooked(fresh_sandbox, cast) -> World:
    """Approvals queue materializer runs for real (the broker sees them; no worker takes them: the test runs them)."""
    return _world(fresh_sandbox, cast, architecture="B")


def test_approvals_while_a_run_is_coming_queue_no_run_of_their_own(world_hooked: World, hooks_called) -> None:
    reqs = _submit(world_hooked, 4)
    assert hooks_called == [("approved", reqs[0].pk)]  # the others saw that a run is coming

    out = request_materialize_task.apply(args=[reqs[0].pk]).get()
    assert out["claimed"] == 4 and out["queued"] == 4
    assert out["runs"] == 3  # the batch, a look that found nothing, then the last look (the mark removed)
    assert all(world_hooked.objects(r) == {"batch/v1/Job": 1} for r in reqs)

    later = _submit(world_hooked, 1)[0]  # that run is over: the next approval queues one
    assert hooks_called == [("approved", reqs[0].pk), ("approved", later.pk)]


def test_an_approval_during_the_runs_last_look_is_taken_by_it(world_hooked: World, hooks_called, monkeypatch) -> None:
    first = _submit(world_hooked, 1)[0]
    late: list[WorkloadRequest] = []
    original = materialize.requests_materialize

    def found_nothing_then_approval(**kwargs):
        out = original(**kwargs)
        if out["claimed"] == 0 and not late:  # this run found nothing, and still says it will look again
            late.extend(_submit(world_hooked, 1))
        return out

    monkeypatch.setattr(materialize, "requests_materialize", found_nothing_then_approval)
    out = request_materialize_task.apply(args=[first.pk]).get()
    assert hooks_called == [("approved", first.pk)]  # the late approval saw the mark: no run of its own
    assert out["queued"] == 2
    late[0].refresh_from_db()
    assert late[0].state == S.QUEUED and world_hooked.objects(late[0]) == {"batch/v1/Job": 1}


def test_a_full_batch_queues_another_run(world: World, hooks_called, monkeypatch) -> None:
    monkeypatch.setattr(materialize, "BATCH", 2)
    reqs = _submit(world, 5)
    out = request_materialize_task.apply(args=[reqs[0].pk]).get()
    assert out["queued"] == 5
    assert hooks_called == [("approved", None), ("approved", None)]  # after each full batch: a backlog is shared
    assert {r.state for r in WorkloadRequest.objects.filter(pk__in=[r.pk for r in reqs])} == {S.QUEUED}


def test_a_namespace_deleted_outside_the_portal_is_restored_and_its_requests_wait_for_it(world: World) -> None:
    """Someone deletes a project's namespace (or the cluster is rebuilt): its approved requests do not fail with
    "namespaces not found". The run releases them, queues a reconcile of the cluster, and once that has put the
    namespace back the next run creates their Jobs, in order."""
    from celery import current_app
    from kubernetes import client as k8s, config as k8s_config
    from kubernetes.client.exceptions import ApiException

    from quotas.tasks import reconcile_cluster_task

    reqs = _submit(world, 3)
    pks = [r.pk for r in reqs]
    namespace = reqs[0].project.namespace
    core = k8s.CoreV1Api(k8s_config.new_client_from_config(str(world.sandbox.kubeconfig)))
    core.delete_namespace(namespace)
    deadline = timezone.now() + timedelta(seconds=60)
    while timezone.now() < deadline:
        try:
            core.read_namespace(namespace)
        except ApiException as exc:
            assert exc.status == 404
            break
    else:
        pytest.fail(f"namespace {namespace} was not removed")

    queue = f"restore-{os.getpid()}"
    current_app.conf.task_routes = {"quotas.reconcile_cluster": {"queue": queue}}
    current_app.amqp.flush_routes()
    current_app.amqp.__dict__.pop("router", None)
    try:
        with pytest.raises(materialize.NamespaceMissing, match=f"namespace {namespace} is missing"):
            materialize.requests_materialize()
        with current_app.connection_for_read() as conn:
            message = conn.SimpleQueue(queue).get(timeout=10)
            message.ack()
    finally:
        current_app.conf.task_routes = None
        current_app.amqp.flush_routes()
        current_app.amqp.__dict__.pop("router", None)
    assert message.headers["task"] == "quotas.reconcile_cluster"
    rows = WorkloadRequest.objects.filter(pk__in=pks)
    assert set(rows.values_list("state", flat=True)) == {S.APPROVED}
    assert set(rows.values_list("claimed_at", flat=True)) == {None}

    reconcile_cluster_task.apply(args=message.payload[0]).get()  # what the queued message runs
    core.read_namespace(namespace)
    out = materialize.requests_materialize()
    assert out["queued"] == 3
    assert set(rows.values_list("state", flat=True)) == {S.QUEUED}
    uids = _jobs(world, reqs)
    assert sorted(uids, key=uids.get) == pks


def test_a_kubeconfig_that_cannot_be_read_is_an_outage_not_a_lost_run(world: World, tmp_path) -> None:
    """The cluster's kubeconfig file is gone for a moment (a sandbox restarting writes it anew): the run releases its
    requests and raises ``ClusterUnavailable`` (the task retries) instead of an error that leaves them claimed; with
    the file back the next run queues them."""
    kubeconfig = tmp_path / "cluster.kubeconfig"
    kubeconfig.write_text(Path(world.sandbox.kubeconfig).read_text())
    type(world.cluster).objects.filter(pk=world.cluster.pk).update(kubeconfig_path=str(kubeconfig))
    reqs = _submit(world, 2)
    rows = WorkloadRequest.objects.filter(pk__in=[r.pk for r in reqs])
    text = kubeconfig.read_text()
    kubeconfig.unlink()
    with pytest.raises(ClusterUnavailable, match="FileNotFoundError"):
        materialize.requests_materialize()
    assert set(rows.values_list("state", "claimed_at")) == {(S.APPROVED, None)}
    kubeconfig.write_text(text)
    assert materialize.requests_materialize()["queued"] == 2
    assert set(rows.values_list("state", flat=True)) == {S.QUEUED}

"""Reclaim latency from the status follower against the sandbox cluster: a borrower runs on quota its sibling
project lent to the cohort; the lender's job arrives; Kueue evicts the borrower "to accommodate a workload (UID:
<the lender's Workload>) due to reclamation within the cohort"; the follower records the reclaim, links it to the
lender by that UID, and stamps the lender's admission. The metric then has the lender's run."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from insights.registry import METRICS, Query
from quotas.models import Quota
from quotas.reconcile import reconcile
from tenants.access import Actor, scope_of
from workloads import services as workload_services
from workloads.materialize import request_materialize
from workloads.models import Reclaim, RequestState

from ..workloads.test_lifecycle import World, _world
from .test_admitted_at import run

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]


@pytest.fixture
def world(fresh_sandbox, cast) -> World:
    fresh_sandbox.clock.speed = 0
    world = _world(fresh_sandbox, cast, architecture="B")
    h100 = world.flavors["h100-80gb-offline"]
    # vision: nominal 4 H100s and may borrow 4; nlp: nominal 4, lent to the cohort while unused
    for row in Quota.objects.filter(project=cast.vision, flavor=h100):
        Quota.objects.create(tenant=cast.acme, project=cast.nlp, flavor=h100, resource=row.resource,
                             nominal=Decimal(4) if row.resource == "nvidia.com/gpu" else row.nominal)
    Quota.objects.filter(project=cast.vision, flavor=h100, resource="nvidia.com/gpu").update(
        nominal=Decimal(4), borrowing_limit=Decimal(4))
    # the tenant's promise is its projects' sum: the cohort has nothing of its own to lend, only nlp's unused 4
    Quota.objects.filter(tenant=cast.acme, project__isnull=True, flavor=h100, resource="nvidia.com/gpu").update(
        nominal=Decimal(8))
    reconcile(world.cluster)
    return world


def _queued(world: World, who: str, project, gpus: int):
    req = world.submit(who, "training", "h100-80gb-offline", project=project, gpus=gpus, duration_hours=1)
    if req.state == S.PENDING_APPROVAL:
        req = workload_services.request_approve(actor=Actor(user=world.cast.alice), request=req, comment="ok")
    assert request_materialize(request_id=req.pk) in ("queued", "skipped")
    return req


def test_the_follower_links_a_reclaim_to_its_lender(world: World) -> None:
    cast = world.cast
    borrower = _queued(world, "bob", cast.vision, 8)  # 4 own + 4 borrowed from nlp
    borrower = run(world, borrower, lambda r: r.state == S.RUNNING, advance=5)
    assert borrower.workload_uid  # the follower keeps the Workload's UID
    lender = _queued(world, "alice", cast.nlp, 4)
    borrower = run(world, borrower, lambda r: r.events.filter(to_state=S.PREEMPTED).exists(), advance=2)
    lender = run(world, lender, lambda r: r.state == S.RUNNING, advance=5)
    assert lender.workload_uid and lender.workload_uid != borrower.workload_uid

    eviction = borrower.events.get(to_state=S.PREEMPTED).message
    assert f"(UID: {lender.workload_uid}" in eviction and "due to reclamation within the cohort" in eviction
    reclaim = Reclaim.objects.get()
    assert reclaim.borrower_id == borrower.pk and reclaim.preemptor_uid == lender.workload_uid
    assert reclaim.lender_id == lender.pk and reclaim.lender_queued_at == lender.queued_at
    assert reclaim.lender_admitted_at == lender.admitted_at
    assert lender.queued_at <= reclaim.evicted_at <= reclaim.lender_admitted_at

    now = timezone.now()
    period = {"start": now - timedelta(days=1), "end": now + timedelta(days=1), "group_by": "project"}
    rows = {r.group: r.values for r in METRICS["reclaim-latency"].compute(
        Query(scope=scope_of(cast.actor("alice")), **period)).rows}
    assert list(rows) == ["acme-nlp"] and rows["acme-nlp"]["reclaims"] == 1 and rows["acme-nlp"]["evictions"] == 1
    waited = (reclaim.lender_admitted_at - lender.queued_at).total_seconds() / 60
    assert rows["acme-nlp"]["admit_p50"] == round(waited, 2) and rows["acme-nlp"]["not_admitted"] == 0
    assert METRICS["reclaim-latency"].compute(Query(scope=scope_of(cast.actor("erin")), **period)).rows == []

"""The ``/metrics`` series the alerting rules read (docs/operations.md, "Alerts"), on known data: the oldest
request approved and not applied, the queue wait target, budgets' spend over their amount, when a cluster last
answered, and how long since its status follower completed a cycle (a real cycle against the sandbox)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import Budget
from portal.kube import kube_cache_clear
from quotas.models import Cluster
from workloads.models import RequestState
from workloads.status import follow_one

from ..billing.test_budgets import _setup_costs, _spent
from ..workloads.factories import make_catalogue, make_request
from .test_prometheus import TOKEN, samples, scrape

pytestmark = pytest.mark.django_db
S = RequestState


def test_the_oldest_unapplied_approval_and_the_wait_target(cast, client, settings) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.INSIGHTS_ADMIT_TARGET_MINUTES = 15
    cat = make_catalogue(cast)
    now = timezone.now()
    make_request(cat, cast.vision, cast.carol, state=S.APPROVED, approved_at=now - timedelta(minutes=20))
    make_request(cat, cast.vision, cast.carol, state=S.APPROVED, approved_at=now - timedelta(minutes=2),
                 flavor=cat.mig)
    # Queued (applied) long ago, and seeded demo history: neither is waiting to be applied.
    make_request(cat, cast.vision, cast.carol, state=S.QUEUED, approved_at=now - timedelta(hours=3), queued_at=now)
    make_request(cat, cast.llm, cast.frank, state=S.APPROVED, approved_at=now - timedelta(hours=5), seeded=True)
    got = samples(scrape(client).content.decode())
    assert 20 * 60 - 5 <= got[("gpuportal_materialize_oldest_seconds", (("cluster", "lab"),))] <= 20 * 60 + 60
    assert got[("gpuportal_queue_wait_target_seconds", ())] == 15 * 60


def test_no_approved_request_means_no_stuck_series(cast, client, settings) -> None:
    settings.METRICS_TOKEN = TOKEN
    cat = make_catalogue(cast)
    make_request(cat, cast.vision, cast.carol, state=S.QUEUED, approved_at=timezone.now() - timedelta(hours=3))
    assert not [k for k in samples(scrape(client).content.decode()) if k[0] == "gpuportal_materialize_oldest_seconds"]


def test_budget_spent_ratio_per_tenant_and_project(cast, client, settings) -> None:
    settings.METRICS_TOKEN = TOKEN
    cat = make_catalogue(cast)
    _setup_costs(cast, cat, minutes=30)  # acme-vision spent 30.00 this month, globex-llm 10.00
    Budget.objects.create(tenant=cast.acme, amount=Decimal("60.00"))
    Budget.objects.create(tenant=cast.acme, project=cast.vision, amount=Decimal("20.00"))
    Budget.objects.create(tenant=cast.globex, amount=Decimal("1000.00"))
    got = samples(scrape(client).content.decode())
    spent = float(_spent(30))
    assert got[("gpuportal_budget_spent_ratio", (("project", ""), ("tenant", "acme")))] == pytest.approx(spent / 60, abs=1e-3)
    assert got[("gpuportal_budget_spent_ratio", (("project", "acme-vision"), ("tenant", "acme")))] == pytest.approx(
        spent / 20, abs=1e-3)
    assert got[("gpuportal_budget_spent_ratio", (("project", ""), ("tenant", "globex")))] == pytest.approx(
        float(_spent(10)) / 1000, abs=1e-4)


def test_last_seen_and_follower_lag_after_a_real_cycle(cast, client, settings, fresh_sandbox) -> None:
    settings.METRICS_TOKEN = TOKEN
    kube_cache_clear()
    followed = Cluster.objects.create(name="followed", architecture="B", kubeconfig_path=str(fresh_sandbox.kubeconfig))
    silent = Cluster.objects.create(name="silent", architecture="B", health="unhealthy",
                                    last_seen_at=timezone.now() - timedelta(minutes=30))
    before = samples(scrape(client).content.decode())
    assert ("gpuportal_follower_lag_seconds", (("cluster", "followed"),)) not in before  # never followed yet
    assert follow_one(followed) is not None
    got = samples(scrape(client).content.decode())
    assert 0 <= got[("gpuportal_follower_lag_seconds", (("cluster", "followed"),))] < 30
    assert 0 <= got[("gpuportal_cluster_last_seen_seconds", (("cluster", "followed"),))] < 30
    assert got[("gpuportal_cluster_healthy", (("cluster", "followed"),))] == 1
    assert ("gpuportal_follower_lag_seconds", (("cluster", silent.name),)) not in got  # no follower runs for it
    assert 30 * 60 - 5 <= got[("gpuportal_cluster_last_seen_seconds", (("cluster", "silent"),))] <= 30 * 60 + 60
    assert got[("gpuportal_cluster_healthy", (("cluster", "silent"),))] == 0

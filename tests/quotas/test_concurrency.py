"""Twenty concurrent quota changes or approvals never break the invariants.

Real transactions (``transaction=True``) and one database connection per thread, all released at a
barrier at once. On PostgreSQL (CI) the row locks in ``quotas/services.py`` are what keeps the
sums within their limits. On SQLite the threads take turns (see ``run_at_once``), so there the same
tests check the bookkeeping (counts, CAS losers, ``applied``) rather than the locks.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.db.models import Sum

from quotas import selectors, services
from quotas.exceptions import AlreadyDecided
from quotas.models import Quota, QuotaRequest
from tenants.access import Actor
from tenants.models import AuditEntry

from ..factories import make_project, make_tenant
from .factories import GPU, make_fleet

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 20


def run_at_once(work: Callable[[int], Any], n: int = THREADS) -> list[tuple[str, Any]]:
    """Run ``work(i)`` in ``n`` threads released together; returns ("ok", result) or ("error", exc) per thread."""
    barrier = threading.Barrier(n)
    outcomes: list[tuple[str, Any]] = [("missing", None)] * n
    # Django's SQLite test database is in memory with a shared cache, where a second writer fails at
    # once ("database table is locked") instead of waiting: there the threads take turns.
    turns = threading.Lock() if connection.vendor == "sqlite" else contextlib.nullcontext()

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            with turns:
                outcomes[i] = ("ok", work(i))
        except Exception as exc:
            outcomes[i] = ("error", exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a thread hung (deadlock?)"
    return outcomes


def kinds(outcomes: list[tuple[str, Any]]) -> Counter:
    return Counter("ok" if status == "ok" else type(value).__name__ for status, value in outcomes)


def actor(username: str) -> Actor:
    # A fresh user object per thread: Django and guardian cache permissions on it.
    return Actor(user=get_user_model().objects.get(username=username))


def project_sum(tenant, flavor) -> Decimal:
    return Quota.objects.filter(tenant=tenant, project__isnull=False, flavor=flavor, resource=GPU).aggregate(s=Sum("nominal"))["s"] or Decimal(0)


def tenant_sum(flavor) -> Decimal:
    return Quota.objects.filter(project__isnull=True, flavor=flavor, resource=GPU).aggregate(s=Sum("nominal"))["s"] or Decimal(0)


def test_twenty_projects_race_for_the_tenants_quota(cast) -> None:
    fleet = make_fleet()
    services.quota_set(actor=cast.actor("ops"), tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=10)
    projects = [make_project(cast.acme, f"acme-race-{i}") for i in range(THREADS)]

    outcomes = run_at_once(
        lambda i: services.quota_set(actor=actor("alice"), project=projects[i], flavor=fleet.h100, resource=GPU, nominal=1)
    )

    assert kinds(outcomes) == Counter({"ok": 10, "QuotaExceeded": 10})
    assert project_sum(cast.acme, fleet.h100) == 10
    assert Quota.objects.get(tenant=cast.acme, project__isnull=True, flavor=fleet.h100).nominal == 10
    assert Quota.objects.filter(project__in=projects, nominal=1).count() == 10
    assert Quota.objects.filter(tenant=cast.acme, project__isnull=True).count() == 1  # no duplicate tenant rows
    assert AuditEntry.objects.filter(action="quota.set", project__in=projects).count() == 10
    errors = [value for status, value in outcomes if status == "error"]
    assert all("but the tenant has 10 (1 over)" in str(error) for error in errors)


def test_twenty_tenants_race_for_the_clusters_capacity(cast) -> None:
    fleet = make_fleet()  # 16 H100s that count
    tenants = [make_tenant(f"race-{i}") for i in range(THREADS)]

    outcomes = run_at_once(
        lambda i: services.quota_set(actor=actor("ops"), tenant=tenants[i], flavor=fleet.h100, resource=GPU, nominal=1)
    )

    assert kinds(outcomes) == Counter({"ok": 16, "QuotaExceeded": 4})
    assert tenant_sum(fleet.h100) == 16
    assert all(row["within_limit"] for row in selectors.overcommit_for(cluster=fleet.cluster))


@pytest.mark.parametrize("approver, refusal", [("alice", "NotAllowed"), ("ops", "QuotaExceeded")])
def test_twenty_approvals_keep_both_invariants(cast, approver, refusal) -> None:
    """acme has 10 of 16; vision 0. Twenty 1-GPU requests approved at once: the first 10 come from
    acme's unassigned quota, 6 more raise acme to the cluster's 16. The last 4 only ops could decide,
    so the tenant admin is refused; ops are refused too, because the cluster has nothing left."""
    fleet = make_fleet()
    services.quota_set(actor=cast.actor("ops"), tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=10)
    requests = [
        services.quota_request_create(actor=cast.actor("carol"), project=cast.vision, flavor=fleet.h100, resource=GPU,
                                      amount=1, reason=f"run {i}")
        for i in range(THREADS)
    ]

    outcomes = run_at_once(lambda i: services.quota_request_approve(actor=actor(approver), request=requests[i]))

    assert kinds(outcomes) == Counter({"ok": 16, refusal: 4})
    assert Quota.objects.get(project=cast.vision, flavor=fleet.h100).nominal == 16
    assert Quota.objects.get(tenant=cast.acme, project__isnull=True, flavor=fleet.h100).nominal == 16
    assert project_sum(cast.acme, fleet.h100) <= 16 and tenant_sum(fleet.h100) <= 16
    statuses = Counter(QuotaRequest.objects.values_list("status", flat=True))
    assert statuses == Counter({"approved": 16, "pending": 4})  # the losers stay decidable
    added = Counter()
    for request in QuotaRequest.objects.filter(status="approved"):
        for level, change in request.applied.items():
            added[level] += Decimal(change["added"])
    assert added == Counter({"project": 16, "tenant": 6})  # exactly what a revert would subtract


def test_twenty_approvers_click_the_same_request(cast) -> None:
    fleet = make_fleet()
    services.quota_set(actor=cast.actor("ops"), tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=10)
    request = services.quota_request_create(actor=cast.actor("carol"), project=cast.vision, flavor=fleet.h100, resource=GPU,
                                            amount=3, reason="one run")
    approvers = ["alice", "bob", "ops"]

    outcomes = run_at_once(lambda i: services.quota_request_approve(actor=actor(approvers[i % 3]), request=request))

    assert kinds(outcomes) == Counter({"ok": 1, "AlreadyDecided": THREADS - 1})
    assert all(isinstance(value, AlreadyDecided) for status, value in outcomes if status == "error")
    assert Quota.objects.get(project=cast.vision, flavor=fleet.h100).nominal == 3
    assert AuditEntry.objects.filter(action="quota_request.approve").count() == 1
    assert AuditEntry.objects.filter(action="quota.raise").count() == 1

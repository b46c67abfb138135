"""The demo cluster in a fresh sandbox (two A100 MIG nodes, all-balanced), its flavors and quotas, and a second ops
person (a change needs an approver other than its proposer)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from maintenance.flow import mig_change_advance
from maintenance.models import MigChange
from portal.kube import kube_cache_clear
from quotas.demo import seed_quota_demo
from quotas.models import Cluster, NodePool
from tenants.access import Actor
from tenants.services import ops_user_ensure

from ..factories import UserFactory


@pytest.fixture
def ops2(cast) -> Any:
    user = UserFactory(username="ops2")
    ops_user_ensure(actor=Actor.system(), user=user)
    return user


@pytest.fixture
def demo(cast, fresh_sandbox, settings) -> SimpleNamespace:
    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    kube_cache_clear()
    seed_quota_demo(architecture="C", reconcile_now=True)  # C enforces MIG flavors
    cluster = Cluster.objects.get(name="sandbox")
    pool = NodePool.objects.get(cluster=cluster, sharing=NodePool.Sharing.MIG)
    return SimpleNamespace(sb=fresh_sandbox, cluster=cluster, pool=pool)


def window(minutes: int = 60) -> dict[str, Any]:
    now = timezone.now()
    return {"window_start": now - timedelta(seconds=1), "deadline": now + timedelta(minutes=minutes)}


def drive(sb: Any, change: MigChange, until: Callable[[MigChange], bool], *, step_seconds: float = 20,
          timeout: float = 60, between: Callable[[], None] | None = None) -> MigChange:
    """Run the change's steps as the worker would (moving the sandbox's clock ``step_seconds`` whenever a step
    waits on the cluster) until ``until`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        change.refresh_from_db()
        if until(change):
            return change
        assert time.monotonic() < deadline, (change.status, change.step, change.status_reason,
                                             list(change.steps.values_list("step", "outcome", "message")))
        again = mig_change_advance(change.pk)
        if between is not None:
            between()
        if again:
            sb.advance(step_seconds)
            time.sleep(0.05)

"""A researcher asks for distributed training "within one rack" on a cluster with racks (issue 26, Kueue TAS) and
reads on the request page where it was placed; a second job that fits no rack says why it waits. One sandbox cluster:
three 2-GPU H100 nodes, two in rack-a1 and one in rack-a2 (block-a)."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
from playwright.sync_api import expect

from portal.kube import kube_cache_clear, kube_for
from quotas.inventory import flavors_discover, inventory_sync, node_taints
from quotas.models import Cluster, Flavor, Quota
from quotas.reconcile import reconcile
from sandbox.testing import _start
from workloads import services
from workloads.catalogue import seed_catalogue
from workloads.materialize import request_materialize
from workloads.models import RequestState, ServiceTemplate, WorkloadRequest
from workloads.status import requests_sync

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]
PROFILE = {"name": "racks", "kubeletVersion": "v1.33.4", "region": "r1", "zone": "h100",
           "nodeGroups": [
               {"name": "gpu", "count": 3, "namePrefix": "gpu-", "instanceType": "x", "cpu": "96", "memory": "1Ti",
                "pods": 110, "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
                "topology": {"block": "block-a", "racks": ["rack-a1", "rack-a1", "rack-a2"]},
                "gpu": {"model": "H100-80GB", "count": 2, "sharing": "whole"}},
               {"name": "cpu", "count": 1, "namePrefix": "cpu-", "instanceType": "y", "cpu": "32", "memory": "128Gi",
                "pods": 110}]}


def _wait(sb, cluster: Cluster, pk: int, states: set[str], timeout: float = 90) -> WorkloadRequest:
    deadline = time.monotonic() + timeout
    while True:
        req = WorkloadRequest.objects.get(pk=pk)
        if req.state in states:
            return req
        assert time.monotonic() < deadline, f"{pk} stuck in {req.state}: {req.pending_reason} {req.cluster_status}"
        sb.advance(2)
        requests_sync(cluster=Cluster.objects.get(pk=cluster.pk), watch_seconds=1)


def _submit(page, cast, flavor: Flavor, name: str, workers: int) -> WorkloadRequest:
    page.goto("/requests/new/?template=training&project=acme-vision")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Command").fill("python train.py")
    page.get_by_label("GPU flavor").select_option(str(flavor.pk))
    page.get_by_label("GPUs").fill("2")
    page.get_by_label("Distributed (multi-node)").check()
    page.get_by_label("Workers").fill(str(workers))
    page.get_by_label("Placement").select_option("rack")
    page.get_by_role("button", name="Submit request").click()
    expect(page.get_by_role("heading", name=name)).to_be_visible()
    req = WorkloadRequest.objects.get(name=name)
    assert req.topology == "rack"
    if req.state == RequestState.PENDING_APPROVAL:  # more GPUs than approved automatically: bob, the project admin
        req = services.request_approve(actor=cast.actor("bob"), request=req)
    if req.state == RequestState.APPROVED:
        request_materialize(request_id=req.pk)
    return req


def test_training_within_one_rack_says_where_it_ran_and_why_the_next_one_waits(signed_in, cast, tmp_path) -> None:
    kube_cache_clear()
    sb = _start(tmp_path / "racks", profile=PROFILE)
    try:
        cluster = Cluster.objects.create(name="racks", architecture="B", kubeconfig_path=str(sb.kubeconfig),
                                         topology="block-rack-host")
        kube = kube_for(cluster)
        inventory_sync(cluster, kube=kube)
        for flavor in flavors_discover(cluster, taints_by_node=node_taints(kube)):
            flavor.save()
        for flavor in Flavor.objects.filter(cluster=cluster):
            for resource in flavor.resource_names:
                amount = {"cpu": 64, "memory": 512}.get(resource, 12)  # quota is not what makes the second job wait
                Quota.objects.create(tenant=cast.acme, flavor=flavor, resource=resource, nominal=Decimal(amount))
                Quota.objects.create(tenant=cast.acme, project=cast.vision, flavor=flavor, resource=resource,
                                     nominal=Decimal(amount), borrowing_limit=Decimal(0))
        seed_catalogue()
        for template in ServiceTemplate.objects.all():
            template.allowed_flavors.set(Flavor.objects.all())
        assert reconcile(cluster, kube=kube).ok
        h100 = Flavor.objects.get(cluster=cluster, kind="whole")

        page = signed_in("carol")
        first = _submit(page, cast, h100, "in-one-rack", workers=2)
        _wait(sb, cluster, first.pk, {RequestState.RUNNING})
        page.reload()
        expect(page.locator(".topology-placement")).to_contain_text("Within one rack; placed in rack rack-a1 (block block-a)")

        second = _submit(page, cast, h100, "needs-a-whole-rack", workers=3)
        _wait(sb, cluster, second.pk, {RequestState.QUEUED})
        deadline = time.monotonic() + 60
        while "in one rack" not in (WorkloadRequest.objects.get(pk=second.pk).pending_reason or ""):
            assert time.monotonic() < deadline, WorkloadRequest.objects.get(pk=second.pk).cluster_status
            sb.advance(2)
            requests_sync(cluster=cluster, watch_seconds=1)
        page.reload()
        reason = page.locator(".pending-reason")
        expect(reason).to_contain_text("free in one rack (3 workers of 2)")
        expect(reason).to_contain_text("the emptiest rack has room for 2 now (1 worker)")
    finally:
        sb.stop()
        kube_cache_clear()

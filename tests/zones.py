"""Two sandbox clusters as two GPU-model zones, for the federation tests (API, pages, browser).

An H100 zone (2 GPUs, failure domain site-a) and an A100 zone (2 GPUs, site-b), each its own sandbox with its own
API endpoint and kubeconfig; acme-vision has 2 GPUs of each, and every template allows every flavor.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

from portal.kube import kube_cache_clear, kube_for
from quotas.inventory import flavors_discover, inventory_sync, node_taints
from quotas.models import Cluster, Flavor, Quota
from quotas.reconcile import reconcile
from sandbox.testing import _start
from workloads.catalogue import seed_catalogue
from workloads.models import ServiceTemplate, WorkloadRequest
from workloads.status import requests_sync


def zone_profile(model: str) -> dict[str, Any]:
    return {"name": f"zone-{model.lower()}", "kubeletVersion": "v1.33.4", "region": "r1", "zone": model.lower(),
            "nodeGroups": [
                {"name": "gpu", "count": 1, "namePrefix": "gpu-", "instanceType": "x", "cpu": "96", "memory": "1Ti",
                 "pods": 110, "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
                 "gpu": {"model": model, "count": 2, "sharing": "whole"}},
                {"name": "cpu", "count": 1, "namePrefix": "cpu-", "instanceType": "y", "cpu": "32", "memory": "128Gi",
                 "pods": 110}]}


@contextmanager
def two_zones(tmp_path: Path, cast: Any) -> Iterator[dict[str, Any]]:
    kube_cache_clear()
    sandboxes = [_start(tmp_path / "h100", profile=zone_profile("H100-80GB")),
                 _start(tmp_path / "a100", profile=zone_profile("A100-80GB"))]
    try:
        clusters = []
        for sb, (name, zone, domain) in zip(sandboxes, [("zone-h100", "h100-training", "site-a"),
                                                        ("zone-a100", "a100-inference", "site-b")], strict=True):
            cluster = Cluster.objects.create(name=name, architecture="B", kubeconfig_path=str(sb.kubeconfig), zone=zone,
                                             failure_domain=domain)
            kube = kube_for(cluster)
            inventory_sync(cluster, kube=kube)
            for flavor in flavors_discover(cluster, taints_by_node=node_taints(kube)):
                flavor.save()
            for flavor in Flavor.objects.filter(cluster=cluster):
                for resource in flavor.resource_names:
                    amount = {"cpu": 64, "memory": 512}.get(resource, 2)
                    Quota.objects.create(tenant=cast.acme, flavor=flavor, resource=resource, nominal=Decimal(amount))
                    Quota.objects.create(tenant=cast.acme, project=cast.vision, flavor=flavor, resource=resource,
                                         nominal=Decimal(amount), borrowing_limit=Decimal(0))
            clusters.append(cluster)
        seed_catalogue()
        flavors = list(Flavor.objects.all())
        for template in ServiceTemplate.objects.all():
            template.allowed_flavors.set(flavors)
        for cluster in clusters:
            assert reconcile(cluster, kube=kube_for(cluster)).ok
        yield {"h100": clusters[0], "a100": clusters[1], "sandboxes": dict(zip(("h100", "a100"), sandboxes, strict=True))}
    finally:
        for sb in sandboxes:
            sb.stop()
        kube_cache_clear()


def zones_sync(zones: dict[str, Any], advance: float = 0) -> None:
    """One status cycle on each zone (after moving its sandbox clock on by ``advance`` seconds)."""
    for key in ("h100", "a100"):
        if advance:
            zones["sandboxes"][key].advance(advance)
        cluster = Cluster.objects.get(pk=zones[key].pk)
        requests_sync(cluster=cluster, watch_seconds=1)


def zones_wait(zones: dict[str, Any], pk: int, states: set[str], timeout: float = 60) -> WorkloadRequest:
    deadline = time.monotonic() + timeout
    while True:
        req = WorkloadRequest.objects.get(pk=pk)
        if req.state in states:
            return req
        assert time.monotonic() < deadline, f"{pk} stuck in {req.state}: {req.pending_reason} {req.cluster_status}"
        zones_sync(zones, advance=2)

"""The demo's H100 training zone on each cluster (issue 26): the sandbox serves Volcano, so `make run` starts it on
architecture E (Volcano Queues for the offline pool); the real control plane runs no Volcano (`make run CLUSTER=real`),
whose API would refuse E's Queues and never start its training, so the seed starts it on F there, and its first
reconcile applies every object."""

from __future__ import annotations

from typing import Any

import pytest

from portal.kube import kube_cache_clear, kube_for
from quotas import manifests as m
from quotas.demo import seed_quota_demo
from quotas.models import Cluster
from tenants.demo import seed_demo

from .test_parity import _clean_real, _kind

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("realcluster"),
              pytest.mark.timeout(400)]


def test_the_demo_h100_zone_runs_e_where_volcano_is_served_and_f_where_it_is_not(cluster_under_test: Any,
                                                                                  settings) -> None:
    if _kind(cluster_under_test) == "real":
        _clean_real(cluster_under_test)
    settings.KUBECONFIG = str(cluster_under_test.kubeconfig)
    kube_cache_clear()
    seed_demo()
    summary = seed_quota_demo()
    cluster = Cluster.objects.get(name="sandbox")
    kube = kube_for(cluster)
    assert summary["reconcile"]["failed"] == [], summary["reconcile"]
    queues = {q["metadata"]["name"] for q in kube.list(m.KUEUE, "ClusterQueue")[0]}
    if _kind(cluster_under_test) == "real":
        assert cluster.architecture == "F" and summary["architecture"] == "F"
        assert {"acme-vision", "acme-vision-online"} <= queues  # F's two queues per project
    else:
        assert cluster.architecture == "E" and summary["architecture"] == "E"
        assert kube.get(m.VOLCANO_QUEUE, "Queue", "acme-vision") is not None
        assert "acme-vision" in queues and "acme-vision-online" not in queues

"""The ops zones page's zone fault is for sandbox zones only (docs/federation.md, "Take a zone down"): a real cluster
(the real control plane, which has no fault endpoint) gets no button, and a POST for it is refused with a 400 that
says why; nothing is audited and the cluster keeps answering."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from portal.kube import kube_cache_clear, kube_for
from quotas.models import Cluster
from tenants.models import AuditEntry

pytestmark = [pytest.mark.django_db, pytest.mark.xdist_group("realcluster"), pytest.mark.timeout(400)]


def test_a_real_cluster_has_no_zone_fault_button_and_is_refused(real_cluster, as_user) -> None:
    kube_cache_clear()
    cluster = Cluster.objects.create(name="real-zone", kubeconfig_path=str(real_cluster.kubeconfig), zone="real",
                                     failure_domain="site-r")
    page = as_user("ops").get("/ops/zones/").content.decode()
    assert "real-zone" in page and ">Take down</button>" not in page and ">Bring up</button>" not in page

    refused = as_user("ops").post("/ops/zones/real-zone/fault/", {"action": "down"})
    assert refused.status_code == 400
    assert "real-zone: only sandbox clusters have fault injection" in refused.content.decode()
    with pytest.raises(CommandError, match="only sandbox clusters have fault injection"):
        call_command("zone_fault", "real-zone", "down", stdout=io.StringIO())
    assert not AuditEntry.objects.filter(action="cluster.zone_fault").exists()
    assert kube_for(cluster).list("v1", "Node")[0]  # it still answers
    kube_cache_clear()

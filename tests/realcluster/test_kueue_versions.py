"""Kueue's two API versions, against real Kueue (v0.17 serves v1beta2 and v1beta1 and converts between them with
its own conversion webhook): the portal detects which it speaks, says so on the ops page, and, spoken to as an older
Kueue (v1beta1 only), writes objects Kueue's v1beta1 schema accepts and that Kueue's own conversion turns into
exactly the v1beta2 objects the portal renders; a job still runs."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test import Client

from portal.kube import Kube, kube_for
from quotas.inventory import inventory_sync
from quotas.models import Cluster, Quota
from quotas.reconcile import reconcile
from workloads.models import RequestState

from ..workloads.test_lifecycle import celery_worker_thread, worker  # noqa: F401 - fixtures
from .test_parity import _custom, _world_on

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("realcluster"),
              pytest.mark.timeout(400)]


def test_the_portal_detects_kueue_v1beta2_and_the_ops_page_says_so(cluster_under_test, cast) -> None:
    cluster = Cluster.objects.create(name="versions", kubeconfig_path=str(cluster_under_test.kubeconfig))
    inventory_sync(cluster)
    cluster.refresh_from_db()
    assert cluster.kueue_api == "v1beta2"
    assert cluster.kueue_served.split(", ") == ["v1beta2", "v1beta1"]
    browser = Client()
    browser.force_login(cast.ops)
    page = browser.get(f"/ops/capacity/?cluster={cluster.name}")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="kueue-api"' in html and "v1beta2" in html and "served: v1beta2, v1beta1" in html
    connections.close_all()


@pytest.mark.usefixtures("worker")
def test_spoken_to_as_an_older_kueue_the_portal_writes_v1beta1_and_kueue_converts_it_back(real_cluster, cast) -> None:
    world = _world_on(real_cluster, cast, "B")
    kube = kube_for(world.cluster)
    # The same cluster, spoken to in v1beta1 only, as a Kueue older than v0.15 would require.
    kube.kueue_pin = "v1beta1"
    assert kube.kueue_api() == "v1beta1"
    # Unchanged: every object read back through v1beta1 and converted up is what the portal renders.
    again = reconcile(world.cluster, kube=kube)
    assert again.ok and not again.applied, again
    # A change written through v1beta1 (the vision queue's nominal quota) ...
    flavor = world.flavors["h100-80gb-offline"]
    Quota.objects.filter(project=cast.vision, flavor=flavor, resource="nvidia.com/gpu").update(nominal=3)
    changed = reconcile(world.cluster, kube=kube)
    assert changed.ok, changed
    assert changed.applied, changed
    assert kube.calls["apply"] >= 1
    # ... is stored by Kueue and read in v1beta2 by a client that detects the version itself.
    plain = Kube(kubeconfig_path=str(real_cluster.kubeconfig))
    assert plain.kueue_api() == "v1beta2"
    queues = {q["metadata"]["name"]: q for q in _custom(plain, "clusterqueues")}
    vision = next(q for name, q in queues.items() if name.endswith("vision"))
    assert vision["spec"]["cohortName"], vision["spec"]  # v1beta1's spec.cohort, converted by Kueue
    gpu = next(r for g in vision["spec"]["resourceGroups"] for f in g["flavors"] if f["name"] == flavor.name
               for r in f["resources"] if r["name"] == "nvidia.com/gpu")
    assert gpu["nominalQuota"] in (3, "3")
    # The raw v1beta1 object has the old field names.
    old = plain.get("kueue.x-k8s.io/v1beta1", "ClusterQueue", vision["metadata"]["name"])
    assert old["spec"].get("cohort") == vision["spec"]["cohortName"] and "cohortName" not in old["spec"]
    # And a job goes through Kueue with the portal following its Workload in v1beta1.
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    req = world.wait(req, lambda r: r.state == RequestState.RUNNING, advance=5, timeout=120)
    workload = next(v for k, v in req.cluster_status["objects"].items() if k.startswith("workload/"))
    assert workload["c"]["Admitted"][0] == "True"
    plain.close()
    connections.close_all()

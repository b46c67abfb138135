"""One Prometheus over several clusters (docs/measured-use.md, "One Prometheus over several clusters"), end to end.

Two sandbox clusters (tests/zones.py: an H100 zone and an A100 zone) both have the namespace ``acme-vision``; the
H100 zone's Prometheus also answers for the A100 zone's (``peers``), and each adds its own ``cluster`` label
(``externalLabels``). A training job runs on the H100 zone (the ``light`` profile), another on the A100 zone
(``saturated``), and a stray pod in the A100 zone's ``acme-vision`` bears the first request's name. With
``PROMETHEUS_CLUSTER_LABEL=cluster`` each request gets its own cluster's numbers; without it the stray pod's are mixed
into the first request's. The health page's XID read tells the two zones' same-named GPU nodes apart likewise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from insights.measured import SLOT_SECONDS, measured_take, queries
from insights.models import MeasuredSample
from maintenance.health import inventory, xid_errors
from quotas.models import Cluster
from sandbox.controllers.sim import GPU_TOLERATION, Sim
from tenants.access import Actor
from workloads.materialize import request_materialize
from workloads.models import RequestState

from ..zones import two_zones, zones_wait

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(300)]


@pytest.fixture
def zones(tmp_path: Path, cast, settings):
    with two_zones(tmp_path, cast) as found:
        h100, a100 = found["sandboxes"]["h100"], found["sandboxes"]["a100"]
        for sb in (h100, a100):
            sb.clock.speed = 0
        h100.dcgm.by_kind.update(training="light")  # the A100 zone: the default, saturated
        # the A100 zone's series carry a value other than its name: Cluster.prometheus_cluster says which
        Cluster.objects.filter(pk=found["a100"].pk).update(prometheus_cluster="a100-east")
        h100.dcgm.external_labels = {"cluster": "zone-h100"}
        a100.dcgm.external_labels = {"cluster": "a100-east"}
        h100.dcgm.peers = [a100.http_url]  # one query API for both
        settings.PROMETHEUS_URL = f"{h100.http_url}/prometheus"
        yield found


def _run(zones: dict[str, Any], api, flavor: str) -> int:
    body = {"project": "acme-vision", "template": "training", "flavor": flavor, "gpus": 1, "duration_hours": 2,
            "name": f"on-{flavor}", "parameters": {"command": "python train.py"}}
    got = api("carol").post("/api/v1/requests/", body, format="json")
    assert got.status_code == 201, got.content
    assert request_materialize(request_id=got.json()["id"]) == "queued"
    return zones_wait(zones, got.json()["id"], {S.RUNNING}).pk


def _stray(sb, name: str) -> None:
    """A GPU pod in ``acme-vision`` of the sandbox ``sb`` whose name starts with ``name-`` (not the portal's)."""
    job = Sim.job(name, "acme-vision", requests={"nvidia.com/gpu": 1, "cpu": 1}, duration="86400",
                  tolerations=[GPU_TOLERATION])
    sb.store.create(job, field_manager="test")
    sb.advance(5)
    sb.advance(5)  # bound, then started
    pods = [p for p in sb.store.list("v1", "Pod", "acme-vision")["items"] if p["metadata"]["name"].startswith(name + "-")]
    assert pods and pods[0]["status"]["phase"] == "Running"


def test_each_request_gets_its_own_clusters_numbers(zones, api, settings) -> None:
    h100_sb, a100_sb = zones["sandboxes"]["h100"], zones["sandboxes"]["a100"]
    on_h100 = _run(zones, api, "h100-80gb")
    on_a100 = _run(zones, api, "a100-80gb")
    _stray(a100_sb, f"req-{on_h100}")  # the same namespace and request name, in the other cluster
    h100_sb.advance(10)
    for sb in (h100_sb, a100_sb):
        sb.advance(SLOT_SECONDS)  # five minutes of scrapes
    now = timezone.now()

    # Without the label (one Prometheus per cluster assumed), the stray pod's numbers are mixed in.
    settings.PROMETHEUS_CLUSTER_LABEL = ""
    assert measured_take(now)["written"] == 2
    mixed = MeasuredSample.objects.get(request_id=on_h100)
    assert mixed.fb_used_max > 60000 and mixed.util_avg > 50  # the A100's saturated pod, not the light job

    settings.PROMETHEUS_CLUSTER_LABEL = "cluster"
    assert queries("cluster")["util"] == "avg by (cluster, namespace, pod) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]))"
    MeasuredSample.objects.all().delete()
    assert measured_take(now)["written"] == 2
    got = {s.request_id: s for s in MeasuredSample.objects.all()}
    light, saturated = got[on_h100], got[on_a100]
    assert 30 <= light.util_avg <= 50 and 8718 <= light.fb_used_max <= 9318  # the H100 zone's light job only
    assert light.cluster_id == zones["h100"].pk
    assert saturated.util_avg >= 95 and saturated.fb_used_max > 0.85 * 81920 and saturated.cluster_id == zones["a100"].pk


def test_xid_errors_are_told_apart_by_cluster(zones, settings, cast) -> None:
    a100_sb = zones["sandboxes"]["a100"]
    node = next(n for n in zones["a100"].nodes.all() if n.name.startswith("gpu-"))
    assert zones["h100"].nodes.filter(name=node.name).exists()  # the same node name in both clusters
    a100_sb.dcgm.xid_faults = [{"node": node.name, "gpu": 0, "code": 79, "afterSeconds": 0}]
    for sb in zones["sandboxes"].values():
        sb.advance(60)  # a scrape after the fault
    settings.PROMETHEUS_CLUSTER_LABEL = "cluster"
    xid = xid_errors(fresh=True)
    assert xid.error == "", xid.error
    rows, _ = inventory(actor=Actor(user=cast.ops), xid=xid)
    flagged = {(r.node.cluster.name, r.node.name) for r in rows if r.xids}
    assert flagged == {("zone-a100", node.name)}
    settings.PROMETHEUS_CLUSTER_LABEL = ""  # by node name alone, both clusters' nodes would be flagged
    rows, _ = inventory(actor=Actor(user=cast.ops), xid=xid_errors(fresh=True))
    assert {(r.node.cluster.name, r.node.name) for r in rows if r.xids} == {("zone-a100", node.name),
                                                                           ("zone-h100", node.name)}

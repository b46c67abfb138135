"""Federation end to end: two sandbox clusters as two GPU-model zones (docs/federation.md).

An H100 zone (2 GPUs) and an A100 zone (2 GPUs), the project provisioned on both. Through the API: a job fills the
H100 zone; a job that accepts A100 but did not consent waits for H100; one that consented spills to A100, runs
there, and is metered as A100; an image that needs more than a model has is refused before dispatch; draining the
H100 zone moves the consenting pending job once and leaves the running one and the non-consenting one alone. Other
tenants see none of it. Materialization and the follower run in the test (no worker).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from billing.models import UsageInterval
from insights.registry import METRICS, Query
from quotas.models import Cluster, Flavor
from quotas.zones import cluster_drain, spill_policy_set
from tenants.access import Actor, scope_of
from tenants.models import AuditEntry
from workloads import routing, services
from workloads.manifests import REQUEST_LABEL
from workloads.materialize import request_materialize
from workloads.models import RequestState, WorkloadRequest

from ..zones import two_zones, zones_sync, zones_wait

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(300)]


@pytest.fixture
def zones(tmp_path: Path, cast):
    """Two clusters, each one GPU model's zone, in two failure domains; acme-vision has 2 GPUs of each."""
    with two_zones(tmp_path, cast) as found:
        yield found


_sync, _wait = zones_sync, zones_wait


def _submit(api, who: str, name: str, **body: Any):
    payload = {"project": "acme-vision", "template": "training", "flavor": "h100-80gb", "gpus": 2, "duration_hours": 1,
               "name": name, "parameters": {"command": "python train.py"}} | body
    return api(who).post("/api/v1/requests/", payload, format="json")


def test_spill_over_only_with_consent_and_a_drained_zone_moves_pending_work_once(zones, api, as_user, cast) -> None:
    h100, a100 = zones["h100"], zones["a100"]
    flavor_h100 = Flavor.objects.get(cluster=h100, name="h100-80gb")
    assert (flavor_h100.gpu_model, flavor_h100.gpu_memory_mib, flavor_h100.compute_capability) == ("h100-80gb", 81559, "9.0")
    assert Flavor.objects.get(cluster=a100, name="a100-80gb").compute_capability == "8.0"
    spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=True, target_models=["a100-80gb"])

    # The H100 zone fills up.
    first = _submit(api, "carol", "fills-h100")
    assert first.status_code == 201, first.content
    assert first.json()["placement"]["cluster"] == "zone-h100"
    assert request_materialize(request_id=first.json()["id"]) == "queued"
    running = _wait(zones, first.json()["id"], {S.RUNNING})

    # Accepts A100 but did not consent: it waits for H100, and says so.
    waits = _submit(api, "carol", "no-consent", accepted_models=["h100-80gb", "a100-80gb"])
    assert waits.status_code == 201, waits.content
    placement = waits.json()["placement"]
    assert placement["cluster"] == "zone-h100" and placement["spilled"] is False
    assert "did not consent to spill over" in placement["reason"], placement
    assert request_materialize(request_id=waits.json()["id"]) == "queued"

    # Consented: it spills over to the A100 zone and runs there.
    spills = _submit(api, "carol", "with-consent", accepted_models=["h100-80gb", "a100-80gb"], spill_consent=True)
    assert spills.status_code == 201, spills.content
    placement = spills.json()["placement"]
    assert (placement["cluster"], placement["zone"], placement["gpu_model"]) == ("zone-a100", "a100-inference", "a100-80gb")
    assert placement["spilled"] is True and placement["spilled_from_model"] == "h100-80gb"
    assert "Spilled over from h100-80gb to a100-80gb" in placement["reason"]
    spilled_id = spills.json()["id"]
    assert request_materialize(request_id=spilled_id) == "queued"
    spilled = _wait(zones, spilled_id, {S.RUNNING})
    assert spilled.cluster_id == a100.pk and spilled.flavor.name == "a100-80gb"

    # The request page and the API detail say where it ran and why.
    page = as_user("carol").get(f"/requests/{spilled_id}/").content.decode()
    assert "spilled over from h100-80gb" in page and "Spilled over from h100-80gb to a100-80gb in zone a100-inference" in page
    detail = api("carol").get(f"/api/v1/requests/{spilled_id}/").json()
    assert detail["placement"]["spilled"] is True and detail["flavor"] == "a100-80gb"

    # Billing charges the model that ran: its usage is metered as A100 GPU-hours on the A100 cluster.
    _sync(zones, advance=30)
    intervals = list(UsageInterval.objects.filter(request_id=spilled_id, unit="gpu"))
    assert intervals and {(i.key, i.cluster_id) for i in intervals} == {("a100-80gb", a100.pk)}

    # The queue wait saved: at routing, the H100 zone's wait was estimated from what runs and waits there (the
    # running job's hour, then the queued job's hour ahead of it); on A100 it waited seconds.
    assert spilled.spill_source_pending is not None
    assert 6600 <= spilled.spill_source_wait_seconds <= 7200, spilled.spill_source_wait_seconds
    now = timezone.now()
    period = {"start": now - timedelta(hours=1), "end": now + timedelta(hours=1), "group_by": "flavor"}
    result = METRICS["spill-over"].compute(Query(scope=scope_of(cast.actor("ops")), **period))
    (row,) = result.rows
    assert (row.group, row.values["spilled"], row.values["measured"]) == ("a100-80gb@zone-a100", 1, 1)
    assert 1.7 <= row.values["saved_hours"] <= 2.0 and row.values["target_wait"] < 5, row.values
    assert METRICS["spill-over"].compute(Query(scope=scope_of(cast.actor("erin")), **period)).rows == []

    # An image that needs more than a model has is refused before dispatch (nothing written).
    before = WorkloadRequest.objects.count()
    refused = _submit(api, "carol", "too-new", accepted_models=["h100-80gb", "a100-80gb"], spill_consent=True,
                      min_compute_capability="9.0")
    assert refused.status_code == 400
    assert "a100-80gb has compute capability 8.0; the image needs 9.0" in refused.content.decode()
    refused = _submit(api, "carol", "too-big", min_gpu_memory_gib=141)
    assert refused.status_code == 400
    assert "the image needs 141 GiB" in refused.content.decode()
    assert WorkloadRequest.objects.count() == before

    # A consenting job that waits on H100 (A100 is full now too).
    pending = _submit(api, "carol", "pending-consent", accepted_models=["h100-80gb", "a100-80gb"], spill_consent=True)
    assert pending.status_code == 201 and pending.json()["placement"]["cluster"] == "zone-h100", pending.content
    assert request_materialize(request_id=pending.json()["id"]) == "queued"
    _sync(zones)

    # Ops drain the H100 zone: the consenting pending job moves once; the running one and the one that did not
    # consent stay. The A100 zone is untouched.
    cluster_drain(actor=Actor(user=cast.ops), cluster=h100, reason="rack power work")
    out = routing.requests_redispatch(cluster_id=h100.pk, usable=services.redispatch_usable)
    assert out == {"moved": 1, "stayed": 1}
    moved = WorkloadRequest.objects.get(pk=pending.json()["id"])
    assert moved.cluster_id == a100.pk and moved.redispatched_from_id == h100.pk and moved.state == S.APPROVED
    assert moved.spilled and moved.spilled_from_model == "h100-80gb"
    assert "Re-dispatched from zone-h100 to zone-a100" in moved.events.last().message
    assert not zones["sandboxes"]["h100"].store.list("batch/v1", "Job", cast.vision.namespace,
                                                     label_selector=f"{REQUEST_LABEL}={moved.pk}")["items"]
    assert WorkloadRequest.objects.get(pk=running.pk).state == S.RUNNING  # never duplicated, never moved
    stayed = WorkloadRequest.objects.get(pk=waits.json()["id"])
    assert stayed.cluster_id == h100.pk and "Not moved off zone-h100" in stayed.events.last().message
    assert WorkloadRequest.objects.get(pk=spilled_id).cluster_id == a100.pk
    # At most once: a second pass moves nothing, and one redispatch is audited.
    assert routing.requests_redispatch(cluster_id=h100.pk, usable=services.redispatch_usable)["moved"] == 0
    assert AuditEntry.objects.filter(action="request.redispatch", target_id=str(moved.pk)).count() == 1
    assert AuditEntry.objects.filter(action="cluster.drain").count() == 1
    assert request_materialize(request_id=moved.pk) == "queued"
    assert zones["sandboxes"]["a100"].store.list("batch/v1", "Job", cast.vision.namespace,
                                                 label_selector=f"{REQUEST_LABEL}={moved.pk}")["items"]

    # Ops see one inventory and the spill-over counts; other tenants see none of it.
    zones_page = as_user("ops").get("/ops/zones/").content.decode()
    assert "h100-training" in zones_page and "a100-inference" in zones_page and "site-b" in zones_page
    assert "draining" in zones_page and "rack power work" in zones_page
    assert "h100-80gb → a100-80gb" in zones_page and "Queue wait saved" in zones_page
    (summary,) = routing.spill_summary()
    assert summary.requests == 2 and summary.measured == 1 and summary.wait_saved_hours >= Decimal("1.7")
    assert as_user("erin").get("/ops/zones/").status_code == 404
    assert api("erin").get("/api/v1/requests/").json()["results"] == []
    assert api("frank").get(f"/api/v1/requests/{spilled_id}/").status_code == 404


def test_a_zone_down_longer_than_the_grace_moves_pending_work_once_and_is_cleaned_when_back(zones, api, cast) -> None:
    """The H100 zone's API goes down (sandbox fault injection). A blip moves nothing; once it has been unhealthy for
    longer than PORTAL_REDISPATCH_AFTER_SECONDS, housekeeping moves its pending consenting job to A100 once; the
    running job and the one that did not consent stay; the A100 zone is untouched. When H100 answers again the
    moved job's leftovers there are deleted."""
    from sandbox.testing import control
    from workloads.tasks import requests_housekeeping_task

    h100, a100 = zones["h100"], zones["a100"]
    running = _submit(api, "carol", "runs-on-h100").json()["id"]
    assert request_materialize(request_id=running) == "queued"
    _wait(zones, running, {S.RUNNING})
    # The policy allows nothing yet: the consenting job waits on H100 (so does the one that did not consent).
    consenting = _submit(api, "carol", "consents", accepted_models=["h100-80gb", "a100-80gb"], spill_consent=True).json()
    stays = _submit(api, "carol", "no-consent", accepted_models=["h100-80gb", "a100-80gb"]).json()
    assert consenting["placement"]["cluster"] == stays["placement"]["cluster"] == "zone-h100"
    for pk in (consenting["id"], stays["id"]):
        assert request_materialize(request_id=pk) == "queued"
    spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=True, target_models=["a100-80gb"])

    sb = zones["sandboxes"]["h100"]
    status, _, _ = control(sb, "PUT", "/sandbox/faults", {"error_rate": 1.0, "error_codes": [500]})
    assert status == 200
    try:
        _sync(zones)
        down = Cluster.objects.get(pk=h100.pk)
        assert down.health == "unhealthy" and Cluster.objects.get(pk=a100.pk).health == "healthy"
        # A blip (unhealthy for less than the grace): nothing moves.
        requests_housekeeping_task()
        assert WorkloadRequest.objects.get(pk=consenting["id"]).cluster_id == h100.pk
        # Longer than the grace: the consenting pending job moves, once; its old objects wait for H100 to answer.
        later = timezone.now() + timedelta(seconds=settings.PORTAL_REDISPATCH_AFTER_SECONDS + 1)
        out = routing.zones_redispatch(usable=services.redispatch_usable, now=later)
        assert out == {"zone-h100": {"moved": 1, "stayed": 1}}
        moved = WorkloadRequest.objects.get(pk=consenting["id"])
        assert (moved.cluster_id, moved.state, moved.redispatched_from_id, moved.leftovers_removed_at) == (
            a100.pk, S.APPROVED, h100.pk, None)
        assert "because cluster zone-h100 is unhealthy" in moved.events.last().message
        assert WorkloadRequest.objects.get(pk=running).state == S.RUNNING  # never duplicated, never moved
        assert WorkloadRequest.objects.get(pk=running).cluster_id == h100.pk
        assert "Not moved off zone-h100" in WorkloadRequest.objects.get(pk=stays["id"]).events.last().message
        assert routing.zones_redispatch(usable=services.redispatch_usable, now=later)["zone-h100"]["moved"] == 0
        assert AuditEntry.objects.filter(action="request.redispatch").count() == 1
        assert request_materialize(request_id=moved.pk) == "queued"
        assert zones["sandboxes"]["a100"].store.list("batch/v1", "Job", cast.vision.namespace,
                                                     label_selector=f"{REQUEST_LABEL}={moved.pk}")["items"]
        assert sb.store.list("batch/v1", "Job", cast.vision.namespace,
                             label_selector=f"{REQUEST_LABEL}={moved.pk}")["items"]  # still there: unreachable
    finally:
        control(sb, "PUT", "/sandbox/faults", {})
    # H100 answers again: healthy, and the moved job's leftovers there are deleted by housekeeping.
    _sync(zones)
    assert Cluster.objects.get(pk=h100.pk).health == "healthy"
    requests_housekeeping_task()
    assert WorkloadRequest.objects.get(pk=moved.pk).leftovers_removed_at is not None
    assert not sb.store.list("batch/v1", "Job", cast.vision.namespace, label_selector=f"{REQUEST_LABEL}={moved.pk}")["items"]
    assert WorkloadRequest.objects.get(pk=running).state == S.RUNNING

"""Routing again at approval (docs/federation.md, "Routing again at approval"): two sandbox clusters as two GPU-model
zones (tests/zones.py: H100 and A100, 2 GPUs each, acme-vision 2 GPUs of each, no borrowing).

A request that waits for an approver was routed at submission; when it is approved the same rule runs again against
the clusters' load then, plus what was approved and is not in their queues yet: it moves (audited, on its timeline,
in the API's placement and on its page) when the answer changed, stays and says so when no zone can take it, and
two approvals at once never route more to a zone than the project's quota there. Materialization and the follower
run in the test (no worker).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from quotas.models import Cluster
from quotas.zones import cluster_drain, cluster_undrain, spill_policy_set
from tenants.access import Actor
from tenants.models import AuditEntry
from workloads.materialize import request_act, request_materialize
from workloads.models import RequestState, WorkloadRequest

from ..zones import two_zones, zones_sync, zones_wait

S = RequestState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(300)]
API = "/api/v1"
BOTH = ["h100-80gb", "a100-80gb"]


@pytest.fixture
def zones(tmp_path: Path, cast):
    with two_zones(tmp_path, cast) as found:
        spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=True, target_models=["a100-80gb"])
        yield found


def _submit(api, name: str, hours: int = 1, **body: Any) -> dict[str, Any]:
    """carol's training job of 2 H100; more than 8 hours waits for an approver (the global approval rule)."""
    payload = {"project": "acme-vision", "template": "training", "flavor": "h100-80gb", "gpus": 2,
               "duration_hours": hours, "name": name, "parameters": {"command": "python train.py"}} | body
    response = api("carol").post(f"{API}/requests/", payload, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _fill_h100(api, zones) -> int:
    running = _submit(api, "fills-h100")
    assert running["state"] == S.APPROVED and running["placement"]["cluster"] == "zone-h100"
    assert request_materialize(request_id=running["id"]) == "queued"
    zones_wait(zones, running["id"], {S.RUNNING})
    return running["id"]


def _reroutes(pk: int) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action="request.reroute", target_id=str(pk)))


def test_api_approval_moves_a_waiting_request_to_the_zone_that_is_free_now(zones, api, as_user, cast) -> None:
    # Submitted while H100 is free: routed there, waits for an approver (9 hours).
    waiting = _submit(api, "long-run", hours=9, accepted_models=BOTH, spill_consent=True)
    assert waiting["state"] == S.PENDING_APPROVAL and waiting["placement"]["cluster"] == "zone-h100"
    # Meanwhile the H100 zone fills up.
    _fill_h100(api, zones)

    response = api("bob").post(f"{API}/requests/{waiting['id']}/approve/", {}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    placement = body["placement"]
    assert body["state"] == S.APPROVED and body["flavor"] == "a100-80gb"
    assert (placement["cluster"], placement["zone"], placement["spilled"], placement["spilled_from_model"]) == (
        "zone-a100", "a100-inference", True, "h100-80gb")
    assert placement["reason"].startswith("Re-routed at approval from zone h100-training (zone-h100")
    assert "h100-80gb is full in every zone" in placement["reason"] and "h100-training: 0 free" in placement["reason"]
    assert any(e["message"].startswith("Re-routed at approval") for e in body["timeline"]), body["timeline"]

    # Audited: who, from, to, why.
    (entry,) = _reroutes(waiting["id"])
    assert entry.actor_id == cast.bob.pk
    assert entry.before["cluster"] == "zone-h100" and entry.after["cluster"] == "zone-a100"
    assert entry.after["spilled"] is True and "full" in entry.after["why"]

    # The request page's timeline says so, and it runs where it was moved to.
    page = as_user("carol").get(f"/requests/{waiting['id']}/").content.decode()
    assert "Re-routed at approval from zone h100-training" in page
    assert request_materialize(request_id=waiting["id"]) == "queued"
    moved = zones_wait(zones, waiting["id"], {S.RUNNING})
    assert moved.cluster.name == "zone-a100" and moved.flavor.name == "a100-80gb"
    assert zones["sandboxes"]["a100"].store.list("batch/v1", "Job", cast.vision.namespace)["items"]

    # Other tenants see none of it.
    assert api("frank").get(f"{API}/requests/{waiting['id']}/").status_code == 404


def test_web_approval_brings_a_spilled_request_back_when_its_first_model_has_room(zones, api, as_user, cast) -> None:
    running = _fill_h100(api, zones)
    spilled = _submit(api, "spilled-long", hours=9, accepted_models=BOTH, spill_consent=True)
    assert spilled["state"] == S.PENDING_APPROVAL and spilled["placement"]["cluster"] == "zone-a100"
    assert spilled["placement"]["spilled"] is True
    # The H100 job is stopped while the spilled one waits: H100 is free again.
    assert api("carol").post(f"{API}/requests/{running}/stop/", {}, format="json").status_code == 200
    request_act(request_id=running, action="stop")
    zones_sync(zones)

    bob = as_user("bob")
    response = bob.post(f"/requests/{spilled['id']}/decide/", {"decision": "approve"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    row = response.content.decode()
    assert "approved. Re-routed at approval from zone a100-inference" in row, row
    req = WorkloadRequest.objects.get(pk=spilled["id"])
    assert (req.state, req.cluster.name, req.flavor.name, req.spilled, req.spilled_from_model) == (
        S.APPROVED, "zone-h100", "h100-80gb", False, "")
    assert "(its first model has room again)" in req.route_reason
    page = as_user("carol").get(f"/requests/{spilled['id']}/").content.decode()
    assert "Re-routed at approval from zone a100-inference" in page and "its first model has room again" in page
    (entry,) = _reroutes(spilled["id"])
    assert (entry.actor_id, entry.before["cluster"], entry.after["cluster"]) == (cast.bob.pk, "zone-a100", "zone-h100")


def test_approval_where_no_zone_can_take_it_approves_it_where_it_is_and_says_so(zones, api, as_user, cast) -> None:
    waiting = _submit(api, "long-run", hours=9, accepted_models=BOTH, spill_consent=True)
    assert waiting["placement"]["cluster"] == "zone-h100"
    for key in ("h100", "a100"):
        cluster_drain(actor=Actor(user=cast.ops), cluster=Cluster.objects.get(pk=zones[key].pk), reason="power work")

    response = api("bob").post(f"{API}/requests/{waiting['id']}/approve/", {}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == S.APPROVED and body["placement"]["cluster"] == "zone-h100"
    (note,) = [e["message"] for e in body["timeline"] if "Approved where it is" in e["message"]]
    assert "no zone can take it now" in note and "drained" in note and "It waits there." in note
    assert _reroutes(waiting["id"]) == []
    page = as_user("bob").get(f"/requests/{waiting['id']}/").content.decode()
    assert "Approved where it is, in zone h100-training" in page

    # A request that stays on a free zone is approved as before: no note, no audit of a move.
    for key in ("h100", "a100"):
        cluster_undrain(actor=Actor(user=cast.ops), cluster=Cluster.objects.get(pk=zones[key].pk))
    other = _submit(api, "stays", hours=9, gpus=1)
    body = api("bob").post(f"{API}/requests/{other['id']}/approve/", {}, format="json").json()
    assert body["placement"]["cluster"] == "zone-h100"
    assert not [e for e in body["timeline"] if "at approval" in e["message"] or "where it is" in e["message"]]


def test_two_approvals_at_once_never_route_more_than_the_quota_of_the_free_zone(zones, api, cast) -> None:
    # Two 2-GPU requests routed to H100 while it was free, each waiting for an approver; then H100 fills up.
    first = _submit(api, "first-long", hours=9, accepted_models=BOTH, spill_consent=True)
    second = _submit(api, "second-long", hours=9, accepted_models=BOTH, spill_consent=True)
    assert first["placement"]["cluster"] == second["placement"]["cluster"] == "zone-h100"
    _fill_h100(api, zones)

    # Both approved at once: the A100 zone has room for one (acme-vision's 2 A100, no borrowing).
    clients = [api("bob"), api("alice")]
    barrier = threading.Barrier(2)
    codes: list[Any] = [None, None]

    def approve(i: int, pk: int) -> None:
        try:
            barrier.wait(timeout=30)
            codes[i] = clients[i].post(f"{API}/requests/{pk}/approve/", {}, format="json").status_code
        finally:
            connections.close_all()

    threads = [threading.Thread(target=approve, args=(i, r["id"])) for i, r in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert codes == [200, 200]
    rows = {r.name: r for r in WorkloadRequest.objects.filter(pk__in=[first["id"], second["id"]]).select_related("cluster")}
    assert {r.state for r in rows.values()} == {S.APPROVED}
    assert sorted(r.cluster.name for r in rows.values()) == ["zone-a100", "zone-h100"], rows
    moved = next(r for r in rows.values() if r.cluster.name == "zone-a100")
    stayed = next(r for r in rows.values() if r.cluster.name == "zone-h100")
    assert len(_reroutes(moved.pk)) == 1 and _reroutes(stayed.pk) == []
    assert stayed.spilled is False

    # Both are materialized: the A100 one runs, the H100 one waits for H100; nothing waits on A100 over quota.
    for req in (moved, stayed):
        assert request_materialize(request_id=req.pk) == "queued"
    assert zones_wait(zones, moved.pk, {S.RUNNING}).cluster.name == "zone-a100"
    assert WorkloadRequest.objects.get(pk=stayed.pk).state == S.QUEUED

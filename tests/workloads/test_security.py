"""Security review of the request path: who may mount which volume, who gets which priority without an
approver, and names that stay unique under concurrent submissions (real PostgreSQL in CI)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, connections, transaction
from rest_framework.test import APIClient

from portal.exceptions import ConflictError, NotAllowed
from tenants.models import AuditEntry
from workloads import catalogue_services, services
from workloads.models import (
    LIVE_STATES,
    ApprovalRule,
    RequestState,
    Volume,
    WorkloadRequest,
)
from workloads.states import FINAL

from .factories import make_request

pytestmark = [pytest.mark.django_db]

API = "/api/v1"
S = RequestState
TRAIN = {"template": "training", "flavor": "h100", "project": "acme-vision", "parameters": {"command": "python train.py"}}


def post(client, path: str, body: dict[str, Any]):
    return client.post(f"{API}{path}", body, format="json")


def submit(cast, cat, who: str = "carol", *, template=None, **values):
    template = template or cat.training
    values.setdefault("parameters", {"training": {"command": "python train.py"}, "inference": {"model_uri": "hf://m"}}
                      .get(template.slug, {}))
    values.setdefault("flavor", cat.h100)
    return services.request_submit(actor=cast.actor(who), project=cast.vision, template=template, **values)


# 1. Volumes: only the requester's own and the project's shared ones ----------------------------------------


def test_a_job_cannot_mount_another_users_notebook_home(api, cast, cat) -> None:
    notebook = submit(cast, cat, "bob", template=cat.notebook, gpus=1)
    home = Volume.objects.get(request=notebook)
    assert (home.name, home.owner) == (f"home-req-{notebook.pk}-0", cast.bob)
    before = WorkloadRequest.objects.count()

    response = post(api("carol"), "/requests/", TRAIN | {"parameters": {"command": "cat /data/.ssh/id_rsa",
                                                                        "data_volume": home.name}})

    assert response.status_code == 400, response.json()
    assert "parameters.data_volume" in response.json()["fields"]
    assert home.name in response.json()["fields"]["parameters.data_volume"][0]
    assert WorkloadRequest.objects.count() == before
    # Nor a claim the portal does not know of.
    unknown = post(api("carol"), "/requests/", TRAIN | {"parameters": {"command": "x", "data_volume": "whatever"}})
    assert unknown.status_code == 400 and "parameters.data_volume" in unknown.json()["fields"]


def test_own_and_project_shared_volumes_may_be_mounted(api, cast, cat) -> None:
    mine = submit(cast, cat, "carol", template=cat.notebook, gpus=1)
    own_home = Volume.objects.get(request=mine).name
    # A project admin shares a dataset claim with the project; carol registers a scratch claim of her own.
    shared = post(api("bob"), "/volumes/", {"project": "acme-vision", "name": "imagenet", "shared": True})
    assert shared.status_code == 201 and shared.json()["shared"] is True and shared.json()["owner"] is None
    scratch = post(api("carol"), "/volumes/", {"project": "acme-vision", "name": "carol-scratch"})
    assert scratch.status_code == 201 and scratch.json()["owner"] == "carol"

    for claim in (own_home, "imagenet", "carol-scratch"):
        response = post(api("carol"), "/requests/", TRAIN | {"parameters": {"command": "x", "data_volume": claim}})
        assert response.status_code == 201, (claim, response.json())
        assert response.json()["parameters"]["data_volume"] == claim
    # carol's own volume is hers: bob's requests may not mount it.
    refused = post(api("bob"), "/requests/", TRAIN | {"parameters": {"command": "x", "data_volume": "carol-scratch"}})
    assert refused.status_code == 400 and "parameters.data_volume" in refused.json()["fields"]
    # Listing: carol sees the shared one and her own, not bob's.
    names = {row["name"] for row in api("carol").get(f"{API}/volumes/").json()["results"]}
    assert names == {own_home, "imagenet", "carol-scratch"}
    # Deleting the notebook removes its home volume, and with it the right to mount it.
    services.request_delete(actor=cast.actor("carol"), request=mine)
    gone = post(api("carol"), "/requests/", TRAIN | {"parameters": {"command": "x", "data_volume": own_home}})
    assert gone.status_code == 400 and "parameters.data_volume" in gone.json()["fields"]


def test_only_approvers_share_volumes_and_home_names_are_reserved(api, cast, cat) -> None:
    response = post(api("carol"), "/volumes/", {"project": "acme-vision", "name": "datasets", "shared": True})
    assert response.status_code == 403
    reserved = post(api("carol"), "/volumes/", {"project": "acme-vision", "name": "home-req-1-0"})
    assert reserved.status_code == 400 and "name" in reserved.json()["fields"]
    assert post(api("dave"), "/volumes/", {"project": "acme-vision", "name": "d"}).status_code == 403  # a viewer
    assert post(api("bob"), "/volumes/", {"project": "acme-vision", "name": "datasets", "shared": True}).status_code == 201
    again = post(api("bob"), "/volumes/", {"project": "acme-vision", "name": "datasets", "shared": True})
    assert again.status_code == 409 and "name" in again.json()["fields"]
    bad = post(api("bob"), "/volumes/", {"project": "acme-vision", "name": "Not_A_Claim"})
    assert bad.status_code == 400 and "name" in bad.json()["fields"]


# 2. Priorities: production always needs an approver ------------------------------------------------------


def test_a_members_production_job_is_not_auto_approved(api, cast, cat) -> None:
    response = post(api("carol"), "/requests/", TRAIN | {"gpus": 1, "priority": "production"})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == S.PENDING_APPROVAL and body["priority"] == "production"
    assert "Priority production needs a project admin" in body["pending_reason"]
    # The same job at batch priority is still approved by the global rule.
    batch = post(api("carol"), "/requests/", TRAIN | {"gpus": 1, "priority": "batch"})
    assert batch.json()["state"] == S.APPROVED


def test_production_is_never_approved_on_submission_not_even_for_an_approver(cast, cat) -> None:
    ApprovalRule.objects.update(require_admin_for_inference=False, auto_approve_max_gpus=8, auto_approve_max_hours=24)
    by_member = submit(cast, cat, "carol", template=cat.inference, gpus=1)
    assert by_member.priority == "production" and by_member.state == S.PENDING_APPROVAL
    by_admin = submit(cast, cat, "bob", gpus=1, priority="production")
    assert by_admin.state == S.PENDING_APPROVAL and "Priority production" in by_admin.pending_reason
    # An approver decides explicitly (and that is audited like any approval).
    approved = services.request_approve(actor=cast.actor("bob"), request=by_admin)
    assert approved.state == S.APPROVED and approved.approved_by == cast.bob
    # Batch work by the admin is approved on submission as before.
    assert submit(cast, cat, "bob", gpus=1, priority="batch").state == S.APPROVED


def test_rule_narrows_members_priorities_per_project_and_template(cast, cat) -> None:
    catalogue_services.approval_rule_create(actor=cast.actor("bob"), project=cast.vision, template_slug="notebook",
                                  auto_approve_max_gpus=2, auto_approve_max_hours=8, member_priorities=["batch"])
    notebook = submit(cast, cat, "carol", template=cat.notebook, gpus=1)  # interactive by default
    assert notebook.state == S.PENDING_APPROVAL and "Priority interactive" in notebook.pending_reason
    assert submit(cast, cat, "carol", template=cat.notebook, gpus=1, priority="batch").state == S.APPROVED
    # Other templates keep the global rule.
    assert submit(cast, cat, "carol", gpus=1, priority="interactive").state == S.APPROVED


def test_a_rule_cannot_auto_approve_production(api, cast, cat) -> None:
    body = {"project": "acme-vision", "template_slug": "training", "member_priorities": ["batch", "production"]}
    response = post(api("bob"), "/approval-rules/", body)
    assert response.status_code == 400 and "member_priorities" in response.json()["fields"]
    response = post(api("bob"), "/approval-rules/", body | {"member_priorities": ["batch"], "admin_priorities": ["production"]})
    assert response.status_code == 400 and "admin_priorities" in response.json()["fields"]
    ok = post(api("bob"), "/approval-rules/", body | {"member_priorities": ["batch", "interactive"]})
    assert ok.status_code == 201 and ok.json()["member_priorities"] == ["interactive", "batch"]
    assert ok.json()["admin_priorities"] == ["interactive", "batch"]
    with pytest.raises(ValidationError):
        catalogue_services.approval_rule_update(actor=cast.actor("bob"), rule=ApprovalRule.objects.get(pk=ok.json()["id"]),
                                      admin_priorities=["production"])


def test_extending_a_production_request_needs_an_approver(cast, cat) -> None:
    req = submit(cast, cat, "carol", gpus=1, priority="production", duration_hours=2)
    req = services.request_approve(actor=cast.actor("bob"), request=req)
    with pytest.raises(NotAllowed, match="Priority production"):
        services.request_extend(actor=cast.actor("carol"), request=req, hours=1)
    assert services.request_extend(actor=cast.actor("bob"), request=req, hours=1).duration_hours == 3


# 4. Names: unique among live requests, decided by the database ------------------------------------------


def test_live_states_are_the_complement_of_final() -> None:
    assert set(LIVE_STATES) == set(S.values) - set(FINAL)


def test_the_database_refuses_a_second_live_request_with_a_name(cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol, name="same", state=S.RUNNING)
    make_request(cat, cast.vision, cast.carol, name="same", state=S.SUCCEEDED)  # ended ones do not count
    make_request(cat, cast.nlp, cast.carol, name="same", state=S.RUNNING)  # nor other projects
    with pytest.raises(IntegrityError), transaction.atomic():
        make_request(cat, cast.vision, cast.bob, name="same", state=S.PENDING_APPROVAL)


def test_restart_under_a_name_taken_meanwhile_is_a_conflict(cast, cat) -> None:
    old = make_request(cat, cast.vision, cast.carol, name="resnet", state=S.STOPPED)
    submit(cast, cat, "carol", gpus=1, name="resnet")
    with pytest.raises(ConflictError) as exc:
        services.request_restart(actor=cast.actor("carol"), request=old)
    assert exc.value.field == "name"
    old.refresh_from_db()
    assert old.state == S.STOPPED


@pytest.mark.django_db(transaction=True)
def test_twenty_parallel_submissions_with_one_name_leave_one_live_request(cast, cat) -> None:
    n = 20
    clients = []
    for _ in range(n):
        client = APIClient()
        client.force_login(cast.carol)
        clients.append(client)
    barrier = threading.Barrier(n)
    responses: list[Any] = [None] * n
    # SQLite's shared in-memory test database fails a second writer at once: there the threads take turns
    # (the constraint is still checked); on PostgreSQL they really race and the unique index decides.
    turns = threading.Lock() if connection.vendor == "sqlite" else contextlib.nullcontext()

    def attempt(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            with turns:
                responses[i] = post(clients[i], "/requests/", TRAIN | {"gpus": 1, "name": "sweep-1"})
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    codes = sorted(r.status_code for r in responses)
    assert codes == [201] + [400] * (n - 1), codes
    for r in responses:
        if r.status_code == 400:
            assert "already in use" in r.json()["fields"]["name"][0]
    assert WorkloadRequest.objects.filter(project=cast.vision, name="sweep-1").exclude(state__in=FINAL).count() == 1
    assert AuditEntry.objects.filter(action="request.submit").count() == 1

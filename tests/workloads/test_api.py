"""REST API for the catalogue and requests: status, body and database state; scoping; tokens; queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils.timezone import localtime

from tenants.models import Project, Tenant
from workloads.models import ApprovalRule, Image, RequestState, WorkloadRequest

from .factories import make_request

pytestmark = [pytest.mark.django_db]

API = "/api/v1"
S = RequestState
TRAIN = {"template": "training", "flavor": "h100", "parameters": {"command": "python train.py"}}


def ids(response) -> set:
    return {row["id"] for row in response.json()["results"]}


def post(client, path: str, body: dict | None = None, **headers):
    return client.post(f"{API}{path}", body or {}, format="json", headers=headers)


# Catalogue ------------------------------------------------------------------------------------


def test_templates_are_readable_with_their_form(api, cat) -> None:
    response = api("carol").get(f"{API}/templates/")
    assert response.status_code == 200
    assert {row["slug"] for row in response.json()["results"]} == {"notebook", "training", "inference", "batch-inference"}
    training = api("carol").get(f"{API}/templates/training/").json()
    assert training["id"] == cat.training.pk and training["max_gpus"] == 8
    assert {f["name"] for f in training["form_fields"]} >= {"command", "args", "env", "retries", "workers"}
    assert {f["name"] for f in training["allowed_flavors"]} == {"h100", "a100-1g.10gb"}
    assert api("carol").get(f"{API}/templates/no-such/").status_code == 404


def test_ops_create_template_versions_others_cannot(api, cat) -> None:
    body = {"kind": "training", "slug": "training", "name": "Training job", "max_gpus": 4,
            "parameters_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
            "allowed_flavors": [cat.h100.pk]}
    for who in ("carol", "bob", "alice"):
        assert post(api(who), "/templates/", body).status_code == 403
    response = post(api("ops"), "/templates/", body)
    assert response.status_code == 201, response.content
    assert response.json()["version"] == 2
    # The slug now means the newest version.
    assert api("carol").get(f"{API}/templates/training/").json()["version"] == 2
    bad = post(api("ops"), "/templates/", body | {"slug": "broken", "parameters_schema": {"type": "nonsense"}})
    assert bad.status_code == 400 and "parameters_schema" in bad.json()["fields"]


def test_template_in_use_keeps_its_meaning(api, cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol)
    url = f"{API}/templates/{cat.training.pk}/"
    assert api("ops").patch(url, {"max_gpus": 1}, format="json").status_code == 409
    assert api("ops").patch(url, {"description": "Now with more docs."}, format="json").status_code == 200


def test_images(api, cat) -> None:
    response = api("carol").get(f"{API}/images/?kind=inference")
    assert [row["reference"] for row in response.json()["results"]] == ["vllm/vllm-openai:v0.12.0"]
    body = {"name": "Triton", "reference": "nvcr.io/nvidia/tritonserver:26.10-py3", "kinds": ["inference"]}
    assert post(api("bob"), "/images/", body).status_code == 403
    assert post(api("ops"), "/images/", body).status_code == 201
    assert post(api("ops"), "/images/", body).status_code == 400  # the reference is taken
    assert post(api("ops"), "/images/", body | {"reference": "x:1", "kinds": ["database"]}).status_code == 400
    assert Image.objects.filter(reference=body["reference"]).count() == 1


def test_approval_rules(api, cast, cat) -> None:
    body = {"project": "acme-vision", "template_slug": "training", "auto_approve_max_gpus": 4, "auto_approve_max_hours": 24}
    assert post(api("carol"), "/approval-rules/", body).status_code == 403
    assert post(api("erin"), "/approval-rules/", body).status_code == 400  # no such project, for erin
    response = post(api("bob"), "/approval-rules/", body)
    assert response.status_code == 201, response.content
    rule_id = response.json()["id"]
    assert post(api("bob"), "/approval-rules/", body).status_code == 409
    assert post(api("bob"), "/approval-rules/", {"template_slug": "notebook", "auto_approve_max_gpus": 8}).status_code == 403
    assert post(api("ops"), "/approval-rules/", {"template_slug": "notebook", "auto_approve_max_gpus": 1}).status_code == 201
    # Everyone sees the global rules; only acme's people see acme-vision's.
    assert rule_id in ids(api("carol").get(f"{API}/approval-rules/"))
    assert rule_id not in ids(api("erin").get(f"{API}/approval-rules/"))
    assert api("erin").get(f"{API}/approval-rules/{rule_id}/").status_code == 404
    assert api("erin").delete(f"{API}/approval-rules/{rule_id}/").status_code == 404
    assert api("carol").patch(f"{API}/approval-rules/{rule_id}/", {"auto_approve_max_gpus": 8}, format="json").status_code == 403
    assert api("bob").patch(f"{API}/approval-rules/{rule_id}/", {"auto_approve_max_gpus": 3}, format="json").json()["auto_approve_max_gpus"] == 3
    # The rule applies: 3 GPUs for 20 hours is auto-approved in acme-vision now.
    response = post(api("carol"), "/requests/", TRAIN | {"project": "acme-vision", "gpus": 3, "duration_hours": 20})
    assert response.json()["state"] == S.APPROVED
    assert api("bob").delete(f"{API}/approval-rules/{rule_id}/").status_code == 204
    assert not ApprovalRule.objects.filter(pk=rule_id).exists()


# Submitting -----------------------------------------------------------------------------------


def test_submit_and_read_back(api, cat) -> None:
    response = post(api("carol"), "/requests/", TRAIN | {"project": "acme-vision", "gpus": 1, "name": "resnet"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert response["Location"].endswith(f"/requests/{body['id']}/")
    assert body["state"] == S.APPROVED and body["name"] == "resnet" and body["namespace"] == "acme-vision"
    assert body["template"]["slug"] == "training" and body["flavor"] == "h100" and body["requested_by"] == "carol"
    assert [e["to_state"] for e in body["timeline"]] == [S.SUBMITTED, S.APPROVED]
    assert body["pending_reason"].startswith("Approved")
    assert body["k8s_name"] == f"req-{body['id']}" and body["cost_estimate"] is None


def test_pending_request_says_why(api, cat) -> None:
    body = post(api("carol"), "/requests/", TRAIN | {"project": "acme-vision", "gpus": 4}).json()
    assert body["state"] == S.PENDING_APPROVAL
    assert body["pending_reason"].startswith("Awaiting approval by a project admin since ")
    assert body["pending_reason"].endswith("4 GPUs is more than the 2 approved automatically.")
    # One sentence for "awaiting approval" (workloads.pending), with the clock time it started waiting.
    req = WorkloadRequest.objects.get(pk=body["id"])
    assert body["pending_reason"] == (f"Awaiting approval by a project admin since {localtime(req.updated_at):%H:%M}: "
                                      "4 GPUs is more than the 2 approved automatically.")
    # Waiting since an earlier day: the date too.
    earlier = req.updated_at - timedelta(days=3)
    WorkloadRequest.objects.filter(pk=req.pk).update(updated_at=earlier)
    body = api("carol").get(f"{API}/requests/{req.pk}/").json()
    assert body["pending_reason"].startswith(f"Awaiting approval by a project admin since {localtime(earlier):%Y-%m-%d %H:%M}: ")


def test_idempotency_key(api, cat) -> None:
    client = api("carol")
    first = post(client, "/requests/", TRAIN | {"project": "acme-vision"}, **{"Idempotency-Key": "build-7"})
    assert first.status_code == 201
    again = post(client, "/requests/", TRAIN | {"project": "acme-vision"}, **{"Idempotency-Key": "build-7"})
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert WorkloadRequest.objects.count() == 1
    other = post(client, "/requests/", TRAIN | {"project": "acme-nlp"}, **{"Idempotency-Key": "build-7"})
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
    assert post(client, "/requests/", TRAIN | {"project": "acme-vision"}, **{"Idempotency-Key": "build-8"}).status_code == 201


@pytest.mark.parametrize(
    "body, field",
    [
        ({"parameters": {"command": "x", "retries": 99}}, "parameters.retries"),
        ({"parameters": {"retries": 1}}, "parameters.command"),
        ({"parameters": {"command": "x", "colour": "red"}}, "parameters.colour"),
        ({"flavor": "cpu"}, "flavor"),
        ({"flavor": "no-such-flavor"}, "flavor"),
        ({"image": "docker.io/me/thing:latest"}, "image"),
        ({"gpus": 9}, "gpus"),
        ({"duration_hours": 1000}, "duration_hours"),
        ({"template": "no-such"}, "template"),
        ({"project": "globex-llm"}, "project"),  # exists, but not for carol
        ({"shoe_size": 44}, "shoe_size"),
        ({"parameters": {"command": "x", "distributed": True, "workers": 2}, "gpus": 6}, "replicas"),  # 12 > 8 + 2
    ],
)
def test_refused_with_field_errors_and_nothing_created(api, cat, body, field) -> None:
    response = post(api("carol"), "/requests/", {**TRAIN, "project": "acme-vision", **body})
    assert response.status_code == 400, response.content
    data = response.json()
    assert data["error"] == "invalid" and field in data["fields"], data
    assert not WorkloadRequest.objects.exists()


def test_over_quota_message_is_plain(api, cat) -> None:
    body = {**TRAIN, "project": "acme-vision", "gpus": 6, "parameters": {"command": "x", "distributed": True, "workers": 2}}
    message = post(api("carol"), "/requests/", body).json()["fields"]["replicas"][0]
    assert message.startswith("This can never run: 12 x H100 80GB") and "8 nominal + 2 borrowable = 10" in message


def test_suspended_tenant_and_archived_project(api, cast, cat) -> None:
    Tenant.objects.filter(pk=cast.acme.pk).update(status=Tenant.Status.SUSPENDED)
    response = post(api("carol"), "/requests/", TRAIN | {"project": "acme-vision"})
    assert response.status_code == 403 and response.json()["error"] == "tenant_suspended"
    Tenant.objects.filter(pk=cast.acme.pk).update(status=Tenant.Status.ACTIVE)
    Project.objects.filter(pk=cast.vision.pk).update(status=Project.Status.ARCHIVED)
    response = post(api("carol"), "/requests/", TRAIN | {"project": "acme-vision"})
    assert response.status_code == 400 and "archived" in response.json()["fields"]["project"][0]
    assert not WorkloadRequest.objects.exists()


@pytest.mark.parametrize("who, status", [("dave", 403), ("erin", 400), ("nobody", 400)])
def test_only_submitters_submit(api, cat, who, status) -> None:
    assert post(api(who), "/requests/", TRAIN | {"project": "acme-vision"}).status_code == status
    assert not WorkloadRequest.objects.exists()


# Visibility -----------------------------------------------------------------------------------


@pytest.fixture
def requests(cast, cat):
    """Two requests in acme-vision, one in acme-nlp, one in globex-llm."""
    return {
        "vision1": make_request(cat, cast.vision, cast.carol, state=S.PENDING_APPROVAL, gpus=4),
        "vision2": make_request(cat, cast.vision, cast.bob, state=S.RUNNING),
        "nlp": make_request(cat, cast.nlp, cast.alice, state=S.QUEUED),
        "llm": make_request(cat, cast.llm, cast.frank, state=S.PENDING_APPROVAL, gpus=4),
    }


@pytest.mark.parametrize(
    "who, expected",
    [
        ("ops", {"vision1", "vision2", "nlp", "llm"}),
        ("alice", {"vision1", "vision2", "nlp"}),
        ("bob", {"vision1", "vision2"}),
        ("carol", {"vision1", "vision2", "nlp"}),  # carol is also a member of acme-nlp
        ("dave", {"vision1", "vision2"}),
        ("erin", {"llm"}),
        ("frank", {"llm"}),
        ("nobody", set()),
    ],
)
def test_request_list_is_scoped(api, requests, who, expected) -> None:
    response = api(who).get(f"{API}/requests/")
    assert response.status_code == 200
    assert ids(response) == {requests[name].pk for name in expected}


def test_filters_and_ordering(api, requests, cast) -> None:
    client = api("ops")
    assert ids(client.get(f"{API}/requests/?state=running&state=queued")) == {requests["vision2"].pk, requests["nlp"].pk}
    assert ids(client.get(f"{API}/requests/?project=acme-vision")) == {requests["vision1"].pk, requests["vision2"].pk}
    assert ids(client.get(f"{API}/requests/?tenant=globex")) == {requests["llm"].pk}
    assert ids(client.get(f"{API}/requests/?phase=waiting")) == {requests[n].pk for n in ("vision1", "nlp", "llm")}
    assert ids(api("carol").get(f"{API}/requests/?mine=true")) == {requests["vision1"].pk}
    assert ids(client.get(f"{API}/requests/?kind=inference")) == set()
    gpus = [row["gpus"] for row in client.get(f"{API}/requests/?ordering=-gpus").json()["results"]]
    assert gpus == sorted(gpus, reverse=True)
    first = client.get(f"{API}/requests/?page_size=2").json()
    assert len(first["results"]) == 2 and len(client.get(first["next"]).json()["results"]) == 2


ACTIONS = [("approve", {}), ("reject", {}), ("cancel", {}), ("stop", {}), ("restart", {}), ("extend", {"hours": 1}),
           ("scale", {"replicas": 2})]


@pytest.mark.parametrize("who", ["erin", "frank", "nobody"])
def test_foreign_requests_are_404_everywhere(api, requests, who) -> None:
    client = api(who)
    pk = requests["vision1"].pk
    assert client.get(f"{API}/requests/{pk}/").status_code == 404
    for name, body in ACTIONS:
        assert post(client, f"/requests/{pk}/{name}/", body).status_code == 404, name
    assert client.delete(f"{API}/requests/{pk}/").status_code == 404
    assert ids(client.get(f"{API}/approvals/")) & {requests["vision1"].pk} == set()
    assert WorkloadRequest.objects.get(pk=pk).state == S.PENDING_APPROVAL


@pytest.mark.parametrize(
    "who, status", [("bob", 200), ("alice", 200), ("ops", 200), ("carol", 403), ("dave", 403), ("erin", 404), ("nobody", 404)]
)
def test_only_approvers_approve(api, requests, who, status) -> None:
    pk = requests["vision1"].pk
    response = post(api(who), f"/requests/{pk}/approve/", {"comment": "fine"})
    assert response.status_code == status, response.content
    assert WorkloadRequest.objects.get(pk=pk).state == (S.APPROVED if status == 200 else S.PENDING_APPROVAL)
    if status == 200:
        assert response.json()["approved_by"] == who
        # Deciding twice: the second one learns it was already decided.
        assert post(api("bob"), f"/requests/{pk}/reject/", {"comment": "too late"}).status_code == 409


def test_reject_with_comment(api, requests, mailoutbox, django_capture_on_commit_callbacks) -> None:
    pk = requests["vision1"].pk
    with django_capture_on_commit_callbacks(execute=True):
        response = post(api("bob"), f"/requests/{pk}/reject/", {"comment": "too big for now"})
    assert response.status_code == 200 and response.json()["state"] == S.REJECTED
    assert response.json()["timeline"][-1]["message"] == "Rejected by bob: too big for now"
    assert mailoutbox[0].to == ["carol@example.com"]


def test_lifecycle_actions(api, cast, cat, requests) -> None:
    carol = api("carol")
    pending = requests["vision1"].pk
    assert post(carol, f"/requests/{pending}/cancel/", {"reason": "oops"}).json()["state"] == S.CANCELLED
    assert post(carol, f"/requests/{pending}/cancel/").status_code == 409
    running = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, duration_hours=4).pk
    assert post(carol, f"/requests/{running}/cancel/").status_code == 409
    assert post(carol, f"/requests/{running}/extend/", {"hours": 2}).json()["duration_hours"] == 6
    assert post(carol, f"/requests/{running}/extend/", {"hours": 0}).status_code == 400
    assert post(carol, f"/requests/{running}/extend/", {"hours": 500}).status_code == 400
    assert post(carol, f"/requests/{running}/scale/", {"replicas": 2}).status_code == 400  # training does not scale
    assert post(carol, f"/requests/{running}/stop/").json()["state"] == S.STOPPED
    assert post(carol, f"/requests/{running}/restart/").json()["state"] == S.APPROVED
    response = carol.delete(f"{API}/requests/{running}/")  # approved again, not yet running: cancelled
    assert response.status_code == 202 and response.json()["state"] == S.CANCELLED
    assert response.json()["timeline"][-1]["message"].startswith("Deleted")
    # dave (viewer) may look but not touch; bob's request is not carol's to stop, but bob may stop carol's.
    assert post(api("dave"), f"/requests/{running}/restart/").status_code == 403
    assert post(carol, f"/requests/{requests['vision2'].pk}/stop/").status_code == 403
    inference = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.RUNNING, replicas=2)
    assert post(carol, f"/requests/{inference.pk}/scale/", {"replicas": 1}).json()["replicas"] == 1
    assert post(api("bob"), f"/requests/{inference.pk}/scale/", {"replicas": 4}).json()["replicas"] == 4


def test_etag_lets_pollers_skip_unchanged_bodies(api, requests) -> None:
    client = api("carol")
    url = f"{API}/requests/{requests['vision1'].pk}/"
    first = client.get(url)
    etag = first["ETag"]
    assert etag
    assert client.get(url, headers={"If-None-Match": etag}).status_code == 304
    post(api("bob"), f"/requests/{requests['vision1'].pk}/approve/")
    changed = client.get(url, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed["ETag"] != etag


# Approvals inbox ------------------------------------------------------------------------------


def test_approvals_inbox_with_context(api, cast, cat, requests) -> None:
    make_request(cat, cast.vision, cast.carol, state=S.QUEUED)  # one ahead in the H100 queue
    make_request(cat, cast.vision, cast.carol, state=S.RUNNING, gpus=2)  # running: 1 + 2 GPUs in use
    response = api("bob").get(f"{API}/approvals/")
    assert response.status_code == 200
    [row] = response.json()["results"]
    assert row["id"] == requests["vision1"].pk
    context = row["context"]
    assert context["waiting_ahead"] == 1 and context["in_use"] == 3 and context["cost_estimate"] is None
    assert context["quota"] == [{"resource": "nvidia.com/gpu", "nominal": 8.0, "borrowing_limit": 2.0, "used": 0.0}]
    assert ids(api("ops").get(f"{API}/approvals/")) == {requests["vision1"].pk, requests["llm"].pk}
    assert ids(api("erin").get(f"{API}/approvals/")) == {requests["llm"].pk}
    for who in ("carol", "dave", "frank", "nobody"):
        assert ids(api(who).get(f"{API}/approvals/")) == set(), who


# Tokens ---------------------------------------------------------------------------------------


def test_read_token_reads_its_project_only(token_client, cast, requests) -> None:
    client, _ = token_client("carol", cast.vision, "read")
    assert ids(client.get(f"{API}/requests/")) == {requests["vision1"].pk, requests["vision2"].pk}  # not acme-nlp
    assert client.get(f"{API}/requests/{requests['vision1'].pk}/").status_code == 200
    assert client.get(f"{API}/requests/{requests['nlp'].pk}/").status_code == 404
    assert client.get(f"{API}/templates/").status_code == 200
    assert post(client, "/requests/", TRAIN).status_code == 403
    assert post(client, f"/requests/{requests['vision1'].pk}/cancel/").status_code == 403
    assert WorkloadRequest.objects.count() == 4


def test_submit_token_submits_in_its_project_only(token_client, cast, cat) -> None:
    client, token = token_client("carol", cast.vision, "read+submit")
    response = post(client, "/requests/", TRAIN, **{"Idempotency-Key": "pipeline-1"})
    assert response.status_code == 201, response.content
    assert response.json()["project"] == "acme-vision"  # the token's project by default
    assert WorkloadRequest.objects.get().token == token
    assert post(client, "/requests/", TRAIN, **{"Idempotency-Key": "pipeline-1"}).status_code == 200
    assert post(client, "/requests/", TRAIN | {"project": "acme-nlp"}).status_code == 400  # carol may; the token not
    # A token never approves, even its admin's.
    bob_client, _ = token_client("bob", cast.vision, "read+submit")
    pending = post(client, "/requests/", TRAIN | {"gpus": 4}).json()
    assert post(bob_client, f"/requests/{pending['id']}/approve/").status_code == 403
    assert post(bob_client, "/approval-rules/", {"project": "acme-vision", "template_slug": "notebook"}).status_code == 403
    assert bob_client.get(f"{API}/approvals/").json()["count"] == 0
    # The requester's token may cancel the requester's request.
    assert post(client, f"/requests/{pending['id']}/cancel/").status_code == 200


# Query counts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["ops", "carol"])
def test_list_queries_do_not_grow_with_rows(api, cast, cat, who, django_assert_max_num_queries) -> None:
    for i in range(30):
        make_request(cat, cast.vision if i % 2 else cast.llm, cast.carol if i % 2 else cast.frank,
                     state=S.PENDING_APPROVAL, template=cat.inference if i % 3 else cat.training)
    client = api(who)
    # Session, user, ops check, page (and the guardian subquery inside it): not one per row.
    with django_assert_max_num_queries(5):
        response = client.get(f"{API}/requests/?page_size=100")
    assert response.status_code == 200 and len(response.json()["results"]) == (30 if who == "ops" else 15)
    with django_assert_max_num_queries(7):  # + the quota rows, prefetched once
        response = client.get(f"{API}/approvals/?page_size=100")
    assert response.json()["count"] == (30 if who == "ops" else 0)
    with django_assert_max_num_queries(7):
        assert client.get(f"{API}/templates/").status_code == 200

"""Request pages: HTTP in; status, body and database state out.

The cast (tests/conftest.py): in acme, alice is tenant admin, bob project admin of acme-vision, carol
member (also of acme-nlp here), dave viewer; in globex, erin is tenant admin and frank a member; ops
is platform ops; nobody has no role. The catalogue (tests/workloads/factories.py): training,
notebook and inference templates; the global rule approves up to 2 GPUs and 8 hours, inference never.

This module is also the URLconf of the request-page tests (``PORTAL_URLS``): the portal's own URLs,
plus the request pages (and the workloads API) for as long as ``portal/urls.py`` does not include them;
once it does, it is the portal's URLconf as-is.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tenants.access import Actor
from tenants.models import Tenant
from tenants.services import tenant_update
from workloads import services
from workloads.models import RequestEvent, RequestState, WorkloadRequest

from .factories import make_request

S = RequestState
HTMX = {"HTTP_HX_REQUEST": "true"}

def text(response) -> str:
    return response.content.decode()


def training_form(cat, **overrides: Any) -> dict[str, Any]:
    """What the generated training form posts, filled in the way a person would."""
    data = {
        "project": "acme-vision", "name": "", "image": "nvcr.io/nvidia/pytorch:26.10-py3", "custom_image": "",
        "flavor": str(cat.h100.pk), "gpus": "1", "cpu": "4", "memory_gib": "32", "duration_hours": "4",
        "priority": "batch", "idempotency_key": "",
        "param_command": "python train.py", "param_args": "--epochs\n3", "param_env": "SEED=1",
        "param_data_volume": "", "param_retries": "1", "param_workers": "1",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


# Sign-in and who sees what --------------------------------------------------------------------


def test_pages_need_sign_in(client, cat) -> None:
    for url in ["/requests/", "/requests/new/", "/requests/1/", "/approvals/", "/ops/requests/"]:
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.parametrize("who", ["erin", "frank", "nobody"])
def test_outsiders_get_404_on_every_request_page(as_user, cast, cat, who) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.PENDING_APPROVAL)
    client = as_user(who)
    assert client.get(f"/requests/{req.pk}/").status_code == 404
    assert client.get(f"/requests/{req.pk}/logs/").status_code == 404
    for action in ["decide", "cancel", "stop", "restart", "delete", "extend", "scale"]:
        response = client.post(f"/requests/{req.pk}/{action}/", {"decision": "approve", "extend-hours": "1", "scale-replicas": "2"})
        assert response.status_code == 404, action
    req.refresh_from_db()
    assert req.state == S.PENDING_APPROVAL and req.events.count() == 0
    assert f"/requests/{req.pk}/" not in text(client.get("/requests/?scope=projects"))


@pytest.mark.parametrize("who, status", [("bob", 200), ("alice", 200), ("ops", 200), ("carol", 404), ("dave", 404), ("nobody", 404)])
def test_only_approvers_have_an_inbox(as_user, cat, who, status) -> None:
    assert as_user(who).get("/approvals/").status_code == status


@pytest.mark.parametrize("who, status", [("ops", 200), ("alice", 404), ("bob", 404), ("carol", 404)])
def test_ops_requests_page_is_for_ops_only(as_user, cat, who, status) -> None:
    assert as_user(who).get("/ops/requests/").status_code == status


def test_navigation_links_follow_the_role(as_user, cat) -> None:
    nav = lambda who: text(as_user(who).get("/")).split('aria-label="Main"')[1].split("</nav>")[0]
    carol, bob, ops, dave = nav("carol"), nav("bob"), nav("ops"), nav("dave")
    assert ">Requests<" in dave and "New request" not in dave and "Approvals" not in dave
    assert ">Requests<" in carol and ">New request<" in carol and "Approvals" not in carol and "All requests" not in carol
    assert ">Approvals<" in bob and "All requests" not in bob
    assert ">Approvals<" in ops and ">All requests<" in ops


def test_project_page_links_to_its_requests(as_user, cat) -> None:
    body = text(as_user("carol").get("/projects/acme-vision/"))
    assert "/requests/?scope=projects&amp;project=acme-vision" in body
    assert "/requests/new/?project=acme-vision" in body
    dave = text(as_user("dave").get("/projects/acme-vision/"))
    assert "/requests/new/" not in dave  # viewers do not submit: no button, no nav link


# New request: the generated form ----------------------------------------------------------------


def test_new_request_lists_templates_then_generates_the_form_from_the_schema(as_user, cat) -> None:
    client = as_user("carol")
    body = text(client.get("/requests/new/?project=acme-vision"))
    for name in ["Notebook", "Training job", "Inference service"]:
        assert name in body
    assert "?template=training&amp;project=acme-vision" in body

    body = text(client.get("/requests/new/?template=training&project=acme-vision"))
    # One field per schema property, with the schema's titles, defaults and bounds.
    for name in ["command", "args", "env", "data_volume", "retries", "distributed", "workers"]:
        assert f'name="param_{name}"' in body
    assert re.search(r'<label for="id_param_retries">Retries \(optional\)</label>', body)
    # Number fields are text inputs (a browser empties a number input it cannot hold): the bounds are in the help.
    assert re.search(r'<p class="help" id="id_param_retries_helptext">[^<]*From 0 to 10\.</p>', body)
    assert "Gang-scheduled PyTorch job across several workers." in body  # the schema's description as help
    assert '<option value="acme-vision" selected>' in body
    assert "Billing not configured" in body
    assert 'name="replicas"' not in body  # training workers come from the parameters
    assert 'name="param_model_uri"' not in body

    inference = text(client.get("/requests/new/?template=inference"))
    assert 'name="param_model_uri"' in inference and 'name="replicas"' in inference
    assert 'name="param_port"' in inference and 'value="8000"' in inference
    notebook = text(client.get("/requests/new/?template=notebook"))
    assert '<select name="param_ide"' in notebook and '<option value="jupyterlab" selected>' in notebook


def test_viewer_cannot_submit_anywhere(as_user, cat) -> None:
    body = text(as_user("dave").get("/requests/new/?template=training"))
    assert "cannot submit work in any active project" in body and "Submit request" not in body


def test_submit_a_training_job(as_user, cast, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    client = as_user("carol")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/requests/new/?template=training", training_form(cat, name="resnet"))
    req = WorkloadRequest.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/requests/{req.pk}/"
    assert (req.name, req.project, req.requested_by, req.state) == ("resnet", cast.vision, cast.carol, S.APPROVED)
    assert req.parameters == {"command": "python train.py", "args": ["--epochs", "3"], "env": {"SEED": "1"},
                              "data_volume": "", "retries": 1, "distributed": False, "workers": 1}
    assert hooks_called == [("approved", req.pk)]
    body = text(client.get(response["Location"]))
    assert "Request resnet submitted and approved." in body
    assert "Approved on submission" in body or "Within the automatic limit" in body  # the rule's reason, on the timeline


def test_the_same_form_sent_twice_makes_one_request(as_user, cat, hooks_called) -> None:
    client = as_user("carol")
    data = training_form(cat, idempotency_key="form-1234")
    first = client.post("/requests/new/?template=training", data)
    second = client.post("/requests/new/?template=training", data, follow=True)
    req = WorkloadRequest.objects.get()
    assert first["Location"] == f"/requests/{req.pk}/" and second.redirect_chain[-1][0] == f"/requests/{req.pk}/"
    assert "This form was already sent" in text(second)
    # A fresh form gets a fresh key.
    keys = {re.search(r'name="idempotency_key" value="(\w+)"', text(client.get("/requests/new/?template=training"))).group(1)
            for _ in range(2)}
    assert len(keys) == 2


@pytest.mark.parametrize(
    "overrides, field, message",
    [
        ({"param_retries": "99"}, "param_retries", "99 is greater than the maximum of 10"),
        ({"param_command": ""}, "param_command", "This parameter is required."),
        ({"param_env": "1BAD=x"}, "param_env", "does not match"),
        ({"param_retries": "many"}, "param_retries", "Enter a whole number."),
        ({"param_env": "no equals sign"}, "param_env", "write NAME=value"),
        ({"flavor": None, "gpus": "5"}, "gpus", "This can never run"),
        ({"gpus": "9"}, "gpus", "At most 8 per replica"),
        ({"duration_hours": "100"}, "duration_hours", "At most 72 hours"),
        ({"image": "__custom__", "custom_image": "evil/miner:latest"}, "custom_image", "not in the curated list"),
        ({"name": "Not A Label"}, "name", "DNS-1123 label"),
    ],
)
def test_invalid_input_is_refused_next_to_its_field(as_user, cat, hooks_called, overrides, field, message) -> None:
    if overrides.get("flavor", "") is None:
        overrides = {**overrides, "flavor": str(cat.mig.pk)}  # 4 slices, no borrowing: 5 can never run
    response = as_user("carol").post("/requests/new/?template=training", training_form(cat, **overrides))
    assert response.status_code == 200
    body = text(response)
    error = re.search(rf'<ul class="errorlist" id="id_{field}_error">(.*?)</ul>', body, re.S)
    assert error is not None, body[body.find("errorlist") - 300:body.find("errorlist") + 300]
    assert message in error.group(1)
    assert re.search(rf'name="{field}"[^>]*aria-invalid="true"', body)
    assert not WorkloadRequest.objects.exists() and hooks_called == []


def test_suspended_tenant_offers_nothing_to_submit_to(as_user, cast, cat) -> None:
    tenant_update(actor=Actor.system(), tenant=cast.acme, status=Tenant.Status.SUSPENDED)
    response = as_user("carol").post("/requests/new/?template=training", training_form(cat))
    assert "cannot submit work in any active project" in text(response) and not WorkloadRequest.objects.exists()


def test_service_errors_map_onto_the_generated_fields(cast, cat) -> None:
    from django.core.exceptions import ValidationError

    from portal.exceptions import Invalid
    from workloads.forms import RequestForm
    from workloads.models import Image

    form = RequestForm(training_form(cat, image="__custom__", custom_image="x/y:1"), template=cat.training,
                       projects=[cast.vision], images=Image.objects.all(), flavors=[cat.h100])
    assert form.is_valid(), form.errors
    form.add_service_error(ValidationError({
        "parameters.args.0": ["Too long."], "parameters.nope": ["Unknown parameter."], "image": ["Not curated."],
        "replicas": ["For training, set parameters.workers instead."],
    }))
    form.add_service_error(Invalid("The cluster is gone.", field="cluster"))
    assert form.errors["param_args"] == ["Too long."]
    assert form.errors["custom_image"] == ["Not curated."]
    assert form.non_field_errors() == ["Unknown parameter.", "For training, set parameters.workers instead.", "The cluster is gone."]


def test_unknown_template_goes_back_to_the_picker(as_user, cat) -> None:
    body = text(as_user("carol").get("/requests/new/?template=nope"))
    assert "That template is not offered" in body and "Training job" in body


# My requests: the list and its live part ----------------------------------------------------------


def test_my_requests_lists_mine_and_all_in_my_projects(as_user, cast, cat) -> None:
    mine = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, name="mine-running")
    other = make_request(cat, cast.vision, cast.bob, state=S.QUEUED, name="bobs-queued")
    make_request(cat, cast.llm, cast.frank, state=S.RUNNING, name="globex-secret")
    client = as_user("carol")
    body = text(client.get("/requests/"))
    assert "mine-running" in body and "bobs-queued" not in body and "globex-secret" not in body
    assert "Running" in body
    body = text(client.get("/requests/?scope=projects"))
    assert "mine-running" in body and "bobs-queued" in body and "globex-secret" not in body
    body = text(client.get("/requests/?scope=projects&state=queued"))
    assert "bobs-queued" in body and "mine-running" not in body
    assert f"/requests/{mine.pk}/" in text(client.get("/requests/?scope=projects&phase=active&project=acme-vision"))
    assert other.pk


def test_the_list_polls_a_partial_while_something_can_change(as_user, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.QUEUED, name="waiting-one")
    client = as_user("carol")
    body = text(client.get("/requests/"))
    assert 'hx-trigger="every 3s"' in body
    partial = client.get("/requests/", HTTP_HX_TARGET="request-rows", **HTMX)
    assert "<html" not in text(partial) and 'id="request-rows"' in text(partial) and "Queued" in text(partial)
    WorkloadRequest.objects.filter(pk=req.pk).update(state=S.SUCCEEDED)
    partial = text(client.get("/requests/", HTTP_HX_TARGET="request-rows", **HTMX))
    assert "Succeeded" in partial and "hx-trigger" not in partial  # everything ended: polling stops


def test_list_queries_do_not_grow_with_rows(as_user, cast, cat, django_assert_max_num_queries) -> None:
    for _ in range(20):
        make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    client = as_user("carol")
    client.get("/requests/")  # warm the session and permission caches
    with django_assert_max_num_queries(14):
        assert client.get("/requests/?scope=projects").status_code == 200


# Request detail: state, why pending, timeline, actions ----------------------------------------------


def submit(cast, cat, who: str = "carol", **values: Any) -> WorkloadRequest:
    template = values.pop("template", cat.training)
    params = {"training": {"command": "python train.py"}, "inference": {"model_uri": "hf://org/model"}}.get(template.slug, {})
    return services.request_submit(actor=cast.actor(who), project=cast.vision, template=template, flavor=cat.h100,
                                   parameters=params, **values)


def test_detail_answers_why_it_is_pending(as_user, cast, cat, hooks_called) -> None:
    req = submit(cast, cat, gpus=4)
    body = text(as_user("carol").get(f"/requests/{req.pk}/"))
    assert "Why is it not running yet?" in body
    assert "Awaiting approval by a project admin" in body and "4 GPUs is more than the 2 approved automatically" in body
    assert "Pending approval" in body and 'hx-trigger="every 3s"' in body
    assert "Billing not configured" in body


def test_detail_shows_what_the_cluster_says(as_user, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.QUEUED, pending_reason="waiting for 1 x H100 80GB: asks for 1; the project has 8 and may not borrow (8 in use now)",
                       cluster_status={"objects": {
                           "workload/job-req-1": {"c": {"QuotaReserved": ["False", "Pending", "insufficient quota"]}, "ev": 0, "cq": "acme-vision"},
                           "pod/req-1-abc": {"phase": "Pending", "sched": ["False", "Unschedulable", "0/4 nodes are available"]},
                       }, "warnings": [["FailedScheduling", "0/4 nodes are available"]]})
    body = text(as_user("carol").get(f"/requests/{req.pk}/"))
    assert "Waiting for 1 x H100 80GB: asks for 1; the project has 8 and may not borrow (8 in use now)" in body
    assert "QuotaReserved=False" in body and "FailedScheduling" in body and "req-1-abc" in body


def test_live_partial_has_no_page_around_it_and_stops_when_ended(as_user, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    client = as_user("carol")
    partial = text(client.get(f"/requests/{req.pk}/", HTTP_HX_TARGET="request-live", **HTMX))
    assert "<html" not in partial and "Running" in partial and "hx-trigger" in partial
    WorkloadRequest.objects.filter(pk=req.pk).update(state=S.SUCCEEDED)
    partial = text(client.get(f"/requests/{req.pk}/", HTTP_HX_TARGET="request-live", **HTMX))
    assert "Succeeded" in partial and "hx-trigger" not in partial


BUTTONS = {"cancel": "Cancel request", "stop": ">Stop<", "restart": ">Restart<", "delete": ">Delete<",
           "extend": ">Extend<", "scale": ">Scale<", "decide": ">Approve<"}


@pytest.mark.parametrize(
    "state, template, who, shown",
    [
        (S.PENDING_APPROVAL, "training", "carol", {"cancel", "delete", "extend"}),
        (S.PENDING_APPROVAL, "training", "bob", {"cancel", "delete", "extend", "decide"}),
        (S.PENDING_APPROVAL, "training", "dave", set()),
        (S.QUEUED, "training", "carol", {"cancel", "delete", "extend"}),
        (S.RUNNING, "training", "carol", {"stop", "delete", "extend"}),
        (S.RUNNING, "inference", "carol", {"stop", "delete", "extend", "scale"}),
        (S.STOPPED, "notebook", "carol", {"restart", "delete"}),
        (S.FAILED, "training", "bob", {"restart", "delete"}),
        (S.SUCCEEDED, "training", "carol", {"delete"}),
        (S.REJECTED, "training", "carol", set()),
        (S.RUNNING, "training", "dave", set()),
    ],
)
def test_actions_are_shown_only_when_allowed(as_user, cast, cat, state, template, who, shown) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=state, template=getattr(cat, template))
    body = text(as_user(who).get(f"/requests/{req.pk}/"))
    assert {name for name, label in BUTTONS.items() if label in body} == shown


def test_lifecycle_actions_through_the_page(as_user, cast, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    client = as_user("carol")
    pending = submit(cast, cat, gpus=4)
    response = client.post(f"/requests/{pending.pk}/cancel/", follow=True)
    assert "cancelled." in text(response)
    pending.refresh_from_db()
    assert pending.state == S.CANCELLED

    training = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    response = client.post(f"/requests/{training.pk}/extend/", {"extend-hours": "2"}, follow=True)
    training.refresh_from_db()
    assert training.duration_hours == 6 and "now runs for up to 6 hours" in text(response)

    running = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, template=cat.inference)
    response = client.post(f"/requests/{running.pk}/scale/", {"scale-replicas": "2"}, follow=True)
    running.refresh_from_db()
    # Scaling an inference service up needs a project admin under the global rule: refused, with the reason.
    assert running.replicas == 1 and "needs a project admin" in text(response)
    with django_capture_on_commit_callbacks(execute=True):
        as_user("bob").post(f"/requests/{running.pk}/scale/", {"scale-replicas": "2"})
    running.refresh_from_db()
    assert running.replicas == 2

    client = as_user("carol")
    client.post(f"/requests/{running.pk}/stop/")
    running.refresh_from_db()
    assert running.state == S.STOPPED
    client.post(f"/requests/{running.pk}/restart/")
    running.refresh_from_db()
    assert running.state == S.APPROVED
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/requests/{running.pk}/delete/", follow=True)
    running.refresh_from_db()
    assert running.state == S.CANCELLED and "deleted" in text(response)
    assert ("scale", running.pk) in hooks_called and ("delete", running.pk) in hooks_called


def test_refused_action_says_why_and_changes_nothing(as_user, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.SUCCEEDED)
    response = as_user("carol").post(f"/requests/{req.pk}/cancel/", follow=True)
    assert "A succeeded request cannot be cancelled." in text(response)
    response = as_user("dave").post(f"/requests/{req.pk}/delete/", follow=True)
    assert "Only the requester or a project admin" in text(response)
    req.refresh_from_db()
    assert req.state == S.SUCCEEDED and not req.events.exists()


def test_logs_without_a_cluster_connection(as_user, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    client = as_user("carol")
    partial = text(client.get(f"/requests/{req.pk}/logs/", **HTMX))
    assert "No pods in the cluster" in partial and "<html" not in partial
    assert "<html" in text(client.get(f"/requests/{req.pk}/logs/"))  # without JavaScript: a page of its own


# Approvals ------------------------------------------------------------------------------------------


def test_inbox_shows_context_and_approves_in_place(as_user, cast, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    waiting = submit(cast, cat, template=cat.inference, name="llm-api")
    make_request(cat, cast.vision, cast.bob, state=S.RUNNING, gpus=3)
    make_request(cat, cast.vision, cast.bob, state=S.QUEUED)
    make_request(cat, cast.llm, cast.frank, state=S.PENDING_APPROVAL, name="not-bobs")
    client = as_user("bob")
    body = text(client.get("/approvals/"))
    assert "llm-api" in body and "not-bobs" not in body
    assert "Inference services need a project admin" in body
    assert "8 nominal + 2 borrowable" in body
    assert "3 in H100 80GB" in body  # running now
    assert "1 approved request waiting for capacity" in body
    assert "Billing not configured." in body

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/requests/{waiting.pk}/decide/", {"decision": "approve", f"decide-{waiting.pk}-comment": "go ahead"}, **HTMX)
    assert response.status_code == 200 and "<html" not in text(response)
    assert "llm-api approved." in text(response) and "Approve" not in text(response).split("</dl>")[1]
    waiting.refresh_from_db()
    assert waiting.state == S.APPROVED and waiting.approved_by == cast.bob
    assert RequestEvent.objects.filter(request=waiting, to_state=S.APPROVED, message="Approved by bob: go ahead").exists()
    assert hooks_called == [("approved", waiting.pk)]
    assert "llm-api" not in text(client.get("/approvals/"))
    # carol sees the decision and the comment on her request.
    assert "Approved by bob: go ahead" in text(as_user("carol").get(f"/requests/{waiting.pk}/"))


def test_reject_without_javascript_and_twice(as_user, cast, cat) -> None:
    req = submit(cast, cat, gpus=4)
    client = as_user("bob")
    response = client.post(f"/requests/{req.pk}/decide/", {"decision": "reject", "next": "inbox", f"decide-{req.pk}-comment": "too big"})
    assert response.status_code == 302 and response["Location"] == "/approvals/"
    req.refresh_from_db()
    assert req.state == S.REJECTED and req.state_reason == "Rejected by bob: too big"
    response = client.post(f"/requests/{req.pk}/decide/", {"decision": "approve"}, follow=True)
    assert "someone already decided on it" in text(response)


def test_members_cannot_decide(as_user, cast, cat) -> None:
    req = submit(cast, cat, gpus=4)
    response = as_user("carol").post(f"/requests/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert "Only project admins" in text(response)
    req.refresh_from_db()
    assert req.state == S.PENDING_APPROVAL


# Ops: all requests ----------------------------------------------------------------------------------


def test_ops_sees_every_request_with_filters(as_user, cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol, state=S.RUNNING, name="acme-one")
    make_request(cat, cast.llm, cast.frank, state=S.FAILED, name="globex-one")
    client = as_user("ops")
    body = text(client.get("/ops/requests/"))
    assert "acme-one" in body and "globex-one" in body and "Globex AI" in body
    body = text(client.get("/ops/requests/?tenant=globex"))
    assert "globex-one" in body and "acme-one" not in body
    body = text(client.get("/ops/requests/?state=running&requested_by=carol"))
    assert "acme-one" in body and "globex-one" not in body


def test_running_notebook_shows_its_access_url_to_the_requester_only(as_user, cast, cat) -> None:
    notebook = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING)
    page = as_user("carol").get(f"/requests/{notebook.pk}/").content.decode()
    assert f'href="/notebooks/{notebook.pk}/lab"' in page and "token=" not in page
    # Approvers open members' notebooks only where the project allows it (off by default).
    assert "Open the notebook" not in as_user("bob").get(f"/requests/{notebook.pk}/").content.decode()
    cast.vision.notebooks_open_to_approvers = True
    cast.vision.save()
    assert "Open the notebook" in as_user("bob").get(f"/requests/{notebook.pk}/").content.decode()  # an approver
    assert "Open the notebook" not in as_user("dave").get(f"/requests/{notebook.pk}/").content.decode()  # a viewer
    training = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    assert "Open the notebook" not in as_user("carol").get(f"/requests/{training.pk}/").content.decode()

"""Scale requests (issue 27): a member whose scale-up of an inference service the approval rule refuses asks the
project's approvers, as for more hours. The ask is an extension request with ``replicas``; approving it scales the
service (``services.request_scale`` as the approver), and the requester is told what was decided.

carol (member) runs an inference service with 2 replicas of 2 GPUs in acme-vision (10 GPUs of quota); bob is the
project's admin, alice the tenant admin.
"""

from __future__ import annotations

import pytest

from portal.exceptions import ConflictError, Invalid, NotAllowed
from workloads import extensions, services
from workloads.models import ExtensionRequest, RequestEvent, RequestState, WorkloadRequest

from .factories import make_request

pytestmark = [pytest.mark.django_db]
S = RequestState
X = ExtensionRequest.Status
API = "/api/v1"
HTMX = {"HTTP_HX_REQUEST": "true"}


def text(response) -> str:
    return response.content.decode()


def post(client, path: str, body: dict | None = None):
    return client.post(f"{API}{path}", body or {}, format="json")


@pytest.fixture
def service(cast, cat) -> WorkloadRequest:
    return make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.RUNNING, gpus=2, replicas=2)


def ask(cast, req, replicas: int = 3, reason: str = "Traffic doubled at launch.", who: str = "carol") -> ExtensionRequest:
    return extensions.scale_request_create(actor=cast.actor(who), request=req, replicas=replicas, reason=reason)


def test_a_refused_scale_leads_to_the_ask_form_and_approval_scales(
        as_user, cast, service, mailoutbox, django_capture_on_commit_callbacks, hooks_called) -> None:
    carol = as_user("carol")
    with pytest.raises(NotAllowed, match="needs a project admin"):
        services.request_scale(actor=cast.actor("carol"), request=service, replicas=3)
    response = carol.post(f"/requests/{service.pk}/scale/", {"scale-replicas": "3"})
    assert response.status_code == 302 and response["Location"] == f"/requests/{service.pk}/?scale=3#ask-scale"
    body = text(carol.get(response["Location"]))
    assert "needs a project admin" in body and 'id="ask-scale"' in body and "Ask to scale" in body
    assert 'name="askscale-replicas"' in body and 'value="3"' in body
    response = carol.post(f"/requests/{service.pk}/scale/ask/", {"askscale-replicas": "3", "askscale-reason": ""})
    assert response.status_code == 400 and "This field is required." in text(response)
    with django_capture_on_commit_callbacks(execute=True):
        response = carol.post(f"/requests/{service.pk}/scale/ask/",
                              {"askscale-replicas": "3", "askscale-reason": "Traffic doubled at launch."}, follow=True)
    page = text(response)
    assert "Asked to scale to 3 replicas" in page and "Scale to 3 replicas" in page
    assert 'id="ask-scale"' not in page  # one at a time
    assert sorted(m.to[0] for m in mailoutbox) == ["alice@example.com", "bob@example.com"]
    assert "Scaling asked for: acme-vision/" in mailoutbox[0].subject and "from 2 to 3 replicas" in mailoutbox[0].body
    mailoutbox.clear()
    # bob finds it in his inbox (and its count) and approves it there (htmx): the service has 3 replicas at once.
    ext = ExtensionRequest.objects.get()
    assert ext.replicas == 3 and ext.hours == 0 and ext.status == X.PENDING
    bob = as_user("bob")
    inbox = text(bob.get("/approvals/"))
    assert f'id="extension-{ext.pk}"' in inbox and "scale to 3 replicas" in inbox and "Traffic doubled" in inbox
    assert 'id="ask-scale"' not in text(bob.get(f"/requests/{service.pk}/"))  # approvers scale directly
    assert bob.get(f"{API}/approvals/waiting/").json()["requests"] == 1
    with django_capture_on_commit_callbacks(execute=True):
        response = bob.post(f"/extension-requests/{ext.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response["HX-Trigger"] == "approvals-changed" and "to 3 replicas approved." in text(response)
    assert WorkloadRequest.objects.get(pk=service.pk).replicas == 3
    assert hooks_called == [("scale", service.pk)]  # the cluster side scales, as for any scale
    assert RequestEvent.objects.filter(request=service, message="Scaled from 2 to 3 replicas by bob.").exists()
    [mail] = mailoutbox
    assert mail.to == ["carol@example.com"] and "Scaling of acme-vision/" in mail.subject and "approved" in mail.subject
    assert "It now has 3 replicas." in mail.body
    assert bob.get(f"{API}/approvals/waiting/").json()["requests"] == 0
    assert "Approved by bob" in text(carol.get(f"/requests/{service.pk}/"))


def test_the_api_asks_and_a_rejection_tells_the_requester_why(
        api, cast, cat, service, mailoutbox, django_capture_on_commit_callbacks) -> None:
    both = post(api("carol"), "/extension-requests/", {"request": service.pk, "hours": 2, "replicas": 3, "reason": "x"})
    assert both.status_code == 400 and "hours" in both.json()["fields"]
    neither = post(api("carol"), "/extension-requests/", {"request": service.pk, "reason": "x"})
    assert neither.status_code == 400 and "hours" in neither.json()["fields"]
    training = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    wrong = post(api("carol"), "/extension-requests/", {"request": training.pk, "replicas": 2, "reason": "x"})
    assert wrong.status_code == 400 and wrong.json()["fields"] == {"replicas": ["Only inference services scale."]}
    response = post(api("carol"), "/extension-requests/", {"request": service.pk, "replicas": 4, "reason": "Launch."})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["replicas"] == 4 and body["hours"] == 0 and body["status"] == "pending"
    inbox = api("bob").get(f"{API}/extension-requests/?inbox=true").json()
    assert [(row["id"], row["replicas"]) for row in inbox["results"]] == [(body["id"], 4)]
    detail = api("carol").get(f"{API}/requests/{service.pk}/").json()
    assert detail["extension_requests"][0]["replicas"] == 4
    with django_capture_on_commit_callbacks(execute=True):
        response = post(api("bob"), f"/extension-requests/{body['id']}/reject/", {"comment": "Use the batch queue."})
    assert response.status_code == 200 and response.json()["status"] == "rejected"
    assert WorkloadRequest.objects.get(pk=service.pk).replicas == 2
    [mail] = mailoutbox
    assert mail.to == ["carol@example.com"] and "rejected" in mail.subject
    assert "scaling to 4 replicas" in mail.body and "Reason: Use the batch queue." in mail.body


def test_what_may_not_be_asked(cast, cat, service) -> None:
    with pytest.raises(Invalid, match="ask for more") as refused:
        ask(cast, service, replicas=2)
    assert refused.value.field == "replicas"
    with pytest.raises(Invalid, match="can never run") as refused:
        ask(cast, service, replicas=6)  # 12 GPUs > the project's 10
    assert refused.value.field == "replicas"
    with pytest.raises(Invalid) as refused:
        ask(cast, service, reason=" ")
    assert refused.value.field == "reason"
    with pytest.raises(NotAllowed):  # approvers scale directly
        ask(cast, service, who="bob")
    with pytest.raises(NotAllowed):
        ask(cast, service, who="dave")
    waiting = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.PENDING_APPROVAL)
    with pytest.raises(ConflictError, match="scale it directly"):
        ask(cast, waiting)
    ask(cast, service)
    with pytest.raises(ConflictError, match="already waits"):
        ask(cast, service, replicas=4)
    # A scale request and an extension wait side by side: they are different asks.
    extensions.extension_request_create(actor=cast.actor("carol"), request=service, hours=10, reason="Longer too.")
    assert ExtensionRequest.objects.filter(status=X.PENDING).count() == 2


def test_approving_after_it_was_scaled_meanwhile_changes_nothing(cast, service) -> None:
    ext = ask(cast, service, replicas=3)
    services.request_scale(actor=cast.actor("bob"), request=service, replicas=4)
    with pytest.raises(ConflictError, match="4 replicas already"):
        extensions.extension_request_approve(actor=cast.actor("bob"), extension=ext)
    assert WorkloadRequest.objects.get(pk=service.pk).replicas == 4
    assert ExtensionRequest.objects.get(pk=ext.pk).status == X.PENDING

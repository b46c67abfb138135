"""Extension requests: more hours than the approval rule grants, asked of the project's approvers.

carol's running training request has 4 hours; the global rule grants up to 8 by itself, the template at most 72.
Services, state machine, API and pages; outsiders (erin, frank, nobody) find nothing (404).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from portal.exceptions import ConflictError, Invalid, NotAllowed
from tenants.models import AuditEntry
from workloads import extension_states, extensions, services
from workloads.models import ExtensionRequest, RequestEvent, RequestState, WorkloadRequest
from workloads.states import move as request_move
from workloads.tasks import requests_housekeeping_task

from .factories import make_request

pytestmark = [pytest.mark.django_db]
S = RequestState
X = ExtensionRequest.Status
API = "/api/v1"
HTMX = {"HTTP_HX_REQUEST": "true"}
OUTSIDERS = ["erin", "frank", "nobody"]


def text(response) -> str:
    return response.content.decode()


def post(client, path: str, body: dict | None = None):
    return client.post(f"{API}{path}", body or {}, format="json")


@pytest.fixture
def running(cast, cat) -> WorkloadRequest:
    started = timezone.now()
    return make_request(cat, cast.vision, cast.carol, state=S.RUNNING, duration_hours=4, started_at=started,
                        expires_at=started + timedelta(hours=4))


def ask(cast, req, hours: int = 10, reason: str = "The run needs another epoch.", who: str = "carol") -> ExtensionRequest:
    return extensions.extension_request_create(actor=cast.actor(who), request=req, hours=hours, reason=reason)


# The service and its state machine -------------------------------------------------------------------------------


def test_past_the_rule_the_requester_is_pointed_to_an_extension_request(cast, running) -> None:
    with pytest.raises(NotAllowed, match="Ask for an extension with a reason instead"):
        services.request_extend(actor=cast.actor("carol"), request=running, hours=10)


def test_asking_tells_the_approvers_and_approving_extends(cast, running, mailoutbox,
                                                          django_capture_on_commit_callbacks, hooks_called) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        ext = ask(cast, running)
    assert ext.status == X.PENDING and ext.hours == 10
    assert sorted(m.to[0] for m in mailoutbox) == ["alice@example.com", "bob@example.com"]
    assert "Extension asked for: acme-vision/" in mailoutbox[0].subject and "another epoch" in mailoutbox[0].body
    assert RequestEvent.objects.filter(request=running, message__startswith="Asked for 10 more hours").exists()
    mailoutbox.clear()
    before = running.expires_at
    with django_capture_on_commit_callbacks(execute=True):
        done = extensions.extension_request_approve(actor=cast.actor("bob"), extension=ext, comment="ok")
    assert done.status == X.APPROVED and done.decided_by == cast.bob
    running.refresh_from_db()
    assert running.duration_hours == 14 and running.expires_at == before + timedelta(hours=10)
    assert hooks_called == [("extend", running.pk)]  # the cluster side moves the deadline, as for any extension
    [mail] = mailoutbox
    assert mail.to == ["carol@example.com"] and "approved" in mail.subject and "14 hours in all" in mail.body
    assert AuditEntry.objects.filter(action="extension_request.approved").exists()
    with pytest.raises(ConflictError, match="approved now"):
        extensions.extension_request_reject(actor=cast.actor("alice"), extension=ext, comment="no")


def test_what_may_not_be_asked(cast, cat, running) -> None:
    with pytest.raises(Invalid) as refused:
        ask(cast, running, reason="  ")
    assert refused.value.field == "reason"
    with pytest.raises(Invalid, match="maximum of 72 hours") as refused:
        ask(cast, running, hours=100)
    assert refused.value.field == "hours"
    with pytest.raises(NotAllowed):  # approvers extend directly
        ask(cast, running, who="bob")
    with pytest.raises(NotAllowed):
        ask(cast, running, who="dave")
    pending = make_request(cat, cast.vision, cast.carol, state=S.PENDING_APPROVAL)
    with pytest.raises(ConflictError, match="extend it directly"):
        ask(cast, pending)
    ask(cast, running)
    with pytest.raises(ConflictError, match="already waits"):
        ask(cast, running)
    assert ExtensionRequest.objects.count() == 1


def test_rejecting_needs_a_reason_and_the_requester_sees_it(cast, running, mailoutbox,
                                                             django_capture_on_commit_callbacks) -> None:
    ext = ask(cast, running)
    with pytest.raises(Invalid) as refused:
        extensions.extension_request_reject(actor=cast.actor("bob"), extension=ext, comment="")
    assert refused.value.field == "comment"
    with pytest.raises(NotAllowed):
        extensions.extension_request_approve(actor=cast.actor("carol"), extension=ext)
    with django_capture_on_commit_callbacks(execute=True):
        extensions.extension_request_reject(actor=cast.actor("bob"), extension=ext, comment="Book a reservation instead.")
    assert [m.to for m in mailoutbox] == [["carol@example.com"]]
    assert "Reason: Book a reservation instead." in mailoutbox[0].body
    running.refresh_from_db()
    assert running.duration_hours == 4
    ask(cast, running, hours=2)  # a rejected one does not block asking again


def test_the_requester_withdraws_and_an_ended_request_lapses_its_extension(cast, cat, running) -> None:
    ext = ask(cast, running)
    with pytest.raises(NotAllowed):
        extensions.extension_request_cancel(actor=cast.actor("bob"), extension=ext)
    assert extensions.extension_request_cancel(actor=cast.actor("carol"), extension=ext).status == X.CANCELLED
    again = ask(cast, running)
    request_move(running, to=S.SUCCEEDED, actor_label="cluster", reason="done")
    with pytest.raises(ConflictError, match="nothing left to extend"):
        extensions.extension_request_approve(actor=cast.actor("bob"), extension=again)
    assert ExtensionRequest.objects.get(pk=again.pk).status == X.PENDING  # the refusal changed nothing
    assert requests_housekeeping_task.apply().get()["extensions_lapsed"] == 1
    assert ExtensionRequest.objects.get(pk=again.pk).status == X.LAPSED
    assert extensions.extension_requests_lapse() == 0  # idempotent


def test_the_state_machine_is_a_compare_and_set(cast, running) -> None:
    ext = ask(cast, running)
    assert extension_states.can_move(X.PENDING, X.APPROVED) and not extension_states.can_move(X.APPROVED, X.REJECTED)
    first = extension_states.move(ext, to=X.CANCELLED, actor=cast.actor("carol"), message="withdrawn")
    second = extension_states.move(ext, to=X.APPROVED, actor=cast.actor("bob"), message="approved")
    assert first is not None and second is None
    assert ExtensionRequest.objects.get(pk=ext.pk).status == X.CANCELLED


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_two_approvers_at_once_extend_once(cast, cat) -> None:
    import threading

    running = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, duration_hours=4,
                           expires_at=timezone.now() + timedelta(hours=4))
    ext = ask(cast, running)
    barrier = threading.Barrier(2)
    results: list[str] = []

    def decide(who: str) -> None:
        barrier.wait()
        try:
            extensions.extension_request_approve(actor=cast.actor(who), extension=ext)
            results.append("won")
        except ConflictError:
            results.append("conflict")
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(who,)) for who in ("bob", "alice")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["conflict", "won"]
    assert WorkloadRequest.objects.get(pk=running.pk).duration_hours == 14


# API --------------------------------------------------------------------------------------------------------------


def test_the_api_round_trip(api, cast, running) -> None:
    response = post(api("carol"), "/extension-requests/", {"request": running.pk, "hours": 10, "reason": "One more epoch."})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "pending" and body["hours"] == 10 and body["duration_hours"] == 4
    pk = body["id"]
    assert post(api("carol"), "/extension-requests/", {"request": running.pk, "hours": 2, "reason": "x"}).status_code == 409
    bad = post(api("carol"), "/extension-requests/", {"request": running.pk, "hours": 2})
    assert bad.status_code == 400 and "reason" in bad.json()["fields"]
    inbox = api("bob").get(f"{API}/extension-requests/?inbox=true").json()
    assert [row["id"] for row in inbox["results"]] == [pk]
    assert api("carol").get(f"{API}/extension-requests/?inbox=true").json()["count"] == 0
    assert api("bob").get(f"{API}/approvals/waiting/").json()["requests"] == 1
    missing = post(api("bob"), f"/extension-requests/{pk}/reject/", {})
    assert missing.status_code == 400 and "comment" in missing.json()["fields"]
    assert post(api("carol"), f"/extension-requests/{pk}/approve/").status_code == 403
    response = post(api("bob"), f"/extension-requests/{pk}/approve/", {"comment": "fine"})
    assert response.status_code == 200 and response.json()["status"] == "approved"
    assert response.json()["duration_hours"] == 14
    detail = api("carol").get(f"{API}/requests/{running.pk}/").json()
    assert detail["duration_hours"] == 14 and detail["extension_requests"][0]["status"] == "approved"
    assert post(api("bob"), f"/extension-requests/{pk}/approve/").status_code == 409
    # In a bulk decision too.
    again = ask(cast, running, hours=2)
    result = post(api("bob"), "/approvals/bulk/", {"decision": "reject", "comment": "Enough.",
                                                   "extension_requests": [again.pk]}).json()
    assert result["results"][0]["ok"] and result["results"][0]["status"] == "rejected"


@pytest.mark.parametrize("who", OUTSIDERS)
def test_outsiders_find_no_extension_request(api, cast, running, who) -> None:
    ext = ask(cast, running)
    client = api(who)
    assert client.get(f"{API}/extension-requests/{ext.pk}/").status_code == 404
    assert ext.pk not in {row["id"] for row in client.get(f"{API}/extension-requests/").json()["results"]}
    for action, body in (("approve", {}), ("reject", {"comment": "no"}), ("cancel", {})):
        assert post(client, f"/extension-requests/{ext.pk}/{action}/", body).status_code == 404, action
    response = post(client, "/extension-requests/", {"request": running.pk, "hours": 2, "reason": "mine now"})
    assert response.status_code == 400 and response.json()["fields"] == {"request": ["No such request."]}
    result = post(client, "/approvals/bulk/", {"decision": "approve", "extension_requests": [ext.pk]}).json()
    assert result["results"][0]["error"]["code"] == "not_found"
    assert ExtensionRequest.objects.get(pk=ext.pk).status == X.PENDING


def test_a_token_asks_but_never_decides(cast, running, token_client) -> None:
    client, _ = token_client("carol", cast.vision, "read+submit")
    response = post(client, "/extension-requests/", {"request": running.pk, "hours": 3, "reason": "CI needs it."})
    assert response.status_code == 201
    bob_token, _ = token_client("bob", cast.vision, "read+submit")
    assert post(bob_token, f"/extension-requests/{response.json()['id']}/approve/").status_code == 403


# Pages --------------------------------------------------------------------------------------------------------------


def test_the_page_offers_to_ask_with_the_hours_filled_in(as_user, cast, running) -> None:
    client = as_user("carol")
    response = client.post(f"/requests/{running.pk}/extend/", {"extend-hours": "10"})
    assert response.status_code == 302 and response["Location"] == f"/requests/{running.pk}/?ask=10#ask-extension"
    body = text(client.get(response["Location"]))
    assert "needs a project admin" in body and 'id="ask-extension"' in body and 'value="10"' in body
    response = client.post(f"/requests/{running.pk}/extension/", {"ask-hours": "10", "ask-reason": ""})
    assert response.status_code == 400 and "This field is required." in text(response)
    response = client.post(f"/requests/{running.pk}/extension/", {"ask-hours": "10", "ask-reason": "One more epoch."},
                           follow=True)
    assert "Asked for 10 more hours" in text(response) and "Extensions asked for" in text(response)
    assert 'id="ask-extension"' not in text(response)  # one at a time
    # bob sees it in his inbox and on the page; approving from the inbox (htmx) extends the request.
    ext = ExtensionRequest.objects.get()
    inbox = text(as_user("bob").get("/approvals/"))
    assert f'id="extension-{ext.pk}"' in inbox and "One more epoch." in inbox and "14 h" in inbox
    assert f'name="extension_requests" value="{ext.pk}" form="bulk-form"' in inbox
    assert 'id="ask-extension"' not in text(as_user("bob").get(f"/requests/{running.pk}/"))  # approvers extend
    response = as_user("bob").post(f"/extension-requests/{ext.pk}/decide/", {"decision": "reject"}, **HTMX)
    assert "Say why it is rejected" in text(response) and ExtensionRequest.objects.get().status == X.PENDING
    response = as_user("bob").post(f"/extension-requests/{ext.pk}/decide/", {"decision": "reject"})  # no JavaScript
    assert response.status_code == 400 and "Say why it is rejected" in text(response)
    assert 'aria-invalid="true"' in text(response)
    response = as_user("bob").post(f"/extension-requests/{ext.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response["HX-Trigger"] == "approvals-changed" and "approved." in text(response)
    running.refresh_from_db()
    assert running.duration_hours == 14
    assert "Approved by bob" in text(as_user("carol").get(f"/requests/{running.pk}/"))


@pytest.mark.parametrize("who", OUTSIDERS)
def test_outsiders_get_404_on_the_pages(as_user, cast, running, who) -> None:
    ext = ask(cast, running)
    client = as_user(who)
    assert client.post(f"/requests/{running.pk}/extension/", {"ask-hours": "2", "ask-reason": "x"}).status_code == 404
    assert client.post(f"/extension-requests/{ext.pk}/decide/", {"decision": "approve"}).status_code == 404
    assert client.post(f"/extension-requests/{ext.pk}/cancel/").status_code == 404
    assert ExtensionRequest.objects.get(pk=ext.pk).status == X.PENDING

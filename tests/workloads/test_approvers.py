"""Approvers are told and decide well: the waiting counts in the navigation, the emails (and webhook) when
something arrives and the reminders while it waits, the reason every rejection needs, bulk decisions.

Services, the API and the pages, through their real interfaces. The cast (tests/conftest.py): bob is project
admin of acme-vision, alice acme's tenant admin, carol a member; erin, frank and nobody are outsiders. The global
rule approves up to 2 GPUs and 8 hours, inference never (tests/workloads/factories.py).
"""

from __future__ import annotations

import http.server
import json
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from portal.exceptions import Invalid
from quotas.models import Quota, QuotaRequest
from workloads import approvals, services
from workloads.models import RequestState, WorkloadRequest
from workloads.tasks import approvals_remind_task

from .factories import make_request

pytestmark = [pytest.mark.django_db]
S = RequestState
API = "/api/v1"
HTMX = {"HTTP_HX_REQUEST": "true"}


def text(response) -> str:
    return response.content.decode()


def post(client, path: str, body: dict | None = None):
    return client.post(f"{API}{path}", body or {}, format="json")


def submit(cast, cat, who: str = "carol", **values):
    values.setdefault("parameters", {"command": "python train.py"})
    return services.request_submit(actor=cast.actor(who), project=values.pop("project", cast.vision),
                                   template=values.pop("template", cat.training), flavor=cat.h100, **values)


def quota_request(cast, cat, who: str = "carol", amount: int = 1) -> QuotaRequest:
    return QuotaRequest.objects.create(project=cast.vision, flavor=cat.h100, resource="nvidia.com/gpu",
                                       amount=Decimal(amount), reason="more", requested_by=getattr(cast, who),
                                       approver=QuotaRequest.Approver.PROJECT_ADMIN)


# The navigation's counts ------------------------------------------------------------------------------------------


def nav_count(body: str, key: str) -> str:
    start = body.index(f'id="nav-count-{key}"')
    return body[start:body.index("</span></span>", start)]


def test_the_navigation_counts_what_waits_for_each_approver(as_user, cast, cat) -> None:
    submit(cast, cat, gpus=4)  # needs an approver in acme-vision
    make_request(cat, cast.llm, cast.frank)  # waits in globex: not acme's business
    make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    quota_request(cast, cat)
    body = text(as_user("bob").get("/requests/"))
    assert '<span class="nav-badge" aria-hidden="true">1</span>' in nav_count(body, "requests")
    assert "1 waiting for your decision" in nav_count(body, "requests")
    assert '<span class="nav-badge" aria-hidden="true">1</span>' in nav_count(body, "quota")
    assert 'aria-describedby="nav-count-requests-text">Approvals' in body
    body = text(as_user("erin").get("/requests/"))
    assert ">1</span>" in nav_count(body, "requests")  # frank's, in globex; not acme's
    assert "nav-badge" not in nav_count(body, "quota")
    body = text(as_user("carol").get("/requests/"))
    assert "nav-count" not in body and "nav-badge" not in body  # members decide nothing: no count, no query


def test_the_count_follows_decisions_and_is_cheap(as_user, cast, cat, django_assert_max_num_queries) -> None:
    waiting = [submit(cast, cat, gpus=4) for _ in range(3)]
    client = as_user("alice")
    client.get("/requests/")  # warm the session and permission caches
    with django_assert_max_num_queries(15):
        body = text(client.get("/requests/"))
    assert ">3</span>" in nav_count(body, "requests")
    services.request_approve(actor=cast.actor("bob"), request=waiting[0])
    response = client.get("/approvals/waiting/", **HTMX)
    assert 'id="nav-count-requests" class="nav-count" hx-swap-oob="true"' in text(response)
    assert ">2</span>" in nav_count(text(response), "requests")
    assert api_waiting(client) == {"requests": 2, "quota_requests": 0, "total": 2}


def api_waiting(client) -> dict:
    return client.get(f"{API}/approvals/waiting/").json()


def test_a_decision_in_place_tells_the_page_to_refresh_the_counts(as_user, cast, cat) -> None:
    req = submit(cast, cat, gpus=4)
    response = as_user("bob").post(f"/requests/{req.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert response["HX-Trigger"] == "approvals-changed"
    body = text(as_user("bob").get("/requests/"))
    assert 'hx-get="/approvals/waiting/" hx-trigger="approvals-changed from:body"' in body


# Emails when something arrives, reminders while it waits ----------------------------------------------------------


def test_approvers_are_emailed_when_a_request_needs_them(cast, cat, mailoutbox, settings,
                                                         django_capture_on_commit_callbacks) -> None:
    posted: list[dict] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.handle_request, daemon=True).start()
    settings.PORTAL_WEBHOOK_URL = f"http://127.0.0.1:{server.server_port}/hook"
    with django_capture_on_commit_callbacks(execute=True):
        req = submit(cast, cat, gpus=4, name="big-run")
    server.server_close()
    assert req.state == S.PENDING_APPROVAL
    assert sorted(m.to[0] for m in mailoutbox) == ["alice@example.com", "bob@example.com"]  # one each, not carol
    mail = mailoutbox[0]
    assert mail.subject == "[GPU portal] Approval needed: acme-vision/big-run"
    assert "carol asks for big-run" in mail.body and "4 GPUs is more than the 2 approved automatically" in mail.body
    assert f"/api/v1/requests/{req.pk}/approve/" in mail.body
    assert posted[0]["event"] == "request.awaiting_approval" and posted[0]["approvers"] == ["alice", "bob"]


def test_links_in_emails_are_absolute(cast, cat, mailoutbox, settings, django_capture_on_commit_callbacks) -> None:
    """A mail client opens no relative link: every link starts with PORTAL_BASE_URL, or without it with the address
    ``make run`` prints (PORTAL_HOST / PORTAL_PORT)."""
    import re

    settings.PORTAL_BASE_URL = "https://gpu.example.org"
    with django_capture_on_commit_callbacks(execute=True):
        req = submit(cast, cat, gpus=4, name="big-run")
    with django_capture_on_commit_callbacks(execute=True):
        services.request_reject(actor=cast.actor("bob"), request=req, comment="too big")
    settings.PORTAL_BASE_URL = ""
    with django_capture_on_commit_callbacks(execute=True):
        submit(cast, cat, gpus=4, name="second")
    bodies = [m.body for m in mailoutbox]
    assert any("https://gpu.example.org/approvals/" in b for b in bodies), bodies
    assert any(f"https://gpu.example.org/requests/{req.pk}/" in b for b in bodies)  # the requester's decision
    assert f"({settings.PORTAL_LINK_BASE_URL}/approvals/)" in bodies[-1]
    assert settings.PORTAL_LINK_BASE_URL.startswith("http://")
    for body in bodies:  # no page's path without a scheme and host in front ("/api/v1/..." names API calls, not links)
        assert not re.search(r"(?<![\w/.:])/(approvals|quota-requests|requests|projects|tenants|ops)/", body), body


def test_approvers_are_told_when_the_requester_cancels(api, as_user, cast, cat, mailoutbox,
                                                      django_capture_on_commit_callbacks) -> None:
    req = submit(cast, cat, gpus=4, name="big-run")
    bob = as_user("bob")
    assert f"/requests/{req.pk}/" in text(bob.get("/approvals/")) and api_waiting(bob)["requests"] == 1
    mailoutbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        answer = post(api("carol"), f"/requests/{req.pk}/cancel/", {"reason": "wrong dataset"})
    assert answer.status_code == 200, answer.json()
    assert sorted(m.to[0] for m in mailoutbox) == ["alice@example.com", "bob@example.com"]  # the approvers asked
    mail = mailoutbox[0]
    assert mail.subject == "[GPU portal] Withdrawn, no decision needed: acme-vision/big-run"
    assert "was cancelled by carol" in mail.body and "wrong dataset" in mail.body
    assert "http://" in mail.body and "/approvals/" in mail.body
    # It has left their inbox: the page, the API and the navigation's count.
    assert f"/requests/{req.pk}/" not in text(bob.get("/approvals/"))
    assert req.pk not in [r["id"] for r in api("bob").get(f"{API}/approvals/").json()["results"]]
    assert api_waiting(bob)["requests"] == 0
    # A request cancelled before it waited for anyone tells no approver.
    mailoutbox.clear()
    quick = submit(cast, cat, gpus=1, name="small")
    with django_capture_on_commit_callbacks(execute=True):
        post(api("carol"), f"/requests/{quick.pk}/cancel/")
    assert mailoutbox == []


def test_nobody_is_emailed_for_what_the_rule_approves(cast, cat, mailoutbox, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        assert submit(cast, cat, gpus=1).state == S.APPROVED
    assert mailoutbox == []


def test_ops_are_told_when_nobody_else_may_decide(cast, cat, mailoutbox, django_capture_on_commit_callbacks) -> None:
    # frank's request in globex-llm: erin (tenant admin) decides; without erin, ops are told.
    from tenants.models import Membership

    Membership.objects.filter(user=cast.erin).delete()
    from tenants.access import permissions_sync

    permissions_sync(user=cast.erin, tenant=cast.globex)
    with django_capture_on_commit_callbacks(execute=True):
        submit(cast, cat, who="frank", project=cast.llm, gpus=4)
    assert [m.to for m in mailoutbox] == [["ops@example.com"]]


def test_reminders_once_per_period_while_it_waits(cast, cat, mailoutbox, settings,
                                                  django_capture_on_commit_callbacks) -> None:
    settings.PORTAL_APPROVAL_REMIND_AFTER = 4 * 3600
    req = submit(cast, cat, gpus=4)
    decided = submit(cast, cat, gpus=4)
    qr = quota_request(cast, cat)
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals.approvals_remind(now=now + timedelta(hours=3)) == {
            "request": 0, "extension_request": 0, "quota_request": 0}
        services.request_reject(actor=cast.actor("bob"), request=decided, comment="no")
    mailoutbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        sent = approvals.approvals_remind(now=now + timedelta(hours=5))
    assert sent == {"request": 1, "extension_request": 0, "quota_request": 1}
    subjects = sorted(m.subject for m in mailoutbox)
    assert f"[GPU portal] Still waiting for a decision: acme-vision/{req.name}" in subjects
    assert f"[GPU portal] Still waiting for a decision: quota request #{qr.pk}" in subjects
    assert all(m.to != ["carol@example.com"] for m in mailoutbox)  # approvers only
    req.refresh_from_db()
    assert req.approval_reminded_at is not None
    # Again within the period (a second beat run, or an overlapping one): nothing more.
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals.approvals_remind(now=now + timedelta(hours=6))["request"] == 0
    # The next period: one more reminder.
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals.approvals_remind(now=now + timedelta(hours=9, minutes=1))["request"] == 1
    # The Celery task (beat) reads the setting: off at 0; else what waited that long since it arrived.
    late = submit(cast, cat, gpus=4)
    WorkloadRequest.objects.filter(pk=late.pk).update(created_at=now - timedelta(hours=2))
    settings.PORTAL_APPROVAL_REMIND_AFTER = 0
    assert approvals_remind_task.apply().get() == {"request": 0, "extension_request": 0, "quota_request": 0}
    settings.PORTAL_APPROVAL_REMIND_AFTER = 3600
    assert approvals_remind_task.apply().get() == {"request": 1, "extension_request": 0, "quota_request": 0}
    assert WorkloadRequest.objects.get(pk=late.pk).approval_reminded_at is not None


def test_the_reminder_setting_reads_durations() -> None:
    from portal.settings import _duration_seconds

    assert [_duration_seconds("X", v) for v in ("4h", "30m", "90", "90s", "1d", "0", "")] == [
        14400, 1800, 90, 90, 86400, 0, 0]
    with pytest.raises(Exception, match="a duration is N"):
        _duration_seconds("X", "four hours")


# Rejecting needs a reason -----------------------------------------------------------------------------------------


def test_the_service_refuses_a_rejection_without_a_reason(cast, cat) -> None:
    req = submit(cast, cat, gpus=4)
    for comment in ("", "   "):
        with pytest.raises(Invalid) as refused:
            services.request_reject(actor=cast.actor("bob"), request=req, comment=comment)
        assert refused.value.field == "comment"
    assert WorkloadRequest.objects.get(pk=req.pk).state == S.PENDING_APPROVAL


def test_the_api_says_which_field_is_missing_and_shows_the_reason(api, cast, cat, mailoutbox,
                                                                  django_capture_on_commit_callbacks) -> None:
    req = submit(cast, cat, gpus=4)
    for body in ({}, {"comment": ""}):
        response = post(api("bob"), f"/requests/{req.pk}/reject/", body)
        assert response.status_code == 400
        assert response.json()["fields"] == {"comment": ["Say why it is rejected: the requester sees the reason."]}
    with django_capture_on_commit_callbacks(execute=True):
        response = post(api("bob"), f"/requests/{req.pk}/reject/", {"comment": "Use the MIG flavor for this."})
    assert response.status_code == 200 and response.json()["decision_comment"] == "Use the MIG flavor for this."
    seen = api("carol").get(f"{API}/requests/{req.pk}/").json()
    assert seen["state"] == S.REJECTED and seen["decision_comment"] == "Use the MIG flavor for this."
    [mail] = [m for m in mailoutbox if m.to == ["carol@example.com"]]
    assert "rejected" in mail.subject and "Reason: Use the MIG flavor for this." in mail.body


def test_the_pages_show_the_missing_reason_on_the_form(as_user, cast, cat) -> None:
    req = submit(cast, cat, gpus=4, name="big-run")
    client = as_user("bob")
    # The inbox (htmx): the item comes back with the error next to the reason's field, still undecided.
    response = client.post(f"/requests/{req.pk}/decide/", {"decision": "reject"}, **HTMX)
    body = text(response)
    assert "Say why it is rejected" in body and 'aria-invalid="true"' in body and "Reject" in body
    assert "HX-Trigger" not in response
    # The request's page (no JavaScript): 400, the form with its error.
    response = client.post(f"/requests/{req.pk}/decide/", {"decision": "reject", f"decide-{req.pk}-comment": " "})
    assert response.status_code == 400 and "Say why it is rejected" in text(response)
    assert WorkloadRequest.objects.get(pk=req.pk).state == S.PENDING_APPROVAL
    client.post(f"/requests/{req.pk}/decide/", {"decision": "reject", f"decide-{req.pk}-comment": "Too big."})
    body = text(as_user("carol").get(f"/requests/{req.pk}/"))
    assert "Why it was rejected:" in body and "Too big." in body


# Bulk decisions -----------------------------------------------------------------------------------------------------


def test_bulk_goes_item_by_item_and_reports_each(cast, cat, mailoutbox, django_capture_on_commit_callbacks) -> None:
    first, second, decided = (submit(cast, cat, gpus=4) for _ in range(3))
    foreign = make_request(cat, cast.llm, cast.frank)
    services.request_reject(actor=cast.actor("alice"), request=decided, comment="no")
    with django_capture_on_commit_callbacks(execute=True):
        outcome = approvals.decide_many(
            actor=cast.actor("bob"), decision="approve",
            items=[("request", first.pk), ("request", second.pk), ("request", decided.pk), ("request", foreign.pk),
                   ("request", first.pk)],
        )
    assert [(r.id, r.ok) for r in outcome.results] == [(first.pk, True), (second.pk, True), (decided.pk, False),
                                                       (foreign.pk, False)]
    assert outcome.results[2].code == "conflict" and "already decided" in outcome.results[2].error
    assert outcome.results[3].code == "not_found"
    assert set(WorkloadRequest.objects.filter(pk__in=[first.pk, second.pk]).values_list("state", flat=True)) == {S.APPROVED}
    assert WorkloadRequest.objects.get(pk=foreign.pk).state == S.PENDING_APPROVAL
    assert len([m for m in mailoutbox if "approved" in m.subject]) == 2  # each requester told, as for one click
    with pytest.raises(Invalid, match="Say why"):
        approvals.decide_many(actor=cast.actor("bob"), decision="reject", items=[("request", first.pk)], comment="")


def test_bulk_quota_approvals_still_enforce_the_limits(cast, cat) -> None:
    # acme has 12 H100 for its projects; vision holds 8 and nlp 2: 2 unassigned. Each +2 fits alone, not both.
    one, two = quota_request(cast, cat, amount=2), quota_request(cast, cat, amount=2)
    outcome = approvals.decide_many(actor=cast.actor("bob"), decision="approve",
                                    items=[("quota_request", one.pk), ("quota_request", two.pk)])
    assert [r.ok for r in outcome.results] == [True, False]
    assert outcome.results[1].code == "permission_denied" and "unassigned quota" in outcome.results[1].error
    assert QuotaRequest.objects.get(pk=two.pk).status == "pending"
    assert Quota.objects.get(project=cast.vision, flavor=cat.h100).nominal == 10


def test_bulk_from_the_api(api, cast, cat) -> None:
    first, second = submit(cast, cat, gpus=4), submit(cast, cat, gpus=4)
    foreign = make_request(cat, cast.llm, cast.frank)
    response = post(api("bob"), "/approvals/bulk/", {"decision": "reject", "requests": [first.pk, second.pk]})
    assert response.status_code == 400 and "comment" in response.json()["fields"]
    assert post(api("bob"), "/approvals/bulk/", {"decision": "approve"}).status_code == 400
    response = post(api("bob"), "/approvals/bulk/", {"decision": "reject", "comment": "Not this week.",
                                                     "requests": [first.pk, foreign.pk]})
    assert response.status_code == 200
    body = response.json()
    assert body["done"] == 1 and body["failed"] == 1
    assert body["results"][0] == {"kind": "request", "id": first.pk, "ok": True, "status": "rejected",
                                  "label": f"acme-vision/{first.name}"}
    assert body["results"][1]["error"]["code"] == "not_found"
    assert WorkloadRequest.objects.get(pk=first.pk).decision_comment == "Not this week."
    # A member decides nothing: every item is refused (403 each), nothing moves.
    response = post(api("carol"), "/approvals/bulk/", {"decision": "approve", "requests": [second.pk]})
    assert response.json()["results"][0]["error"]["code"] == "permission_denied"
    assert WorkloadRequest.objects.get(pk=second.pk).state == S.PENDING_APPROVAL


def test_bulk_from_the_inbox_page(as_user, cast, cat) -> None:
    first, second, third = (submit(cast, cat, gpus=4) for _ in range(3))
    client = as_user("bob")
    body = text(client.get("/approvals/"))
    assert f'name="requests" value="{first.pk}" form="bulk-form"' in body and 'id="bulk-form"' in body
    response = client.post("/approvals/bulk/", {"decision": "reject", "requests": [first.pk, second.pk]})
    assert response.status_code == 400 and "Say why it is rejected" in text(response)
    assert f'value="{first.pk}" form="bulk-form" checked' in text(response)  # the selection is kept
    response = client.post("/approvals/bulk/", {"decision": "approve", "requests": [first.pk, second.pk]}, follow=True)
    body = text(response)
    assert f"Approved 2: acme-vision/{first.name}, acme-vision/{second.name}." in body
    assert third.name in body and f'value="{first.pk}"' not in body
    assert as_user("carol").get("/approvals/").status_code == 404
    assert as_user("carol").post("/approvals/bulk/", {"decision": "approve", "requests": [third.pk]}).status_code == 404


def test_quota_inbox_bulk_and_its_table_follows_decisions(as_user, cast, cat) -> None:
    one, two = quota_request(cast, cat, amount=1), quota_request(cast, cat, amount=1)
    client = as_user("bob")
    body = text(client.get("/quota-requests/"))
    assert f'name="quota_requests" value="{one.pk}" form="quota-bulk-form"' in body
    assert 'hx-trigger="approvals-changed from:body"' in body  # the table of every request follows decisions
    response = client.post("/quota-requests/bulk/", {"bulk-decision": "reject", "quota_requests": [one.pk]}, follow=True)
    assert "Say why they are rejected" in text(response) and QuotaRequest.objects.get(pk=one.pk).status == "pending"
    response = client.post("/quota-requests/bulk/", {"bulk-decision": "approve", "quota_requests": [one.pk]},
                           follow=True)
    assert f"Approved 1: #{one.pk}." in text(response)
    # A decision in place (htmx) tells the page; the table refreshes with the new statuses and the inbox's count.
    three = two
    response = client.post(f"/quota-requests/{three.pk}/decide/", {"decision": "approve", "next": "/quota-requests/"}, **HTMX)
    assert response.status_code == 200 and response["HX-Trigger"] == "approvals-changed"
    partial = text(client.get("/quota-requests/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="all"))
    assert "<html" not in partial and f'id="quota-request-row-{three.pk}"' in partial
    row = partial[partial.index(f'id="quota-request-row-{three.pk}"'):]
    assert "badge-request-approved" in row[:row.index("</tr>")]
    assert 'id="inbox-count" hx-swap-oob="true"' in partial


@pytest.mark.parametrize("who", ["erin", "frank", "nobody"])
def test_outsiders_decide_nothing_of_acme_in_bulk(api, as_user, cast, cat, who) -> None:
    req = submit(cast, cat, gpus=4)
    qr = quota_request(cast, cat)
    result = post(api(who), "/approvals/bulk/", {"decision": "approve", "requests": [req.pk], "quota_requests": [qr.pk]})
    assert [r["error"]["code"] for r in result.json()["results"]] == ["not_found", "not_found"]
    client = as_user(who)
    if who == "erin":  # an approver elsewhere: her inbox exists, acme's requests are not in it
        response = client.post("/approvals/bulk/", {"decision": "approve", "requests": [req.pk]}, follow=True)
        assert "Not found." in text(response)
    else:
        assert client.post("/approvals/bulk/", {"decision": "approve", "requests": [req.pk]}).status_code == 404
    response = client.post("/quota-requests/bulk/", {"bulk-decision": "approve", "quota_requests": [qr.pk]}, follow=True)
    assert "Not found." in text(response)
    assert client.get("/approvals/waiting/").status_code == 200
    assert WorkloadRequest.objects.get(pk=req.pk).state == S.PENDING_APPROVAL
    assert QuotaRequest.objects.get(pk=qr.pk).status == "pending"

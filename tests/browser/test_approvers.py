"""Approvers in a real browser: the navigation's count of what waits for them (and the email that says so), a
rejection that needs a reason the requester then reads, approving several at once, an extension asked for and
granted, and the quota inbox's table following a decision made in place.

No cluster runs here: where the cluster would run a request, the test moves it with ``states.move``, the same call
the status follower makes.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from tests.browser.pages import stay

from quotas.models import QuotaRequest
from tests.workloads.factories import make_catalogue, make_request
from workloads import services
from workloads.models import RequestState, WorkloadRequest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
S = RequestState


@pytest.fixture
def cat(cast):
    return make_catalogue(cast)


def pending(cast, cat, name: str) -> WorkloadRequest:
    """carol's request that needs an approver (4 GPUs: more than the rule's 2)."""
    return services.request_submit(actor=cast.actor("carol"), project=cast.vision, template=cat.training, flavor=cat.h100,
                                   gpus=4, name=name, parameters={"command": "python train.py"})


def nav(page):
    return page.get_by_role("navigation", name="Main")


def test_the_approver_is_told_by_email_and_by_the_navigation(signed_in, cast, cat, mailoutbox) -> None:
    carol = signed_in("carol")
    expect(nav(carol).locator(".nav-badge")).to_have_count(0)  # members decide nothing
    carol.goto("/requests/new/?template=inference")
    carol.get_by_label("Name").fill("llm-api")
    carol.get_by_label("Model").fill("hf://meta-llama/Llama-3.1-8B-Instruct")
    carol.get_by_role("button", name="Submit request").click()
    expect(carol.get_by_role("heading", name="llm-api")).to_be_visible()

    # The email reached the project's approvers (bob, and alice as tenant admin), not the requester.
    waiting = [m for m in mailoutbox if "Approval needed" in m.subject]
    assert sorted(m.to[0] for m in waiting) == ["alice@example.com", "bob@example.com"]
    assert "Inference services need a project admin's approval." in waiting[0].body

    bob = signed_in("bob")
    approvals = nav(bob).get_by_role("link", name="Approvals", exact=True)
    expect(approvals.locator(".nav-badge")).to_have_text("1")
    expect(approvals).to_have_accessible_description("1 waiting for your decision")
    approvals.click()
    item = bob.get_by_role("listitem").filter(has_text="llm-api")
    item.get_by_role("button", name="Approve llm-api").click()
    expect(item).to_contain_text("llm-api approved.")
    # The count follows the decision without a reload.
    expect(approvals.locator(".nav-badge")).to_have_count(0)
    expect(approvals).to_have_accessible_description("Nothing waits for your decision")


def test_a_rejection_needs_a_reason_that_the_requester_reads(signed_in, cast, cat, mailoutbox) -> None:
    req = pending(cast, cat, "big-run")
    bob = signed_in("bob")
    bob.goto("/approvals/")
    item = bob.get_by_role("listitem").filter(has_text="big-run")
    item.get_by_role("button", name="Reject big-run").click()
    reason = item.get_by_label("Comment on big-run")
    expect(reason).to_have_attribute("aria-invalid", "true")
    expect(item).to_contain_text("Say why it is rejected: the requester sees the reason.")
    assert WorkloadRequest.objects.get(pk=req.pk).state == S.PENDING_APPROVAL
    reason.fill("Four GPUs for a smoke test is too many; use one.")
    item.get_by_role("button", name="Reject big-run").click()
    expect(item).to_contain_text("big-run rejected.")

    carol = signed_in("carol")
    carol.goto(f"/requests/{req.pk}/")
    expect(carol.locator(".state-line .state")).to_have_text("Rejected")
    expect(carol.locator(".decision-reason")).to_contain_text("Four GPUs for a smoke test is too many; use one.")
    [mail] = [m for m in mailoutbox if m.to == ["carol@example.com"]]
    assert "Reason: Four GPUs for a smoke test is too many; use one." in mail.body


def test_bulk_approve_from_the_inbox(signed_in, cast, cat) -> None:
    first, second, third = (pending(cast, cat, name) for name in ("run-a", "run-b", "run-c"))
    bob = signed_in("bob")
    bob.goto("/approvals/")
    expect(nav(bob).get_by_role("link", name="Approvals", exact=True).locator(".nav-badge")).to_have_text("3")
    bob.get_by_label("Select run-a").check()
    bob.get_by_label("Select run-c").check()
    bob.get_by_role("button", name="Approve selected").click()
    expect(bob.get_by_role("status").first).to_contain_text("Approved 2: acme-vision/run-a, acme-vision/run-c.")
    expect(bob.get_by_role("list", name="Awaiting approval").get_by_role("listitem")).to_have_count(1)
    expect(bob.get_by_role("list", name="Awaiting approval")).to_contain_text("run-b")
    expect(nav(bob).get_by_role("link", name="Approvals", exact=True).locator(".nav-badge")).to_have_text("1")
    states = dict(WorkloadRequest.objects.values_list("name", "state"))
    assert states == {"run-a": S.APPROVED, "run-b": S.PENDING_APPROVAL, "run-c": S.APPROVED}

    # Rejecting several needs one reason for all.
    bob.get_by_label("Select run-b").check()
    bob.get_by_role("button", name="Reject selected").click()
    expect(bob.get_by_label("Reason for the selected")).to_have_attribute("aria-invalid", "true")
    expect(bob.get_by_label("Select run-b")).to_be_checked()  # the selection is kept
    bob.get_by_label("Reason for the selected").fill("Not before the review.")
    bob.get_by_role("button", name="Reject selected").click()
    expect(bob.get_by_role("status").first).to_contain_text("Rejected 1: acme-vision/run-b.")
    assert WorkloadRequest.objects.get(pk=second.pk).decision_comment == "Not before the review."
    assert {first.pk, third.pk} == set(WorkloadRequest.objects.filter(state=S.APPROVED).values_list("pk", flat=True))


def test_an_extension_is_asked_for_and_granted(signed_in, cast, cat, mailoutbox) -> None:
    started = timezone.now()
    req = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, duration_hours=4, name="long-train",
                       started_at=started, expires_at=started + timedelta(hours=4))
    carol = signed_in("carol")
    carol.goto(f"/requests/{req.pk}/")
    carol.locator("form.inline-form").get_by_label("More hours").fill("10")
    carol.get_by_role("button", name="Extend", exact=True).click()
    expect(carol.locator(".messages")).to_contain_text("Extending to 14 hours needs a project admin")
    ask = carol.locator("#ask-extension")
    expect(ask.get_by_label("More hours")).to_have_value("10")  # what was asked for, carried over
    ask.get_by_label("Why").fill("The last epoch needs ten more hours.")
    ask.get_by_role("button", name="Ask the approvers").click()
    expect(carol.locator(".messages")).to_contain_text("Asked for 10 more hours.")
    extensions = carol.get_by_role("list", name="Extensions asked for")
    expect(extensions).to_contain_text("Pending")
    assert sorted(m.to[0] for m in mailoutbox if "Extension asked for" in m.subject) == [
        "alice@example.com", "bob@example.com"]

    bob = signed_in("bob")
    approvals = nav(bob).get_by_role("link", name="Approvals", exact=True)
    expect(approvals.locator(".nav-badge")).to_have_text("1")
    approvals.click()
    item = bob.get_by_role("list", name="Extensions awaiting approval").get_by_role("listitem").filter(has_text="long-train")
    expect(item).to_contain_text("The last epoch needs ten more hours.")
    expect(item).to_contain_text("14 h")
    item.get_by_role("button", name="Approve the extension of long-train").click()
    expect(item).to_contain_text("Extension of long-train by 10 h approved.")
    expect(approvals.locator(".nav-badge")).to_have_count(0)

    carol.reload()
    expect(extensions).to_contain_text("Approved by bob")
    expect(carol.get_by_role("region", name="Details")).to_contain_text("14 h")
    assert WorkloadRequest.objects.get(pk=req.pk).duration_hours == 14
    assert any(m.to == ["carol@example.com"] and "approved" in m.subject for m in mailoutbox)


def test_the_quota_inbox_table_follows_a_decision_made_in_place(signed_in, cast, cat) -> None:
    request = QuotaRequest.objects.create(project=cast.vision, flavor=cat.h100, resource="nvidia.com/gpu",
                                          amount=Decimal(1), reason="One more for the demo.", requested_by=cast.carol,
                                          approver=QuotaRequest.Approver.PROJECT_ADMIN)
    bob = signed_in("bob")
    quota_link = nav(bob).get_by_role("link", name="Quota requests", exact=True)
    expect(quota_link.locator(".nav-badge")).to_have_text("1")
    quota_link.click()
    row = bob.locator(f"#quota-request-row-{request.pk}")
    expect(row).to_contain_text("Pending")
    stay(bob)
    card = bob.get_by_role("list", name="Waiting for you").get_by_role("listitem").filter(has_text=f"#{request.pk}")
    card.get_by_role("button", name=f"Approve #{request.pk}").click()
    expect(card).to_contain_text("Approved by bob")
    # Before the fix the table below kept saying "Pending" until a reload.
    expect(row).to_contain_text("Approved")
    expect(row).to_contain_text("bob")
    expect(bob.locator("#inbox-count .badge")).to_have_count(0)
    expect(quota_link.locator(".nav-badge")).to_have_count(0)
    assert bob.evaluate("window.__stayed") is True

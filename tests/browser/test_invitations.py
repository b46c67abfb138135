"""Invitations end to end: a tenant admin invites an address; a newcomer opens the emailed link in
another browser, picks a username and password, and lands in the project."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from playwright.sync_api import expect

from tenants.models import Invitation, Membership, Role

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_new_user_accepts_an_invitation(signed_in, new_page, cast, mailoutbox) -> None:
    alice = signed_in("alice")
    alice.goto("/tenants/acme/members/")
    invite = alice.get_by_role("region", name="Invite by email")
    invite.get_by_label("Email").fill("grace@example.org")
    invite.get_by_label("Project").select_option(label="NLP (acme-nlp)")
    invite.get_by_label("Role").select_option(label="Member")
    invite.get_by_role("button", name="Send invitation").click()
    expect(alice.get_by_role("status").first).to_contain_text("Invitation sent to grace@example.org")
    pending = alice.get_by_role("region", name="Pending invitations")
    expect(pending.locator("tr", has_text="grace@example.org")).to_contain_text("Pending")

    assert [m.to for m in mail.outbox] == [["grace@example.org"]]
    link = re.search(r"https?://\S+/invitations/\S+/", mail.outbox[0].body).group(0)

    grace = new_page()  # another browser: nobody signed in
    grace.goto(link)
    expect(grace.get_by_role("heading", name="Join Acme Research")).to_be_visible()
    expect(grace.get_by_text("Member", exact=True)).to_be_visible()
    # Usernames are offered, not typed (a typed one would tell whether someone has it): take the second.
    offered = grace.get_by_label("Username").locator("option").all_inner_texts()
    assert len(offered) == 4 and all(name.startswith("grace-") for name in offered), offered
    grace.get_by_label("Username").select_option(offered[1])
    grace.get_by_label("Password", exact=True).fill("a-long-pass-phrase-7")
    grace.get_by_label("Password again").fill("a-long-pass-phrase-7")
    grace.get_by_role("button", name="Create account and join").click()

    expect(grace.get_by_role("heading", name="NLP")).to_be_visible()
    expect(grace.get_by_role("status").first).to_contain_text("Welcome: you are now Member of NLP.")
    expect(grace.locator(".usermenu .username")).to_have_text(offered[1])
    user = get_user_model().objects.get(username=offered[1])
    assert user.email == "grace@example.org"
    assert Membership.objects.filter(user=user, project=cast.nlp, role=Role.MEMBER).exists()
    assert Invitation.objects.get().status == "accepted"

    # The link worked once; the admin's list no longer shows it as pending.
    grace.goto(link)
    expect(grace.get_by_role("heading", name="Invitation closed")).to_be_visible()
    alice.reload()
    expect(pending.locator("tr", has_text="grace@example.org")).to_have_count(0)

"""Single sign-on in the browser against the real test provider (tests/oidc, the npm ``oidc-provider``):
first sign-in, a group change, losing access, logout at both ends, refused tokens, key rotation, password
sign-in switched off, an invitation taken at the first sign-in."""

from __future__ import annotations

import re

import pytest
from django.core import mail
from playwright.sync_api import expect

from tenants.models import ApiToken, GroupMapping, Invitation, LoginSettings, Membership, Role

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def idp(sso, live_server, cast):
    """The provider knows the live server's callback; acme's groups map to roles."""
    sso.client(live_server.url)
    GroupMapping.objects.create(group="gpu-{tenant}-admins", match="pattern", role=Role.TENANT_ADMIN)
    GroupMapping.objects.create(group="gpu-{tenant}-{project}-users", match="pattern", role=Role.MEMBER)
    return sso


def sso_sign_in(page, login: str, *, start: str = "/accounts/login/") -> None:
    page.goto(start)
    page.get_by_role("link", name="Sign in with Test IdP").click()
    expect(page.get_by_role("heading", name="Sign in to the test provider")).to_be_visible()
    page.get_by_label("Login").fill(login)
    page.get_by_role("button", name="Continue").click()


def test_first_sign_in_makes_the_user_a_group_change_follows_and_logout_ends_both_sessions(idp, new_page) -> None:
    idp.user("s-grace", groups=["gpu-acme-acme-nlp-users"], username="grace", email="grace@acme.example")
    page = new_page()
    sso_sign_in(page, "s-grace")
    expect(page.locator(".usermenu .username")).to_have_text("grace")
    expect(page.get_by_role("link", name="NLP")).to_be_visible()
    assert Membership.objects.filter(user__username="grace", project__slug="acme-nlp", role=Role.MEMBER).exists()

    # Sign out: the portal, then the provider (RP-initiated logout), and back to the sign-in page.
    page.locator(".usermenu summary").click()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign out of the test provider")).to_be_visible()
    page.get_by_role("button", name="Yes, sign me out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert idp.state()["end_sessions"] >= 1

    # The provider's session ended too: the next sign-in asks for the login again, and the groups changed.
    idp.user("s-grace", groups=["gpu-acme-acme-nlp-users", "gpu-acme-admins"], username="grace", email="grace@acme.example")
    sso_sign_in(page, "s-grace")
    expect(page.locator(".usermenu .username")).to_have_text("grace")
    assert Membership.objects.filter(user__username="grace", tenant__slug="acme", project=None,
                                     role=Role.TENANT_ADMIN).exists()
    page.goto("/tenants/acme/members/")
    expect(page.get_by_role("heading", name="Acme Research")).to_be_visible()


def test_a_user_who_loses_their_group_loses_access_and_tokens(idp, new_page, mailoutbox) -> None:
    idp.user("s-ivy", groups=["gpu-acme-acme-vision-users"], username="ivy", email="ivy@acme.example")
    page = new_page()
    sso_sign_in(page, "s-ivy")
    expect(page.get_by_role("link", name="Vision")).to_be_visible()
    page.goto("/projects/acme-vision/")
    page.locator("summary", has_text="New token").click()
    page.get_by_label("Name").fill("ci")
    page.get_by_role("button", name="Create token").click()
    expect(page.get_by_text("Copy it now")).to_be_visible()
    page.context.clear_cookies()

    idp.user("s-ivy", groups=[], username="ivy", email="ivy@acme.example")
    sso_sign_in(page, "s-ivy")
    expect(page.get_by_role("status").first).to_contain_text("you are no longer Member of acme-vision")
    expect(page.get_by_role("link", name="Vision")).to_have_count(0)
    assert page.goto("/projects/acme-vision/").status == 404
    assert ApiToken.objects.get(user__username="ivy").revoked_at is not None
    assert any("acme-vision" in m.body for m in mail.outbox if m.to == ["ivy@acme.example"])


def test_tampered_and_wrong_audience_tokens_are_refused(idp, new_page) -> None:
    idp.user("s-oz", groups=[], username="oz")
    page = new_page()
    idp.mode("bad-signature")
    sso_sign_in(page, "s-oz")
    expect(page.get_by_role("alert").or_(page.locator(".messages"))).to_contain_text("signature does not verify")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    idp.mode("wrong-audience")
    page.context.clear_cookies()  # the provider's session too: sign in there again
    sso_sign_in(page, "s-oz")
    expect(page.get_by_text("issued for another application")).to_be_visible()
    assert page.goto("/").url.endswith("/accounts/login/?next=/")


def test_sign_in_goes_on_after_the_provider_rotates_its_keys(idp, new_page) -> None:
    idp.user("s-sue", groups=["gpu-acme-acme-vision-users"], username="sue")
    page = new_page()
    sso_sign_in(page, "s-sue")
    expect(page.locator(".usermenu .username")).to_have_text("sue")
    page.context.clear_cookies()
    old = idp.state()["kid"]
    assert idp.rotate() != old
    sso_sign_in(page, "s-sue")
    expect(page.locator(".usermenu .username")).to_have_text("sue")


def test_ops_switch_password_sign_in_off_for_everyone_but_staff(idp, signed_in, new_page, password) -> None:
    ops = signed_in("ops")
    ops.goto("/ops/identity/")
    ops.get_by_label("Password sign-in only for staff and ops").check()
    ops.get_by_role("button", name="Save login settings").click()
    expect(ops.get_by_role("status").first).to_contain_text("Login settings saved.")
    assert LoginSettings.objects.get().password_login_staff_only

    carol = new_page()
    carol.goto("/accounts/login/")
    expect(carol.get_by_text("Password sign-in is for platform staff only")).to_be_visible()
    carol.get_by_label("Username").fill("carol")
    carol.get_by_label("Password").fill(password)
    carol.get_by_role("button", name="Sign in", exact=True).click()
    expect(carol.get_by_text("Password sign-in is switched off for your account")).to_be_visible()
    # Ops (break-glass) still sign in with their password.
    assert signed_in("ops").locator(".usermenu .username").inner_text() == "ops"


def test_an_invitation_link_is_taken_by_the_first_single_sign_on(idp, cast, live_server, new_page) -> None:
    from tenants import services
    from tenants.access import Actor

    services.invitation_create(actor=Actor(user=cast.alice), tenant=cast.acme, email="newcomer@acme.example",
                               role=Role.MEMBER, project=cast.vision, base_url=live_server.url)
    link = re.search(r"https?://\S+/invitations/\S+/", mail.outbox[-1].body).group(0)
    idp.user("s-nia", groups=[], username="nia", email="nia@corp.example")
    page = new_page()
    page.goto(link)
    page.get_by_role("link", name="Sign in with Test IdP to accept").click()
    page.get_by_label("Login").fill("s-nia")
    page.get_by_role("button", name="Continue").click()
    expect(page.get_by_role("status").first).to_contain_text("you joined Vision by invitation")
    expect(page.get_by_role("link", name="Vision")).to_be_visible()
    invitation = Invitation.objects.get()
    assert invitation.status == Invitation.Status.ACCEPTED and invitation.accepted_by.username == "nia"

"""Member management and tokens, end to end: what one user does changes what another sees."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.pages import stay

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_admin_adds_changes_and_removes_a_member(signed_in) -> None:
    alice = signed_in("alice")
    carol = signed_in("carol")
    projects = carol.get_by_role("list", name="Projects").get_by_role("listitem")
    expect(projects).to_have_count(1)

    # alice adds carol to NLP as a member.
    alice.goto("/tenants/acme/members/")
    alice.on("dialog", lambda dialog: dialog.accept())
    add = alice.get_by_role("region", name="Add a member to a project")
    add.get_by_label("Member", exact=True).select_option("carol")  # a list of acme's own people, not free text
    add.get_by_label("Project").select_option(label="NLP (acme-nlp)")
    add.get_by_label("Role").select_option(label="Member")
    add.get_by_role("button", name="Add member").click()
    expect(alice.get_by_role("status").first).to_contain_text("carol is now Member of NLP.")

    carol.reload()
    expect(projects).to_have_count(2)
    expect(projects.filter(has_text="NLP")).to_contain_text("Member")

    # alice makes her a viewer, in place (htmx): the page does not reload.
    stay(alice)
    row = alice.locator("tr", has_text="carol").filter(has=alice.get_by_role("link", name="NLP"))
    row.get_by_label("Role of carol").select_option(label="Viewer")
    row.get_by_role("button", name="Save role of carol").click()
    expect(row).to_contain_text("carol is now Viewer.")
    assert alice.evaluate("window.__stayed") is True

    carol.goto("/projects/acme-nlp/")
    expect(carol.locator(".role").first).to_have_text("Viewer")
    carol.get_by_text("New token").click()
    expect(carol.get_by_label("Scope").locator("option")).to_have_count(1)  # viewers get read-only tokens

    # alice removes her; the row goes away and carol loses the project.
    row.get_by_role("button", name="Remove carol").click()
    expect(row).to_have_count(0)
    assert alice.evaluate("window.__stayed") is True
    carol.goto("/projects/acme-nlp/")
    expect(carol.get_by_role("heading", name="Not found")).to_be_visible()
    carol.goto("/")
    expect(projects).to_have_count(1)


def test_bad_member_input_shows_the_error_next_to_the_field(signed_in) -> None:
    alice = signed_in("alice")
    alice.goto("/tenants/acme/members/")
    add = alice.get_by_role("region", name="Add a member to a project")
    add.get_by_label("Member", exact=True).select_option("carol")
    add.get_by_label("Project").select_option(label="Vision (acme-vision)")
    add.get_by_role("button", name="Add member").click()
    expect(add.get_by_label("Member", exact=True)).to_have_attribute("aria-invalid", "true")
    expect(alice.locator("#id_member-user_error")).to_contain_text("carol already has a role in acme-vision")
    expect(alice.get_by_text("carol already has a role in acme-vision")).to_have_count(1)  # once, next to the field


def test_token_secret_is_shown_once_and_revoke_works_in_place(signed_in) -> None:
    carol = signed_in("carol")
    carol.context.grant_permissions(["clipboard-read", "clipboard-write"])
    carol.goto("/projects/acme-vision/")
    carol.get_by_text("New token").click()
    carol.get_by_label("Name").fill("ci-nightly")
    carol.get_by_label("Scope").select_option(label="Read and submit")
    carol.get_by_label("Expires in (days)").fill("30")
    carol.get_by_role("button", name="Create token").click()

    secret = carol.get_by_label("Token secret")
    expect(secret).to_have_value(re.compile(r"^gpp_[0-9a-f]{8}_"))
    value = secret.input_value()
    carol.get_by_role("button", name="Copy").click()
    expect(carol.get_by_role("button", name="Copied")).to_be_visible()
    assert carol.evaluate("navigator.clipboard.readText()") == value

    carol.goto("/projects/acme-vision/")
    expect(carol.get_by_label("Token secret")).to_have_count(0)  # shown once only
    row = carol.locator("tr", has_text="ci-nightly")
    expect(row).to_contain_text("Active")
    expect(row).to_contain_text("never")  # last used

    carol.on("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke ci-nightly").click()
    expect(row).to_contain_text("Revoked")
    expect(row.get_by_role("button")).to_have_count(0)


def test_declining_the_confirmation_changes_nothing(signed_in, cast) -> None:
    from tenants.models import Membership

    alice = signed_in("alice")
    alice.goto("/tenants/acme/members/?user=dave")
    alice.on("dialog", lambda dialog: dialog.dismiss())
    alice.get_by_role("button", name="Remove dave").click()
    alice.wait_for_timeout(300)
    expect(alice.locator("tr", has_text="dave")).to_have_count(1)
    assert Membership.objects.filter(user=cast.dave).exists()

"""Every error is shown once: next to its field, or in the form's summary, or as a message; never in
two of those places. Bad input is sent to the portal's forms and each page's errors are counted."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def shown_errors(html: str) -> list[str]:
    """The error texts a person reads on the page: list items of error lists, flash messages and alerts."""
    found: list[str] = []
    for block in re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', html, re.S):
        found += [re.sub(r"<[^>]+>", "", item).strip() for item in re.findall(r"<li>(.*?)</li>", block, re.S)]
    found += [re.sub(r"<[^>]+>", "", m).strip() for m in re.findall(r'<li class="message message-error">(.*?)</li>', html, re.S)]
    found += [re.sub(r"<[^>]+>", "", m).strip() for m in re.findall(r'<p class="error[^"]*"[^>]*>(.*?)</p>', html, re.S)]
    return [text for text in found if text]


def assert_each_once(response) -> list[str]:
    errors = shown_errors(response.content.decode())
    twice = [text for text, count in Counter(errors).items() if count > 1]
    assert twice == [], f"shown more than once: {twice}"
    return errors


def test_the_finder_finds_a_repeat() -> None:
    page = ('<div class="form-errors"><ul class="errorlist nonfield"><li>Bad.</li></ul></div>'
            '<ul class="errorlist" id="id_x_error"><li>Bad.</li></ul>')
    assert shown_errors(page) == ["Bad.", "Bad."]


CASES = [
    # (who, url name, args, data, an error that must be on the page)
    ("alice", "member-add", ["acme"], {"member-user": "carol", "member-project": "acme-vision", "member-role": "viewer"},
     "already has a role"),
    ("alice", "member-add", ["acme"], {"member-user": "", "member-project": "", "member-role": "owner"}, "required"),
    ("alice", "invitation-create", ["acme"], {"invite-email": "x", "invite-project": "", "invite-role": "member"}, "valid email"),
    ("alice", "project-create", ["acme"], {"project-name": "Vision", "project-slug": "acme-vision"}, "already has a project with this slug"),
    ("alice", "tenant-details", ["acme"], {"details-name": "", "details-contact_email": "nope"}, "required"),
    ("carol", "token-create", ["acme-vision"], {"token-name": "", "token-scope": "admin", "token-expires_days": "1e309"},
     "too large"),
    ("dave", "token-create", ["acme-vision"], {"token-name": "x", "token-scope": "read+submit", "token-expires_days": "3"},
     "Select a valid choice"),
]


@pytest.mark.parametrize(("who", "name", "args", "data", "expected"), CASES)
def test_tenancy_form_errors_show_once(as_user, who, name, args, data, expected) -> None:
    response = as_user(who).post(reverse(name, args=args), data)
    assert response.status_code == 200
    errors = assert_each_once(response)
    assert any(expected in e for e in errors), errors


def test_login_and_password_errors_show_once(client, as_user, cast) -> None:
    response = client.post(reverse("login"), {"username": "carol", "password": "wrong"})
    assert any("do not match" in e for e in assert_each_once(response))
    response = as_user("carol").post(reverse("password_change"), {"old_password": "wrong", "new_password1": "carol",
                                                                  "new_password2": "other"})
    assert len(assert_each_once(response)) >= 2


def test_a_service_refusal_shows_once(as_user, cast) -> None:
    """The service's refusal (suspended tenant) is the form's summary, not also a message."""
    from tenants.services import tenant_update

    tenant_update(actor=cast.actor("ops"), tenant=cast.acme, status="suspended")
    response = as_user("alice").post(reverse("project-create", args=["acme"]), {"project-name": "New", "project-slug": "acme-new"})
    errors = assert_each_once(response)
    assert any("suspended" in e for e in errors)

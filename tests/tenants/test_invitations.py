"""Invitations by email: an admin invites an address; whoever opens the single-use link signs in or
signs up and gets the role. Through the pages (test client) and the API; the link comes from the email."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from tenants import services
from tenants.models import AuditEntry, Invitation, Membership, Role
from tenants.tasks import invitations_expire_task

pytestmark = pytest.mark.django_db

API = "/api/v1"
LINK = re.compile(r"https?://[^\s]+/invitations/([A-Za-z0-9_-]+)/")


def text(response) -> str:
    return response.content.decode()


def invite_form(email: str = "newcomer@example.org", project: str = "acme-nlp", role: str = "member") -> dict[str, str]:
    return {"invite-email": email, "invite-project": project, "invite-role": role}


@pytest.fixture
def invite(as_user, mailoutbox, django_capture_on_commit_callbacks):
    """``invite(**form)`` sends an invitation as alice through the members page; returns (invitation, link path)."""

    def make(**kwargs) -> tuple[Invitation, str]:
        client = as_user("alice")
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(reverse("invitation-create", args=["acme"]), invite_form(**kwargs))
        assert response.status_code == 302, text(response)
        message = mailoutbox[-1]
        secret = LINK.search(message.body).group(1)
        return Invitation.objects.latest("pk"), reverse("invitation-accept", args=[secret])

    return make


# Sending -----------------------------------------------------------------------------------------


def test_admin_invites_by_email_and_the_link_is_mailed(invite, mailoutbox, as_user, cast) -> None:
    invitation, path = invite(email="NewComer@Example.org")
    assert invitation.email == "newcomer@example.org"
    assert (invitation.tenant, invitation.project, invitation.role, invitation.status) == (cast.acme, cast.nlp, "member", "pending")
    assert invitation.invited_by == cast.alice and invitation.send_count == 1
    mail = mailoutbox[-1]
    assert mail.to == ["newcomer@example.org"]
    assert "NLP" in mail.body and "Member" in mail.body and path in mail.body
    # Only a hash of the link's secret is stored.
    secret = path.rstrip("/").rsplit("/", 1)[1]
    assert secret not in str(Invitation.objects.values().get(pk=invitation.pk))
    assert invitation.secret_hash == services.invitation_secret_hash(secret)
    page = text(as_user("alice").get("/tenants/acme/members/"))
    assert "newcomer@example.org" in page and "Pending invitations" in page
    entry = AuditEntry.objects.get(action="invitation.create")
    assert entry.after["email"] == "newcomer@example.org" and secret not in str(entry.after)


def test_the_members_page_has_no_free_text_username(as_user, cast) -> None:
    body = text(as_user("alice").get("/tenants/acme/members/"))
    assert 'name="member-username"' not in body
    users = re.search(r'<select name="member-user".*?</select>', body, re.S).group(0)
    # Only acme's own people are offered: never frank (globex), nobody (no role) or ops.
    for name in ("alice", "bob", "carol", "dave"):
        assert f'value="{name}"' in users
    for name in ("frank", "erin", "nobody", "ops"):
        assert f'value="{name}"' not in users


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (invite_form(email="not-an-address"), "email", "valid email"),
        (invite_form(project=""), "project", "choose one"),
        (invite_form(role="tenant_admin"), "project", "leave project empty"),
        (invite_form(project="globex-llm"), "project", "Select a valid choice"),
        (invite_form(role="owner"), "role", "Select a valid choice"),
    ],
)
def test_bad_invitation_input_writes_and_sends_nothing(as_user, mailoutbox, data, field, message) -> None:
    response = as_user("alice").post(reverse("invitation-create", args=["acme"]), data)
    assert response.status_code == 200
    body = text(response)
    assert f'id="id_invite-{field}_error"' in body and message in body
    assert not Invitation.objects.exists() and mailoutbox == []


def test_a_second_invitation_to_the_same_place_is_refused_while_one_is_pending(invite, as_user) -> None:
    invite(email="twice@example.org")
    response = as_user("alice").post(reverse("invitation-create", args=["acme"]), invite_form(email="twice@example.org"))
    assert "already has a pending invitation" in text(response)
    assert Invitation.objects.count() == 1


@pytest.mark.parametrize(("who", "status"), [("ops", 302), ("alice", 302), ("bob", 403), ("carol", 403), ("erin", 404), ("nobody", 404)])
def test_invite_matrix(as_user, who, status) -> None:
    response = as_user(who).post(reverse("invitation-create", args=["acme"]), invite_form())
    assert response.status_code == status
    assert Invitation.objects.exists() is (status == 302)


def test_invitation_form_replayed_invites_once(as_user, mailoutbox, django_capture_on_commit_callbacks) -> None:
    client = as_user("alice")
    body = text(client.get("/tenants/acme/members/"))
    token = re.search(r'name="invite-form_token" value="([^"]+)"', body).group(1)
    data = invite_form() | {"invite-form_token": token}
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(reverse("invitation-create", args=["acme"]), data)
        again = client.post(reverse("invitation-create", args=["acme"]), data, follow=True)
    assert first.status_code == 302 and again.redirect_chain[-1][0] == first["Location"]
    assert "already sent" in text(again)
    assert Invitation.objects.count() == 1 and len(mailoutbox) == 1


# Accepting ---------------------------------------------------------------------------------------


def test_a_newcomer_signs_up_on_the_link_and_joins(invite, client, cast) -> None:
    invitation, path = invite()
    client.logout()
    page = client.get(path)
    assert page.status_code == 200 and "no-store" in page["Cache-Control"] and page["Referrer-Policy"] == "same-origin"
    assert "Join Acme Research" in text(page) and "Create your account" in text(page)
    offered = usernames_offered(page)
    assert len(offered) == 4 and all(re.fullmatch(r"newcomer-[a-z2-9]{4}", name) for name in offered), offered
    assert usernames_offered(client.get(path)) == offered  # the same link offers the same names
    response = client.post(path, {"signup-username": offered[1], "signup-password1": "a-long-pass-phrase-7",
                                  "signup-password2": "a-long-pass-phrase-7"})
    assert response.status_code == 302 and response["Location"] == "/projects/acme-nlp/"
    user = get_user_model().objects.get(username=offered[1])
    assert user.email == "newcomer@example.org" and user.check_password("a-long-pass-phrase-7")
    assert Membership.objects.filter(user=user, project=cast.nlp, role=Role.MEMBER).exists()
    invitation.refresh_from_db()
    assert (invitation.status, invitation.accepted_by) == ("accepted", user)
    assert client.get("/projects/acme-nlp/").status_code == 200  # signed in, and the role works at once
    actions = list(AuditEntry.objects.order_by("seq").values_list("action", flat=True))
    assert actions[-3:] == ["user.signup", "membership.create", "invitation.accept"]
    # Single use: the link does nothing more, for anyone.
    client.logout()
    again = client.get(path)
    assert again.status_code == 410 and "already accepted" in text(again)
    assert client.post(path, {"signup-username": "second", "signup-password1": "a-long-pass-phrase-7",
                              "signup-password2": "a-long-pass-phrase-7"}).status_code == 410
    assert not get_user_model().objects.filter(username="second").exists()


OFFERED = "(offered)"


def usernames_offered(response) -> list[str]:
    select = re.search(r'<select name="signup-username".*?</select>', text(response), re.S).group(0)
    return re.findall(r'<option value="([^"]+)"', select)


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"signup-username": "carol", "signup-password1": "a-long-pass-phrase-7", "signup-password2": "a-long-pass-phrase-7"},
         "username", "Choose one of the usernames offered."),
        ({"signup-username": "newbie", "signup-password1": "a-long-pass-phrase-7", "signup-password2": "a-long-pass-phrase-7"},
         "username", "Choose one of the usernames offered."),
        ({"signup-username": "bad name!", "signup-password1": "a-long-pass-phrase-7", "signup-password2": "a-long-pass-phrase-7"},
         "username", "Choose one of the usernames offered."),
        ({"signup-username": OFFERED, "signup-password1": "short", "signup-password2": "short"}, "password1", "too short"),
        ({"signup-username": OFFERED, "signup-password1": "a-long-pass-phrase-7", "signup-password2": "other-pass-phrase-8"},
         "password2", "differ"),
    ],
)
def test_bad_signup_makes_no_account_and_keeps_the_link(invite, client, data, field, message) -> None:
    invitation, path = invite()
    client.logout()
    users = get_user_model().objects.count()
    if data["signup-username"] == OFFERED:
        data = data | {"signup-username": usernames_offered(client.get(path))[0]}
    response = client.post(path, data)
    assert response.status_code == 200
    body = text(response)
    assert f'id="id_signup-{field}_error"' in body and message in body
    assert get_user_model().objects.count() == users
    invitation.refresh_from_db()
    assert invitation.status == "pending"


def _username_errors(response) -> str:
    return re.search(r'<ul class="errorlist" id="id_signup-username_error">.*?</ul>', text(response), re.S).group(0)


def test_signup_does_not_tell_which_usernames_exist_in_any_tenant(invite, client, cast) -> None:
    """The form used to answer "That username is taken" for ops, frank, erin (another tenant's people):
    a username oracle for anyone holding a link. Existing and unused names now get the same answer."""
    invitation, path = invite(email="ops@example.org")
    client.logout()
    offered = usernames_offered(client.get(path))
    assert not {"ops", "frank", "erin"} & set(offered) and all(name.startswith("ops-") for name in offered)
    form = {"signup-password1": "a-long-pass-phrase-7", "signup-password2": "a-long-pass-phrase-7"}
    answers = {name: _username_errors(client.post(path, form | {"signup-username": name}))
               for name in ["ops", "frank", "Erin", "no-such-user-anywhere", "ops-zzzz"]}
    assert len(set(answers.values())) == 1, answers
    assert "taken" not in next(iter(answers.values()))
    assert get_user_model().objects.filter(username__startswith="no-such").count() == 0
    # Someone takes an offered name meanwhile: it is no longer offered, and refused like any other.
    get_user_model().objects.create_user(username=offered[0], password="x-long-pass-phrase-1")
    again = usernames_offered(client.get(path))
    assert offered[0] not in again and len(again) == 4 and again[:3] == offered[1:]
    assert _username_errors(client.post(path, form | {"signup-username": offered[0]})) == answers["ops"]
    invitation.refresh_from_db()
    assert invitation.status == "pending"


def test_signup_attempts_are_throttled_per_invitation(invite, client, settings) -> None:
    settings.SIGNUP_THROTTLE_ATTEMPTS = 3
    invitation, path = invite()
    client.logout()
    offered = usernames_offered(client.get(path))
    bad = {"signup-username": offered[0], "signup-password1": "short", "signup-password2": "short"}
    for n in range(3):
        assert client.post(path, bad, REMOTE_ADDR=f"10.7.0.{n}").status_code == 200
    good = {"signup-username": offered[0], "signup-password1": "a-long-pass-phrase-7", "signup-password2": "a-long-pass-phrase-7"}
    refused = client.post(path, good, REMOTE_ADDR="10.7.0.9")  # from another address too: the link is paused
    assert refused.status_code == 429
    assert "Too many sign-up attempts on this invitation. Try again in" in text(refused)
    assert not get_user_model().objects.filter(username=offered[0]).exists()
    invitation.refresh_from_db()
    assert invitation.status == "pending"


def test_signup_attempts_are_throttled_per_address(invite, client, settings) -> None:
    settings.SIGNUP_THROTTLE_ADDRESS_ATTEMPTS = 2
    _, first = invite(email="one@example.org")
    _, second = invite(email="two@example.org")
    client.logout()
    bad = {"signup-username": "x", "signup-password1": "short", "signup-password2": "short"}
    assert client.post(first, bad, REMOTE_ADDR="10.8.0.1").status_code == 200
    assert client.post(second, bad, REMOTE_ADDR="10.8.0.1").status_code == 200
    refused = client.post(second, bad, REMOTE_ADDR="10.8.0.1")
    assert refused.status_code == 429 and "Too many sign-up attempts from your network address" in text(refused)
    offered = usernames_offered(client.get(second))
    good = {"signup-username": offered[0], "signup-password1": "a-long-pass-phrase-7", "signup-password2": "a-long-pass-phrase-7"}
    assert client.post(second, good, REMOTE_ADDR="10.8.0.2").status_code == 302  # another address: free


def test_an_existing_user_signs_in_and_accepts(invite, client, cast, password) -> None:
    invitation, path = invite(email="frank@example.com", project="acme-vision", role="viewer")
    client.logout()
    page = text(client.get(path))
    login = re.search(r'href="(/accounts/login/\?next=[^"]+)"', page).group(1)
    response = client.post(login.replace("&amp;", "&"), {"username": "frank", "password": password})
    assert response.status_code == 302 and response["Location"] == path
    assert "Accept as <strong>frank</strong>" in text(client.get(path))
    response = client.post(path, {"accept": "1"}, follow=True)
    assert response.redirect_chain[-1][0] == "/projects/acme-vision/"
    assert "you are now Viewer of Vision" in text(response)
    assert Membership.objects.filter(user=cast.frank, project=cast.vision, role=Role.VIEWER).exists()
    assert Membership.objects.filter(user=cast.frank, project=cast.llm).exists()  # globex untouched


def test_accepting_a_role_already_held_changes_nothing(invite, as_user, cast) -> None:
    invitation, path = invite(email="carol@example.com", project="acme-vision", role="viewer")
    response = as_user("carol").post(path, {"accept": "1"})
    assert "You already have a role in Vision" in text(response)
    assert Membership.objects.get(user=cast.carol, project=cast.vision).role == Role.MEMBER
    invitation.refresh_from_db()
    assert invitation.status == "pending"


def test_tenant_admin_invitation_is_tenant_wide(invite, as_user, cast) -> None:
    invitation, path = invite(email="second-admin@example.org", project="", role="tenant_admin")
    assert invitation.project is None
    response = as_user("frank").post(path, {"accept": "1"})
    assert response.status_code == 302 and response["Location"] == "/tenants/acme/"
    assert Membership.objects.filter(user=cast.frank, tenant=cast.acme, project=None, role=Role.TENANT_ADMIN).exists()


def test_an_unknown_link_says_nothing(client, db) -> None:
    response = client.get(reverse("invitation-accept", args=["x" * 43]))
    assert response.status_code == 404 and "not a valid invitation" in text(response)


# Expiry, revoke, resend --------------------------------------------------------------------------


def test_an_expired_link_says_so_and_the_status_follows(invite, client, settings) -> None:
    invitation, path = invite()
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    client.logout()
    response = client.get(path)
    assert response.status_code == 410 and "expired" in text(response)
    invitation.refresh_from_db()
    assert invitation.status == "expired"
    assert AuditEntry.objects.filter(action="invitation.expire", actor_label="system").count() == 1


def test_the_periodic_task_expires_overdue_invitations(invite) -> None:
    old, _ = invite(email="old@example.org")
    fresh, _ = invite(email="fresh@example.org")
    Invitation.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert invitations_expire_task.apply().get() == 1
    assert invitations_expire_task.apply().get() == 0  # running twice changes nothing
    assert dict(Invitation.objects.values_list("email", "status")) == {"old@example.org": "expired", "fresh@example.org": "pending"}


def test_expiry_follows_the_setting(invite, settings) -> None:
    settings.PORTAL_INVITATION_DAYS = 2
    invitation, _ = invite()
    assert timedelta(days=2) - timedelta(minutes=1) < invitation.expires_at - timezone.now() <= timedelta(days=2)


def test_revoke_kills_the_link(invite, as_user, client) -> None:
    invitation, path = invite()
    response = as_user("alice").post(reverse("invitation-revoke", args=["acme", invitation.pk]), follow=True)
    assert "revoked: its link no longer works" in text(response)
    assert "newcomer@example.org" not in text(response).split("Pending invitations", 1)[1]
    invitation.refresh_from_db()
    assert invitation.status == "revoked" and invitation.revoked_at is not None
    client.logout()
    response = client.get(path)
    assert response.status_code == 410 and "withdrawn" in text(response)
    assert AuditEntry.objects.filter(action="invitation.revoke").count() == 1


def test_resend_mails_a_new_link_and_the_old_one_stops(invite, as_user, client, mailoutbox, django_capture_on_commit_callbacks) -> None:
    invitation, old_path = invite()
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    services.invitation_expire(invitation=invitation)
    with django_capture_on_commit_callbacks(execute=True):
        response = as_user("alice").post(reverse("invitation-resend", args=["acme", invitation.pk]), follow=True)
    assert "sent again" in text(response)
    new_path = reverse("invitation-accept", args=[LINK.search(mailoutbox[-1].body).group(1)])
    assert new_path != old_path and len(mailoutbox) == 2
    invitation.refresh_from_db()
    assert (invitation.status, invitation.send_count) == ("pending", 2) and invitation.expires_at > timezone.now()
    client.logout()
    old = client.get(old_path)  # the old link opens nothing, and says why
    assert old.status_code == 410
    assert "A newer invitation was sent" in text(old) and "Open the link in the most recent invitation email" in text(old)
    assert "not a valid invitation" not in text(old) and "Join Acme" not in text(old)
    assert client.get(new_path).status_code == 200
    assert AuditEntry.objects.filter(action="invitation.resend").count() == 1


def test_a_link_superseded_while_pending_says_a_newer_invitation_was_sent(invite, as_user, client, mailoutbox,
                                                                         django_capture_on_commit_callbacks) -> None:
    invitation, first = invite()
    for _ in range(2):  # sent again twice: both earlier links say so
        with django_capture_on_commit_callbacks(execute=True):
            as_user("alice").post(reverse("invitation-resend", args=["acme", invitation.pk]))
    second = reverse("invitation-accept", args=[LINK.search(mailoutbox[-2].body).group(1)])
    client.logout()
    for path in (first, second):
        response = client.get(path)
        assert response.status_code == 410 and "A newer invitation was sent" in text(response), path
        assert client.post(path, {"username": "x", "password1": "a-Long-pass-1", "password2": "a-Long-pass-1"}).status_code == 410
    assert client.get(reverse("invitation-accept", args=[LINK.search(mailoutbox[-1].body).group(1)])).status_code == 200


def test_an_accepted_invitation_cannot_be_resent_or_revoked(invite, as_user, cast) -> None:
    invitation, path = invite(email="frank@example.com")
    as_user("frank").post(path, {"accept": "1"})
    client = as_user("alice")
    response = client.post(reverse("invitation-resend", args=["acme", invitation.pk]), follow=True)
    assert "accepted" in text(response)
    response = client.post(reverse("invitation-revoke", args=["acme", invitation.pk]), follow=True)
    assert "already accepted" in text(response)
    invitation.refresh_from_db()
    assert invitation.status == "accepted"


# Foreign tenants ---------------------------------------------------------------------------------


def test_foreign_tenant_admin_cannot_touch_invitations(invite, as_user) -> None:
    invitation, _ = invite()
    erin = as_user("erin")
    assert erin.post(reverse("invitation-create", args=["acme"]), invite_form()).status_code == 404
    assert erin.post(reverse("invitation-revoke", args=["acme", invitation.pk])).status_code == 404
    assert erin.post(reverse("invitation-resend", args=["acme", invitation.pk])).status_code == 404
    # Nor through her own tenant's URLs: the invitation is looked up within the tenant in the address.
    assert erin.post(reverse("invitation-revoke", args=["globex", invitation.pk])).status_code == 404
    assert erin.post(reverse("invitation-resend", args=["globex", invitation.pk])).status_code == 404
    assert "newcomer@example.org" not in text(erin.get("/tenants/globex/members/"))
    invitation.refresh_from_db()
    assert (invitation.status, invitation.send_count) == ("pending", 1)


def test_an_admin_cannot_invite_into_a_foreign_project(as_user, mailoutbox) -> None:
    response = as_user("erin").post(reverse("invitation-create", args=["globex"]), invite_form(project="acme-nlp"))
    assert 'id="id_invite-project_error"' in text(response)
    assert not Invitation.objects.exists() and mailoutbox == []


def test_member_add_never_reveals_foreign_usernames(as_user, cast) -> None:
    """frank exists (in globex), ghost does not: the answers are identical but for the name."""
    client = as_user("alice")
    answers = []
    for name in ("frank", "ghost"):
        body = text(client.post(reverse("member-add", args=["acme"]),
                                {"member-user": name, "member-project": "acme-nlp", "member-role": "member"}))
        error = re.search(r'id="id_member-user_error"[^>]*>(.*?)</ul>', body, re.S).group(1)
        answers.append(error.replace(name, "NAME"))
    assert answers[0] == answers[1]
    assert not Membership.objects.filter(user=cast.frank, tenant=cast.acme).exists()


# API ---------------------------------------------------------------------------------------------


def test_api_invite_list_resend_revoke(api, cast, mailoutbox, django_capture_on_commit_callbacks) -> None:
    alice = api("alice")
    body = {"email": "api@example.org", "tenant": "acme", "project": "acme-vision", "role": "viewer"}
    with django_capture_on_commit_callbacks(execute=True):
        created = alice.post(f"{API}/invitations/", body, format="json")
    assert created.status_code == 201, created.content
    data = created.json()
    assert (data["email"], data["project"], data["role"], data["status"], data["link_works"]) == (
        "api@example.org", "acme-vision", "viewer", "pending", True)
    assert "secret" not in str(data) and "hash" not in str(data)
    assert mailoutbox[-1].to == ["api@example.org"]
    listed = alice.get(f"{API}/invitations/?status=pending").json()
    assert [i["email"] for i in listed["results"]] == ["api@example.org"]
    with django_capture_on_commit_callbacks(execute=True):
        resent = alice.post(f"{API}/invitations/{data['id']}/resend/")
    assert resent.status_code == 200 and resent.json()["send_count"] == 2 and len(mailoutbox) == 2
    revoked = alice.post(f"{API}/invitations/{data['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked" and revoked.json()["link_works"] is False
    assert alice.post(f"{API}/invitations/{data['id']}/revoke/").json()["status"] == "revoked"  # twice: a no-op
    assert alice.post(f"{API}/invitations/{data['id']}/resend/").status_code == 409


@pytest.mark.parametrize("who, status", [("ops", 201), ("alice", 201), ("bob", 403), ("carol", 403), ("erin", 400), ("nobody", 400)])
def test_api_invite_matrix(api, who, status) -> None:
    body = {"email": "m@example.org", "tenant": "acme", "project": "acme-nlp", "role": "member"}
    response = api(who).post(f"{API}/invitations/", body, format="json")
    assert response.status_code == status, response.content
    assert Invitation.objects.exists() is (status == 201)


def test_api_invitations_are_tenant_scoped(api, cast, invite) -> None:
    invitation, _ = invite()
    erin = api("erin")
    assert erin.get(f"{API}/invitations/").json()["count"] == 0
    assert erin.get(f"{API}/invitations/{invitation.pk}/").status_code == 404
    assert erin.post(f"{API}/invitations/{invitation.pk}/revoke/").status_code == 404
    assert erin.post(f"{API}/invitations/{invitation.pk}/resend/").status_code == 404
    assert api("carol").get(f"{API}/invitations/").json()["count"] == 0
    assert api("ops").get(f"{API}/invitations/").json()["count"] == 1
    response = erin.post(f"{API}/invitations/", {"email": "x@example.org", "tenant": "globex", "project": "acme-nlp",
                                                 "role": "member"}, format="json")
    assert response.status_code == 400 and "project" in response.json()["fields"]


def test_api_tokens_cannot_invite(token_client, cast) -> None:
    client, _ = token_client("alice", cast.vision, "read+submit")
    body = {"email": "t@example.org", "tenant": "acme", "project": "acme-nlp", "role": "member"}
    assert client.post(f"{API}/invitations/", body, format="json").status_code == 403
    assert client.get(f"{API}/invitations/").json()["count"] == 0


def test_api_bad_invitation_input(api) -> None:
    alice = api("alice")
    cases = [
        ({"email": "nope", "tenant": "acme", "project": "acme-nlp", "role": "member"}, "email"),
        ({"email": "a@example.org", "tenant": "acme", "role": "member"}, "project"),
        ({"email": "a@example.org", "tenant": "acme", "project": "acme-nlp", "role": "tenant_admin"}, "project"),
        ({"email": "a@example.org", "tenant": "acme", "project": "acme-nlp", "role": "emperor"}, "role"),
        ({"email": "a@example.org", "tenant": "acme", "project": "acme-nlp", "role": "member", "extra": 1}, "extra"),
    ]
    for body, field in cases:
        response = alice.post(f"{API}/invitations/", body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert field in response.json().get("fields", {}), (body, response.json())
    assert not Invitation.objects.exists()


def test_api_membership_create_names_only_own_tenant_members(api, cast) -> None:
    """A tenant admin's API answer for another tenant's user is the one for a name that does not exist."""
    alice = api("alice")
    answers = {}
    for name in ("frank", "ghost"):
        response = alice.post(f"{API}/memberships/", {"user": name, "tenant": "acme", "project": "acme-nlp", "role": "member"},
                              format="json")
        assert response.status_code == 400
        answers[name] = response.json()["fields"]["user"][0].replace(repr(name), "NAME")
    assert answers["frank"] == answers["ghost"]
    assert not Membership.objects.filter(user=cast.frank, tenant=cast.acme).exists()
    # Ops see every user anyway and may still name anyone.
    response = api("ops").post(f"{API}/memberships/", {"user": "nobody", "tenant": "acme", "project": "acme-nlp", "role": "member"},
                               format="json")
    assert response.status_code == 201

"""Single sign-on against a real OpenID provider (tests/oidc: the npm ``oidc-provider``), through the portal's
pages with Django's test client; the provider's side is walked over HTTP like a browser would.

Each security check has its test here (docs/security.md "Single sign-on"): state, nonce, PKCE, signature,
audience, issuer, expiry, a replayed code, key rotation.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.core import mail

from tenants import identity, services
from tenants.access import Actor
from tenants.models import AuditEntry, GroupMapping, Invitation, LoginSettings, Membership, OidcIdentity, Role
from tests.oidc.provider import provider_sign_in

pytestmark = pytest.mark.django_db

CALLBACK = "http://testserver/oidc/callback/"


@pytest.fixture
def mappings(cast):
    """acme's groups: gpu-{tenant}-admins (tenant admins), gpu-{tenant}-{project}-users (members), and an exact
    group for vision's project admins."""
    GroupMapping.objects.create(group="gpu-{tenant}-admins", match="pattern", role=Role.TENANT_ADMIN)
    GroupMapping.objects.create(group="gpu-{tenant}-{project}-users", match="pattern", role=Role.MEMBER)
    GroupMapping.objects.create(group="vision-leads", match="exact", tenant=cast.acme, project=cast.vision,
                                role=Role.PROJECT_ADMIN)
    return cast


def start(client, next_url: str = "") -> str:
    """The portal's redirect to the provider (the authorization request)."""
    response = client.get("/oidc/login/" + (f"?next={next_url}" if next_url else ""))
    assert response.status_code == 302, response.content[:300]
    return response["Location"]


def sign_in(client, login: str, next_url: str = ""):
    """A whole single sign-on: the answer the portal's callback gave."""
    callback = provider_sign_in(start(client, next_url), login, stop_at=CALLBACK)
    return client.get(callback.removeprefix("http://testserver"), follow=True)


def signed_in_as(client):
    response = client.get("/")
    return response.wsgi_request.user if response.status_code == 200 else None


def refused(response, why: str) -> None:
    assert response.redirect_chain[-1][0].startswith("/accounts/login/")
    text = response.content.decode()
    assert "Sign-in with Test IdP refused" in text, text[:2000]
    assert why in text


# The mapping ----------------------------------------------------------------------------------------------------


def test_patterns_find_the_tenant_and_project_in_the_group_name() -> None:
    rules = [identity.Rule(group="gpu-{tenant}-admins", match="pattern", role=Role.TENANT_ADMIN),
             identity.Rule(group="gpu-{tenant}-{project}-users", match="pattern", role=Role.MEMBER),
             identity.Rule(group="hpc-*-viewers", match="exact", role="", tenant_id=2),
             identity.Rule(group="all-{tenant}", match="pattern", role="")]
    directory = identity.Directory(tenants={"acme": 1, "globex": 2},
                                   projects={"acme-vision": (1, 10), "acme-nlp": (1, 11), "globex-llm": (2, 20)},
                                   active_projects={1: [10, 11], 2: [20]})
    found = identity.roles_from_groups(
        ["gpu-acme-admins", "gpu-acme-acme-vision-users", "gpu-globex-acme-nlp-users", "gpu-nope-admins",
         "hpc-*-viewers", "all-globex"], rules, directory, Role.VIEWER)
    assert found == {
        (1, None): Role.TENANT_ADMIN,
        (1, 10): Role.MEMBER,  # a project of the tenant named; acme-nlp is not globex's
        (2, 20): Role.VIEWER,  # exact names are exact ("*" is no wildcard there); the default role everywhere in globex
    }


def test_the_stronger_role_wins_and_tenant_wide_roles_cover_every_active_project() -> None:
    rules = [identity.Rule(group="acme-users", match="exact", role=Role.MEMBER, tenant_id=1),
             identity.Rule(group="vision-leads", match="exact", role=Role.PROJECT_ADMIN, tenant_id=1, project_id=10),
             identity.Rule(group="vision-*", match="pattern", role=Role.VIEWER)]
    directory = identity.Directory(tenants={"acme": 1}, projects={}, active_projects={1: [10, 11]})
    assert identity.roles_from_groups(["acme-users", "vision-leads"], rules, directory, Role.VIEWER) == {
        (1, 10): Role.PROJECT_ADMIN, (1, 11): Role.MEMBER}
    assert identity.roles_from_groups([], rules, directory, Role.VIEWER) == {}


def test_glob_patterns_hold_the_tenant_placeholder() -> None:
    regex = identity.pattern_regex("gpu-{tenant}-*")
    assert regex.fullmatch("gpu-acme-admins").group("tenant") == "acme"
    assert regex.fullmatch("GPU-ACME-admins") is not None
    assert regex.fullmatch("cpu-acme-admins") is None


def test_ops_edit_mappings_on_their_page_and_every_change_is_audited(cast, as_user, settings) -> None:
    assert as_user("alice").get("/ops/identity/").status_code == 404
    client = as_user("ops")
    assert client.get("/ops/identity/").status_code == 200
    bad = client.post("/ops/identity/", {"action": "mapping", "mapping-group": "gpu-admins", "mapping-match": "pattern",
                                          "mapping-role": "tenant_admin"})
    assert bad.status_code == 400
    assert "A pattern holds {tenant} or {project}" in bad.content.decode()
    done = client.post("/ops/identity/", {"action": "mapping", "mapping-group": "gpu-{tenant}-admins",
                                           "mapping-match": "pattern", "mapping-role": "tenant_admin"})
    assert done.status_code == 302
    mapping = GroupMapping.objects.get()
    assert AuditEntry.objects.filter(action="group_mapping.create", target_id=str(mapping.pk)).exists()
    row = '<td data-label="Group"><code>gpu-{tenant}-admins</code>'
    tried = client.get("/ops/identity/?try=gpu-acme-admins,gpu-nope-admins").content.decode()
    assert "<li>Tenant admin of acme</li>" in tried
    assert "match no mapping" in client.get("/ops/identity/?try=other").content.decode()
    assert row in client.get("/ops/identity/?q=admins").content.decode()
    assert row not in client.get("/ops/identity/?q=nothing").content.decode()
    assert as_user("alice").post(f"/ops/identity/mappings/{mapping.pk}/delete/").status_code == 404
    client = as_user("ops")
    assert client.post(f"/ops/identity/mappings/{mapping.pk}/delete/").status_code == 302
    assert not GroupMapping.objects.exists()
    assert AuditEntry.objects.filter(action="group_mapping.delete").exists()
    off = client.post("/ops/identity/", {"action": "settings", "password_login_staff_only": "on", "default_role": "member"})
    assert off.status_code == 400  # without single sign-on nobody but staff could sign in
    assert "Single sign-on is not configured" in off.content.decode()
    settings.OIDC_ISSUER, settings.OIDC_RP_CLIENT_ID = "https://idp.example", "portal"
    saved = client.post("/ops/identity/", {"action": "settings", "password_login_staff_only": "on",
                                           "default_role": "member"})
    assert saved.status_code == 302
    assert LoginSettings.objects.get().password_login_staff_only is True
    assert AuditEntry.objects.filter(action="login_settings.update").exists()
    assert client.post("/ops/identity/", {"action": "settings", "default_role": "owner"}).status_code == 400


# Sign-in, roles from groups -------------------------------------------------------------------------------------


def test_the_first_sign_in_creates_the_user_with_the_mapped_roles(mappings, client, sso) -> None:
    sso.user("s-grace", groups=["gpu-acme-acme-nlp-users", "unrelated"], username="grace", email="grace@acme.example")
    response = sign_in(client, "s-grace")
    assert response.status_code == 200
    user = signed_in_as(client)
    assert user.username == "grace" and user.email == "grace@acme.example"
    assert not user.has_usable_password()
    assert OidcIdentity.objects.get(user=user).subject == "s-grace"
    assert set(Membership.objects.filter(user=user).values_list("project__slug", "role")) == {("acme-nlp", "member")}
    assert AuditEntry.objects.filter(action="user.sso_create", target_id=str(user.pk)).exists()
    assert AuditEntry.objects.filter(action="membership.create", target_repr__startswith="grace ").count() == 1
    # The login page offered the provider.
    client.logout()
    assert "Sign in with Test IdP" in client.get("/accounts/login/").content.decode()


def test_a_group_change_between_two_sign_ins_changes_the_role(mappings, client, sso) -> None:
    sso.user("s-hal", groups=["gpu-acme-acme-vision-users"])
    sign_in(client, "s-hal")
    user = signed_in_as(client)
    assert Membership.objects.get(user=user, project=mappings.vision).role == Role.MEMBER
    client.logout()
    sso.user("s-hal", groups=["gpu-acme-acme-vision-users", "vision-leads", "gpu-acme-admins"])
    sign_in(client, "s-hal")
    assert Membership.objects.get(user=user, project=mappings.vision).role == Role.PROJECT_ADMIN
    assert Membership.objects.get(user=user, project=None).role == Role.TENANT_ADMIN
    assert AuditEntry.objects.filter(action="membership.update", target_repr__contains="hal").exists()
    assert AuditEntry.objects.filter(action="user.sso_sync").count() == 2


def test_a_user_who_loses_the_group_loses_the_role_and_its_tokens_and_is_told(
    mappings, client, sso, mailoutbox, django_capture_on_commit_callbacks
) -> None:
    sso.user("s-ivy", groups=["gpu-acme-acme-vision-users"], email="ivy@acme.example")
    sign_in(client, "s-ivy")
    user = signed_in_as(client)
    token, _secret = services.token_create(actor=Actor(user=user), project=mappings.vision, name="ci", scope="read+submit")
    # A role given by hand stays: single sign-on only takes back what it gave.
    Membership.objects.create(user=user, tenant=mappings.acme, project=mappings.nlp, role=Role.VIEWER)
    client.logout()
    sso.user("s-ivy", groups=[], email="ivy@acme.example")
    with django_capture_on_commit_callbacks(execute=True):
        response = sign_in(client, "s-ivy")
    assert "you are no longer Member of acme-vision" in response.content.decode()
    assert not Membership.objects.filter(user=user, project=mappings.vision).exists()
    assert Membership.objects.filter(user=user, project=mappings.nlp).exists()
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEntry.objects.filter(action="token.revoke", target_id=str(token.pk)).exists()
    assert AuditEntry.objects.filter(action="membership.delete").exists()
    lost = [m for m in mailoutbox if m.to == ["ivy@acme.example"]]
    assert lost and "Member of acme-vision" in lost[0].body and "acme-vision were revoked" in lost[0].body
    # Another tenant's pages stay closed to them as before.
    assert client.get("/projects/globex-llm/").status_code == 404


def test_the_tenants_last_admin_is_kept_when_their_group_goes(mappings, client, sso) -> None:
    Membership.objects.filter(tenant=mappings.globex, role=Role.TENANT_ADMIN).delete()
    sso.user("s-jo", groups=["gpu-globex-admins"])
    sign_in(client, "s-jo")
    user = signed_in_as(client)
    client.logout()
    sso.user("s-jo", groups=[])
    sign_in(client, "s-jo")
    assert Membership.objects.filter(user=user, tenant=mappings.globex, role=Role.TENANT_ADMIN).exists()
    entry = AuditEntry.objects.filter(action="user.sso_sync").order_by("-id").first()
    assert entry.after["kept"] == ["Tenant admin of globex"]


def test_users_are_matched_by_subject_never_by_email(cast, client, sso) -> None:
    sso.user("s-mallory", groups=[], email=cast.alice.email or "alice@example.org", username="alice")
    sign_in(client, "s-mallory")
    user = signed_in_as(client)
    assert user.pk != cast.alice.pk and user.username == "alice-2"


# The security checks --------------------------------------------------------------------------------------------


def test_pkce_the_request_carries_an_s256_challenge_and_the_provider_requires_it(cast, client, sso) -> None:
    sso.user("s-kim", groups=[])
    url = start(client)
    query = parse_qs(urlsplit(url).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) >= 43
    assert query["state"][0] and query["nonce"][0]
    # Without the challenge the provider refuses to go on: a stolen code is useless without the verifier.
    parts = urlsplit(url)
    kept = {k: v for k, v in parse_qs(parts.query).items() if not k.startswith("code_challenge")}
    stripped = parts._replace(query=urlencode(kept, doseq=True)).geturl()
    callback = provider_sign_in(stripped, "s-kim", stop_at=CALLBACK)
    assert "error=" in callback
    refused(client.get(callback.removeprefix("http://testserver"), follow=True), "PKCE")
    assert signed_in_as(client) is None


def test_state_mismatch_is_refused(cast, client, sso) -> None:
    sso.user("s-lee", groups=[])
    callback = provider_sign_in(start(client), "s-lee", stop_at=CALLBACK)
    forged = callback.replace("state=", "state=forged")
    refused(client.get(forged.removeprefix("http://testserver"), follow=True), "(state)")
    assert signed_in_as(client) is None
    other = type(client)()  # the answer arrives in another browser (login CSRF): no state there
    refused(other.get(callback.removeprefix("http://testserver"), follow=True), "(state)")


def test_nonce_mismatch_is_refused(cast, client, sso) -> None:
    sso.user("s-max", groups=[])
    sso.mode("wrong-nonce")
    refused(sign_in(client, "s-max"), "(nonce)")
    assert signed_in_as(client) is None


def test_an_expired_token_is_refused(cast, client, sso) -> None:
    sso.user("s-ned", groups=[])
    sso.mode("expired")
    refused(sign_in(client, "s-ned"), "has expired")
    assert signed_in_as(client) is None


def test_a_tampered_token_is_refused(mappings, client, sso) -> None:
    sso.user("s-oz", groups=[])
    sso.mode("bad-signature")  # the provider's token with groups=[gpu-acme-admins] written in
    refused(sign_in(client, "s-oz"), "signature does not verify")
    assert signed_in_as(client) is None
    assert not Membership.objects.filter(user__username="s-oz").exists()


def test_a_token_for_another_audience_is_refused(cast, client, sso) -> None:
    sso.user("s-pat", groups=[])
    sso.mode("wrong-audience")
    refused(sign_in(client, "s-pat"), "issued for another application")
    assert signed_in_as(client) is None


def test_a_token_from_another_issuer_is_refused(cast, client, sso) -> None:
    sso.user("s-quin", groups=[])
    sso.mode("wrong-issuer")
    refused(sign_in(client, "s-quin"), "another issuer")


def test_a_replayed_code_is_refused(cast, client, sso) -> None:
    sso.user("s-ray", groups=[])
    callback = provider_sign_in(start(client), "s-ray", stop_at=CALLBACK)
    path = callback.removeprefix("http://testserver")
    assert client.get(path, follow=True).status_code == 200
    assert signed_in_as(client).username == "s-ray"
    client.logout()
    # The same answer again: its state was used up.
    refused(client.get(path, follow=True), "(state)")
    # The same code under a fresh state of this browser: the provider refuses to exchange it twice.
    fresh_state = parse_qs(urlsplit(start(client)).query)["state"][0]
    code = parse_qs(urlsplit(callback).query)["code"][0]
    refused(client.get(f"/oidc/callback/?code={code}&state={fresh_state}", follow=True), "used already")
    assert signed_in_as(client) is None


def test_keys_rotate_at_the_provider(cast, client, sso) -> None:
    sso.user("s-sue", groups=[])
    sign_in(client, "s-sue")
    assert signed_in_as(client).username == "s-sue"
    client.logout()
    new_kid = sso.rotate()
    assert sso.state()["kid"] == new_kid
    sign_in(client, "s-sue")  # signed with the new key: the portal fetches the keys again
    assert signed_in_as(client).username == "s-sue"


# Password sign-in, invitations, logout ---------------------------------------------------------------------------


def test_password_sign_in_switched_off_for_all_but_staff(cast, client, sso, password) -> None:
    LoginSettings.objects.create(pk=1, password_login_staff_only=True)
    response = client.post("/accounts/login/", {"username": "carol", "password": password})
    assert response.status_code == 200
    assert "Password sign-in is switched off for your account" in response.content.decode()
    assert signed_in_as(client) is None
    response = client.post("/accounts/login/", {"username": "ops", "password": password})
    assert response.status_code == 302
    assert signed_in_as(client).username == "ops"


def test_an_invitation_is_taken_by_the_verified_address_at_the_first_sign_in(cast, client, sso) -> None:
    invitation = services.invitation_create(actor=cast.actor("alice"), tenant=cast.acme, email="una@acme.example",
                                            role=Role.MEMBER, project=cast.nlp)
    sso.user("s-una", groups=[], email="una@acme.example", email_verified=False)
    sign_in(client, "s-una")
    invitation.refresh_from_db()
    assert invitation.status == Invitation.Status.PENDING  # an address the provider does not vouch for binds nothing
    client.logout()
    sso.user("s-una", groups=[], email="una@acme.example", email_verified=True)
    response = sign_in(client, "s-una")
    invitation.refresh_from_db()
    assert invitation.status == Invitation.Status.ACCEPTED
    user = signed_in_as(client)
    assert invitation.accepted_by_id == user.pk
    assert Membership.objects.filter(user=user, project=cast.nlp, role=Role.MEMBER).exists()
    assert "you joined" in response.content.decode()


def test_an_invitation_link_followed_by_single_sign_on_binds_to_that_identity(
    cast, client, sso, mailoutbox, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        services.invitation_create(actor=cast.actor("alice"), tenant=cast.acme, email="someone@else.example",
                                   role=Role.VIEWER, project=cast.vision, base_url="http://testserver")
    link = re.search(r"http://testserver(/invitations/\S+/)", mail.outbox[-1].body).group(1)
    page = client.get(link).content.decode()
    assert "Sign in with Test IdP to accept" in page
    sso.user("s-vic", groups=[], email="vic@corp.example")
    client.get(link + "sso/")
    callback = provider_sign_in(start(client), "s-vic", stop_at=CALLBACK)
    client.get(callback.removeprefix("http://testserver"), follow=True)
    user = get_user_model().objects.get(oidc_identities__subject="s-vic")
    assert Membership.objects.filter(user=user, project=cast.vision, role=Role.VIEWER).exists()
    assert Invitation.objects.get().accepted_by_id == user.pk


def test_logout_ends_the_session_at_the_provider_too(cast, client, sso) -> None:
    sso.user("s-wes", groups=[])
    sign_in(client, "s-wes")
    response = client.post("/accounts/logout/")
    assert response.status_code == 200
    assert signed_in_as(client) is None
    body = response.content.decode()
    end = re.search(r'content="0;url=([^"]+)"', body).group(1).replace("&amp;", "&")
    query = parse_qs(urlsplit(end).query)
    assert end.startswith(sso.issuer + "/session/end")
    assert query["post_logout_redirect_uri"] == ["http://testserver/accounts/login/"]
    assert query["id_token_hint"][0].count(".") == 2


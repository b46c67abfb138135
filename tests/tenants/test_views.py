"""Portal pages: HTTP in; status, body and database state out.

The cast (tests/conftest.py): acme has alice (tenant admin), bob (project admin of acme-vision),
carol (member of acme-vision), dave (viewer of acme-vision); globex has erin (tenant admin) and
frank (member of globex-llm); ops is platform ops; nobody has no role.
"""

from __future__ import annotations

import re
import time

import pytest
from django.test import Client
from django.urls import reverse

from tenants.authentication import token_hash
from tenants.models import ApiToken, AuditEntry, Membership, Project, Role, Tenant
from tenants.services import tenant_update, token_create
from tests.factories import PASSWORD, UserFactory, make_project

HTMX = {"HTTP_HX_REQUEST": "true"}


def suspend(tenant: Tenant) -> None:
    from tenants.access import Actor

    tenant_update(actor=Actor.system(), tenant=tenant, status=Tenant.Status.SUSPENDED)


def text(response) -> str:
    return response.content.decode()


# Sign-in, sign-out, password ------------------------------------------------------------------


def test_pages_need_sign_in(client, cast) -> None:
    for url in ["/", "/projects/acme-vision/", "/tenants/", "/tenants/acme/", "/ops/", "/accounts/password/"]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_login_page_renders_form_with_own_assets(client, db) -> None:
    response = client.get(reverse("login"))
    assert response.status_code == 200
    body = text(response)
    assert '<label for="id_username">' in body and 'name="password"' in body
    assert "csrfmiddlewaretoken" in body
    assert "/static/css/portal.css" in body and "/static/vendor/htmx.min.js" in body
    # Everything comes from the portal itself: no script or stylesheet from elsewhere.
    assert not re.search(r'(src|href)="(https?:)?//', body)


def test_login_wrong_password_shows_error(client, cast) -> None:
    response = client.post(reverse("login"), {"username": "carol", "password": "wrong"})
    assert response.status_code == 200
    assert "do not match" in text(response)
    assert "_auth_user_id" not in client.session


def test_login_right_password_lands_on_home(client, cast) -> None:
    response = client.post(reverse("login"), {"username": "carol", "password": PASSWORD}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("home")
    assert "Vision" in text(response)
    assert client.session["_auth_user_id"] == str(cast.carol.pk)


def test_login_throttles_a_username_from_one_address_then_lets_go_after_the_window(client, cast, settings, monkeypatch) -> None:
    settings.LOGIN_THROTTLE_ATTEMPTS = 3
    settings.LOGIN_THROTTLE_WINDOW = 60
    for _ in range(3):
        client.post(reverse("login"), {"username": "carol", "password": "wrong"}, REMOTE_ADDR="10.0.0.1")
    # Even the right password is refused now from that address (from another one it is not: test_login_throttle.py).
    response = client.post(reverse("login"), {"username": "carol", "password": PASSWORD}, REMOTE_ADDR="10.0.0.1")
    assert response.status_code == 200
    assert "Too many failed sign-in attempts for this username from your network address" in text(response)
    assert "_auth_user_id" not in client.session

    later = time.time() + 61
    monkeypatch.setattr(time, "time", lambda: later)
    response = client.post(reverse("login"), {"username": "carol", "password": PASSWORD}, REMOTE_ADDR="10.0.0.1")
    assert response.status_code == 302
    assert client.session["_auth_user_id"] == str(cast.carol.pk)


def test_login_throttles_a_client_address_across_usernames(client, cast, settings) -> None:
    settings.LOGIN_THROTTLE_ADDRESS_ATTEMPTS = 3
    for name in ["alice", "bob", "dave"]:
        client.post(reverse("login"), {"username": name, "password": "wrong"}, REMOTE_ADDR="10.0.0.9")
    response = client.post(reverse("login"), {"username": "carol", "password": PASSWORD}, REMOTE_ADDR="10.0.0.9")
    assert "Too many failed sign-in attempts" in text(response)
    # Another address is not affected.
    response = client.post(reverse("login"), {"username": "carol", "password": PASSWORD}, REMOTE_ADDR="10.0.0.10")
    assert response.status_code == 302


def test_successful_login_resets_username_failures(client, cast, settings) -> None:
    settings.LOGIN_THROTTLE_ATTEMPTS = 3
    for _ in range(2):
        client.post(reverse("login"), {"username": "carol", "password": "wrong"})
    assert client.post(reverse("login"), {"username": "carol", "password": PASSWORD}).status_code == 302
    client.logout()
    client.post(reverse("login"), {"username": "carol", "password": "wrong"}, REMOTE_ADDR="10.1.1.1")
    response = client.post(reverse("login"), {"username": "carol", "password": PASSWORD}, REMOTE_ADDR="10.1.1.2")
    assert response.status_code == 302


def test_logout_is_post_only(as_user) -> None:
    client = as_user("carol")
    assert client.get(reverse("logout")).status_code == 405
    response = client.post(reverse("logout"))
    assert response.status_code == 302 and response["Location"] == reverse("login")
    assert "_auth_user_id" not in client.session


def test_password_change(as_user, cast) -> None:
    client = as_user("carol")
    response = client.post(
        reverse("password_change"),
        {"old_password": "wrong", "new_password1": "a-new-long-pass-phrase", "new_password2": "a-new-long-pass-phrase"},
    )
    assert response.status_code == 200
    assert 'id="id_old_password_error"' in text(response)
    cast.carol.refresh_from_db()
    assert cast.carol.check_password(PASSWORD)

    response = client.post(
        reverse("password_change"),
        {"old_password": PASSWORD, "new_password1": "a-new-long-pass-phrase", "new_password2": "a-new-long-pass-phrase"},
        follow=True,
    )
    assert response.redirect_chain[-1][0] == reverse("password_change_done")
    assert "Your password was changed." in text(response)
    cast.carol.refresh_from_db()
    assert cast.carol.check_password("a-new-long-pass-phrase")


def test_forms_need_csrf(cast) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(cast.alice)
    response = client.post(reverse("member-add", args=["acme"]), {"member-user": "dave", "member-project": "acme-nlp", "member-role": "member"})
    assert response.status_code == 403
    assert not Membership.objects.filter(user=cast.dave, project=cast.nlp).exists()


# Home ------------------------------------------------------------------------------------------


def test_home_lists_my_projects_with_role(as_user) -> None:
    body = text(as_user("carol").get("/"))
    assert "Vision" in body and "Acme Research" in body and "Member" in body
    assert "NLP" not in body and "LLM" not in body
    assert 'href="/ops/"' not in body  # no ops link for non-ops

    body = text(as_user("alice").get("/"))
    assert "Vision" in body and "NLP" in body and "Tenant admin" in body
    assert "LLM" not in body
    assert "Tenants you admin" in body


def test_home_for_ops_links_ops_pages(as_user) -> None:
    body = text(as_user("ops").get("/"))
    assert 'href="/ops/"' in body
    assert "LLM" in body and "Vision" in body


def test_home_empty_state(as_user) -> None:
    body = text(as_user("nobody").get("/"))
    assert "You are not in any project yet" in body
    assert "Tenants you admin" not in body


def test_home_filters_and_paginates(as_user, cast, django_assert_max_num_queries) -> None:
    for n in range(30):
        make_project(cast.acme, f"acme-extra-{n:02d}", name=f"Extra {n:02d}")
    client = as_user("alice")
    with django_assert_max_num_queries(15):
        body = text(client.get("/"))
    assert body.count('class="card project-card"') == 25
    assert "1–25 of 32" in body and "page=2" in body
    body = text(client.get("/?page=2"))
    assert body.count('class="card project-card"') == 7
    body = text(client.get("/?q=nlp"))
    assert body.count('class="card project-card"') == 1 and "NLP" in body
    body = text(client.get("/?status=archived"))
    assert "No project matches these filters" in body


# Project page ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "slug", "status"),
    [
        ("carol", "acme-vision", 200),
        ("dave", "acme-vision", 200),
        ("alice", "acme-nlp", 200),
        ("ops", "globex-llm", 200),
        ("carol", "acme-nlp", 404),  # same tenant, not her project
        ("erin", "acme-vision", 404),  # another tenant's admin
        ("nobody", "acme-vision", 404),
        ("carol", "no-such-project", 404),
    ],
)
def test_project_page_visibility(as_user, who, slug, status) -> None:
    assert as_user(who).get(f"/projects/{slug}/").status_code == status


def test_project_page_shows_details_members_and_own_tokens(as_user, cast) -> None:
    token_create(actor=cast.actor("carol"), project=cast.vision, name="carol-ci", scope="read")
    token_create(actor=cast.actor("bob"), project=cast.vision, name="bob-ci", scope="read")
    body = text(as_user("carol").get("/projects/acme-vision/"))
    assert "Vision" in body and "acme-vision" in body
    for name in ["bob", "carol", "dave"]:
        assert f'<td data-label="User">{name}</td>' in body
    assert "carol-ci" in body and "bob-ci" not in body  # her tokens only
    assert "Manage members" not in body and "Archive project" not in body

    body = text(as_user("alice").get("/projects/acme-vision/"))
    assert "carol-ci" in body and "bob-ci" in body  # tenant admins see (and may revoke) all
    assert "Manage members" in body and "Archive project" in body


def test_token_create_shows_secret_once(as_user, cast) -> None:
    client = as_user("carol")
    response = client.post(
        reverse("token-create", args=["acme-vision"]),
        {"token-name": "nightly", "token-scope": "read+submit", "token-expires_days": "30"},
    )
    # Post/redirect/get: the secret is on the page the redirect leads to, once.
    assert response.status_code == 302 and response["Location"] == "/projects/acme-vision/#tokens"
    response = client.get(response["Location"])
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    secret = re.search(r'id="token-secret"[^>]*value="([^"]+)"', text(response)).group(1)
    token = ApiToken.objects.get(name="nightly")
    assert token.user == cast.carol and token.project == cast.vision and token.scope == "read+submit"
    assert token.secret_hash == token_hash(secret)
    assert 29 <= (token.expires_at - token.created_at).days <= 30
    assert secret not in text(client.get("/projects/acme-vision/"))


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"token-name": "", "token-scope": "read", "token-expires_days": "30"}, "name"),
        ({"token-name": "x", "token-scope": "read", "token-expires_days": "0"}, "expires_days"),
        ({"token-name": "x", "token-scope": "read", "token-expires_days": "400"}, "expires_days"),
        ({"token-name": "x", "token-scope": "admin", "token-expires_days": "30"}, "scope"),
    ],
)
def test_token_create_bad_input_writes_nothing(as_user, data, field) -> None:
    response = as_user("carol").post(reverse("token-create", args=["acme-vision"]), data)
    assert response.status_code == 200
    assert f'id="id_token-{field}_error"' in text(response)
    assert not ApiToken.objects.exists()


def test_viewer_cannot_create_a_submit_token(as_user) -> None:
    client = as_user("dave")
    assert 'value="read+submit"' not in text(client.get("/projects/acme-vision/"))
    response = client.post(
        reverse("token-create", args=["acme-vision"]),
        {"token-name": "x", "token-scope": "read+submit", "token-expires_days": "30"},
    )
    assert 'id="id_token-scope_error"' in text(response)
    assert not ApiToken.objects.exists()


def test_token_create_outsider_gets_404(as_user) -> None:
    response = as_user("erin").post(
        reverse("token-create", args=["acme-vision"]), {"token-name": "x", "token-scope": "read", "token-expires_days": "30"}
    )
    assert response.status_code == 404
    assert not ApiToken.objects.exists()


def test_token_revoke_plain_post_and_htmx(as_user, cast) -> None:
    first, _ = token_create(actor=cast.actor("carol"), project=cast.vision, name="one", scope="read")
    second, _ = token_create(actor=cast.actor("carol"), project=cast.vision, name="two", scope="read")
    client = as_user("carol")

    response = client.post(reverse("token-revoke", args=["acme-vision", first.pk]), follow=True)
    assert "revoked" in text(response)
    first.refresh_from_db()
    assert first.revoked_at is not None

    response = client.post(reverse("token-revoke", args=["acme-vision", second.pk]), **HTMX)
    assert response.status_code == 200
    assert text(response).lstrip().startswith(f'<tr id="token-{second.pk}">') and "Revoked" in text(response)
    second.refresh_from_db()
    assert second.revoked_at is not None
    assert AuditEntry.objects.filter(action="token.revoke").count() == 2


@pytest.mark.parametrize(("who", "status", "revoked"), [("alice", 302, True), ("bob", 404, False), ("erin", 404, False)])
def test_token_revoke_by_others(as_user, cast, who, status, revoked) -> None:
    token, _ = token_create(actor=cast.actor("carol"), project=cast.vision, name="carol-ci", scope="read")
    response = as_user(who).post(reverse("token-revoke", args=["acme-vision", token.pk]))
    assert response.status_code == status
    token.refresh_from_db()
    assert (token.revoked_at is not None) is revoked


@pytest.mark.parametrize(
    ("who", "status", "archived"),
    [("alice", 302, True), ("ops", 302, True), ("bob", 403, False), ("carol", 403, False), ("erin", 404, False)],
)
def test_project_archive_matrix(as_user, cast, who, status, archived) -> None:
    response = as_user(who).post(reverse("project-status", args=["acme-vision"]), {"status": "archived"})
    assert response.status_code == status
    cast.vision.refresh_from_db()
    assert (cast.vision.status == Project.Status.ARCHIVED) is archived


def test_archived_project_restores_and_refuses_tokens(as_user, cast) -> None:
    client = as_user("alice")
    client.post(reverse("project-status", args=["acme-vision"]), {"status": "archived"})
    body = text(client.get("/projects/acme-vision/"))
    assert "This project is archived" in body and "Restore project" in body and "Create token" not in body
    response = client.post(
        reverse("token-create", args=["acme-vision"]), {"token-name": "x", "token-scope": "read", "token-expires_days": "30"}
    )
    assert "The project is archived." in text(response)
    assert not ApiToken.objects.exists()
    client.post(reverse("project-status", args=["acme-vision"]), {"status": "active"})
    cast.vision.refresh_from_db()
    assert cast.vision.is_active


# Tenant admin pages ----------------------------------------------------------------------------

TENANT_PAGES = ["/tenants/acme/", "/tenants/acme/members/", "/tenants/acme/audit/"]


@pytest.mark.parametrize(
    ("who", "status"),
    [("ops", 200), ("alice", 200), ("bob", 403), ("carol", 403), ("dave", 403), ("erin", 404), ("nobody", 404)],
)
@pytest.mark.parametrize("url", TENANT_PAGES)
def test_tenant_pages_matrix(as_user, who, status, url) -> None:
    assert as_user(who).get(url).status_code == status


def test_unknown_tenant_is_404(as_user) -> None:
    assert as_user("ops").get("/tenants/no-such/").status_code == 404


def test_tenant_list_shows_admin_tenants(as_user) -> None:
    body = text(as_user("alice").get("/tenants/"))
    assert "Acme Research" in body and "Globex" not in body
    body = text(as_user("carol").get("/tenants/"))
    assert "You are not a tenant admin anywhere" in body


def test_tenant_overview_lists_projects_and_details(as_user) -> None:
    body = text(as_user("alice").get("/tenants/acme/"))
    assert "Vision" in body and "NLP" in body and "LLM" not in body
    assert 'name="details-name"' in body and 'name="project-slug"' in body


def test_tenant_details_edit(as_user, cast) -> None:
    client = as_user("alice")
    data = {"details-name": "Acme Research Ltd", "details-cost_centre": "CC-9", "details-contact_email": "gpu@acme.example"}
    response = client.post(reverse("tenant-details", args=["acme"]), data, follow=True)
    assert "Tenant details saved." in text(response)
    cast.acme.refresh_from_db()
    assert (cast.acme.name, cast.acme.cost_centre) == ("Acme Research Ltd", "CC-9")
    assert AuditEntry.objects.filter(action="tenant.update", tenant=cast.acme).exists()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"details-name": "Acme", "details-contact_email": "not-an-email"}, "contact_email"),
        ({"details-name": "", "details-contact_email": ""}, "name"),
        ({"details-name": "Globex AI", "details-contact_email": ""}, "name"),  # unique, from the model's full_clean
    ],
)
def test_tenant_details_bad_input_writes_nothing(as_user, cast, data, field) -> None:
    response = as_user("alice").post(reverse("tenant-details", args=["acme"]), data)
    assert response.status_code == 200
    assert f'id="id_details-{field}_error"' in text(response)
    cast.acme.refresh_from_db()
    assert cast.acme.name == "Acme Research"


def test_project_create(as_user, cast) -> None:
    client = as_user("alice")
    data = {"project-name": "Speech", "project-slug": "acme-speech", "project-description": "ASR"}
    response = client.post(reverse("project-create", args=["acme"]), data, follow=True)
    assert "Project Speech created" in text(response)
    project = Project.objects.get(slug="acme-speech")
    assert project.tenant == cast.acme
    assert client.get("/projects/acme-speech/").status_code == 200


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"project-name": "Bad", "project-slug": "Bad Slug"}, "slug"),
        ({"project-name": "Dup", "project-slug": "globex-llm"}, "slug"),  # slugs are unique portal-wide
        ({"project-name": "", "project-slug": "acme-x"}, "name"),
    ],
)
def test_project_create_bad_input_writes_nothing(as_user, data, field) -> None:
    before = Project.objects.count()
    response = as_user("alice").post(reverse("project-create", args=["acme"]), data)
    assert response.status_code == 200
    assert f'id="id_project-{field}_error"' in text(response)
    assert Project.objects.count() == before


def test_project_create_same_name_in_tenant_is_refused(as_user) -> None:
    response = as_user("alice").post(reverse("project-create", args=["acme"]), {"project-name": "Vision", "project-slug": "acme-vision-2"})
    assert "already exists" in text(response)
    assert not Project.objects.filter(slug="acme-vision-2").exists()


def test_project_slug_of_another_tenant_is_not_available_without_saying_whose(as_user, api) -> None:
    """globex-llm is globex's project, a 404 to alice: creating it used to say "Project with this Slug already
    exists", confirming it. Now: "not available", the same words as any slug she cannot have."""
    response = as_user("alice").post(reverse("project-create", args=["acme"]),
                                     {"project-name": "Mine", "project-slug": "globex-llm"})
    body = text(response)
    assert response.status_code == 200 and 'id="id_project-slug_error"' in body
    assert "This slug is not available: choose another." in body and "already exists" not in body
    assert "Globex" not in body and "LLM" not in body
    answer = api("alice").post("/api/v1/projects/", {"tenant": "acme", "name": "Mine", "slug": "globex-llm"}, format="json")
    assert answer.status_code == 400
    assert answer.json()["fields"] == {"slug": ["This slug is not available: choose another."]}
    assert Project.objects.filter(slug="globex-llm").count() == 1
    # Her own tenant's slug: she sees that project anyway, so the answer may say so.
    again = api("alice").post("/api/v1/projects/", {"tenant": "acme", "name": "Mine", "slug": "acme-vision"}, format="json")
    assert again.json()["fields"] == {"slug": ["This tenant already has a project with this slug."]}


def test_members_page_lists_tenant_members_only(as_user) -> None:
    body = text(as_user("alice").get("/tenants/acme/members/"))
    for name in ["alice", "bob", "carol", "dave"]:
        assert f"<strong>{name}</strong>" in body
    assert "<strong>erin</strong>" not in body and "<strong>frank</strong>" not in body
    body = text(as_user("alice").get("/tenants/acme/members/?role=viewer"))
    assert "<strong>dave</strong>" in body and "<strong>carol</strong>" not in body


def test_choice_filters_offer_one_any_and_no_dashes(as_user) -> None:
    """django-filter's choice fields bring their own empty choice; the page shows it once, as "Any"."""
    body = text(as_user("alice").get("/tenants/acme/members/"))
    role = re.search(r'<select name="role".*?</select>', body, re.S)
    assert role is not None
    assert role.group(0).count(">Any</option>") == 1
    assert "---------" not in body


ADD_DAVE = {"member-user": "dave", "member-project": "acme-nlp", "member-role": "member"}


@pytest.mark.parametrize(
    ("who", "status", "created"),
    [
        ("ops", 302, True),
        ("alice", 302, True),
        ("bob", 403, False),  # project admins don't manage members
        ("carol", 403, False),
        ("dave", 403, False),
        ("erin", 404, False),  # another tenant's admin
        ("nobody", 404, False),
    ],
)
def test_member_add_matrix(as_user, cast, who, status, created) -> None:
    response = as_user(who).post(reverse("member-add", args=["acme"]), ADD_DAVE)
    assert response.status_code == status
    assert Membership.objects.filter(user=cast.dave, project=cast.nlp, role=Role.MEMBER).exists() is created


def test_member_add_changes_what_the_user_sees(as_user, cast) -> None:
    response = as_user("alice").post(reverse("member-add", args=["acme"]), ADD_DAVE, follow=True)
    assert "dave is now Member of NLP." in text(response)
    assert AuditEntry.objects.filter(action="membership.create", project=cast.nlp).exists()
    client = as_user("dave")
    assert "NLP" in text(client.get("/"))
    assert client.get("/projects/acme-nlp/").status_code == 200


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"member-user": "ghost", "member-project": "acme-nlp", "member-role": "member"}, "user", "Select a valid choice"),
        # Another tenant's user reads exactly like an unknown name: the form tells nobody who exists elsewhere.
        ({"member-user": "frank", "member-project": "acme-nlp", "member-role": "member"}, "user", "Select a valid choice"),
        ({"member-user": "nobody", "member-project": "acme-nlp", "member-role": "member"}, "user", "Select a valid choice"),
        ({"member-user": "dave", "member-project": "", "member-role": "member"}, "project", "choose one"),
        ({"member-user": "dave", "member-project": "acme-nlp", "member-role": "tenant_admin"}, "project", "leave project empty"),
        ({"member-user": "dave", "member-project": "globex-llm", "member-role": "member"}, "project", "Select a valid choice"),
        ({"member-user": "dave", "member-project": "acme-nlp", "member-role": "owner"}, "role", "Select a valid choice"),
        ({"member-user": "carol", "member-project": "acme-vision", "member-role": "viewer"}, "user", "already has a role"),
        ({"member-user": "", "member-project": "acme-nlp", "member-role": "member"}, "user", "required"),
    ],
)
def test_member_add_bad_input_writes_nothing(as_user, data, field, message) -> None:
    before = list(Membership.objects.values_list("pk", "role"))
    audit_before = AuditEntry.objects.count()
    response = as_user("alice").post(reverse("member-add", args=["acme"]), data)
    assert response.status_code == 200
    body = text(response)
    assert f'id="id_member-{field}_error"' in body and message in body
    assert list(Membership.objects.values_list("pk", "role")) == before
    assert AuditEntry.objects.count() == audit_before


def _carol_in_vision(cast) -> Membership:
    return Membership.objects.get(user=cast.carol, project=cast.vision)


def test_member_role_change_plain_post(as_user, cast) -> None:
    membership = _carol_in_vision(cast)
    response = as_user("alice").post(reverse("member-role", args=["acme", membership.pk]), {"role": "viewer"}, follow=True)
    assert "carol is now Viewer." in text(response)
    membership.refresh_from_db()
    assert membership.role == Role.VIEWER
    # carol's view follows: a viewer may only create read tokens.
    assert 'value="read+submit"' not in text(as_user("carol").get("/projects/acme-vision/"))


def test_member_role_change_htmx_returns_the_row(as_user, cast) -> None:
    membership = _carol_in_vision(cast)
    response = as_user("alice").post(reverse("member-role", args=["acme", membership.pk]), {"role": "project_admin"}, **HTMX)
    assert response.status_code == 200
    body = text(response)
    assert body.lstrip().startswith(f'<tr id="member-{membership.pk}">')
    assert '<option value="project_admin" selected>' in body and "carol is now Project admin." in body
    membership.refresh_from_db()
    assert membership.role == Role.PROJECT_ADMIN


@pytest.mark.parametrize("role", ["tenant_admin", "owner", ""])
def test_member_role_change_bad_role_writes_nothing(as_user, cast, role) -> None:
    membership = _carol_in_vision(cast)
    response = as_user("alice").post(reverse("member-role", args=["acme", membership.pk]), {"role": role}, **HTMX)
    assert response.status_code == 200
    assert 'class="error small"' in text(response)
    membership.refresh_from_db()
    assert membership.role == Role.MEMBER


@pytest.mark.parametrize(
    ("who", "status", "changed"),
    [("ops", 302, True), ("alice", 302, True), ("bob", 403, False), ("carol", 403, False), ("erin", 404, False), ("nobody", 404, False)],
)
def test_member_role_change_matrix(as_user, cast, who, status, changed) -> None:
    membership = _carol_in_vision(cast)
    response = as_user(who).post(reverse("member-role", args=["acme", membership.pk]), {"role": "viewer"})
    assert response.status_code == status
    membership.refresh_from_db()
    assert (membership.role == Role.VIEWER) is changed


def test_member_of_another_tenant_is_404_on_this_tenants_page(as_user, cast) -> None:
    frank = Membership.objects.get(user=cast.frank)
    response = as_user("alice").post(reverse("member-role", args=["acme", frank.pk]), {"role": "viewer"})
    assert response.status_code == 404
    response = as_user("ops").post(reverse("member-remove", args=["acme", frank.pk]))
    assert response.status_code == 404
    assert Membership.objects.filter(pk=frank.pk).exists()


@pytest.mark.parametrize(
    ("who", "status", "removed"),
    [("ops", 302, True), ("alice", 302, True), ("bob", 403, False), ("dave", 403, False), ("erin", 404, False)],
)
def test_member_remove_matrix(as_user, cast, who, status, removed) -> None:
    membership = _carol_in_vision(cast)
    response = as_user(who).post(reverse("member-remove", args=["acme", membership.pk]))
    assert response.status_code == status
    assert Membership.objects.filter(pk=membership.pk).exists() is not removed


def test_member_remove_htmx_and_the_user_loses_access(as_user, cast) -> None:
    token, _ = token_create(actor=cast.actor("carol"), project=cast.vision, name="ci", scope="read")
    membership = _carol_in_vision(cast)
    response = as_user("alice").post(reverse("member-remove", args=["acme", membership.pk]), **HTMX)
    assert response.status_code == 200 and response.content == b""
    token.refresh_from_db()
    assert token.revoked_at is not None
    client = as_user("carol")
    assert client.get("/projects/acme-vision/").status_code == 404
    assert "You are not in any project yet" in text(client.get("/"))


def test_last_tenant_admin_cannot_be_removed(as_user, cast) -> None:
    alice = Membership.objects.get(user=cast.alice)
    response = as_user("alice").post(reverse("member-remove", args=["acme", alice.pk]), follow=True)
    assert "last tenant admin" in text(response)
    assert Membership.objects.filter(pk=alice.pk).exists()


# Suspended tenants ------------------------------------------------------------------------------


REFUSED = "is suspended: its data can be read but not changed."  # the service's own words


def test_suspended_tenant_is_read_only(as_user, cast) -> None:
    suspend(cast.acme)
    client = as_user("alice")
    for url in ["/tenants/acme/", "/tenants/acme/members/", "/projects/acme-vision/"]:
        body = text(client.get(url))
        assert "is suspended: read-only." in body
        assert "Add member" not in body and "Create project" not in body and "Create token" not in body
        assert "Save details" not in body and "Archive project" not in body
    assert "<fieldset disabled>" in text(client.get("/tenants/acme/"))

    memberships = Membership.objects.count()
    response = client.post(reverse("member-add", args=["acme"]), ADD_DAVE)
    assert REFUSED in text(response)
    response = client.post(reverse("invitation-create", args=["acme"]),
                           {"invite-email": "new@example.com", "invite-project": "acme-nlp", "invite-role": "member"})
    assert REFUSED in text(response)
    response = client.post(reverse("project-create", args=["acme"]), {"project-name": "New", "project-slug": "acme-new"})
    assert REFUSED in text(response)
    response = client.post(
        reverse("tenant-details", args=["acme"]), {"details-name": "Renamed", "details-contact_email": ""}
    )
    assert REFUSED in text(response)
    membership = _carol_in_vision(cast)
    response = client.post(reverse("member-role", args=["acme", membership.pk]), {"role": "viewer"}, follow=True)
    assert REFUSED in text(response)
    response = client.post(reverse("member-remove", args=["acme", membership.pk]), follow=True)
    assert REFUSED in text(response)
    response = as_user("carol").post(
        reverse("token-create", args=["acme-vision"]), {"token-name": "x", "token-scope": "read", "token-expires_days": "30"}
    )
    assert REFUSED in text(response)

    assert Membership.objects.count() == memberships
    assert not Project.objects.filter(slug="acme-new").exists()
    assert not ApiToken.objects.exists()
    cast.acme.refresh_from_db()
    assert cast.acme.name == "Acme Research"
    assert _carol_in_vision(cast).role == Role.MEMBER


# Audit ------------------------------------------------------------------------------------------


def test_tenant_audit_shows_own_tenant_only_newest_first(as_user, cast) -> None:
    body = text(as_user("alice").get("/tenants/acme/audit/"))
    assert "membership.create" in body and "acme-vision" in body
    assert "globex" not in body
    times = re.findall(r'<time datetime="([^"]+)"', body)
    assert times == sorted(times, reverse=True)


def test_audit_filters_and_paginates(as_user, cast) -> None:
    for n in range(26):
        make_project(cast.globex, f"globex-p{n:02d}")
    client = as_user("ops")
    body = text(client.get("/ops/audit/?action=project.create&tenant=globex"))
    assert body.count("<code>project.create</code>") == 25
    assert "1–25 of 27" in body  # the 26 new ones and globex-llm
    body = text(client.get("/ops/audit/?action=project.create&tenant=globex&page=2"))
    assert body.count("<code>project.create</code>") == 2 and "globex/globex-llm" in body  # oldest last
    body = text(client.get("/ops/audit/?actor=nosuchactor"))
    assert "No entry matches these filters" in body
    body = text(client.get("/ops/audit/?since=2999-01-01T00:00"))
    assert "No entry matches these filters" in body
    body = text(client.get("/ops/audit/?until=2999-01-01T00:00&action=membership"))
    assert "membership.create" in body and "project.create" not in body


# Ops pages --------------------------------------------------------------------------------------

OPS_PAGES = ["/ops/", "/ops/tenants/", "/ops/projects/", "/ops/users/", "/ops/audit/"]


@pytest.mark.parametrize("who", ["alice", "bob", "carol", "erin", "nobody"])
@pytest.mark.parametrize("url", OPS_PAGES)
def test_ops_pages_are_404_for_everyone_else(as_user, who, url) -> None:
    assert as_user(who).get(url).status_code == 404


@pytest.mark.parametrize("url", OPS_PAGES[1:])
def test_ops_pages_render_for_ops(as_user, url) -> None:
    assert as_user("ops").get(url).status_code == 200


def test_ops_tenant_create(as_user) -> None:
    client = as_user("ops")
    data = {"name": "Initech", "slug": "initech", "cost_centre": "CC-3", "contact_email": "it@initech.example"}
    response = client.post(reverse("ops-tenant-create"), data, follow=True)
    assert "Tenant Initech created" in text(response)
    assert Tenant.objects.filter(slug="initech", cost_centre="CC-3").exists()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "Acme Two", "slug": "acme"}, "slug"),
        ({"name": "X", "slug": "Not_Valid"}, "slug"),
        ({"name": "", "slug": "x"}, "name"),
        ({"name": "Y", "slug": "y", "contact_email": "nope"}, "contact_email"),
    ],
)
def test_ops_tenant_create_bad_input_writes_nothing(as_user, data, field) -> None:
    before = Tenant.objects.count()
    response = as_user("ops").post(reverse("ops-tenant-create"), data)
    assert response.status_code == 200
    assert f'id="id_{field}_error"' in text(response)
    assert Tenant.objects.count() == before


def test_ops_tenant_create_refused_to_others(as_user) -> None:
    assert as_user("alice").post(reverse("ops-tenant-create"), {"name": "Z", "slug": "z"}).status_code == 404
    assert not Tenant.objects.filter(slug="z").exists()


def test_ops_suspend_and_activate(as_user, cast) -> None:
    client = as_user("ops")
    response = client.post(reverse("ops-tenant-status", args=["acme"]), {"status": "suspended"}, follow=True)
    assert "is suspended" in text(response)
    cast.acme.refresh_from_db()
    assert cast.acme.status == Tenant.Status.SUSPENDED
    assert "Activate" in text(client.get("/ops/tenants/?status=suspended"))
    client.post(reverse("ops-tenant-status", args=["acme"]), {"status": "active"})
    cast.acme.refresh_from_db()
    assert cast.acme.is_active
    assert list(AuditEntry.objects.filter(tenant=cast.acme, action__in=["tenant.suspend", "tenant.activate"]).values_list("action", flat=True)) == [
        "tenant.activate", "tenant.suspend"
    ]
    assert as_user("alice").post(reverse("ops-tenant-status", args=["acme"]), {"status": "suspended"}).status_code == 404


def test_ops_projects_filter(as_user, cast) -> None:
    client = as_user("ops")
    body = text(client.get("/ops/projects/?tenant=globex"))
    assert "LLM" in body and "Vision" not in body
    from tenants.access import Actor
    from tenants.services import project_update

    project_update(actor=Actor.system(), project=cast.nlp, status=Project.Status.ARCHIVED)
    body = text(client.get("/ops/projects/?status=archived"))
    assert "NLP" in body and "Vision" not in body


def test_ops_users_lists_memberships(as_user, cast, django_assert_max_num_queries) -> None:
    for n in range(10):
        UserFactory(username=f"extra{n}")
    client = as_user("ops")
    with django_assert_max_num_queries(12):
        body = text(client.get("/ops/users/"))
    assert "Member of" in body and "acme-vision" in body and "Tenant admin of" in body
    body = text(client.get("/ops/users/?q=caro"))
    assert "<strong>carol</strong>" in body and "<strong>alice</strong>" not in body
    body = text(client.get("/ops/users/?tenant=globex"))
    assert "<strong>erin</strong>" in body and "<strong>frank</strong>" in body and "<strong>carol</strong>" not in body


def _is_ops(user) -> bool:
    from tenants.access import is_ops

    user.refresh_from_db()
    user.__dict__.pop("_portal_is_ops", None)
    return is_ops(user)


def test_ops_make_and_remove_ops_on_the_users_page(as_user, cast) -> None:
    client = as_user("ops")
    body = text(client.get("/ops/users/?q=caro"))
    assert "Make ops" in body and reverse("ops-user-ops", args=[cast.carol.pk]) in body
    response = client.post(reverse("ops-user-ops", args=[cast.carol.pk]), {"ops": "true", "next": "?q=caro"}, follow=True)
    assert response.redirect_chain[-1][0] == "/ops/users/?q=caro"
    assert "carol is now platform ops." in text(response) and "Remove ops" in text(response)
    assert _is_ops(cast.carol)
    entry = AuditEntry.objects.get(action="user.make_ops", target_id=str(cast.carol.pk))
    assert entry.actor == cast.ops and entry.tenant is None
    assert as_user("carol").get("/ops/tenants/").status_code == 200  # carol now has the ops pages

    client = as_user("ops")
    response = client.post(reverse("ops-user-ops", args=[cast.carol.pk]), {"ops": "false"}, follow=True)
    assert "carol is no longer platform ops." in text(response)
    assert not _is_ops(cast.carol)
    assert AuditEntry.objects.filter(action="user.remove_ops", target_id=str(cast.carol.pk), actor=cast.ops).count() == 1
    assert as_user("carol").get("/ops/tenants/").status_code == 404


def test_ops_cannot_remove_their_own_ops_role(as_user, cast) -> None:
    client = as_user("ops")
    body = text(client.get("/ops/users/?q=ops"))
    assert reverse("ops-user-ops", args=[cast.ops.pk]) not in body  # no button on your own row
    response = client.post(reverse("ops-user-ops", args=[cast.ops.pk]), {"ops": "false"}, follow=True)
    assert "You cannot remove your own ops role" in text(response)
    assert _is_ops(cast.ops)
    assert not AuditEntry.objects.filter(action="user.remove_ops").exists()


def test_making_an_ops_user_ops_again_changes_nothing(as_user, cast) -> None:
    from tenants.access import Actor
    from tenants.services import ops_user_ensure

    ops_user_ensure(actor=Actor.system(), user=cast.bob)
    before = AuditEntry.objects.count()
    response = as_user("ops").post(reverse("ops-user-ops", args=[cast.bob.pk]), {"ops": "true"}, follow=True)
    assert "bob was already platform ops." in text(response)
    assert AuditEntry.objects.count() == before


@pytest.mark.parametrize("who", ["alice", "bob", "carol", "erin", "nobody"])
def test_only_ops_change_who_is_ops(as_user, cast, who) -> None:
    response = as_user(who).post(reverse("ops-user-ops", args=[cast.dave.pk]), {"ops": "true"})
    assert response.status_code == 404
    assert not _is_ops(cast.dave)
    response = as_user(who).post(reverse("ops-user-ops", args=[cast.ops.pk]), {"ops": "false"})
    assert response.status_code == 404
    assert _is_ops(cast.ops)
    assert not AuditEntry.objects.filter(action__in=["user.make_ops", "user.remove_ops"], actor__isnull=False).exists()


def test_ops_user_action_is_post_only_and_checks_its_input(as_user, cast) -> None:
    client = as_user("ops")
    assert client.get(reverse("ops-user-ops", args=[cast.carol.pk])).status_code == 405
    assert client.post(reverse("ops-user-ops", args=[999999]), {"ops": "true"}).status_code == 404
    response = client.post(reverse("ops-user-ops", args=[cast.carol.pk]), {"ops": "maybe"}, follow=True)
    assert "Say whether to make the user ops or not." in text(response)
    assert not _is_ops(cast.carol)


# Django admin for ops -------------------------------------------------------------------------


def test_admin_is_read_mostly_for_ops(as_user, cast) -> None:
    token, _ = token_create(actor=cast.actor("carol"), project=cast.vision, name="ci", scope="read")
    client = as_user("ops")
    for model in ["tenant", "project", "membership", "apitoken", "auditentry"]:
        assert client.get(f"/admin/tenants/{model}/").status_code == 200
        assert client.get(f"/admin/tenants/{model}/add/").status_code == 403
    body = text(client.get(f"/admin/tenants/apitoken/{token.pk}/change/"))
    assert token.prefix in body
    assert token.secret_hash not in body and "Secret hash" not in body
    entry = AuditEntry.objects.first()
    response = client.post(f"/admin/tenants/auditentry/{entry.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


def test_admin_action_goes_through_services(as_user, cast) -> None:
    client = as_user("ops")
    response = client.post(
        "/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [cast.globex.pk]}, follow=True
    )
    assert response.status_code == 200
    cast.globex.refresh_from_db()
    assert cast.globex.status == Tenant.Status.SUSPENDED
    assert AuditEntry.objects.filter(action="tenant.suspend", tenant=cast.globex, actor_label="ops").exists()


def test_admin_refuses_non_ops(as_user) -> None:
    response = as_user("alice").get("/admin/tenants/tenant/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_admin_shows_ops_every_table_users_billing_mig_changes_and_identity(as_user, cast) -> None:
    """What ops do in the admin (README, "Django admin"): read every table, act through the services. Every
    registered table's list answers them (Django's own user admin answered 403: ops hold no auth.* permission)."""
    from django.contrib import admin

    client = as_user("ops")
    index = text(client.get("/admin/"))
    for label in ("Users", "Statements", "Prices", "Budgets", "Mig changes", "Group mappings"):
        assert label in index, label
    for model in admin.site._registry:
        path = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        assert client.get(path).status_code == 200, path
    body = text(client.get(f"/admin/auth/user/{cast.carol.pk}/change/"))
    assert "carol" in body and cast.carol.password not in body and "pbkdf2" not in body
    assert client.get("/admin/auth/user/add/").status_code == 403  # people come by invitation or sign-in
    response = client.post("/admin/auth/user/", {"action": "make_ops", "_selected_action": [cast.carol.pk]},
                           follow=True)
    assert response.status_code == 200 and "1 user(s) made ops" in text(response)
    assert _is_ops(cast.carol) and AuditEntry.objects.filter(action="user.make_ops", actor_label="ops").exists()
    assert as_user("alice").get("/admin/auth/user/").status_code == 302  # not ops: the admin's sign-in

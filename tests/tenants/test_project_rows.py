"""The project page's member and token rows (templates/jinja2/tenants/_project_rows.html, _token_row.html): what each
says, and each list written by one Jinja2 render, whatever its number of rows (docs/performance.md, the last
section). The htmx answer to a revoke is the same row template (tests/tenants/test_views.py)."""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils import timezone

from tenants.models import ApiToken, Role
from tenants.services import token_create, token_revoke
from tests.factories import UserFactory, make_member



def section_rows(body: str, section: str) -> list[str]:
    part = body.split(f'id="{section}"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr[ >].*?</tr>", part.split("<tbody>", 1)[1], re.S)


def test_every_member_and_token_row_says_what_it_did(as_user, cast) -> None:
    carol = cast.actor("carol")
    live, _ = token_create(actor=carol, project=cast.vision, name="ci-live", scope=ApiToken.Scope.SUBMIT)
    gone, _ = token_create(actor=carol, project=cast.vision, name="ci-gone", scope=ApiToken.Scope.READ)
    token_revoke(actor=carol, token=gone)
    old, _ = token_create(actor=carol, project=cast.vision, name="ci-old", scope=ApiToken.Scope.READ)
    ApiToken.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(days=1))
    named = UserFactory(username="zed", first_name="Zed", last_name="Zimmer")
    make_member(named, cast.acme, Role.VIEWER, project=cast.vision)

    body = as_user("carol").get("/projects/acme-vision/").content.decode()
    members = section_rows(body, "members")
    zed = next(r for r in members if ">zed<" in r)
    assert ">Zed Zimmer<" in zed and ">Viewer<" in zed
    carol_row = next(r for r in members if ">carol<" in r)
    assert ">Member<" in carol_row
    tokens = {re.search(r'<td data-label="Name">(.*?)</td>', r).group(1): r for r in section_rows(body, "tokens")}
    assert set(tokens) == {"ci-live", "ci-gone", "ci-old"}
    assert ">Read and submit<" in tokens["ci-live"] and f"<code>{live.prefix}</code>" in tokens["ci-live"]
    assert "badge-active" in tokens["ci-live"] and "badge-revoked" in tokens["ci-gone"] and "badge-expired" in tokens["ci-old"]
    assert f'action="/projects/acme-vision/tokens/{live.pk}/revoke/"' in tokens["ci-live"]
    assert "<form" not in tokens["ci-gone"] + tokens["ci-old"]  # nothing to revoke
    assert 'data-label="Owner"' not in body  # carol does not manage members
    page_token = re.search(r'"X-CSRFToken": "([^"]+)"', body).group(1)
    assert set(re.findall(r'name="csrfmiddlewaretoken" value="([^"]+)"', tokens["ci-live"])) == {page_token}

    as_admin = as_user("alice").get("/projects/acme-vision/").content.decode()
    assert all('<td data-label="Owner">carol</td>' in r for r in section_rows(as_admin, "tokens"))


def test_each_list_is_one_render_whatever_its_rows(as_user, cast, jinja_renders) -> None:
    carol = cast.actor("carol")
    token_create(actor=carol, project=cast.vision, name="one", scope=ApiToken.Scope.READ)
    client = as_user("carol")
    first = client.get("/projects/acme-vision/")
    few = (list(jinja_renders), [t.name for t in first.templates])
    for i in range(8):
        token_create(actor=carol, project=cast.vision, name=f"more-{i}", scope=ApiToken.Scope.READ)
        make_member(UserFactory(), cast.acme, Role.MEMBER, project=cast.vision)
    jinja_renders.clear()
    many = client.get("/projects/acme-vision/")
    assert len(section_rows(many.content.decode(), "tokens")) == 9
    assert (jinja_renders, [t.name for t in many.templates]) == few
    # The rows' two lists, their pagination, the page's forms (includes/form_fields.html) and the frame, one render
    # each whatever the rows.
    assert jinja_renders.count("tenants/_project_rows.html") == 2
    assert set(jinja_renders) == {"tenants/_project_rows.html", "includes/pagination.html", "includes/form_fields.html",
                                  "frame.html"}

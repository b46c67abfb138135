"""The tenant quotas, project quota and project pages read through kept queries (``portal.compiled``;
docs/performance.md, "The tenant quotas, project quota and project pages from kept queries"): the tenant or project
by its slug, the tenant's projects, the first page of each list (project quota rows, quota requests, members,
tokens). Once warm they compile none of that SQL, and they show what the ORM shows: the same rows in the same order,
paged and counted right, filtered through the ORM, and never a row the reader may not see."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from quotas.models import Quota, QuotaRequest
from tenants.authentication import token_generate
from tenants.models import ApiToken, Role
from tests.factories import UserFactory, make_member, make_project

from .factories import GPU

pytestmark = [pytest.mark.django_db]


def text(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def _compiled_sql(monkeypatch, client, path: str) -> list[str]:
    for _ in range(2):
        text(client.get(path))
    built: list[str] = []
    real = SQLCompiler.as_sql

    def spy(self, *args, **kwargs):
        sql = real(self, *args, **kwargs)
        built.append(sql[0])
        return sql

    monkeypatch.setattr(SQLCompiler, "as_sql", spy)
    try:
        text(client.get(path))
    finally:
        monkeypatch.undo()
    return built


@pytest.mark.django_db(transaction=True)  # outside a transaction, as a server runs
def test_warm_pages_compile_none_of_their_own_sql(as_user, cast, split, monkeypatch) -> None:
    QuotaRequest.objects.create(project=cast.vision, flavor=split.h100, resource=GPU, amount=1, reason="more",
                                requested_by=cast.carol, approver=QuotaRequest.Approver.PROJECT_ADMIN)
    assert _compiled_sql(monkeypatch, as_user("carol"), f"/projects/{cast.vision.slug}/quota/") == []
    assert _compiled_sql(monkeypatch, as_user("carol"), f"/projects/{cast.vision.slug}/") == []
    # The tenant admin's scope (the projects of the tenants they administer) is the frame's: none of the page's own.
    built = _compiled_sql(monkeypatch, as_user("alice"), f"/tenants/{cast.acme.slug}/quotas/")
    assert not [sql for sql in built if "quotas_quota" in sql or "tenants_tenant" in sql or '"tenants_project"."name"' in sql]


def _project_rows(body: str) -> list[str]:
    table = body.split('id="project-quotas-h"', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<td data-label="Project"><a href="/projects/([^/]+)/quota/">', table)


def test_tenant_quotas_pages_its_project_rows_and_counts_none(as_user, cast, split) -> None:
    projects = [make_project(cast.acme, f"acme-bulk-{i:02d}", name=f"Bulk {i:02d}") for i in range(26)]
    Quota.objects.bulk_create([Quota(tenant=cast.acme, project=p, flavor=split.h100, resource=GPU, nominal=Decimal(0))
                               for p in projects])
    client = as_user("alice")
    path = f"/tenants/{cast.acme.slug}/quotas/"
    text(client.get(path))
    with CaptureQueriesContext(connection) as ctx:
        body = text(client.get(path))
    # 27 project rows (26 and vision's) by project name: 25 on the first page, kept, counted by the split (no COUNT).
    assert _project_rows(body) == [p.slug for p in projects[:25]] and "1–25 of 27" in body
    assert not [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"]]
    assert _project_rows(text(client.get(path + "?page=2"))) == ["acme-bulk-25", "acme-vision"]
    filtered = text(client.get(path + "?project=acme-vision"))
    assert _project_rows(filtered) == ["acme-vision"] and "No project quota matches" not in filtered
    # The project filter offers the tenant's projects by name, never another tenant's.
    choices = body.split('name="project"', 1)[1].split("</select>", 1)[0]
    assert re.findall(r'<option value="([^"]*)"', choices)[:3] == ["", "acme-bulk-00", "acme-bulk-01"]
    assert cast.llm.slug not in choices and "acme-nlp" in choices


def test_tenant_and_project_pages_by_slug_keep_their_refusals(as_user, cast, split) -> None:
    assert as_user("frank").get(f"/tenants/{cast.acme.slug}/quotas/").status_code == 404  # another tenant's
    assert as_user("carol").get(f"/tenants/{cast.acme.slug}/quotas/").status_code == 403  # seen, not administered
    assert as_user("alice").get("/tenants/no-such-tenant/quotas/").status_code == 404
    for path in (f"/projects/{cast.vision.slug}/", f"/projects/{cast.vision.slug}/quota/"):
        assert as_user("frank").get(path).status_code == 404  # not his project
        assert as_user("erin").get(path).status_code == 404  # another tenant's admin
        assert as_user("dave").get(path).status_code == 200  # a viewer sees it
    assert as_user("carol").get("/projects/no-such-project/").status_code == 404
    assert as_user("ops").get(f"/projects/{cast.llm.slug}/quota/").status_code == 200


def test_project_quota_lists_the_requests_the_reader_may_see(as_user, cast, split) -> None:
    made = [QuotaRequest.objects.create(project=cast.vision, flavor=split.h100, resource=GPU, amount=1, reason="more",
                                        requested_by=getattr(cast, who), approver=QuotaRequest.Approver.PROJECT_ADMIN).pk
            for who in ["carol", "dave", "carol", "bob"]]

    def _request_reasons(body: str) -> list[str]:  # the requests listed, by their order of creation here
        return [str(made.index(int(pk))) for pk in re.findall(r'<li class="request-line">\s*<a href="[^"]+">#(\d+)</a>', body)]

    path = f"/projects/{cast.vision.slug}/quota/"
    # A member sees their own requests, newest first; the project's approver and the tenant's admin every one.
    assert _request_reasons(text(as_user("carol").get(path))) == ["2", "0"]
    assert _request_reasons(text(as_user("dave").get(path))) == ["1"]
    assert _request_reasons(text(as_user("bob").get(path))) == ["3", "2", "1", "0"]
    assert _request_reasons(text(as_user("alice").get(path))) == ["3", "2", "1", "0"]
    assert _request_reasons(text(as_user("ops").get(path))) == ["3", "2", "1", "0"]
    assert _request_reasons(text(as_user("bob").get(path + "?mine=true"))) == ["3"]  # a filter: through the ORM


def _token(cast, who: str, name: str, minutes: int) -> ApiToken:
    _, prefix, hashed = token_generate()
    token = ApiToken.objects.create(name=name, project=cast.vision, user=getattr(cast, who), scope="read", prefix=prefix,
                                    secret_hash=hashed, expires_at=timezone.now() + timedelta(days=1))
    ApiToken.objects.filter(pk=token.pk).update(created_at=timezone.now() - timedelta(minutes=minutes))
    return token


def test_project_page_lists_members_and_the_tokens_the_reader_may_see(as_user, cast) -> None:
    for i in range(24):
        make_member(UserFactory(username=f"zz-member-{i:02d}"), cast.acme, Role.MEMBER, cast.vision)
    _token(cast, "carol", "carol-old", 30)
    _token(cast, "bob", "bob-token", 20)
    _token(cast, "carol", "carol-new", 10)
    path = f"/projects/{cast.vision.slug}/"
    body = text(as_user("carol").get(path))
    members = body.split('id="members-h"', 1)[1].split("</section>", 1)[0]
    # 27 members (bob, carol, dave and 24 more) by username: 25 here, counted by the page's own rows.
    assert "1–25 of 27" in members and "bob" in members and "zz-member-21" in members and "zz-member-22" not in members
    second = text(as_user("carol").get(path + "?members_page=2")).split('id="members-h"', 1)[1].split("</section>", 1)[0]
    assert "zz-member-22" in second and "zz-member-23" in second and "zz-member-21" not in second
    tokens = body.split('id="tokens-h"', 1)[1]
    # A member sees their own tokens, newest first; the tenant's admin and ops every token of the project.
    assert _token_names(tokens) == ["carol-new", "carol-old"]
    for who in ("alice", "ops"):
        shown = text(as_user(who).get(path)).split('id="tokens-h"', 1)[1]
        assert _token_names(shown) == ["carol-new", "bob-token", "carol-old"]


def _token_names(body: str) -> list[str]:
    return re.findall(r'<td data-label="Name">([^<]+)</td>', body)

"""The quota requests page reads its first pages (the inbox, the table of every request one sees) and its project
filter's choices through kept queries (``portal.compiled``; docs/performance.md, "The quota requests page from kept
queries; the forms in Jinja2"). They are the ORM's rows (``quota_requests_for``, ``projects_for``) for every kind of
reader, never another tenant's; the page pages and counts them right, filters through the ORM, and once warm
compiles none of that SQL."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from quotas import selectors
from quotas.models import QuotaRequest
from tenants import selectors as tenancy
from tenants.access import scope_of

from .factories import GPU

pytestmark = [pytest.mark.django_db]
READERS = ["ops", "alice", "bob", "carol", "dave", "erin", "frank", "nobody"]
A = QuotaRequest.Approver


def _ask(project, who, *, approver=A.PROJECT_ADMIN, status=QuotaRequest.Status.PENDING, minutes=0, flavor):
    row = QuotaRequest.objects.create(project=project, flavor=flavor, resource=GPU, amount=1, reason="more", requested_by=who,
                                      approver=approver, status=status)
    QuotaRequest.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(minutes=minutes))
    return row


@pytest.fixture
def asked(cast, split):
    h100 = split.h100
    rows = [
        _ask(cast.vision, cast.carol, minutes=1, flavor=h100),
        _ask(cast.vision, cast.bob, minutes=2, flavor=h100),  # bob's own: not his to decide at the project tier
        _ask(cast.vision, cast.carol, approver=A.TENANT_ADMIN, minutes=3, flavor=h100),
        _ask(cast.nlp, cast.alice, minutes=4, flavor=h100),
        _ask(cast.vision, cast.dave, status=QuotaRequest.Status.APPROVED, minutes=5, flavor=h100),
        _ask(cast.llm, cast.frank, minutes=6, flavor=h100),
        _ask(cast.llm, cast.erin, approver=A.TENANT_ADMIN, minutes=7, flavor=h100),
    ]
    return rows


def _orm(actor, inbox=False):
    rows = selectors.quota_requests_listed(selectors.quota_requests_for(actor=actor, inbox=inbox))
    rows = selectors.with_quota_now(rows).order_by("created_at") if inbox else rows.order_by("-created_at")
    return list(rows[:26])


@pytest.mark.parametrize("who", READERS)
def test_kept_first_pages_are_the_orm_rows(cast, asked, who) -> None:
    actor = cast.actor(who)
    for inbox in (False, True):
        kept, orm = selectors.quota_requests_first(actor=actor, inbox=inbox), _orm(actor, inbox)
        assert [r.pk for r in kept] == [r.pk for r in orm], (who, inbox)
        if inbox:
            assert [selectors.quota_now(r) for r in kept] == [selectors.quota_now(r) for r in orm]
    choices = list(tenancy.projects_for(actor=actor).order_by("name").values_list("slug", "name"))
    assert selectors.project_choices_for(actor=actor) == choices


def test_never_another_tenants_rows(cast, asked) -> None:
    acme = {cast.vision.pk, cast.nlp.pk}
    for who, theirs in (("alice", acme), ("bob", {cast.vision.pk}), ("erin", {cast.llm.pk}), ("frank", {cast.llm.pk})):
        actor = cast.actor(who)
        seen = selectors.quota_requests_first(actor=actor) + selectors.quota_requests_first(actor=actor, inbox=True)
        assert seen and {r.project_id for r in seen} <= theirs, who
    # carol sees her own only; nobody sees nothing, and their inbox asks no query.
    assert {r.requested_by_id for r in selectors.quota_requests_first(actor=cast.actor("carol"))} == {cast.carol.pk}
    nobody = cast.actor("nobody")
    scope_of(nobody)  # their memberships (none), read once per actor
    with CaptureQueriesContext(connection) as ctx:
        assert selectors.quota_requests_first(actor=nobody, inbox=True) == []
    assert ctx.captured_queries == []
    # bob decides the vision requests at the project tier that are not his own.
    inbox = selectors.quota_requests_first(actor=cast.actor("bob"), inbox=True)
    assert [r.pk for r in inbox] == [asked[0].pk]


def _table(body: str) -> list[str]:
    table = body.split('id="all-h"', 1)[1]
    return re.findall(r'href="/quota-requests/(\d+)/"', table.split("</table>", 1)[0])


def test_the_page_pages_counts_and_filters(as_user, cast, split) -> None:
    rows = [_ask(cast.vision, cast.carol, minutes=i, flavor=split.h100) for i in range(30)]
    client = as_user("bob")
    body = client.get("/quota-requests/").content.decode()
    # 30 in the table, newest first: 25 on the first page and the count; 25 in the inbox, oldest first.
    assert _table(body) == [str(r.pk) for r in rows[:25]] and "1–25 of 30" in body
    second = client.get("/quota-requests/?page=2").content.decode()
    assert _table(second) == [str(r.pk) for r in rows[25:]]
    inbox = body.split('id="inbox-h"', 1)[1].split('id="all-h"', 1)[0]
    assert [int(pk) for pk in re.findall(r'<li class="card request-card" id="request-(\d+)"', inbox)] == [r.pk for r in reversed(rows[5:])]
    assert '<span class="badge badge-request-pending">30</span>' in body
    filtered = client.get(f"/quota-requests/?project={cast.nlp.slug}").content.decode()
    assert _table(filtered) == []
    # A request asked now shows at once (the rows are read, not kept).
    new = _ask(cast.vision, cast.carol, minutes=-1, flavor=split.h100)
    assert _table(client.get("/quota-requests/").content.decode())[0] == str(new.pk)


@pytest.mark.django_db(transaction=True)  # outside a transaction, as a server runs
def test_warm_page_compiles_none_of_its_sql(as_user, cast, split, monkeypatch) -> None:
    _ask(cast.vision, cast.carol, flavor=split.h100)
    client = as_user("bob")
    for _ in range(2):
        assert client.get("/quota-requests/").status_code == 200
    built: list[str] = []
    real = SQLCompiler.as_sql

    def spy(self, *args, **kwargs):
        sql = real(self, *args, **kwargs)
        built.append(sql[0])
        return sql

    monkeypatch.setattr(SQLCompiler, "as_sql", spy)
    with CaptureQueriesContext(connection) as ctx:
        assert client.get("/quota-requests/").status_code == 200
    monkeypatch.undo()
    assert not [sql for sql in built if "quotas_quotarequest" in sql or '"tenants_project"."name"' in sql], built
    assert len(ctx.captured_queries) <= 4


@pytest.mark.parametrize("who", READERS)
def test_kept_counts_are_the_orm_counts(cast, asked, who) -> None:
    actor = cast.actor(who)
    counts = selectors.quota_request_counts_kept(actor=actor)
    assert counts == {"inbox": selectors.quota_requests_for(actor=actor, inbox=True).count(),
                      "seen": selectors.quota_requests_for(actor=actor).count()}, who


@pytest.mark.django_db(transaction=True)  # outside a transaction, as a server runs: the counts are kept
def test_a_full_page_counts_nothing_and_follows_every_write(as_user, cast, split) -> None:
    """With more than a page of requests, the unfiltered page reads its counts from the kept pair: no COUNT query.
    A new request, a decision and a membership change each show at once."""
    for i in range(27):
        _ask(cast.vision, cast.carol, minutes=i + 1, flavor=split.h100)
    client = as_user("bob")
    assert client.get("/quota-requests/").status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        body = client.get("/quota-requests/").content.decode()
    assert not [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]
    assert "1–25 of 27" in body and '<span class="badge badge-request-pending">27</span>' in body
    # A new request: 28 in both.
    _ask(cast.vision, cast.carol, flavor=split.h100)
    body = client.get("/quota-requests/").content.decode()
    assert "1–25 of 28" in body and '<span class="badge badge-request-pending">28</span>' in body
    # Decided elsewhere (a status move): out of the inbox, still in the table.
    first = QuotaRequest.objects.filter(status=QuotaRequest.Status.PENDING).order_by("created_at").first()
    from quotas.services import quota_request_reject
    quota_request_reject(actor=cast.actor("alice"), request=first, comment="not now")
    body = client.get("/quota-requests/").content.decode()
    assert "1–25 of 28" in body and '<span class="badge badge-request-pending">27</span>' in body
    # Bob loses his project admin role: he decides nothing there any more, and sees only his own requests.
    from tenants.models import Membership
    Membership.objects.filter(user=cast.bob, project=cast.vision).delete()
    body = client.get("/quota-requests/").content.decode()
    assert "1–25 of" not in body and '<span class="badge badge-request-pending">' not in body
    # Filtered, the table is counted by the ORM, as before.
    body = as_user("alice").get(f"/quota-requests/?project={cast.vision.slug}").content.decode()
    assert "1–25 of 28" in body


def test_the_inbox_pages_past_the_kept_first_page(as_user, cast, split) -> None:
    """The inbox's first page is the kept one (its queryset not even built); a later page, or a page number that is
    not one, reads as before."""
    rows = [_ask(cast.vision, cast.carol, minutes=i + 1, flavor=split.h100) for i in range(28)]
    oldest_first = [r.pk for r in reversed(rows)]
    client = as_user("bob")

    def inbox(path: str) -> list[int]:
        body = client.get(path).content.decode()
        part = body.split('id="inbox-h"', 1)[1].split('id="all-h"', 1)[0]
        return [int(pk) for pk in re.findall(r'<li class="card request-card" id="request-(\d+)"', part)]

    assert inbox("/quota-requests/") == oldest_first[:25]
    assert inbox("/quota-requests/?inbox_page=2") == oldest_first[25:]
    assert inbox("/quota-requests/?inbox_page=x") == inbox("/quota-requests/?inbox_page=0") == oldest_first[:25]
    body = client.get("/quota-requests/?inbox_page=2").content.decode()
    assert "26–28 of 28" in body and "Page 2 of 2" in body

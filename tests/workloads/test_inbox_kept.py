"""The approvals inbox reads its unfiltered first page through kept queries (``selectors.inbox_first_page``,
``approvable_projects``; ``portal.compiled``, docs/performance.md): once warm, a view of it compiles no SQL, and it
shows what the filtered (ORM) path shows: the requests waiting in the projects the approver may decide, oldest
first, 25 a page with the right count, never another tenant's nor one only shared with the approver."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db.models.sql.compiler import SQLCompiler
from django.test import Client
from django.utils import timezone

from workloads.extensions import extension_request_create
from workloads.models import RequestState, WorkloadRequest
from workloads.sharing import request_share

from .factories import make_request

pytestmark = [pytest.mark.django_db]


def _names(body: str) -> list[str]:
    return re.findall(r'id="approval-\d+-h"><a href="[^"]*">([^<]+)</a>', body)


def _compiled_sql(monkeypatch, client: Client, path: str) -> list[str]:
    """The SQL Django's compiler builds for one GET of ``path``, after two warming ones."""
    for _ in range(2):
        assert client.get(path).status_code == 200
    built: list[str] = []
    real = SQLCompiler.as_sql

    def spy(self, *args, **kwargs):
        sql = real(self, *args, **kwargs)
        built.append(sql[0])
        return sql

    monkeypatch.setattr(SQLCompiler, "as_sql", spy)
    try:
        assert client.get(path).status_code == 200
    finally:
        monkeypatch.undo()
    return built


def _waiting(cast, cat, n: int) -> list[WorkloadRequest]:
    start = timezone.now() - timedelta(days=1)
    rows = []
    for i in range(n):
        req = make_request(cat, cast.vision, cast.carol, name=f"wait-{i:02d}")
        WorkloadRequest.objects.filter(pk=req.pk).update(created_at=start + timedelta(minutes=i))
        rows.append(req)
    return rows


@pytest.mark.django_db(transaction=True)  # outside a transaction, as a server runs: the badge's count is kept too
def test_first_page_compiles_no_sql_once_warm(cast, cat, monkeypatch) -> None:
    _waiting(cast, cat, 3)
    running = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING, name="longer")
    extension_request_create(actor=cast.actor("carol"), request=running, hours=2, reason="more time")
    client = Client()
    client.force_login(cast.bob)
    built = _compiled_sql(monkeypatch, client, "/approvals/")
    assert built == [], built
    body = client.get("/approvals/").content.decode()
    assert _names(body) == ["wait-00", "wait-01", "wait-02"]
    assert 'id="extension-' in body and "more time" in body
    # A filter is the ORM's (compiled per view): the same rows.
    filtered = client.get(f"/approvals/?project={cast.vision.slug}").content.decode()
    assert _names(filtered) == _names(body)


def test_pages_count_and_scope_as_the_filtered_list(cast, cat) -> None:
    _waiting(cast, cat, 30)
    make_request(cat, cast.llm, cast.frank, name="globex-wait")  # another tenant
    make_request(cat, cast.nlp, cast.alice, name="nlp-wait")  # acme, a project bob may not decide
    shared = make_request(cat, cast.nlp, cast.alice, name="nlp-shared")
    request_share(actor=cast.actor("alice"), request=shared, user="bob", level="view")
    client = Client()
    client.force_login(cast.bob)
    first = client.get("/approvals/").content.decode()
    assert _names(first) == [f"wait-{i:02d}" for i in range(25)]
    assert "1–25 of 30" in first and "Page 1 of 2" in first
    second = client.get("/approvals/?page=2").content.decode()
    assert _names(second) == [f"wait-{i:02d}" for i in range(25, 30)]
    for body in (first, second):
        assert "globex-wait" not in body and "nlp-wait" not in body and "nlp-shared" not in body
    filtered = client.get(f"/approvals/?project={cast.vision.slug}").content.decode()
    assert _names(filtered) == _names(first) and "1–25 of 30" in filtered
    # The project filter offers the projects bob decides, alice's all of acme's, by name.
    assert re.findall(r'<option value="([^"]*)"', first.split('name="project"', 1)[1].split("</select>", 1)[0]) == [
        "", cast.vision.slug]
    client.force_login(cast.alice)
    body = client.get("/approvals/").content.decode()
    assert _names(body) == [f"wait-{i:02d}" for i in range(25)] and "1–25 of 32" in body
    assert _names(client.get("/approvals/?page=2").content.decode()) == [
        *(f"wait-{i:02d}" for i in range(25, 30)), "nlp-wait", "nlp-shared"]
    options = body.split('name="project"', 1)[1].split("</select>", 1)[0]
    assert re.findall(r'<option value="([^"]*)"', options) == ["", cast.nlp.slug, cast.vision.slug]


def _queries(client: Client, path: str) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    assert client.get(path).status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(path).status_code == 200
    return [q["sql"] for q in ctx.captured_queries]


@pytest.mark.django_db(transaction=True)  # outside a transaction, as a server runs: the kept values are used
def test_warm_inbox_reads_neither_projects_nor_extensions_while_none_waits(cast, cat) -> None:
    """The project filter's choices are kept with the approver's counts (``approvable_projects``, under
    ``APPROVALS``), and no extension request is read while the counts say none waits: the unfiltered inbox in
    four queries (the session's user, the page's rows, their quota rows and queue). Each change shows at once."""
    from tenants.services import project_update

    _waiting(cast, cat, 2)
    client = Client()
    client.force_login(cast.bob)
    sql = _queries(client, "/approvals/")
    assert not [q for q in sql if q.startswith(('SELECT "tenants_project".', 'SELECT "workloads_extensionrequest".'))]
    assert len(sql) <= 4, sql

    # An extension request asked for: in the inbox at the next visit (its count changed with it).
    running = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING, name="longer")
    extension_request_create(actor=cast.actor("carol"), request=running, hours=2, reason="more time please")
    body = client.get("/approvals/").content.decode()
    assert 'id="extension-' in body and "more time please" in body
    # A project renamed: the filter offers its new name at the next visit.
    project_update(actor=cast.actor("ops"), project=cast.vision, name="Vision Renamed")
    body = client.get("/approvals/").content.decode()
    options = body.split('name="project"', 1)[1].split("</select>", 1)[0]
    assert ">Vision Renamed</option>" in options and _names(body) == ["wait-00", "wait-01"]


def test_each_rows_decision_form_is_a_fresh_one_even_after_a_refused_decision(cast, cat) -> None:
    """The rows' decision forms are copies of one built form (``approval_views._fresh_form``): each row's comment
    field is what ``DecisionForm(prefix=...)`` writes, with its own prefix, and a refused decision's bound form (its
    error, its text) stays in its own answer, never in a later page's rows."""
    from workloads.forms import DecisionForm

    rows = _waiting(cast, cat, 2)
    client = Client()
    client.force_login(cast.bob)
    refused = client.post(f"/requests/{rows[0].pk}/decide/", {"decision": "reject", f"decide-{rows[0].pk}-comment": "",
                                                             "next": "inbox"}, HTTP_HX_REQUEST="true")
    assert refused.status_code in (200, 400) and "errorlist" in refused.content.decode()
    body = client.get("/approvals/").content.decode()
    assert "errorlist" not in body
    for req in rows:
        assert str(DecisionForm(prefix=f"decide-{req.pk}")["comment"]) in body
    assert body.count('name="decide-') == 2

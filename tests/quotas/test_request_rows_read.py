"""The quota request lists read their rows without joins (``selectors.quota_requests_listed``: the shown columns
only) and the related rows they show in one query after the page (``selectors.with_shown_related``): the project
with its tenant's name, the flavor's name, the requester's and decider's usernames (docs/performance.md).

Checked here against rows read in full (``select_related``), in the real database: the table rows, the project
page's request lines and the inbox cards come out the same, for every reader, status and kind of decider; writing
them asks the database nothing more (a field left unread would be a query per row); one query for any number of
rows; and the pages that use them show what they showed."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from itertools import cycle

import pytest
from django.db import connection
from django.template import engines
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from quotas import selectors
from quotas.models import QuotaRequest

# The Jinja2 templates the pages write them with (templates/jinja2/quotas/), rendered alike for both sides.
ROWS = ("quotas/_request_rows.html", "quotas/_request_lines.html")
CARD = "quotas/_request_card.html"


def _rows(rows) -> str:
    env = engines["jinja2"].env
    return "".join(env.get_template(name).render(rows=rows) for name in ROWS)


def _cards(rows, request, inbox: bool) -> str:
    card = engines["jinja2"].env.get_template(CARD)
    return "".join(card.render(r=r, current=None, inbox=inbox, selectable=True, request=request, csrf_input="t")
                   for r in rows)


@pytest.fixture
def asked(cast):
    from tests.workloads.factories import make_catalogue

    cat = make_catalogue(cast)
    now = timezone.now()
    asking = cycle([(cast.vision, cast.carol), (cast.nlp, cast.alice), (cast.llm, cast.frank), (cast.vision, cast.bob)])
    flavors = cycle([cat.h100, cat.mig])
    kinds = cycle([(None, None, ""), (cast.bob, now, "fine <by> me"), (cast.ops, now, ""), (None, None, 'why "not"')])
    approvers = cycle(QuotaRequest.Approver.values)
    made = []
    for n, status in enumerate(QuotaRequest.Status.values * 3):
        decider, decided_at, comment = next(kinds)
        project, asker = next(asking)
        made.append(QuotaRequest.objects.create(
            project=project, flavor=next(flavors), resource="nvidia.com/gpu", amount=Decimal(n + 1) / 2,
            until=now + timedelta(days=n) if n % 2 else None, reason=f"reason <{n}>\nmore", requested_by=asker,
            status=status, approver=next(approvers), decided_by=decider, decided_at=decided_at, comment=comment,
        ))
    return made


def _full(pks):
    rows = QuotaRequest.objects.filter(pk__in=pks).select_related("project__tenant", "flavor", "requested_by", "decided_by")
    return sorted(rows, key=lambda r: r.pk)


def _read(pks):
    return sorted(selectors.quota_requests_listed(QuotaRequest.objects.filter(pk__in=pks)), key=lambda r: r.pk)


def test_rows_read_without_joins_write_the_same(cast, asked) -> None:
    pks = [r.pk for r in asked]
    full, light = _full(pks), _read(pks)
    with CaptureQueriesContext(connection) as read:
        selectors.with_shown_related(light)
    assert len(read) == 1
    for who in ("bob", "carol", "alice", "erin", "ops"):
        for inbox in (True, False):
            request = RequestFactory().get("/quota-requests/")
            request.user = getattr(cast, who)
            with CaptureQueriesContext(connection) as before:
                expected = _cards(full, request, inbox)
            request = RequestFactory().get("/quota-requests/")
            request.user = getattr(cast, who)
            with CaptureQueriesContext(connection) as written:
                got = _cards(light, request, inbox)
            assert got == expected
            # The policies read the reader's memberships (once per request), never a row's related fields.
            assert len(written) <= len(before) <= 3
    expected = _rows(full)
    with CaptureQueriesContext(connection) as written:
        got = _rows(light)
    assert got == expected and len(written) == 0
    assert "Globex AI" in got and "LLM" in got and "fine &lt;by&gt; me" in got and "ops" in got


def test_a_field_not_read_is_not_guessed(cast, asked) -> None:
    """The related rows carry only what the lists show: another field is read from the database, not made up."""
    light = selectors.with_shown_related(_read([asked[0].pk]))
    project = light[0].project
    type(project).objects.filter(pk=project.pk).update(description="read <from> the row")
    with CaptureQueriesContext(connection) as more:
        description, status = project.description, project.status
    assert len(more) == 2
    assert (description, status) == ("read <from> the row", type(project).objects.get(pk=project.pk).status)
    assert light[0].flavor.get_deferred_fields() >= {"active", "gpu_model"}
    assert light[0].flavor.cluster.get_deferred_fields() >= {"architecture"}


def test_one_query_whatever_the_number_of_rows(cast, asked) -> None:
    for size in (1, 2, 3, 5, 9, len(asked)):
        light = _read([r.pk for r in asked[:size]])
        with CaptureQueriesContext(connection) as read:
            selectors.with_shown_related(light)
        assert len(read) == 1, size
        for r, full in zip(light, _full([r.pk for r in asked[:size]]), strict=True):
            assert (r.project.slug, r.project.name, r.project.tenant_id, r.project.tenant.name, r.project.tenant.slug) == (
                full.project.slug, full.project.name, full.project.tenant_id, full.project.tenant.name,
                full.project.tenant.slug)
            assert (r.flavor.name, r.flavor.cluster_id, r.flavor.cluster.name) == (
                full.flavor.name, full.flavor.cluster_id, full.flavor.cluster.name)
            assert r.requested_by.get_username() == full.requested_by.get_username()
            assert (r.decided_by and r.decided_by.get_username()) == (full.decided_by and full.decided_by.get_username())
    with CaptureQueriesContext(connection) as none:
        assert selectors.with_shown_related([]) == []
    assert len(none) == 0


def test_the_pages_show_them(as_user, cast, asked) -> None:
    by_pk = {r.pk: r for r in asked}
    body = as_user("alice").get("/quota-requests/").content.decode()
    for pk, r in by_pk.items():
        if r.project.tenant_id == cast.acme.pk:
            assert f'id="quota-request-row-{pk}"' in body
            assert f'<a href="/projects/{r.project.slug}/quota/">{r.project.name}</a>' in body
    assert "globex-llm" not in body  # another tenant's requests stay out
    body = as_user("erin").get("/quota-requests/").content.decode()
    assert "/projects/globex-llm/quota/" in body and "acme-vision" not in body
    body = as_user("bob").get("/projects/acme-vision/quota/").content.decode()
    assert body.count('<li class="request-line">') == sum(1 for r in asked if r.project_id == cast.vision.pk)


@pytest.mark.parametrize("who", ["ops", "alice", "bob", "carol", "frank"])
def test_the_api_list_writes_each_row_as_the_detail_does(api, cast, asked, who) -> None:
    """``GET /api/v1/quota-requests/`` reads its page without joins and the related rows after it: each row is what
    the detail (read with every join) answers, for every reader; the page's count is the list's length."""
    client = api(who)
    listed = client.get("/api/v1/quota-requests/?page_size=500")
    assert listed.status_code == 200, listed.content
    body = listed.json()
    assert body["count"] == len(body["results"]) > 0
    for row in body["results"]:
        detail = client.get(f"/api/v1/quota-requests/{row['id']}/")
        assert detail.status_code == 200
        assert row == detail.json()
    # Filtered or not, the same rows for the same filter.
    pending = client.get("/api/v1/quota-requests/?status=pending&page_size=500").json()
    assert pending["count"] == len(pending["results"]) == sum(r["status"] == "pending" for r in body["results"])


"""The request lists (``/requests/`` and its scopes, ``/ops/requests/``) read only the columns their rows show
(``views.LIST_COLUMNS``, ``LIST_JOINED``; docs/performance.md): not a request's parameters or cluster status, nor a
flavor's labels and taints, nor a template's form. A column left out that a row reads would be loaded one query per
row: the page's query count must not grow with its rows, and each row still shows what it showed."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from workloads.models import RequestState

from .factories import make_request

pytestmark = [pytest.mark.django_db]

# Columns no list row shows (each decoded from JSON, or large): none may be in the page's query.
NOT_READ = ('"workloads_workloadrequest"."parameters"', '"workloads_workloadrequest"."cluster_status"',
            '"quotas_flavor"."labels"', '"quotas_flavor"."taints"', '"auth_user"."password"')


def _page(client: Client, path: str) -> tuple[str, list[str]]:
    client.get(path)  # the frame's caches (badges, memberships) warm
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200
    return response.content.decode(), [q["sql"] for q in queries.captured_queries]


def _add(cast, cat, first: int, n: int) -> None:
    for i in range(first, first + n):
        make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING, name=f"run-{i}", gpus=2, replicas=3,
                     cluster_status={"objects": {"pod/x": {"phase": "Running"}}})
        make_request(cat, cast.vision, cast.carol, name=f"wait-{i}", template=cat.notebook, flavor=cat.mig)


@pytest.mark.parametrize(("who", "path"), [("carol", "/requests/"), ("carol", "/requests/?scope=projects"),
                                           ("bob", "/requests/?scope=projects"), ("ops", "/ops/requests/")])
def test_a_request_list_reads_its_rows_columns_in_one_query(cast, cat, who, path) -> None:
    client = Client()
    client.force_login(getattr(cast, who))
    _add(cast, cat, 0, 1)
    _, few = _page(client, path)
    _add(cast, cat, 1, 3)
    body, many = _page(client, path)
    assert len(many) == len(few), "a deferred column is read per row"
    page_query = next(sql for sql in many if 'FROM "workloads_workloadrequest"' in sql and " LIMIT " in sql
                      and "COUNT(" not in sql)
    assert not [column for column in NOT_READ if column in page_query]
    for i in range(4):
        row = body.split(f">run-{i}</a>", 1)[1].split("</tr>", 1)[0]
        assert "Vision" in row and cat.training.name in row and "2 × H100 80GB × 3" in row
        assert "Running" in row and 'class="badge badge-active"' in row
        assert ("carol" in row) is (path != "/requests/")  # the By column, except on "mine"
        assert ("Acme Research" in row) is (who == "ops")  # the Tenant column of the ops list
        waiting = body.split(f">wait-{i}</a>", 1)[1].split("</tr>", 1)[0]
        assert cat.notebook.name in waiting and "1 × A100 1g.10gb" in waiting and "Pending approval" in waiting

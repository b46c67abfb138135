"""What the project's queues offer is kept per process (``quotas.selectors.OFFERS``): a submission reads it before its
transaction, without a query. Every write it depends on makes the next submission see the change, through the API.

Committed transactions, as in production: inside a transaction nothing is kept (the tables are read)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from workloads.models import RequestState

pytestmark = [pytest.mark.django_db(transaction=True)]

API = "/api/v1/requests/"
TRAIN = {"template": "training", "flavor": "h100", "gpus": 1, "duration_hours": 4,
         "parameters": {"command": "python train.py"}}


def _offer_queries(ctx: CaptureQueriesContext) -> list[str]:
    """The offer check's reads: the tenants' quota rows (all of them, no project named) and their active projects."""
    return [q["sql"] for q in ctx.captured_queries
            if ('FROM "quotas_quota"' in q["sql"] and '"quotas_quota"."tenant_id" IN' in q["sql"])
            or ('FROM "tenants_project"' in q["sql"] and '"tenants_project"."status" =' in q["sql"])]


def test_a_second_submission_reads_no_offers(token_client, cast, cat) -> None:
    client, _ = token_client("carol", cast.vision, "read+submit")
    with CaptureQueriesContext(connection) as first:
        assert client.post(API, TRAIN | {"name": "first"}, format="json").status_code == 201
    assert _offer_queries(first), "the first submission reads what the queues offer"
    with CaptureQueriesContext(connection) as second:
        answer = client.post(API, TRAIN | {"name": "second"}, format="json")
    assert answer.status_code == 201, answer.content
    assert _offer_queries(second) == [], "\n".join(q["sql"][:200] for q in second.captured_queries)


def test_a_project_restored_is_offered_again(token_client, api, cast, cat) -> None:
    """Restoring a project is a status move (an UPDATE, no save signal): it says so itself. What acme's queues offer is
    kept while acme-vision is archived (a submission in acme-nlp); once restored, acme-vision is offered again."""
    vision, _ = token_client("carol", cast.vision, "read+submit")
    nlp, _ = token_client("carol", cast.nlp, "read+submit")
    admin = api("alice")
    assert admin.patch("/api/v1/projects/acme-vision/", {"status": "archived"}, format="json").status_code == 200
    assert nlp.post(API, TRAIN | {"name": "meanwhile"}, format="json").status_code == 201
    assert admin.patch("/api/v1/projects/acme-vision/", {"status": "active"}, format="json").status_code == 200
    again = vision.post(API, TRAIN | {"name": "restored"}, format="json")
    assert again.status_code == 201, again.content
    assert again.json()["state"] == RequestState.APPROVED


def test_a_quota_written_through_the_api_is_seen_by_the_next_submission(token_client, api, cast, cat) -> None:
    """acme-nlp's quota row in h100 set to nothing: a submission there is refused, and what acme's queues offer (h100
    not to acme-nlp) is kept. The tenant admin sets the row back through the API: the next submission is accepted."""
    client, _ = token_client("carol", cast.nlp, "read+submit")
    admin = api("alice")
    row = next(r for r in admin.get("/api/v1/quotas/", {"project": "acme-nlp"}).json()["results"]
               if r["flavor_name"] == cat.h100.name)
    nothing = admin.patch(f"/api/v1/quotas/{row['id']}/", {"nominal": "0", "borrowing_limit": "0"}, format="json")
    assert nothing.status_code == 200, nothing.content
    refused = client.post(API, TRAIN | {"name": "none"}, format="json")
    assert refused.status_code == 400 and "can never run" in refused.content.decode(), refused.content
    back = admin.patch(f"/api/v1/quotas/{row['id']}/", {"nominal": "2", "borrowing_limit": None}, format="json")
    assert back.status_code == 200, back.content
    accepted = client.post(API, TRAIN | {"name": "after"}, format="json")
    assert accepted.status_code == 201, accepted.content

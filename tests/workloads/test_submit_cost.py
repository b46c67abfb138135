"""What one submission costs: the queries of an auto-approved API submission with a read+submit token, and an
answer built from what was written (no read-back) that says the same as reading the request again."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tenants.models import AuditEntry
from workloads.models import RequestState

# Committed transactions, as in production: the submission's own transaction is not a savepoint here.
pytestmark = [pytest.mark.django_db(transaction=True)]

API = "/api/v1/requests/"
TRAIN = {"template": "training", "flavor": "h100", "gpus": 1, "duration_hours": 4,
         "parameters": {"command": "python train.py"}}
# Token (1), the project in scope (1) and read again by the service (1), the live template with its flavors and their clusters (2), the project's
# permission (2, user and group), the Idempotency-Key's earlier request and the name in one (1), curated images (1),
# the quota row (1), the approval rule (1), the request (1), both timeline entries (1), the audit chain: head
# under lock, both entries, head (3); BEGIN and COMMIT (2). docs/performance.md, "Submissions".
MAX_QUERIES = 18


def test_auto_approved_submission_query_ceiling(token_client, cast, cat, django_capture_on_commit_callbacks) -> None:
    client, _ = token_client("carol", cast.vision, "read+submit")
    # Warm-up: content types and the throttles' cache keys; the token's "last used" is written (once a minute).
    assert client.post(API, TRAIN | {"name": "warm"}, format="json").status_code == 201
    with CaptureQueriesContext(connection) as ctx:
        response = client.post(API, TRAIN | {"name": "counted"}, format="json", headers={"Idempotency-Key": "count-1"})
    assert response.status_code == 201, response.content
    assert response.json()["state"] == RequestState.APPROVED
    assert len(ctx.captured_queries) <= MAX_QUERIES, "\n".join(q["sql"][:200] for q in ctx.captured_queries)


def test_the_answer_to_a_submission_is_what_reading_it_gives(token_client, cast, cat) -> None:
    client, _ = token_client("carol", cast.vision, "read+submit")
    created = client.post(API, TRAIN | {"name": "answer"}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    read = client.get(f"{API}{body['id']}/")
    assert read.json() == body
    assert read.headers["ETag"] == created.headers["ETag"]
    assert [(e["from_state"], e["to_state"]) for e in body["timeline"]] == [("", "submitted"), ("submitted", "approved")]
    actions = list(AuditEntry.objects.filter(target_type="workloads.workloadrequest", target_id=str(body["id"])).order_by("seq").values_list("action", "after__state"))
    assert actions == [("request.submit", "submitted"), ("request.approved", "approved")]


def test_pending_submission_writes_both_steps(token_client, cast, cat) -> None:
    client, _ = token_client("carol", cast.vision, "read+submit")
    body = client.post(API, TRAIN | {"name": "big", "gpus": 4}, format="json").json()
    assert body["state"] == RequestState.PENDING_APPROVAL
    assert [e["to_state"] for e in body["timeline"]] == ["submitted", "pending_approval"]
    assert client.get(f"{API}{body['id']}/").json() == body

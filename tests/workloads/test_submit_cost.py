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
# The token with its project, tenant and its user's memberships there (1: the project is the token's own, the
# permission comes from the memberships), the request (1), the audit chain in one statement with both timeline entries
# (1: ``audit_append(..., along=...)``); BEGIN and COMMIT (2). With an Idempotency-Key nothing is read before: the
# unique constraints refuse a repeated key or a taken name, and only a refusal looks for the earlier call. The template with its flavors, the images and the approval rule come from the process's catalogue copy;
# what the project's queues can ever admit (``quotas.selectors.queue_offers``, the rule the form offers by) and the
# project's quota ceilings (``workloads.selectors.quota_ceilings_kept``) from the process's copy at the offers' version
# (``quotas.selectors.OFFERS``; the warm-up read it: the tenant's quota rows, their flavors, its active projects).
# docs/performance.md, "Submissions".
MAX_QUERIES = 5
MAX_STATEMENTS = 3


@pytest.mark.postgresql  # the audit chain in one statement is PostgreSQL's (on SQLite it is three, and the timeline one more)
def test_auto_approved_submission_query_ceiling(token_client, cast, cat, django_capture_on_commit_callbacks) -> None:
    client, _ = token_client("carol", cast.vision, "read+submit")
    # Warm-up: content types and the throttles' cache keys; the token's "last used" is written (once a minute).
    assert client.post(API, TRAIN | {"name": "warm"}, format="json").status_code == 201
    with CaptureQueriesContext(connection) as ctx:
        response = client.post(API, TRAIN | {"name": "counted"}, format="json", headers={"Idempotency-Key": "count-1"})
    assert response.status_code == 201, response.content
    assert response.json()["state"] == RequestState.APPROVED
    assert len(ctx.captured_queries) <= MAX_QUERIES, "\n".join(q["sql"][:200] for q in ctx.captured_queries)
    statements = [q for q in ctx.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) <= MAX_STATEMENTS, "\n".join(q["sql"][:200] for q in statements)


def test_a_catalogue_write_is_seen_by_the_next_submission(token_client, cast, cat) -> None:
    """The catalogue is the process's copy: every write to a template, image, approval rule, flavor or cluster
    forgets it, so the next submission sees the change."""
    from workloads.models import ApprovalRule, Image

    client, _ = token_client("carol", cast.vision, "read+submit")
    assert client.post(API, TRAIN | {"name": "before"}, format="json").json()["state"] == RequestState.APPROVED
    ApprovalRule.objects.filter(project__isnull=True).update(auto_approve_max_gpus=0)  # behind the services' back
    for rule in ApprovalRule.objects.filter(project__isnull=True):
        rule.save()  # a save, as the services write
    assert client.post(API, TRAIN | {"name": "after"}, format="json").json()["state"] == RequestState.PENDING_APPROVAL
    Image.objects.create(name="fresh", reference="registry.example/fresh:1", kinds=["training"], active=True)
    answer = client.post(API, TRAIN | {"name": "image", "image": "registry.example/fresh:1"}, format="json")
    assert answer.status_code == 201, answer.content
    cat.training.allowed_flavors.remove(cat.h100)
    refused = client.post(API, TRAIN | {"name": "flavor"}, format="json")
    assert refused.status_code == 400 and "flavor" in refused.content.decode(), refused.content


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


def test_every_kind_of_answer_is_what_reading_it_gives(token_client, api, cast, cat) -> None:
    """The 201 is written out from the request in memory (``serializers.request_row``): priced (a price list,
    so a cost estimate), pending or approved, a MIG flavor, decimals, workers, another template, by token or
    session: each answer is the GET of the same request, ETag included."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from billing import services as billing

    jan = datetime(2026, 1, 1, tzinfo=UTC)
    for unit, amount, key in (("gpu", "2.00", cat.h100.gpu_model or cat.h100.gpu_product or cat.h100.name),
                              ("mig", "0.50", cat.mig.mig_profile), ("cpu", "0.05", ""), ("memory", "0.01", ""),
                              ("storage", "7.30", "")):
        billing.price_create(actor=cast.actor("ops"), unit=unit, key=key, amount=Decimal(amount), effective_from=jan)
    token, _ = token_client("carol", cast.vision, "read+submit")
    session = api("carol")
    bodies = [
        (token, TRAIN | {"name": "priced"}),
        (token, TRAIN | {"name": "big", "gpus": 4, "cpu": "2.5", "memory_gib": 16, "priority": "batch",
                         "parameters": {"command": "python train.py", "distributed": True, "workers": 2}}),
        (token, TRAIN | {"name": "mig", "flavor": cat.mig.name, "cpu": 3}),
        (session, TRAIN | {"project": cast.vision.slug, "name": "by-session", "image": ""}),
        (session, {"template": cat.notebook.slug, "project": cast.vision.slug, "flavor": cat.h100.name}),
    ]
    for client, body in bodies:
        created = client.post(API, body, format="json")
        assert created.status_code == 201, created.content
        answer = created.json()
        assert answer["cost_estimate"] not in (None, "0.00"), answer
        read = client.get(f"{API}{answer['id']}/")
        assert read.json() == answer
        assert read.headers["ETag"] == created.headers["ETag"]

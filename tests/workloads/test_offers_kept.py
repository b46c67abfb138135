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


def test_a_second_submission_reads_no_quota_row(token_client, cast, cat) -> None:
    """The "can it ever run" ceiling comes from the process's copy of the tenant's quota rows too
    (``selectors.quota_ceilings_kept``); too much is still refused, with the ceiling's figures."""
    from quotas.models import Quota

    row = Quota.objects.get(project=cast.vision, flavor=cat.h100, resource=cat.h100.primary_resource)
    row.nominal, row.borrowing_limit = 2, 0
    row.save()  # a write: the next submission reads the rows again
    client, _ = token_client("carol", cast.vision, "read+submit")
    assert client.post(API, TRAIN | {"name": "first"}, format="json").status_code == 201
    with CaptureQueriesContext(connection) as second:
        assert client.post(API, TRAIN | {"name": "second"}, format="json").status_code == 201
    assert not [q for q in second.captured_queries if 'FROM "quotas_quota"' in q["sql"]], \
        "\n".join(q["sql"][:200] for q in second.captured_queries)
    with CaptureQueriesContext(connection) as big:
        refused = client.post(API, TRAIN | {"name": "big", "gpus": 3}, format="json")
    assert refused.status_code == 400, refused.content
    assert "(2 nominal + 0 borrowable = 2)" in refused.json()["fields"]["gpus"][0], refused.content
    assert not [q for q in big.captured_queries if 'FROM "quotas_quota"' in q["sql"]]


def test_the_kept_ceilings_are_the_ceilings(cast, cat) -> None:
    """Every project, flavor and resource: the kept ceiling is ``quota_ceiling``'s, with a tenant pool, without one
    (the projects' sum), with and without a borrowing limit, and for a flavor without a row (nothing)."""
    from decimal import Decimal

    from quotas.models import Flavor, Quota
    from tenants.models import Project
    from workloads import selectors

    vision_h100 = Quota.objects.filter(project=cast.vision, flavor=cat.h100).first()
    if vision_h100 is not None:  # no borrowing limit: bounded by the cohort (the pool, or the projects' sum)
        vision_h100.borrowing_limit = None
        vision_h100.save()
    Quota.objects.filter(tenant=cast.acme, project__isnull=True).delete()  # no pool: the projects' sum
    checked = 0
    for project in Project.objects.select_related("tenant"):
        kept = selectors.quota_ceilings_kept(project=project)
        assert kept is not None
        for flavor in Flavor.objects.all():
            for resource in {flavor.primary_resource, *flavor.resource_names}:
                assert selectors.ceiling_of(kept, project=project, flavor=flavor, resource=resource) == \
                    selectors.quota_ceiling(project=project, flavor=flavor, resource=resource), (project, flavor, resource)
                checked += 1
    assert checked > 10
    assert any(c.total > 0 for c in selectors.quota_ceilings_kept(project=cast.vision).values())
    assert selectors.ceiling_of({}, project=cast.vision, flavor=cat.h100).total == Decimal(0)

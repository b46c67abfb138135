"""The request list, detail and inbox as the API serves them (rows, cursor pages): the documented shape and the
values users see; the cursor walk; the token's last use written at most once a minute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from schemathesis.openapi import from_dict

from tenants.models import ApiToken
from workloads.extensions import extension_request_create
from workloads.models import RequestEvent, RequestState, WorkloadRequest

from ..test_api_schema import conforms
from .factories import make_request

pytestmark = [pytest.mark.django_db]

API = "/api/v1"
S = RequestState


def _variety(cast, cat) -> list[WorkloadRequest]:
    """Requests whose JSON takes every path: waiting and running states, an approver, nulls, decimals, a MIG
    flavor (its display name in "why pending"), another template, events and an extension request."""
    now = timezone.now()
    reqs = [
        make_request(cat, cast.vision, cast.carol, state=S.PENDING_APPROVAL, pending_reason="4 GPUs is more than 2"),
        make_request(cat, cast.vision, cast.carol, state=S.QUEUED, flavor=cat.mig, replicas=3, cpu=Decimal("2.5")),
        make_request(cat, cast.vision, cast.carol, state=S.RUNNING, approved_by=cast.bob, approved_at=now,
                     started_at=now, expires_at=now + timedelta(hours=4), decision_comment="ok",
                     cluster_status={"phase": "Running"}),
        make_request(cat, cast.vision, cast.bob, state=S.APPROVED, template=cat.inference),
        make_request(cat, cast.vision, cast.carol, state=S.SUBMITTED, template=cat.notebook, parameters={}),
        make_request(cat, cast.vision, cast.carol, state=S.FAILED, state_reason="OOMKilled", finished_at=now),
    ]
    RequestEvent.objects.create(request=reqs[2], from_state="queued", to_state="running", actor_label="cluster",
                                message="started")
    RequestEvent.objects.create(request=reqs[2], from_state="approved", to_state="queued", actor_label="portal")
    extension_request_create(actor=cast.actor("carol"), request=reqs[2], hours=2, reason="a longer run")
    return reqs


@pytest.fixture
def schema(client) -> Any:
    return from_dict(client.get("/api/schema/?format=json").json())


def test_list_detail_and_inbox_show_each_request_as_documented(api, cast, cat, schema) -> None:
    """Every path of the JSON (waiting and running states, an approver, nulls, decimals, a MIG flavor, another
    template, events, an extension request) in the shape the OpenAPI schema documents, with the values users see."""
    reqs = _variety(cast, cat)
    client = api("carol")
    listed = conforms(schema, "GET", "/api/v1/requests/", client.get(f"{API}/requests/"))["results"]
    assert [row["id"] for row in listed] == [req.pk for req in reversed(reqs)]
    documented = schema.raw_schema["components"]["schemas"]
    assert all(set(row) == set(documented["Request"]["properties"]) for row in listed)
    details = {req.pk: conforms(schema, "GET", "/api/v1/requests/{id}/", client.get(f"{API}/requests/{req.pk}/"))
               for req in reqs}
    assert all(set(d) == set(documented["RequestDetail"]["properties"]) for d in details.values())
    for row in listed:  # the list's row is the detail's, less the detail's own fields
        assert row == {k: v for k, v in details[row["id"]].items() if k in row}
    pending, queued, running, approved, notebook, failed = (details[req.pk] for req in reqs)
    assert pending["pending_reason"].startswith("Awaiting approval") and pending["pending_reason"].endswith(
        ": 4 GPUs is more than 2")
    assert queued["pending_reason"] == f"Waiting in project acme-vision's queue for 1 x {cat.mig} x 3."
    assert (queued["flavor"], queued["replicas"], queued["cpu"]) == (cat.mig.name, 3, "2.50")
    assert (running["approved_by"], running["decision_comment"], running["cluster_status"]) == ("bob", "ok", {"phase": "Running"})
    assert running["pending_reason"] == "" and running["expires_at"].endswith("Z") and pending["approved_by"] is None
    assert {"started", "Asked for 2 more hours: a longer run"} <= {e["message"] for e in running["timeline"]}
    extension = running["extension_requests"][0]
    assert (extension["hours"], extension["request"], extension["request_name"], extension["requested_by"],
            extension["tenant"], extension["status"]) == (2, reqs[2].pk, reqs[2].name, "carol", "acme", "pending")
    assert approved["template"]["kind"] == cat.inference.kind and approved["requested_by"] == "bob"
    assert notebook["parameters"] == {} and failed["state_reason"] == "OOMKilled" and failed["finished_at"]
    assert all(d["k8s_name"] == f"req-{d['id']}" and d["namespace"] == cast.vision.namespace for d in details.values())
    assert pending["placement"]["cluster"] == cat.cluster.name and pending["cost_so_far"] is None
    # The approver's inbox writes the same request (read as a model instance) as the list does, with its context.
    inbox = conforms(schema, "GET", "/api/v1/approvals/", api("bob").get(f"{API}/approvals/"))["results"]
    mine = next(row for row in inbox if row["id"] == reqs[0].pk)
    assert {k: v for k, v in mine.items() if k != "context"} == next(r for r in listed if r["id"] == reqs[0].pk)
    assert set(mine["context"]) >= {"quota", "in_use", "waiting_ahead", "cost_estimate"}
    assert client.get(f"{API}/requests/{reqs[0].pk}/?state=running").status_code == 404  # filters apply, as before
    assert client.get(f"{API}/requests/abc/").status_code == 404


def test_dates_are_written_in_the_current_time_zone(api, cast, cat, settings) -> None:
    settings.TIME_ZONE = "Asia/Kolkata"  # +05:30: the dates are written in the current time zone, not as UTC
    reqs = _variety(cast, cat)
    client = api("carol")
    listed = {row["id"]: row for row in client.get(f"{API}/requests/").json()["results"]}
    for req in reqs:
        row, detail = listed[req.pk], client.get(f"{API}/requests/{req.pk}/").json()
        assert row["created_at"].endswith("+05:30") and datetime.fromisoformat(row["created_at"]) == req.created_at
        assert detail["created_at"] == row["created_at"] and detail["expires_at"] == row["expires_at"]
        assert all(event["at"].endswith("+05:30") for event in detail["timeline"])
    assert listed[reqs[2].pk]["expires_at"].endswith("+05:30")


def test_dates_in_utc_are_what_drf_writes(api, cast, cat, settings) -> None:
    """In UTC (the default) a date read from PostgreSQL is written as it is; the text is DRF's own."""
    from rest_framework import serializers

    settings.TIME_ZONE = "UTC"
    reqs = _variety(cast, cat)
    listed = {row["id"]: row for row in api("carol").get(f"{API}/requests/").json()["results"]}
    field = serializers.DateTimeField()
    for req in reqs:
        req.refresh_from_db()
        for name in ("created_at", "updated_at", "approved_at", "started_at", "finished_at", "expires_at"):
            value = getattr(req, name)
            assert listed[req.pk][name] == (None if value is None else field.to_representation(value)), name
    assert listed[reqs[0].pk]["created_at"].endswith("Z")


def test_a_price_list_prices_the_list_the_detail_and_the_inbox_alike(api, cast, cat) -> None:
    """With a price list every request has a cost estimate (one flavor query per page), the same in the list,
    its detail and the approver's inbox; nothing is metered yet, so its cost so far is 0.00."""
    from billing import services as billing

    jan = datetime(2026, 1, 1, tzinfo=UTC)
    for unit, amount, key in (("gpu", "2.00", cat.h100.gpu_model or cat.h100.gpu_product or cat.h100.name),
                              ("mig", "0.50", cat.mig.mig_profile), ("cpu", "0.05", ""), ("memory", "0.01", ""),
                              ("storage", "7.30", "")):
        billing.price_create(actor=cast.actor("ops"), unit=unit, key=key, amount=Decimal(amount), effective_from=jan)
    reqs = _variety(cast, cat)
    client = api("carol")
    listed = {row["id"]: row["cost_estimate"] for row in client.get(f"{API}/requests/").json()["results"]}
    assert all(value not in (None, "0.00") for value in listed.values())
    assert listed[reqs[0].pk] != listed[reqs[1].pk]  # 4 H100s, and 3 replicas of a MIG slice
    for req in reqs:
        detail = client.get(f"{API}/requests/{req.pk}/").json()
        assert (detail["cost_estimate"], detail["cost_so_far"]) == (listed[req.pk], "0.00")
    inbox = {row["id"]: row for row in api("bob").get(f"{API}/approvals/").json()["results"]}
    assert inbox[reqs[0].pk]["cost_estimate"] == listed[reqs[0].pk] == inbox[reqs[0].pk]["context"]["cost_estimate"]


def test_cursor_walks_every_row_once_while_new_rows_arrive(api, cast, cat) -> None:
    before = {make_request(cat, cast.vision, cast.carol).pk for _ in range(7)}
    client = api("carol")
    seen: list[int] = []
    url = f"{API}/requests/?page_size=2"
    pages = 0
    while url:
        body = client.get(url).json()
        assert "count" not in body
        seen += [row["id"] for row in body["results"]]
        make_request(cat, cast.vision, cast.carol)  # newer than everything: never on a later page
        url = body["next"]
        pages += 1
    assert pages == 4 and len(seen) == len(set(seen)) and set(seen) == before
    # Back again with ``previous``: the page before, in the list's order.
    first = client.get(f"{API}/requests/?page_size=3&project=acme-vision").json()
    second = client.get(first["next"]).json()
    assert first["previous"] is None and client.get(second["previous"]).json()["results"] == first["results"]


def test_the_unfiltered_list_read_from_its_compiled_query_is_the_filtered_ones(api, cast, cat, token_client) -> None:
    """No filter: the page comes from a compiled query (``selectors.request_page``); a filter that changes nothing
    (the default ordering, asked for) reads it the ordinary way. Both give the same JSON, page after page, forwards
    and backwards, for ops (everything), a member (their projects) and a token (its project)."""
    for project, user in [(cast.vision, cast.carol), (cast.nlp, cast.alice), (cast.llm, cast.erin)] * 3:
        make_request(cat, project, user)
    token, _ = token_client("carol", cast.vision)
    for client in (api("ops"), api("carol"), token):
        walked = {}
        for extra in ("", "&ordering=-created_at"):
            pages, url = [], f"{API}/requests/?page_size=2{extra}"
            while url:
                body = client.get(url).json()
                pages.append(body["results"])
                url = body["next"]
            back = client.get(body["previous"]).json()["results"] if body["previous"] else []
            walked[extra] = (pages, back)
        assert walked[""] == walked["&ordering=-created_at"]
        ids = [row["id"] for page in walked[""][0] for row in page]
        assert len(ids) == len(set(ids)) and ids == sorted(ids, reverse=True)
    assert len([row for page in walked[""][0] for row in page]) == 3  # the token: its project's three


def test_cursor_follows_the_ordering_with_ties(api, cast, cat) -> None:
    for gpus in (2, 1, 2, 2, 1, 3, 2):
        make_request(cat, cast.vision, cast.carol, gpus=gpus)
    client = api("carol")
    expected = list(WorkloadRequest.objects.order_by("gpus", "pk").values_list("gpus", "pk"))
    seen, url = [], f"{API}/requests/?ordering=gpus&page_size=2"
    while url:
        body = client.get(url).json()
        seen += [(row["gpus"], row["id"]) for row in body["results"]]
        url = body["next"]
    assert seen == expected
    by_project = client.get(f"{API}/requests/?ordering=-project__slug&page_size=3").json()
    assert len(client.get(by_project["next"]).json()["results"]) == 3
    # A cursor is valid with the ordering it was made under only; an altered one is a 400, never a 500.
    cursor = by_project["next"].split("cursor=")[1].split("&")[0]
    for bad in (f"ordering=gpus&cursor={cursor}", "cursor=nonsense", "cursor=eyJvIjpbIi1jcmVhdGVkX2F0Il19",
                "cursor=eyJvIjpbIi1jcmVhdGVkX2F0IiwiLXBrIl0sInYiOlsieCIsMV19",
                "cursor=eyJvIjpbIi1jcmVhdGVkX2F0IiwiLXBrIl0sInYiOlsiMjAyNi0wMS0wMVQwMDowMDowMCswMDowMCIsOTk5OTk5OTk5OTk5OTk5OTk5OTk5XX0"):
        response = client.get(f"{API}/requests/?{bad}")
        assert response.status_code == 400 and "cursor" in response.json()["fields"], bad


def test_token_last_use_is_written_at_most_once_a_minute(cast, cat, token_client) -> None:
    client, token = token_client("carol", cast.vision)
    with CaptureQueriesContext(connection) as first:
        assert client.get(f"{API}/requests/").status_code == 200
    with CaptureQueriesContext(connection) as second:
        assert client.get(f"{API}/requests/").status_code == 200
    writes = [q["sql"] for q in [*first, *second] if q["sql"].startswith('UPDATE "tenants_apitoken"')]
    assert len(writes) == 1 and ApiToken.objects.get(pk=token.pk).last_used_at is not None
    recently = timezone.now() - timedelta(seconds=50)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=recently)
    client.get(f"{API}/requests/")
    assert ApiToken.objects.get(pk=token.pk).last_used_at == recently
    a_while_ago = timezone.now() - timedelta(seconds=61)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=a_while_ago)
    client.get(f"{API}/requests/")
    assert ApiToken.objects.get(pk=token.pk).last_used_at > recently


def test_list_and_detail_queries_stay_flat(api, cast, cat, token_client, django_assert_max_num_queries) -> None:
    client, _ = token_client("carol", cast.vision)
    req = make_request(cat, cast.vision, cast.carol)
    for _ in range(60):
        make_request(cat, cast.vision, cast.carol, state=S.RUNNING, approved_by=cast.bob)
    client.get(f"{API}/requests/")  # the token's last use, written once a minute
    with django_assert_max_num_queries(2):  # the token (with its user and project), the page
        assert len(client.get(f"{API}/requests/?page_size=60").json()["results"]) == 60
    # The token, the row with its timeline (SQLite: the timeline apart).
    with django_assert_max_num_queries(2 if connection.vendor == "postgresql" else 3):
        assert client.get(f"{API}/requests/{req.pk}/").status_code == 200

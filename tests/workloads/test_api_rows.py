"""The request list and detail as the API serves them (rows, cursor pages) against the serializers' JSON; the
cursor walk; the token's last use written at most once a minute."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIRequestFactory

from tenants.models import ApiToken
from workloads import selectors
from workloads.api.serializers import RequestDetailSerializer, RequestSerializer
from workloads.extensions import extension_request_create
from workloads.models import RequestEvent, RequestState, WorkloadRequest

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


def test_list_and_detail_json_are_the_serializers(api, cast, cat) -> None:
    reqs = _variety(cast, cat)
    client = api("carol")
    listed = client.get(f"{API}/requests/").json()["results"]
    context = {"request": APIRequestFactory().get("/")}
    expected = RequestSerializer(selectors.requests_for(actor=cast.actor("carol")).order_by("-created_at", "-id"),
                                 many=True, context=context).data
    assert [row["id"] for row in listed] == [row["id"] for row in expected]
    for row, reference in zip(listed, expected, strict=True):
        assert list(row) == list(reference)
        assert {k: v for k, v in row.items() if reference[k] != v} == {}, {k: reference[k] for k in row if reference[k] != row[k]}
    for req in reqs:
        detail = client.get(f"{API}/requests/{req.pk}/").json()
        reference = RequestDetailSerializer(selectors.requests_for(actor=cast.actor("carol")).get(pk=req.pk)).data
        assert detail == reference, req.state
    assert client.get(f"{API}/requests/{reqs[2].pk}/").json()["extension_requests"][0]["hours"] == 2
    assert client.get(f"{API}/requests/{reqs[0].pk}/?state=running").status_code == 404  # filters apply, as before
    assert client.get(f"{API}/requests/abc/").status_code == 404


def test_list_dates_are_the_serializers_in_another_time_zone(api, cast, cat, settings) -> None:
    settings.TIME_ZONE = "Asia/Kolkata"  # +05:30: the dates are written in the current time zone, not as UTC
    _variety(cast, cat)
    listed = api("carol").get(f"{API}/requests/").json()["results"]
    expected = RequestSerializer(selectors.requests_for(actor=cast.actor("carol")).order_by("-created_at", "-id"),
                                 many=True, context={"request": APIRequestFactory().get("/")}).data
    assert [row["created_at"] for row in listed] == [row["created_at"] for row in expected]
    assert all(row["created_at"].endswith("+05:30") for row in listed)
    assert [row["expires_at"] for row in listed] == [row["expires_at"] for row in expected]


def test_rows_carry_the_cost_estimate_and_cost_so_far_of_the_price_list(api, cast, cat) -> None:
    """With a price list the rows price each request as the serializers do (one flavor query per page)."""
    from datetime import UTC, datetime

    from billing import services as billing

    jan = datetime(2026, 1, 1, tzinfo=UTC)
    for unit, amount, key in (("gpu", "2.00", cat.h100.gpu_model or cat.h100.gpu_product or cat.h100.name),
                              ("mig", "0.50", cat.mig.mig_profile), ("cpu", "0.05", ""), ("memory", "0.01", ""),
                              ("storage", "7.30", "")):
        billing.price_create(actor=cast.actor("ops"), unit=unit, key=key, amount=Decimal(amount), effective_from=jan)
    reqs = _variety(cast, cat)
    client = api("carol")
    listed = client.get(f"{API}/requests/").json()["results"]
    context = {"request": APIRequestFactory().get("/")}
    expected = RequestSerializer(selectors.requests_for(actor=cast.actor("carol")).order_by("-created_at", "-id"),
                                 many=True, context=context).data
    assert [row["cost_estimate"] for row in listed] == [row["cost_estimate"] for row in expected]
    assert all(row["cost_estimate"] not in (None, "0.00") for row in listed)
    for req in reqs:
        detail = client.get(f"{API}/requests/{req.pk}/").json()
        assert detail == RequestDetailSerializer(selectors.requests_for(actor=cast.actor("carol")).get(pk=req.pk)).data
        assert detail["cost_so_far"] == "0.00"  # nothing metered yet


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

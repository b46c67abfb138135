"""The metrics API: definitions, one metric's rows/points/columns/note, scoping (ops all tenants, a tenant admin
their own, others 403, another tenant's filter 404), bad input as 400 field errors in the one error format."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from insights.registry import METRICS
from tests.workloads.factories import make_catalogue

from .surfaces import KEY, NOTE
from . import surfaces

pytestmark = [pytest.mark.django_db]
demo_metric = surfaces.demo_metric  # the fixture

URL = f"/api/v1/metrics/{KEY}/"


def field_error(response, field: str) -> list[str]:
    assert response.status_code == 400, (response.status_code, response.content[:500])
    body = response.json()
    assert body["error"] == "invalid" and field in body["fields"], body
    return body["fields"][field]


def groups(response) -> list[str]:
    assert response.status_code == 200, response.content[:500]
    return [row["group"] for row in response.json()["rows"]]


def test_the_definitions_list(api, demo_metric) -> None:
    for who in ("ops", "alice", "erin"):
        response = api(who).get("/api/v1/metrics/")
        assert response.status_code == 200
        found = {m["key"]: m for m in response.json()["results"]}
        assert found[KEY] == {"key": KEY, "family": "scheduling", "title": demo_metric.title,
                              "definition": demo_metric.definition, "groups": ["tenant", "project"]}
        # Tenant admins are not listed the cluster-wide (ops-only) metrics (tests/insights/test_ops_only.py).
        expected = METRICS if who == "ops" else [k for k, m in METRICS.items() if not m.ops_only]
        assert response.json()["count"] == len(expected)


@pytest.mark.parametrize("who", ["bob", "carol", "dave", "frank", "nobody"])
def test_members_without_admin_get_403(api, demo_metric, who) -> None:
    assert api(who).get("/api/v1/metrics/").status_code == 403
    response = api(who).get(URL)
    assert response.status_code == 403 and response.json()["error"] == "permission_denied"


def test_tokens_get_403_and_anonymous_401(client, token_client, cast, demo_metric) -> None:
    token, _ = token_client("alice", cast.vision)
    assert token.get("/api/v1/metrics/").status_code == 403 and token.get(URL).status_code == 403
    assert client.get("/api/v1/metrics/").status_code == 401 and client.get(URL).status_code == 401


def test_ops_see_every_tenant(api, demo_metric) -> None:
    response = api("ops").get(URL, {"start": "2026-01-01T00:00:00Z", "end": "2026-01-08T00:00:00Z", "bucket": "week"})
    body = response.json()
    assert groups(response) == ["acme", "globex"]
    assert body["rows"][0] == {"group": "acme", "group_id": str(body["rows"][0]["group_id"]),
                               "values": {"projects": 2.0, "share": 0.5}}
    assert body["columns"] == [{"key": "projects", "title": "Projects", "unit": "count"},
                               {"key": "share", "title": "Share", "unit": ""}]
    assert body["points"] == [{"at": "2026-01-01T00:00:00Z", "series": "acme", "value": 2.0},
                              {"at": "2026-01-01T00:00:00Z", "series": "globex", "value": 1.0}]
    assert (body["group_by"], body["bucket"], body["chart_value"], body["note"], body["seeded"], body["count"]) == \
        ("tenant", "week", "projects", "", False, 2)
    assert datetime.fromisoformat(body["end"]) == datetime(2026, 1, 8, tzinfo=UTC)
    assert groups(api("ops").get(URL, {"tenant": "globex"})) == ["globex"]
    assert groups(api("ops").get(URL, {"group_by": "project", "tenant": "acme"})) == ["acme-nlp", "acme-vision"]


def test_a_tenant_admin_sees_their_tenant_only(api, demo_metric) -> None:
    assert groups(api("alice").get(URL)) == ["acme-nlp", "acme-vision"]  # by project by default
    assert groups(api("alice").get(URL, {"group_by": "tenant"})) == ["acme"]
    assert groups(api("alice").get(URL, {"tenant": "acme", "project": "acme-vision"})) == ["acme-vision"]
    assert groups(api("erin").get(URL, {"group_by": "tenant"})) == ["globex"]


@pytest.mark.parametrize(("who", "params", "status"), [
    ("alice", {"tenant": "globex"}, 404),
    ("alice", {"project": "globex-llm"}, 404),
    ("erin", {"tenant": "acme"}, 404),
    ("erin", {"project": "acme-vision"}, 404),
    ("ops", {"tenant": "no-such-tenant"}, 404),
    ("ops", {"cluster": "no-such-cluster"}, 404),
    ("ops", {"flavor": "no-such-flavor"}, 404),
])
def test_another_tenants_filter_is_404(api, demo_metric, who, params, status) -> None:
    response = api(who).get(URL, params)
    assert response.status_code == status and response.json()["error"] == "not_found"


def test_a_tenant_admin_who_is_a_member_elsewhere(api, cast, demo_metric) -> None:
    from tenants.models import Role
    from tests.factories import make_member

    make_member(cast.alice, cast.globex, Role.MEMBER, cast.llm)
    assert api("alice").get(URL, {"tenant": "globex"}).status_code == 403  # sees it, may not read its metrics
    assert groups(api("alice").get(URL, {"group_by": "tenant"})) == ["acme"]


def test_filters_and_the_note(api, cast, demo_metric) -> None:
    cat = make_catalogue(cast)
    body = api("ops").get(URL, {"cluster": cat.cluster.name, "flavor": cat.h100.name}).json()
    assert body["note"] == NOTE and body["rows"] == [] and body["count"] == 0


def test_rows_paginate(api, demo_metric) -> None:
    body = api("ops").get(URL, {"page_size": "1"}).json()
    assert [r["group"] for r in body["rows"]] == ["acme"] and body["count"] == 2 and "page=2" in body["next"]
    body = api("ops").get(URL, {"page_size": "1", "page": "2"}).json()
    assert [r["group"] for r in body["rows"]] == ["globex"] and body["previous"]


@pytest.mark.parametrize(("params", "field", "message"), [
    ({"start": "2026-02-10T00:00:00Z", "end": "2026-02-01T00:00:00Z"}, "end", "The end must be after the start."),
    ({"start": "2026-02-10T00:00:00Z", "end": "2026-02-10T00:00:00Z"}, "end", "The end must be after the start."),
    ({"start": "2024-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "end", "The period is at most 400 days."),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-03-01T00:00:00Z", "bucket": "hour"}, "bucket", "Hourly buckets"),
    ({"group_by": "galaxy"}, "group_by", "is not a valid choice"),
    ({"group_by": "queue"}, "group_by", "This metric breaks down by tenant, project."),
    ({"bucket": "month"}, "bucket", "is not a valid choice"),
    ({"start": "last tuesday"}, "start", "Datetime has wrong format"),
    ({"start": "2026-01-01T00:00:00+20:00"}, "start", "offset"),
    ({"colour": "blue"}, "colour", "Unknown field."),
    ({"tenant": "Not A Slug!"}, "tenant", "slug"),
])
def test_bad_input_is_a_field_error(api, demo_metric, params, field, message) -> None:
    messages = field_error(api("ops").get(URL, params), field)
    assert any(message in m for m in messages), messages


def test_a_flavor_on_several_clusters_needs_the_cluster(api, cast, demo_metric) -> None:
    from tests.workloads.factories import make_cluster, make_flavors

    cat = make_catalogue(cast)
    make_flavors(make_cluster("second"))
    assert "cluster too" in field_error(api("ops").get(URL, {"flavor": cat.h100.name}), "flavor")[0]
    assert api("ops").get(URL, {"flavor": cat.h100.name, "cluster": cat.cluster.name}).status_code == 200


def test_an_unknown_metric_is_404(api, cast) -> None:
    response = api("ops").get("/api/v1/metrics/no-such-metric/")
    assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_the_schema_documents_both_operations(client, cast) -> None:
    paths = client.get("/api/schema/?format=json").json()["paths"]
    detail = paths["/api/v1/metrics/{key}/"]["get"]
    assert {p["name"] for p in detail["parameters"]} >= {"key", "start", "end", "group_by", "bucket", "cluster", "flavor",
                                                         "tenant", "project", "page", "page_size"}
    assert "400" in detail["responses"] and "/api/v1/metrics/" in paths


def test_every_registered_metric_answers(api, cast, demo_metric) -> None:
    make_catalogue(cast)
    for key in METRICS:
        for who in ("ops", "alice"):
            for params in ({}, {"bucket": "hour"}, {"group_by": METRICS[key].groups[-1]}):
                response = api(who).get(f"/api/v1/metrics/{key}/", params)
                if who == "alice" and METRICS[key].ops_only:  # cluster-wide: ops only (test_ops_only.py)
                    assert response.status_code == 404
                    continue
                assert response.status_code == 200, (key, who, params, response.content[:300])
                assert set(response.json()) >= {"rows", "points", "columns", "note"}

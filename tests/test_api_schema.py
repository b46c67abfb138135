"""The OpenAPI schema says what the API does: responses checked against /api/schema/ with schemathesis'
validator (the check the fuzzing in test_fuzz_api.py runs), for the operations whose answer used to differ
from their documentation: clusters (one shape for everyone), overcommit (paginated), approval rules
(``search`` works) and the ``search`` parameter only where a list searches. And who may read the schema."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests
from django.test import Client
from schemathesis.core.transport import Response as CheckedResponse
from schemathesis.openapi import from_dict

from quotas.models import Architecture, Quota
from workloads.models import ApprovalRule

from .workloads.factories import make_catalogue, make_request

pytestmark = [pytest.mark.django_db]

ROOT = Path(__file__).resolve().parent.parent
API = "/api/v1"
CLUSTER_OPS_ONLY = {
    "use_mig", "use_hami", "volcano_capacity_plugin", "overcommit_percent", "topology", "topology_levels", "admission_check",
    "kubeconfig_path",
    "has_kubeconfig", "inventory_synced_at", "inventory_error", "reconciled_at", "created_at", "health", "last_error", "last_seen_at",
}


@pytest.fixture
def schema(client) -> Any:
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    return from_dict(response.json())


def conforms(schema: Any, method: str, template: str, response: Any) -> Any:
    """Raise (schemathesis' failure report) unless ``response`` is what the schema documents for the operation."""
    request = requests.Request(method, f"http://testserver{response.wsgi_request.get_full_path()}").prepare()
    checked = CheckedResponse(
        status_code=response.status_code, headers={k.lower(): [v] for k, v in response.headers.items()},
        content=response.content, request=request, elapsed=0.0, verify=True,
    )
    schema[template][method].validate_response(checked)
    return response.json()


@pytest.fixture
def cat(cast):
    return make_catalogue(cast)


@pytest.mark.parametrize("who", ["ops", "carol", "erin", "nobody"])
def test_clusters_answer_everyone_in_the_documented_shape(api, cat, schema, who) -> None:
    client = api(who)
    page = conforms(schema, "GET", "/api/v1/clusters/", client.get(f"{API}/clusters/"))
    detail = conforms(schema, "GET", "/api/v1/clusters/{id}/", client.get(f"{API}/clusters/{cat.cluster.pk}/"))
    by_name = conforms(schema, "GET", "/api/v1/clusters/{id}/", client.get(f"{API}/clusters/lab/"))
    assert page["results"] == [detail] and by_name == detail
    assert set(detail) == {"id", "name", "architecture", "role", "manager"} | CLUSTER_OPS_ONLY  # the same keys for everyone
    assert (detail["id"], detail["name"], detail["architecture"]) == (cat.cluster.pk, "lab", "C")
    if who == "ops":
        assert detail["use_mig"] is True and detail["overcommit_percent"] == 0 and detail["health"] == "unknown"
        assert detail["has_kubeconfig"] is False and detail["created_at"]
    else:
        assert all(detail[key] is None for key in CLUSTER_OPS_ONLY)
    assert "kubeconfig" not in detail


def test_overcommit_is_paginated_like_every_list(api, cast, cat, schema) -> None:
    for flavor in (cat.h100, cat.mig, cat.cpu):
        Quota.objects.create(tenant=cast.globex, project=None, flavor=flavor, resource=flavor.primary_resource, nominal=Decimal(1))
    ops = api("ops")
    everything = conforms(schema, "GET", "/api/v1/clusters/{id}/overcommit/", ops.get(f"{API}/clusters/lab/overcommit/"))
    assert everything["count"] == len(everything["results"]) >= 3 and everything["next"] is None
    first = conforms(schema, "GET", "/api/v1/clusters/{id}/overcommit/", ops.get(f"{API}/clusters/lab/overcommit/?page_size=1"))
    assert first["count"] == everything["count"] and len(first["results"]) == 1 and "page=2" in first["next"]
    second = ops.get(f"{API}/clusters/lab/overcommit/?page_size=1&page=2").json()
    assert second["results"] == everything["results"][1:2]
    assert ops.get(f"{API}/clusters/lab/overcommit/?page=99").status_code == 404
    # The cluster list's filters are not this list's: not documented, and ignored.
    parameters = {p["name"] for p in schema.raw_schema["paths"]["/api/v1/clusters/{id}/overcommit/"]["get"]["parameters"]}
    assert parameters == {"id", "page", "page_size"}
    assert api("carol").get(f"{API}/clusters/lab/overcommit/").status_code == 403
    assert api("carol").get(f"{API}/clusters/no-such/overcommit/").status_code == 404


def test_approval_rules_search(api, cast, cat, schema) -> None:
    ApprovalRule.objects.get_or_create(project=None, template_slug="")
    ApprovalRule.objects.create(project=cast.vision, template_slug="training")
    ApprovalRule.objects.create(project=cast.nlp, template_slug="notebook")
    ApprovalRule.objects.create(project=cast.llm, template_slug="training")  # globex: alice never sees it
    alice = api("alice")

    def found(query: str) -> list[tuple[str | None, str]]:
        body = conforms(schema, "GET", "/api/v1/approval-rules/", alice.get(f"{API}/approval-rules/", {"search": query}))
        return sorted((r["project"] or "", r["template_slug"]) for r in body["results"])

    assert found("vision") == [("acme-vision", "training")]
    assert found("training") == [("acme-vision", "training")]
    assert found("NLP notebook") == [("acme-nlp", "notebook")]  # every word must match, any field, any case
    assert found("globex") == [] and found("nothing-like-this") == []
    visible = alice.get(f"{API}/approval-rules/").json()["count"]
    assert len(found("")) == visible and visible >= 3
    erin = api("erin").get(f"{API}/approval-rules/", {"search": "training"}).json()["results"]
    assert [(r["project"], r["template_slug"]) for r in erin] == [("globex-llm", "training")]


def test_search_is_documented_only_where_a_list_searches(schema) -> None:
    paths = schema.raw_schema["paths"]

    def names(path: str) -> set[str]:
        return {p["name"] for p in paths[path]["get"].get("parameters", [])}

    assert "search" in names("/api/v1/approval-rules/") and "search" in names("/api/v1/requests/")
    assert "search" not in names("/api/v1/volumes/") and "search" not in names("/api/v1/approvals/")
    described = next(p for p in paths["/api/v1/approval-rules/"]["get"]["parameters"] if p["name"] == "search")
    assert "template_slug" in described["description"] and "project.slug" in described["description"]


# Who may read the schema ---------------------------------------------------------------------------------


def test_schema_and_docs_are_public_by_default_in_development(settings) -> None:
    assert settings.PORTAL_SCHEMA_PUBLIC is True
    anonymous = Client()
    assert anonymous.get("/api/schema/").status_code == 200
    assert anonymous.get("/api/docs/").status_code == 200
    assert anonymous.get("/api/redoc/").status_code == 200


def test_schema_and_docs_need_a_login_when_not_public(settings, cast, token_client) -> None:
    settings.PORTAL_SCHEMA_PUBLIC = False
    anonymous = Client()
    refused = anonymous.get("/api/schema/")
    assert refused.status_code == 401 and refused.json()["error"] == "not_authenticated"
    for page in ("/api/docs/", "/api/redoc/"):
        response = anonymous.get(page)
        assert response.status_code == 302 and response["Location"].startswith(f"/accounts/login/?next={page}")

    signed_in = Client()
    signed_in.force_login(cast.carol)
    assert signed_in.get("/api/schema/").status_code == 200
    assert signed_in.get("/api/docs/").status_code == 200
    token, _ = token_client("carol", cast.vision, "read")
    assert token.get("/api/schema/").status_code == 200  # a pipeline may fetch it with its token


def _schema_public(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in {"PORTAL_ENV", "PORTAL_SCHEMA_PUBLIC", "DEBUG", "SECRET_KEY"}}
    code = "import django; django.setup(); from django.conf import settings; print(settings.PORTAL_SCHEMA_PUBLIC)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean | env | {"DJANGO_SETTINGS_MODULE": "portal.settings"},
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_schema_public_setting_defaults() -> None:
    production = {"PORTAL_ENV": "production", "DEBUG": "0", "SECRET_KEY": "k" * 50}
    assert _schema_public() == "True"
    assert _schema_public(**production) == "False"
    assert _schema_public(**production, PORTAL_SCHEMA_PUBLIC="1") == "True"
    assert _schema_public(PORTAL_SCHEMA_PUBLIC="off") == "False"


def test_the_schema_declares_the_bearer_token_and_every_operation_accepts_it(client) -> None:
    """Swagger's "Authorize" takes a project token: the scheme is declared, and each operation that needs a
    login lists it beside the session cookie (the schema's own endpoints and the token-free ones excepted)."""
    document = client.get("/api/schema/?format=json").json()
    schemes = document["components"]["securitySchemes"]
    bearer = [name for name, s in schemes.items() if s.get("type") == "http" and s.get("scheme") == "bearer"]
    assert bearer == ["projectToken"]
    missing = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            names = {name for requirement in operation.get("security", document.get("security", [])) for name in requirement}
            if path.startswith("/api/v1/") and "projectToken" not in names and names != set():
                missing.append(f"{method.upper()} {path}: {sorted(names)}")
    assert missing == [], missing
    # The request endpoints CI uses take the token.
    submit = document["paths"]["/api/v1/requests/"]["post"]
    assert {"projectToken": []} in submit["security"]


# What schemathesis' coverage phase found (FUZZ_PHASES=examples,coverage,fuzzing) ------------------------------


def test_a_cluster_without_a_kubeconfig_is_a_documented_409(api, cast, cat, schema) -> None:
    """The namespace of a project on a cluster without a kubeconfig was a 500 (ValueError from portal.kube): it is a
    409 naming the reason (a 503 would say "retry later", which would not help)."""
    ops = api("ops")
    response = ops.get(f"{API}/clusters/lab/projects/{cast.vision.slug}/namespace/")
    assert response.status_code == 409, response.content
    body = conforms(schema, "GET", "/api/v1/clusters/{cluster}/projects/{slug}/namespace/", response)
    assert body["error"] == "conflict" and "lab" in body["detail"] and "kubeconfig" in body["detail"]
    adopt = ops.post(f"{API}/clusters/lab/projects/{cast.vision.slug}/namespace/adopt/", {"confirm": 0}, format="json")
    assert adopt.status_code == 409, adopt.content
    conforms(schema, "POST", "/api/v1/clusters/{cluster}/projects/{slug}/namespace/adopt/", adopt)
    assert ops.get(f"{API}/clusters/lab/projects/no-such-project/namespace/").status_code == 404


def test_an_empty_tail_is_the_default_tail(api, cast, cat, schema) -> None:
    req = make_request(cat, cast.vision, cast.carol, state="running")
    carol = api("carol")
    for query in ({"tail": ""}, {}):
        response = carol.get(f"{API}/requests/{req.pk}/logs/", query)
        assert response.status_code == 200, response.content
        conforms(schema, "GET", "/api/v1/requests/{id}/logs/", response)
    assert carol.get(f"{API}/requests/{req.pk}/logs/", {"tail": "0"}).status_code == 400


def test_template_filters_read_as_the_schema_says(api, cast, cat, schema) -> None:
    """``?versions=`` has one value (anything else was ignored); ``?project=`` naming a project one may not submit
    in offers no flavor (it was a 400 on a read)."""
    ops, carol = api("ops"), api("carol")
    wrong = ops.get(f"{API}/templates/", {"versions": "-58800"})
    assert wrong.status_code == 400 and "versions" in conforms(schema, "GET", "/api/v1/templates/", wrong)["fields"]
    assert ops.get(f"{API}/templates/", {"versions": ""}).status_code == 200
    assert ops.get(f"{API}/templates/", {"versions": "all"}).status_code == 200
    for slug in ("no-such-project", cast.llm.slug):  # unknown, and another tenant's
        listed = conforms(schema, "GET", "/api/v1/templates/", carol.get(f"{API}/templates/", {"project": slug}))
        assert listed["results"] and all(t["allowed_flavors"] == [] for t in listed["results"])
        one = conforms(schema, "GET", "/api/v1/templates/{id}/", carol.get(f"{API}/templates/training/", {"project": slug}))
        assert one["allowed_flavors"] == []
    mine = carol.get(f"{API}/templates/training/", {"project": cast.vision.slug}).json()
    assert mine["allowed_flavors"]


def test_the_architecture_to_plan_for_is_one_of_the_reference_ones(schema) -> None:
    operation = schema.raw_schema["paths"]["/api/v1/clusters/{id}/architecture/"]["get"]
    parameter = next(p for p in operation["parameters"] if p["name"] == "architecture")
    assert set(parameter["schema"]["enum"]) == set(Architecture.values) and len(Architecture.values) >= 4
    assert "503" in operation["responses"]
    for path, method in [("/api/v1/requests/", "post"), ("/api/v1/requests/{id}/clone/", "post"),
                         ("/api/v1/clusters/{cluster}/projects/{slug}/namespace/", "get")]:
        response = schema.raw_schema["paths"][path][method]["responses"]["503"]
        assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}

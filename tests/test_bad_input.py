"""Bad input is a 400 with field errors or a 404, never a 500: API and pages, real PostgreSQL.

Each case once caused a server error: time-zone offsets PostgreSQL refuses, Unicode digits where an
id is expected, NUL characters (PostgreSQL text and jsonb cannot hold them) in paths, query strings,
JSON bodies and headers.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from workloads.models import WorkloadRequest

from .workloads.factories import make_catalogue, make_request

pytestmark = [pytest.mark.django_db]

API = "/api/v1"
TRAIN = {"template": "training", "flavor": "h100", "parameters": {"command": "python train.py"}}


@pytest.fixture
def cat(cast):
    return make_catalogue(cast)


def field_error(response, field: str) -> list[str]:
    assert response.status_code == 400, (response.status_code, response.content[:500])
    body = response.json()
    assert body["error"] == "invalid", body
    assert field in body["fields"], body
    return body["fields"][field]


# Time-zone offsets -------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", ["+99:00", "+20:00", "-16:00", "+16:00"])
@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/requests/", "created_after"),
        ("/requests/", "created_before"),
        ("/approvals/", "created_after"),
        ("/audit/", "since"),
        ("/audit/", "until"),
    ],
)
def test_api_date_filter_with_out_of_range_offset_is_a_field_error(api, offset, path, field) -> None:
    response = api("ops").get(f"{API}{path}", {field: f"2026-01-01T00:00:00{offset}"})
    messages = field_error(response, field)
    assert any("offset" in message for message in messages), messages


@pytest.mark.parametrize("offset", ["+15:59", "-15:59", "+05:30", "Z"])
def test_api_date_filter_accepts_offsets_postgresql_accepts(api, offset) -> None:
    assert api("ops").get(f"{API}/requests/", {"created_after": f"2026-01-01T00:00:00{offset}"}).status_code == 200


@pytest.mark.parametrize(
    ("page", "field"), [("/requests/", "created_after"), ("/ops/requests/", "created_before"), ("/ops/audit/", "since")]
)
def test_page_date_filter_with_out_of_range_offset_is_not_a_server_error(as_user, page, field) -> None:
    response = as_user("ops").get(page, {field: "2026-01-01T00:00:00+20:00"})
    assert response.status_code in (200, 400), response.status_code


def test_token_expiry_with_out_of_range_offset_is_a_field_error(api, cast) -> None:
    body = {"name": "ci", "project": "acme-vision", "expires_at": "2026-12-01T00:00:00+20:00"}
    response = api("carol").post(f"{API}/tokens/", body, format="json")
    assert "offset" in " ".join(field_error(response, "expires_at"))


def test_quota_request_until_with_out_of_range_offset_is_a_field_error(api, cat) -> None:
    body = {"project": "acme-vision", "flavor": "h100", "amount": "1", "reason": "more", "until": "2027-01-01T00:00:00-18:00"}
    response = api("carol").post(f"{API}/quota-requests/", body, format="json")
    assert "offset" in " ".join(field_error(response, "until"))


# Unicode digits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["²", "١٢", "𝟙", "1²"])
@pytest.mark.parametrize("collection", ["tenants", "projects", "templates", "clusters"])
def test_api_unicode_digits_in_id_or_slug_are_404(api, cat, collection, key) -> None:
    response = api("ops").get(f"{API}/{collection}/{key}/")
    assert response.status_code == 404, response.content[:300]
    assert response.json()["error"] == "not_found"


@pytest.mark.parametrize("key", ["²", "١"])
def test_api_unicode_digits_as_flavor_or_template_are_field_errors(api, cat, key) -> None:
    client = api("ops")
    quota = {"project": "acme-vision", "flavor": key, "nominal": "1"}
    assert field_error(client.post(f"{API}/quotas/", quota, format="json"), "flavor")
    ask = {"project": "acme-vision", "flavor": key, "amount": "1", "reason": "more"}
    assert field_error(client.post(f"{API}/quota-requests/", ask, format="json"), "flavor")
    submit = TRAIN | {"project": "acme-vision", "template": key}
    assert field_error(client.post(f"{API}/requests/", submit, format="json"), "template")


def test_pages_unicode_digits_are_not_server_errors(as_user, cast, cat) -> None:
    client = as_user("alice")
    assert client.get("/requests/new/", {"template": "²"}).status_code in (200, 404)
    assert client.get(f"/tenants/{cast.acme.slug}/quotas/", {"edit": "²"}).status_code == 200


# NUL characters ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/tenants/acme%00/", "/projects/acme-vision%00/", "/templates/training%00/", "/clusters/lab%00/",
        "/projects/acme-vision%00/quota/", "/requests/1%00/", "/memberships/%00/",
    ],
)
def test_api_nul_in_path_is_404(api, cat, path) -> None:
    response = api("ops").get(f"{API}{path}")
    assert response.status_code == 404, response.content[:300]
    assert response.json()["error"] == "not_found"


@pytest.mark.parametrize("page", ["/ops/clusters/lab%00/", "/ops/clusters/%00/settings/"])
def test_page_nul_in_path_is_404(as_user, cat, page) -> None:
    assert as_user("ops").get(page).status_code == 404


@pytest.mark.parametrize(
    ("path", "field"),
    [("/tenants/", "slug"), ("/projects/", "tenant"), ("/requests/", "q"), ("/audit/", "actor"), ("/clusters/", "name")],
)
def test_api_nul_in_query_is_a_field_error(api, cat, path, field) -> None:
    response = api("ops").get(f"{API}{path}", {field: "a\x00b"})
    assert "NUL" in " ".join(field_error(response, field))


@pytest.mark.parametrize(("page", "field"), [("/requests/", "q"), ("/ops/tenants/", "q"), ("/ops/audit/", "actor")])
def test_page_nul_in_query_is_400(as_user, page, field) -> None:
    assert as_user("ops").get(page, {field: "a\x00b"}).status_code == 400


@pytest.mark.parametrize(
    "parameters",
    [{"command": "python\x00train.py"}, {"command": "python train.py", "args": ["--a\x00"]}, {"command": "x", "env\x00": "1"}],
)
def test_api_nul_in_request_parameters_is_a_field_error(api, cat, parameters) -> None:
    response = api("carol").post(f"{API}/requests/", TRAIN | {"project": "acme-vision", "parameters": parameters}, format="json")
    assert "NUL" in " ".join(field_error(response, "parameters"))
    assert not WorkloadRequest.objects.exists()


def test_api_nul_in_other_json_fields_is_a_field_error(api, cat) -> None:
    client = api("ops")
    assert field_error(client.post(f"{API}/requests/", TRAIN | {"project": "acme-vision", "name": "a\x00"}, format="json"), "name")
    flavor = {"cluster": "lab", "name": "x", "display_name": "X", "kind": "cpu", "node_labels": {"a": "b\x00"}}
    assert field_error(client.post(f"{API}/flavors/", flavor, format="json"), "node_labels")
    template = {"kind": "training", "slug": "t2", "name": "T", "parameters_schema": {"type": "object", "title": "\x00"}}
    assert field_error(client.post(f"{API}/templates/", template, format="json"), "parameters_schema")


def test_api_nul_in_idempotency_key_is_a_field_error(api, cat) -> None:
    response = api("carol").post(
        f"{API}/requests/", TRAIN | {"project": "acme-vision"}, format="json", headers={"Idempotency-Key": "build\x007"}
    )
    assert "NUL" in " ".join(field_error(response, "Idempotency-Key"))
    assert not WorkloadRequest.objects.exists()


def test_api_nul_in_bearer_token_is_401(cat) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer gpp_\x00abc")
    assert client.get(f"{API}/projects/").status_code in (400, 401)


# Without the middleware, the serializers and lookups refuse NUL themselves -------------------------


@pytest.fixture
def without_nul_guard(settings) -> None:
    settings.MIDDLEWARE = [name for name in settings.MIDDLEWARE if name != "portal.inputs.NulGuardMiddleware"]


@pytest.mark.usefixtures("without_nul_guard")
def test_serializers_and_lookups_refuse_nul_without_the_middleware(api, cat) -> None:
    client = api("carol")
    body = TRAIN | {"project": "acme-vision", "parameters": {"command": "a", "args": ["\x00"]}}
    assert "args.0" in " ".join(field_error(client.post(f"{API}/requests/", body, format="json"), "parameters"))
    response = client.post(f"{API}/requests/", TRAIN | {"project": "acme-vision"}, format="json", headers={"Idempotency-Key": "\x00"})
    assert field_error(response, "Idempotency-Key")
    for path in ["/tenants/acme%00/", "/templates/training%00/", "/clusters/lab%00/"]:
        assert client.get(f"{API}{path}").status_code == 404
    assert not WorkloadRequest.objects.exists()


# What schemathesis found: input the schema calls invalid is refused, not ignored or coerced ---------


@pytest.mark.parametrize(("path", "query"), [("/flavors/", {"active": "-58800"}), ("/requests/", {"mine": "maybe"}), ("/tokens/", {"active": "x"})])
def test_api_boolean_filter_with_nonsense_is_a_field_error(api, cat, path, query) -> None:
    assert field_error(api("ops").get(f"{API}{path}", query), next(iter(query)))


def test_api_boolean_filter_reads_true_and_false(api, cat) -> None:
    client = api("ops")
    assert client.get(f"{API}/flavors/", {"active": "true"}).json()["count"] == 3
    assert client.get(f"{API}/flavors/", {"active": "false"}).json()["count"] == 0


@pytest.mark.parametrize("size", ["null", "0", "-1", "²", "1.5"])
def test_api_page_size_must_be_a_whole_number_from_1(api, cat, size) -> None:
    assert field_error(api("ops").get(f"{API}/flavors/", {"page_size": size}), "page_size")


def test_api_page_size_over_the_maximum_is_the_maximum(api, cat) -> None:
    assert api("ops").get(f"{API}/flavors/", {"page_size": "9" * 30}).status_code == 200


def test_api_unknown_route_is_a_json_404(api, cat) -> None:
    response = api("ops").get(f"{API}/flavors/0.5/")
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "detail": "Not found."}


def test_api_values_of_the_wrong_json_type_are_field_errors(api, cast, cat) -> None:
    client = api("ops")
    response = client.post(f"{API}/tenants/", {"name": "X", "slug": "x", "cost_centre": 0}, format="json")
    assert field_error(response, "cost_centre") == ["Must be a string."]
    response = client.post(f"{API}/clusters/", {"name": "c2", "use_mig": "yes"}, format="json")
    assert field_error(response, "use_mig") == ["Must be true or false."]
    running = make_request(cat, cast.vision, cast.carol, state="running")
    response = client.post(f"{API}/requests/{running.pk}/extend/", {"hours": "4"}, format="json")
    assert field_error(response, "hours") == ["Must be a whole number."]
    response = client.post(f"{API}/flavors/", {"cluster": "lab", "name": "f", "kind": "cpu", "node_labels": None}, format="json")
    assert field_error(response, "node_labels")
    response = client.post(f"{API}/flavors/", {"cluster": 0, "name": "f", "kind": "cpu"}, format="json")
    assert field_error(response, "cluster") == ["Must be a string."]
    quota = cat.h100.quotas.filter(project=cast.vision).get()
    response = client.patch(f"{API}/quotas/{quota.pk}/", {"lending_limit": ""}, format="json")
    assert field_error(response, "lending_limit") == ["Must be a number."]
    # Ids may be numbers where the schema says "id or name" (409: past validation, over capacity).
    response = client.post(f"{API}/quotas/", {"tenant": "acme", "flavor": cat.h100.pk, "nominal": 1}, format="json")
    assert response.status_code in (200, 201, 409), response.content
    assert "fields" not in response.json() or "flavor" not in response.json()["fields"]


def test_api_empty_multiple_choice_filter_is_no_filter(api, cat) -> None:
    assert api("ops").get(f"{API}/requests/", {"state": ""}).status_code == 200
    assert field_error(api("ops").get(f"{API}/requests/", {"state": "nonsense"}), "state")


# Lone surrogates and nesting too deep: valid JSON that no database or parser can take ---------------
# "\ud800" is a legal JSON escape that decodes to no text (PostgreSQL, psycopg and the page renderer all
# fail on it); 100,000 "[" overflow Python's parser (RecursionError). Each was a 500 before.

SURROGATE_VALUE = b'{"template": "training", "flavor": "h100", "project": "acme-vision", "parameters": {"command": "\\ud800"}}'
SURROGATE_KEY = b'{"template": "training", "flavor": "h100", "project": "acme-vision", "parameters": {"command": "x", "\\udfff": "1"}}'
SURROGATE_PRESET = b'{"name": "p", "template": "training", "project": "acme-vision", "parameters": {"command": "\\ud800"}}'
DEEP = b"[" * 100_000


def post_raw(client, path: str, body: bytes):
    return client.post(f"{API}{path}", body, content_type="application/json")


@pytest.fixture(params=["middleware", "parser"])
def json_guard(request, settings) -> str:
    """Each case twice: as deployed, and with the API's parser alone (the middleware taken out)."""
    if request.param == "parser":
        settings.MIDDLEWARE = [name for name in settings.MIDDLEWARE if name != "portal.inputs.NulGuardMiddleware"]
    return request.param


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [("/requests/", SURROGATE_VALUE, "parameters.command"), ("/requests/", SURROGATE_KEY, "parameters.\\udfff"),
     ("/presets/", SURROGATE_PRESET, "parameters.command")],
)
def test_api_lone_surrogate_in_parameters_is_a_field_error(api, cat, json_guard, path, body, where) -> None:
    from workloads.models import RequestPreset

    response = post_raw(api("carol"), path, body)
    message = " ".join(field_error(response, "parameters"))
    assert "surrogate" in message and f"(at {where})" in message, message
    assert not WorkloadRequest.objects.exists() and not RequestPreset.objects.exists()


def test_api_lone_surrogate_in_any_json_field_is_a_field_error(api, cat, json_guard) -> None:
    client = api("ops")
    assert "surrogate" in " ".join(field_error(post_raw(client, "/tenants/", b'{"name": "\\ud83d", "slug": "x"}'), "name"))
    assert field_error(post_raw(client, "/tokens/", b'{"name": "ci\\udc00", "project": "acme-vision"}'), "name")
    # A pair that makes one character is text, and is taken.
    response = post_raw(api("carol"), "/requests/", SURROGATE_VALUE.replace(b"\\ud800", b"\\ud83d\\ude80"))
    assert response.status_code == 201, response.content[:300]


@pytest.mark.parametrize("path", ["/requests/", "/presets/", "/tokens/", "/tenants/", "/quota-requests/", "/flavors/"])
def test_api_json_nested_too_deep_is_a_400_everywhere(api, cat, json_guard, path) -> None:
    messages = field_error(post_raw(api("ops"), path, DEEP), "non_field_errors")
    assert "nested more than 64 levels" in " ".join(messages), messages
    # Deep inside a field: the field is named.
    body = b'{"name": "p", "template": "training", "project": "acme-vision", "parameters": {"a": ' + b"[" * 70 + b"]" * 70 + b"}}"
    assert "parameters.a" in " ".join(field_error(post_raw(api("carol"), "/presets/", body), "parameters"))


def test_page_json_body_with_surrogate_or_deep_nesting_is_400(as_user, cat) -> None:
    client = as_user("carol")
    for body in (DEEP, SURROGATE_VALUE):
        assert client.post("/requests/new/", body, content_type="application/json").status_code == 400


def test_page_json_fields_refuse_surrogates_and_deep_nesting(as_user, cat) -> None:
    client = as_user("ops")
    flavor = {"flavor-cluster": str(cat.h100.cluster_id), "flavor-name": "x1", "flavor-kind": "cpu", "flavor-order": "100",
              "flavor-hami_memory_mib": "0", "flavor-hami_cores_percent": "0"}
    for text, message in (('{"a": "\\ud800"}', "surrogate"), ("[" * 100_000, "nested more than 64")):
        response = client.post("/ops/flavors/new/", flavor | {"flavor-node_labels": text})
        assert response.status_code == 200 and message in response.content.decode()
        assert 'id="id_flavor-node_labels_error"' in response.content.decode()
    from tests.workloads.test_ops_pages import template_form

    for text, message in (('{"type": "object", "title": "\\udfff"}', "surrogate"), ("[" * 100_000, "nested more than 64")):
        response = client.post("/ops/templates/new/", template_form(cat, parameters_schema=text))
        assert response.status_code == 200 and message in response.content.decode()

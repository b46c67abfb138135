"""Idempotency-Key over the API: a retry with the same body replays the first request (200), the key
sent again with a different body is a client bug answered 422 ``idempotency_key_reused``."""

from __future__ import annotations

import re

import pytest

from workloads.models import WorkloadRequest

pytestmark = [pytest.mark.django_db]

API = "/api/v1"
TRAIN = {"template": "training", "flavor": "h100", "project": "acme-vision",
         "parameters": {"command": "python train.py", "env": {"A": "1", "B": "2"}}}


def post(client, body: dict, key: str):
    return client.post(f"{API}/requests/", body, format="json", headers={"Idempotency-Key": key})


def assert_reused(response) -> None:
    assert response.status_code == 422, response.content
    body = response.json()
    assert body["error"] == "idempotency_key_reused"
    assert "different request body" in body["detail"]
    assert "Idempotent-Replayed" not in response


def test_same_body_replays_the_first_request(api, cat) -> None:
    client = api("carol")
    first = post(client, TRAIN, "build-1")
    assert first.status_code == 201, first.content
    # The same body, its JSON keys in another order: the same submission.
    reordered = {"parameters": {"env": {"B": "2", "A": "1"}, "command": "python train.py"},
                 "project": "acme-vision", "flavor": "h100", "template": "training"}
    again = post(client, reordered, "build-1")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert WorkloadRequest.objects.count() == 1


@pytest.mark.parametrize(
    "change",
    [
        {"gpus": 2},
        {"parameters": {"command": "python train.py --lr 0.1"}},
        {"duration_hours": 2},
        {"name": "other-name"},
        {"priority": "production"},
        {"project": "acme-nlp"},
        {"template": "notebook", "parameters": {}},
    ],
    ids="+".join,
)
def test_the_key_with_a_different_body_is_422(api, cat, change) -> None:
    client = api("carol")
    first = post(client, TRAIN, "build-2")
    assert first.status_code == 201, first.content
    assert_reused(post(client, TRAIN | change, "build-2"))
    assert WorkloadRequest.objects.count() == 1
    assert WorkloadRequest.objects.get().gpus == first.json()["gpus"]
    # The first body still replays; a new key submits the changed one.
    assert post(client, TRAIN, "build-2").status_code == 200


def test_a_token_retry_is_compared_too(token_client, cast, cat) -> None:
    client, _ = token_client("carol", cast.vision, "read+submit")
    assert post(client, TRAIN, "pipeline-9").status_code == 201
    assert post(client, TRAIN, "pipeline-9").status_code == 200
    assert_reused(post(client, TRAIN | {"gpus": 2}, "pipeline-9"))


def test_rows_from_before_fingerprints_compare_project_and_template(api, cat) -> None:
    client = api("carol")
    first = post(client, TRAIN, "old-key")
    assert first.status_code == 201
    assert WorkloadRequest.objects.get().idempotency_fingerprint  # recorded for new rows
    WorkloadRequest.objects.update(idempotency_fingerprint="")  # as a row made before the field existed
    # Only project and template can be compared: another GPU count replays, as it did then.
    again = post(client, TRAIN | {"gpus": 2}, "old-key")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert_reused(post(client, TRAIN | {"project": "acme-nlp"}, "old-key"))
    assert WorkloadRequest.objects.count() == 1


def test_openapi_declares_the_422(client) -> None:
    schema = client.get("/api/schema/?format=json").json()
    response = schema["paths"]["/api/v1/requests/"]["post"]["responses"]["422"]
    assert "idempotency_key_reused" in response["description"]
    assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


def test_the_form_sent_again_with_other_values_gets_a_new_key(as_user, cat) -> None:
    from .test_views import training_form

    client = as_user("carol")
    assert client.post("/requests/new/?template=training", training_form(cat, idempotency_key="form-77")).status_code == 302
    # The back button, another GPU count, send: not the first request silently, not a dead end.
    edited = training_form(cat, idempotency_key="form-77", gpus="2")
    page = client.post("/requests/new/?template=training", edited)
    assert page.status_code == 200 and WorkloadRequest.objects.count() == 1
    body = page.content.decode()
    assert "already sent with other values" in body
    fresh = re.search(r'name="idempotency_key" value="(\w+)"', body).group(1)
    assert fresh != "form-77"
    again = client.post("/requests/new/?template=training", edited | {"idempotency_key": fresh})
    assert again.status_code == 302 and WorkloadRequest.objects.count() == 2
    assert WorkloadRequest.objects.get(idempotency_key=fresh).gpus == 2


# A submission with a key goes ahead without first looking for the call it may repeat; a refusal looks for it.
def test_a_retry_gets_the_first_request_even_where_a_new_one_would_now_be_refused(api, cast, cat) -> None:
    from quotas.services import quota_set
    from tenants.access import Actor

    client = api("carol")
    first = post(client, TRAIN | {"gpus": 8, "name": "big-run"}, "deadline-1")
    assert first.status_code == 201, first.content
    # The project's quota is cut to 2 since: 8 GPUs could never run there now.
    quota_set(actor=Actor(user=cast.ops), project=cast.vision, flavor=cat.h100, resource="nvidia.com/gpu", nominal=2,
              borrowing_limit=0)
    fresh = post(client, TRAIN | {"gpus": 8, "name": "big-run-2"}, "deadline-2")
    assert fresh.status_code == 400 and "gpus" in fresh.json()["fields"], fresh.content
    again = post(client, TRAIN | {"gpus": 8, "name": "big-run"}, "deadline-1")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true", again.content
    assert again.json()["id"] == first.json()["id"]
    # A different body under the key is still the client's mistake, refused or not.
    assert_reused(post(client, TRAIN | {"gpus": 9, "name": "big-run"}, "deadline-1"))
    assert WorkloadRequest.objects.filter(requested_by=cast.carol).count() == 1


def test_a_taken_name_is_named_with_the_other_errors(api, cat) -> None:
    client = api("carol")
    assert post(client, TRAIN | {"name": "nightly"}, "night-1").status_code == 201
    # The name is held by a live request, and the duration is out of bounds: both are said at once.
    refused = post(client, TRAIN | {"name": "nightly", "duration_hours": 10_000}, "night-2")
    assert refused.status_code == 400, refused.content
    fields = refused.json()["fields"]
    assert fields["name"] == ["nightly is already in use by an active request in acme-vision."]
    assert "duration_hours" in fields
    # Only the name: the constraint refuses the row, and the answer says why.
    taken = post(client, TRAIN | {"name": "nightly"}, "night-3")
    assert taken.status_code == 400 and list(taken.json()["fields"]) == ["name"], taken.content
    assert WorkloadRequest.objects.count() == 1

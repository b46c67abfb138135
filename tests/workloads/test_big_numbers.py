"""Numbers too large to hold are refused as too large, not as missing: ``cpu=1e309`` on the request
form (a browser would send an ``<input type="number">`` it cannot hold as empty) and in the API
(JSON ``1e309`` reads as infinity)."""

from __future__ import annotations

import re

import pytest

from workloads.models import WorkloadRequest

from .test_views import text, training_form

pytestmark = pytest.mark.django_db

API = "/api/v1/requests/"


def field_error(response, field: str) -> str:
    found = re.search(rf'id="id_{field}_error"[^>]*>(.*?)</ul>', text(response), re.S)
    return re.sub(r"<[^>]+>", "", found.group(1)).strip() if found else ""


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cpu", "1e309", "This number is too large (at most 64)."),
    ("cpu", "-1e309", "This number is too small."),
    ("gpus", "1e309", "This number is too large (at most 8)."),
    ("memory_gib", "99999999999999999999", "Between 1 and 512 GiB for Training job."),
    ("memory_gib", "1e309", "This number is too large (at most 512)."),
    ("duration_hours", "1e400", "This number is too large (at most 72)."),
    ("param_retries", "1e309", "This number is too large (at most 10)."),
])
def test_the_form_says_too_large(as_user, cat, field, value, message) -> None:
    response = as_user("carol").post("/requests/new/?template=training", training_form(cat, **{field: value}))
    assert response.status_code == 200
    assert field_error(response, field) == message
    assert "required" not in field_error(response, field)
    assert not WorkloadRequest.objects.exists()


def test_number_fields_are_text_inputs_so_the_browser_sends_what_was_typed(as_user, cat) -> None:
    body = text(as_user("carol").get("/requests/new/?template=training"))
    for name, mode in (("cpu", "decimal"), ("gpus", "numeric"), ("memory_gib", "numeric"), ("param_retries", "numeric")):
        tag = re.search(rf'<input[^>]*name="{name}"[^>]*>', body).group(0)
        assert 'type="text"' in tag and f'inputmode="{mode}"' in tag, tag


@pytest.mark.parametrize(("raw", "field", "message"), [
    ('"cpu": 1e309', "cpu", "This number is too large (at most 9999.99)."),
    ('"cpu": "1e309"', "cpu", "This number is too large (at most 9999.99)."),
    ('"cpu": -1e309', "cpu", "This number is too small."),
    ('"gpus": 1e309', "gpus", "This number is too large (at most 2147483647)."),
    ('"memory_gib": 100000000000000000000', "memory_gib", "This number is too large (at most 2147483647)."),
    ('"parameters": {"command": "x", "retries": 1e309}', "parameters", "This number is too large (at retries)."),
])
def test_the_api_says_too_large(api, cat, raw, field, message) -> None:
    body = '{"template": "training", "project": "acme-vision", "flavor": "h100", "parameters": {"command": "x"}, ' + raw + '}'
    if raw.startswith('"parameters"'):
        body = '{"template": "training", "project": "acme-vision", "flavor": "h100", ' + raw + '}'
    response = api("carol").post(API, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["fields"].get(field) == [message], response.json()
    assert not WorkloadRequest.objects.exists()

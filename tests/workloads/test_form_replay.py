"""A replayed request form (Back and send again, a double click, a reload of the POST) makes one
request: the form's one-time token is its idempotency key (portal/forms.py)."""

from __future__ import annotations

import re

import pytest

from workloads.models import WorkloadRequest

from .test_views import text, training_form

pytestmark = pytest.mark.django_db


def fresh_key(client) -> str:
    body = text(client.get("/requests/new/?template=training"))
    return re.search(r'name="idempotency_key" value="([^"]+)"', body).group(1)


def test_an_unnamed_form_sent_twice_makes_one_request(as_user, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    client = as_user("carol")
    data = training_form(cat, name="", idempotency_key=fresh_key(client))
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post("/requests/new/?template=training", data)
        assert first.status_code == 302
        again = client.post("/requests/new/?template=training", data, follow=True)
    req = WorkloadRequest.objects.get()
    assert first["Location"] == f"/requests/{req.pk}/" and again.redirect_chain[-1][0] == f"/requests/{req.pk}/"
    assert f"This form was already sent: here is request {req.name}." in text(again)
    assert len(hooks_called) == 1  # materialized once


def test_the_replayed_form_with_other_values_asks_before_a_second_request(as_user, cat) -> None:
    client = as_user("carol")
    key = fresh_key(client)
    client.post("/requests/new/?template=training", training_form(cat, idempotency_key=key))
    response = client.post("/requests/new/?template=training", training_form(cat, idempotency_key=key, gpus="2"))
    assert response.status_code == 200
    body = text(response)
    assert "already sent with other values" in body
    new_key = re.search(r'name="idempotency_key" value="([^"]+)"', body).group(1)
    assert new_key != key and WorkloadRequest.objects.count() == 1
    client.post("/requests/new/?template=training", training_form(cat, idempotency_key=new_key, gpus="2"))
    assert sorted(WorkloadRequest.objects.values_list("gpus", flat=True)) == [1, 2]


def test_a_form_with_errors_can_be_fixed_and_sent_with_its_token(as_user, cat) -> None:
    client = as_user("carol")
    key = fresh_key(client)
    bad = client.post("/requests/new/?template=training", training_form(cat, idempotency_key=key, cpu="1e309"))
    assert "This number is too large (at most 64)." in text(bad)
    good = client.post("/requests/new/?template=training", training_form(cat, idempotency_key=key))
    assert good.status_code == 302 and WorkloadRequest.objects.count() == 1

"""Offered must be enforced: a flavor the cluster's architecture does not enforce is never offered to a
researcher, and a submission for it is refused at once with the reason and what would make it possible.

The catalogue's cluster runs C (whole GPUs + MIG); switching it to B (whole GPUs only, the old demo's
start) leaves its MIG flavor offered by the templates but enforced by nothing.
"""

from __future__ import annotations

import re

import pytest

from quotas.models import Cluster
from workloads.models import WorkloadRequest

from .test_views import text, training_form

pytestmark = pytest.mark.django_db
API = "/api/v1"


@pytest.fixture
def on_b(cat):
    Cluster.objects.filter(pk=cat.cluster.pk).update(architecture="B", use_mig=False)
    cat.cluster.refresh_from_db()
    return cat


def test_api_refuses_an_unenforced_flavor_at_once_with_the_reason(api, on_b, hooks_called) -> None:
    body = {"project": "acme-vision", "template": "notebook", "flavor": on_b.mig.name, "gpus": 1,
            "parameters": {}, "duration_hours": 2}
    response = api("carol").post(f"{API}/requests/", body, format="json")
    assert response.status_code == 400, response.content
    message = " ".join(response.json()["fields"]["flavor"])
    assert "not enforced" in message and "architecture B" in message
    assert "architecture C" in message  # what would make it possible
    assert not WorkloadRequest.objects.exists() and hooks_called == []


def test_the_same_flavor_is_accepted_once_the_architecture_enforces_it(api, cat) -> None:
    body = {"project": "acme-vision", "template": "notebook", "flavor": cat.mig.name, "gpus": 1,
            "parameters": {}, "duration_hours": 2}
    response = api("carol").post(f"{API}/requests/", body, format="json")
    assert response.status_code == 201, response.content


def test_default_flavor_skips_unenforced_ones(api, on_b) -> None:
    # The template's first allowed flavor would be the MIG one if it came first: it must never be picked.
    on_b.mig.order = 1
    on_b.mig.save()
    body = {"project": "acme-vision", "template": "notebook", "gpus": 1, "parameters": {}, "duration_hours": 2}
    response = api("carol").post(f"{API}/requests/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["flavor"] == on_b.h100.name


def test_form_never_offers_it_and_refuses_a_forged_post_with_the_reason(as_user, on_b) -> None:
    client = as_user("carol")
    body = text(client.get("/requests/new/?template=training&project=acme-vision"))
    options = re.findall(r'<option value="(\d+)"[^>]*>([^<]*)</option>', body)
    offered = {pk for pk, _label in options}
    assert str(on_b.h100.pk) in offered and str(on_b.mig.pk) not in offered
    response = client.post("/requests/new/?template=training", training_form(on_b, flavor=str(on_b.mig.pk)))
    page = text(response)
    error = re.search(r'<ul class="errorlist" id="id_flavor_error">(.*?)</ul>', page, re.S)
    assert error is not None
    assert "not enforced" in error.group(1) and "architecture C" in error.group(1)
    assert not WorkloadRequest.objects.exists()


def test_catalogue_lists_only_enforced_flavors_to_researchers(api, as_user, on_b) -> None:
    templates = api("carol").get(f"{API}/templates/").json()["results"]
    for template in templates:
        names = {f["name"] for f in template["allowed_flavors"]}
        assert on_b.mig.name not in names and on_b.h100.name in names
    # Ops still see every allowed flavor, marked.
    ops = api("ops").get(f"{API}/templates/").json()["results"]
    flavors = {f["name"]: f for f in ops[0]["allowed_flavors"]}
    assert flavors[on_b.mig.name]["enforced"] is False and flavors[on_b.h100.name]["enforced"] is True
    picker = text(as_user("carol").get("/requests/new/?project=acme-vision"))
    assert "A100 1g.10gb" not in picker and "H100 80GB" in picker


def test_flavors_api_hides_it_from_researchers_and_explains_it_to_ops(api, on_b) -> None:
    mine = {f["name"] for f in api("carol").get(f"{API}/flavors/").json()["results"]}
    assert on_b.mig.name not in mine and on_b.h100.name in mine
    rows = {f["name"]: f for f in api("ops").get(f"{API}/flavors/").json()["results"]}
    assert rows[on_b.h100.name]["enforced"] is True
    mig = rows[on_b.mig.name]
    assert mig["enforced"] is False
    assert "offered but not enforced" in mig["enforcement"]["reason"]
    assert "architecture C" in mig["enforcement"]["remedy"]

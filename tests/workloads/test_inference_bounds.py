"""Inference services' sizes and class (docs/inference.md): a minimum above the maximum, or above the template's
bounds, is refused (form, API, scale) and nothing is saved; inference runs in the online class only."""

from __future__ import annotations

import re
from typing import Any

import pytest

from portal.labels import PRIORITY_CLASS_LABEL
from workloads.kinds import request_manifests
from workloads.models import RequestState, WorkloadRequest

from .factories import make_request

pytestmark = [pytest.mark.django_db]

API = "/api/v1"
S = RequestState
SERVE = {"template": "inference", "project": "acme-vision", "flavor": "h100", "image": "vllm/vllm-openai:v0.12.0",
         "duration_hours": 4}


def submit(api, **body: Any):
    return api("carol").post(f"{API}/requests/", {**SERVE, **body}, format="json")


def inference_form(cat, **overrides: Any) -> dict[str, Any]:
    """What the generated inference form posts, filled in the way a person would."""
    data = {
        "project": "acme-vision", "name": "", "image": "vllm/vllm-openai:v0.12.0", "custom_image": "",
        "flavor": str(cat.h100.pk), "gpus": "1", "replicas": "2", "cpu": "4", "memory_gib": "32",
        "duration_hours": "4", "priority": "production", "idempotency_key": "",
        "param_model_uri": "hf://org/tiny-llm", "param_port": "8000", "param_readiness_path": "/health",
        "param_min_replicas": "", "param_target_requests_per_second": "5",
    }
    data.update(overrides)
    return data


def field_error(body: str, field: str) -> str:
    found = re.search(rf'<ul class="errorlist" id="id_{field}_error">(.*?)</ul>', body, re.S)
    assert found is not None, body[body.find("errorlist") - 300:body.find("errorlist") + 300]
    return found.group(1)


# ------------------------------------------------------------------------------------------------ the minimum
def test_api_refuses_a_minimum_above_the_replicas_with_a_field_error_and_saves_nothing(api, cat) -> None:
    over = submit(api, replicas=2, parameters={"model_uri": "hf://m", "min_replicas": 3})
    assert over.status_code == 400, over.content
    assert over.json()["error"] == "invalid"
    message = over.json()["fields"]["parameters.min_replicas"][0]
    assert "minimum (3) cannot be above the replicas (2)" in message
    assert not WorkloadRequest.objects.exists()
    # Equal is a fixed size; below is autoscaled: both are fine.
    assert submit(api, replicas=2, parameters={"model_uri": "hf://m", "min_replicas": 2}).status_code == 201
    made = submit(api, replicas=3, parameters={"model_uri": "hf://m", "min_replicas": 1})
    assert made.status_code == 201, made.content


def test_the_template_bounds_the_minimum_and_the_maximum(api, cat) -> None:
    schema = dict(cat.inference.parameters_schema)
    schema["x-max-replicas"] = 3
    schema["properties"] = {**schema["properties"],
                            "min_replicas": {**schema["properties"]["min_replicas"], "maximum": 2}}
    cat.inference.parameters_schema = schema
    cat.inference.save(update_fields=["parameters_schema"])
    too_many = submit(api, replicas=4, parameters={"model_uri": "hf://m", "min_replicas": 1})
    assert too_many.status_code == 400 and "At most 3 replicas" in too_many.json()["fields"]["replicas"][0]
    high_floor = submit(api, replicas=3, parameters={"model_uri": "hf://m", "min_replicas": 3})
    assert high_floor.status_code == 400 and "parameters.min_replicas" in high_floor.json()["fields"]
    assert not WorkloadRequest.objects.exists()
    assert submit(api, replicas=3, parameters={"model_uri": "hf://m", "min_replicas": 2}).status_code == 201


def test_the_form_refuses_a_minimum_above_the_replicas_next_to_its_field(as_user, cat, hooks_called) -> None:
    response = as_user("carol").post("/requests/new/?template=inference",
                                     inference_form(cat, replicas="2", param_min_replicas="5"))
    assert response.status_code == 200
    assert "minimum (5) cannot be above the replicas (2)" in field_error(response.content.decode(), "param_min_replicas")
    assert not WorkloadRequest.objects.exists() and hooks_called == []
    ok = as_user("carol").post("/requests/new/?template=inference", inference_form(cat, param_min_replicas="1"))
    assert ok.status_code == 302, field_error(ok.content.decode(), "param_min_replicas")
    assert WorkloadRequest.objects.get().parameters["min_replicas"] == 1


def test_scaling_below_the_minimum_is_refused(api, cast, cat) -> None:
    svc = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.RUNNING, replicas=3,
                       parameters={"model_uri": "hf://m", "min_replicas": 2})
    below = api("bob").post(f"{API}/requests/{svc.pk}/scale/", {"replicas": 1}, format="json")
    assert below.status_code == 400 and "minimum (2)" in below.json()["fields"]["replicas"][0]
    svc.refresh_from_db()
    assert svc.replicas == 3
    assert api("bob").post(f"{API}/requests/{svc.pk}/scale/", {"replicas": 2}, format="json").status_code == 200


def test_scaling_or_asking_to_scale_above_the_templates_bound_is_refused(api, as_user, cast, cat) -> None:
    cat.inference.parameters_schema = {**cat.inference.parameters_schema, "x-max-replicas": 3}
    cat.inference.save(update_fields=["parameters_schema"])
    svc = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.RUNNING, replicas=2,
                       parameters={"model_uri": "hf://m", "min_replicas": 1})
    above = api("bob").post(f"{API}/requests/{svc.pk}/scale/", {"replicas": 4}, format="json")
    assert above.status_code == 400 and "At most 3 replicas" in above.json()["fields"]["replicas"][0]
    asked = as_user("carol").post(f"/requests/{svc.pk}/scale/ask/",
                                  {"askscale-replicas": "4", "askscale-reason": "Launch day."})
    assert asked.status_code == 400 and "At most 3 replicas" in asked.content.decode()
    svc.refresh_from_db()
    assert svc.replicas == 2 and not svc.extension_requests.exists()
    assert api("bob").post(f"{API}/requests/{svc.pk}/scale/", {"replicas": 3}, format="json").status_code == 200


# ------------------------------------------------------------------------------------------------ the online class
def test_api_refuses_inference_in_a_lower_class_and_defaults_to_the_online_one(api, cat) -> None:
    for lower in ("batch", "interactive"):
        refused = submit(api, priority=lower, parameters={"model_uri": "hf://m"})
        assert refused.status_code == 400, refused.content
        assert "always run at production priority" in refused.json()["fields"]["priority"][0]
    assert not WorkloadRequest.objects.exists()
    made = submit(api, parameters={"model_uri": "hf://m"})
    assert made.status_code == 201 and made.json()["priority"] == "production"
    assert submit(api, priority="production", parameters={"model_uri": "hf://m"}).status_code == 201


def test_the_form_offers_only_the_online_class_for_inference(as_user, cat) -> None:
    page = as_user("carol").get("/requests/new/?template=inference").content.decode()
    select = re.search(r'<select name="priority"[^>]*>(.*?)</select>', page, re.S).group(1)
    assert re.findall(r'<option value="(\w+)"', select) == ["production"]
    training = as_user("carol").get("/requests/new/?template=training").content.decode()
    assert 'value="batch"' in re.search(r'<select name="priority"[^>]*>(.*?)</select>', training, re.S).group(1)
    forged = as_user("carol").post("/requests/new/?template=inference", inference_form(cat, priority="batch"))
    assert forged.status_code == 200 and field_error(forged.content.decode(), "priority")
    assert not WorkloadRequest.objects.exists()


def test_rendered_inference_objects_always_carry_the_online_class(cast, cat) -> None:
    # A row from before the rule, stored with a batch priority, still renders in the online class.
    old = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.APPROVED, priority="batch",
                       replicas=2, parameters={"model_uri": "hf://m", "min_replicas": 1})
    objects = {o["kind"]: o for o in request_manifests(old)}
    assert objects["Deployment"]["metadata"]["labels"][PRIORITY_CLASS_LABEL] == "production"
    training = make_request(cat, cast.vision, cast.carol, state=S.APPROVED, priority="batch")
    assert {o["metadata"]["labels"].get(PRIORITY_CLASS_LABEL) for o in request_manifests(training)} >= {"batch"}

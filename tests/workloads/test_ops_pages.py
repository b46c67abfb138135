"""Ops catalogue pages (templates and images): HTTP in; status, body and database state out.

The cast (tests/conftest.py) and the catalogue (tests/workloads/factories.py): training, notebook and
inference templates (v1 each), on a cluster with h100, MIG and CPU flavors.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tenants.models import AuditEntry
from workloads.models import Image, ServiceTemplate

from .factories import make_request

pytestmark = [pytest.mark.django_db]

SCHEMA = {"type": "object", "properties": {"prompt": {"type": "string", "title": "Prompt"}}, "required": ["prompt"]}


def text(response) -> str:
    return response.content.decode()


def template_form(cat, **overrides: Any) -> dict[str, Any]:
    data = {
        "kind": "inference", "slug": "llm-chat", "name": "LLM chat", "description": "A chat model.",
        "parameters_schema": json.dumps(SCHEMA), "allowed_flavors": [str(cat.h100.pk), str(cat.mig.pk)],
        "default_gpus": "1", "max_gpus": "4", "default_cpu": "4", "max_cpu": "16", "default_memory_gib": "32",
        "max_memory_gib": "128", "max_duration_hours": "12", "idle_timeout_minutes": "", "active": "on",
    }
    data.update(overrides)
    return {f"template-{k}": v for k, v in data.items() if v is not None}


def image_form(**overrides: Any) -> dict[str, Any]:
    data = {"name": "vLLM", "reference": "vllm/vllm-openai:v0.9.0", "description": "", "kinds": ["inference"], "active": "on"}
    data.update(overrides)
    return {f"image-{k}": v for k, v in data.items() if v is not None}


def written() -> tuple[int, ...]:
    return ServiceTemplate.objects.count(), Image.objects.count(), AuditEntry.objects.count()


# Who sees the pages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["alice", "carol", "nobody"])
def test_catalogue_pages_are_404_for_everyone_but_ops(as_user, cat, who) -> None:
    image = Image.objects.first()
    before = written()
    client = as_user(who)
    for url in ["/ops/templates/", "/ops/templates/new/", f"/ops/templates/{cat.training.pk}/",
                "/ops/images/", "/ops/images/new/", f"/ops/images/{image.pk}/"]:
        assert client.get(url).status_code == 404, url
    assert client.post("/ops/templates/new/", template_form(cat)).status_code == 404
    assert client.post(f"/ops/templates/{cat.training.pk}/", template_form(cat, name="x")).status_code == 404
    assert client.post("/ops/images/new/", image_form()).status_code == 404
    assert client.post(f"/ops/images/{image.pk}/", image_form(name="x")).status_code == 404
    assert written() == before


def test_anonymous_is_sent_to_sign_in(client, cat) -> None:
    response = client.get("/ops/templates/")
    assert response.status_code == 302 and "/login" in response["Location"]


# Templates ------------------------------------------------------------------------------------------


def test_ops_lists_templates_with_filters_and_versions(as_user, cat, django_assert_max_num_queries) -> None:
    client = as_user("ops")
    with django_assert_max_num_queries(15):
        body = text(client.get("/ops/templates/"))
    assert all(slug in body for slug in ("training", "notebook", "inference"))
    assert "/ops/templates/new/" in body and 'aria-current="page">Templates</a>' in body
    body = text(client.get("/ops/templates/?kind=notebook"))
    assert f"/ops/templates/{cat.notebook.pk}/" in body and f"/ops/templates/{cat.training.pk}/" not in body
    ServiceTemplate.objects.filter(pk=cat.inference.pk).update(active=False)
    body = text(client.get("/ops/templates/?active=false"))
    assert f"/ops/templates/{cat.inference.pk}/" in body and f"/ops/templates/{cat.training.pk}/" not in body


def test_ops_creates_a_template(as_user, cat) -> None:
    response = as_user("ops").post("/ops/templates/new/", template_form(cat))
    template = ServiceTemplate.objects.get(slug="llm-chat")
    assert response.status_code == 302 and response["Location"] == f"/ops/templates/{template.pk}/"
    assert (template.version, template.kind, template.max_gpus, template.parameters_schema) == (1, "inference", 4, SCHEMA)
    assert set(template.allowed_flavors.all()) == {cat.h100, cat.mig}
    assert template.idle_timeout_minutes is None and template.active
    assert AuditEntry.objects.filter(action="template.create").count() == 1


@pytest.mark.parametrize(("overrides", "field", "message"), [
    ({"parameters_schema": '{"type": "object",'}, "parameters_schema", "Not valid JSON"),
    ({"parameters_schema": '{"type": "objekt"}'}, "parameters_schema", "is not valid under any of the given schemas"),
    ({"parameters_schema": '{"type": "string"}'}, "parameters_schema", "must describe an object"),
    ({"parameters_schema": "[]"}, "parameters_schema", "must be a JSON object"),
    ({"slug": "training"}, "slug", "A template with this slug exists"),
    ({"slug": "Not_A_Label"}, "slug", ""),
    ({"default_gpus": "8", "max_gpus": "4"}, "default_gpus", "At most max_gpus"),
])
def test_bad_template_input_shows_errors_and_writes_nothing(as_user, cat, overrides, field, message) -> None:
    before = written()
    response = as_user("ops").post("/ops/templates/new/", template_form(cat, **overrides))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors and message in " ".join(errors[field])
    assert 'class="field field-invalid"' in text(response)
    assert written() == before


def test_edit_in_place_while_no_request_uses_the_version(as_user, cat) -> None:
    client = as_user("ops")
    body = text(client.get(f"/ops/templates/{cat.inference.pk}/"))
    assert "Versions" in body and "Save template" in body
    response = client.post(f"/ops/templates/{cat.inference.pk}/", template_form(cat, slug="ignored", kind="notebook", max_gpus="2"))
    assert response.status_code == 302
    cat.inference.refresh_from_db()
    assert (cat.inference.version, cat.inference.max_gpus, cat.inference.slug, cat.inference.kind) == (1, 2, "inference", "inference")
    assert ServiceTemplate.objects.filter(slug="inference").count() == 1
    assert AuditEntry.objects.filter(action="template.update").count() == 1


def test_edit_of_a_used_version_makes_the_next_version(as_user, cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol, template=cat.training)
    old_schema = cat.training.parameters_schema
    client = as_user("ops")
    assert "Requests use this version" in text(client.get(f"/ops/templates/{cat.training.pk}/"))
    form = template_form(cat, kind="training", slug="training", max_gpus="2", parameters_schema=json.dumps(SCHEMA))
    response = client.post(f"/ops/templates/{cat.training.pk}/", form)
    new = ServiceTemplate.objects.get(slug="training", version=2)
    assert response.status_code == 302 and response["Location"] == f"/ops/templates/{new.pk}/"
    assert (new.kind, new.max_gpus, new.parameters_schema) == ("training", 2, SCHEMA)
    cat.training.refresh_from_db()
    assert cat.training.parameters_schema == old_schema and cat.training.max_gpus != 2
    assert AuditEntry.objects.filter(action="template.create").count() == 1
    messages = [str(m) for m in client.get("/ops/templates/").context["messages"]]
    assert any("saved as v2" in m for m in messages)
    body = text(client.get("/ops/templates/?slug=training"))
    assert "v2" in body and "v1" in body and "latest" in body


def test_cosmetic_edit_of_a_used_version_stays_in_place(as_user, cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol, template=cat.training)
    t = cat.training
    form = template_form(
        cat, kind=t.kind, slug=t.slug, name="Training (old)", description=t.description,
        parameters_schema=json.dumps(t.parameters_schema), allowed_flavors=[str(f.pk) for f in t.allowed_flavors.all()],
        default_gpus=str(t.default_gpus), max_gpus=str(t.max_gpus), default_cpu=str(t.default_cpu), max_cpu=str(t.max_cpu),
        default_memory_gib=str(t.default_memory_gib), max_memory_gib=str(t.max_memory_gib),
        max_duration_hours=str(t.max_duration_hours), idle_timeout_minutes=str(t.idle_timeout_minutes or ""), active=None,
    )
    assert as_user("ops").post(f"/ops/templates/{t.pk}/", form).status_code == 302
    t.refresh_from_db()
    assert (t.name, t.active, ServiceTemplate.objects.filter(slug="training").count()) == ("Training (old)", False, 1)


def test_bad_edit_writes_nothing(as_user, cat) -> None:
    before = written()
    response = as_user("ops").post(f"/ops/templates/{cat.inference.pk}/", template_form(cat, parameters_schema="{nope"))
    assert response.status_code == 200 and "parameters_schema" in response.context["form"].errors
    assert written() == before


# Images ---------------------------------------------------------------------------------------------


def test_ops_lists_creates_and_edits_images(as_user, cat) -> None:
    client = as_user("ops")
    body = text(client.get("/ops/images/"))
    assert "/ops/images/new/" in body and 'aria-current="page">Images</a>' in body
    response = client.post("/ops/images/new/", image_form(kinds=["inference", "notebook"]))
    assert response.status_code == 302 and response["Location"] == "/ops/images/"
    image = Image.objects.get(reference="vllm/vllm-openai:v0.9.0")
    assert (image.name, image.kinds, image.active) == ("vLLM", ["inference", "notebook"], True)
    assert AuditEntry.objects.filter(action="image.create").count() == 1
    assert "vllm/vllm-openai:v0.9.0" in text(client.get("/ops/images/?kind=notebook"))
    assert "vllm/vllm-openai:v0.9.0" not in text(client.get("/ops/images/?kind=training"))

    assert client.get(f"/ops/images/{image.pk}/").context["form"].initial["kinds"] == ["inference", "notebook"]
    response = client.post(f"/ops/images/{image.pk}/", image_form(name="vLLM 0.9", kinds=["inference"], active=None))
    assert response.status_code == 302
    image.refresh_from_db()
    assert (image.name, image.kinds, image.active) == ("vLLM 0.9", ["inference"], False)
    assert AuditEntry.objects.filter(action="image.update").count() == 1
    assert "vLLM 0.9" in text(client.get("/ops/images/?active=false"))


@pytest.mark.parametrize(("overrides", "field"), [
    ({"kinds": []}, "kinds"),
    ({"kinds": ["gaming"]}, "kinds"),
    ({"name": ""}, "name"),
    ("duplicate", "reference"),
])
def test_bad_image_input_shows_errors_and_writes_nothing(as_user, cat, overrides, field) -> None:
    if overrides == "duplicate":
        overrides = {"reference": Image.objects.first().reference}
    before = written()
    response = as_user("ops").post("/ops/images/new/", image_form(**overrides))
    assert response.status_code == 200 and field in response.context["form"].errors
    assert written() == before


def test_edit_to_a_duplicate_reference_is_refused(as_user, cat) -> None:
    first, second = Image.objects.order_by("pk")[:2]
    before = written()
    response = as_user("ops").post(f"/ops/images/{second.pk}/", image_form(name=second.name, reference=first.reference))
    assert response.status_code == 200 and "reference" in response.context["form"].errors
    second.refresh_from_db()
    assert second.reference != first.reference and written() == before


def test_ops_sets_the_idle_threshold_of_a_template(as_user, cat) -> None:
    """The template's ``idle_gpu_percent`` (docs/measured-use.md, "Idle detection") on the edit page, audited."""
    client = as_user("ops")
    assert 'name="template-idle_gpu_percent"' in text(client.get(f"/ops/templates/{cat.inference.pk}/"))
    before = written()
    bad = client.post(f"/ops/templates/{cat.inference.pk}/", template_form(cat, idle_gpu_percent="150"))
    assert bad.status_code == 200 and "idle_gpu_percent" in bad.context["form"].errors and written() == before
    response = client.post(f"/ops/templates/{cat.inference.pk}/", template_form(cat, idle_gpu_percent="12.5"))
    assert response.status_code == 302
    cat.inference.refresh_from_db()
    assert cat.inference.idle_gpu_percent == 12.5
    entry = AuditEntry.objects.get(action="template.update")
    assert entry.after["idle_gpu_percent"] == 12.5 and entry.before["idle_gpu_percent"] is None
    # empty again: the platform's default
    assert client.post(f"/ops/templates/{cat.inference.pk}/", template_form(cat, idle_gpu_percent="")).status_code == 302
    cat.inference.refresh_from_db()
    assert cat.inference.idle_gpu_percent is None

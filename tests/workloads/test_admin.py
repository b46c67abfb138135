"""The admin saves the catalogue through the services: their checks, versioning and audit entries."""

from __future__ import annotations

import json
import re

import pytest

from tenants.models import AuditEntry
from workloads.models import ApprovalRule, Image, ServiceTemplate

from .factories import make_request

pytestmark = pytest.mark.django_db


def _template_form(template: ServiceTemplate, **changes) -> dict:
    data = {
        "kind": template.kind, "slug": template.slug, "version": template.version, "name": template.name,
        "description": template.description, "parameters_schema": json.dumps(template.parameters_schema),
        "allowed_flavors": [f.pk for f in template.allowed_flavors.all()],
        "default_gpus": template.default_gpus, "max_gpus": template.max_gpus, "default_cpu": template.default_cpu,
        "max_cpu": template.max_cpu, "default_memory_gib": template.default_memory_gib,
        "max_memory_gib": template.max_memory_gib, "max_duration_hours": template.max_duration_hours,
        "idle_timeout_minutes": template.idle_timeout_minutes or "", "active": "on" if template.active else "",
    }
    data.update(changes)
    return data


def errors(response) -> str:
    return " ".join(re.findall(r'class="errorlist[^"]*"[^>]*>(.*?)</ul>', response.content.decode(), re.S))


def test_a_new_template_of_a_known_slug_is_its_next_version(as_user, cat) -> None:
    client = as_user("ops")
    response = client.post("/admin/workloads/servicetemplate/add/", _template_form(cat.training, version=1, name="Training 2"))
    assert response.status_code == 302, errors(response)
    newest = ServiceTemplate.objects.filter(slug=cat.training.slug).order_by("-version").first()
    assert newest.version == cat.training.version + 1 and newest.name == "Training 2"
    assert set(newest.allowed_flavors.all()) == set(cat.training.allowed_flavors.all())
    entry = AuditEntry.objects.get(action="template.create", target_id=str(newest.pk))
    assert entry.actor_label == "ops"


def test_a_used_version_refuses_meaningful_changes_in_the_form(as_user, cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol, template=cat.training)
    client = as_user("ops")
    url = f"/admin/workloads/servicetemplate/{cat.training.pk}/change/"
    response = client.post(url, _template_form(cat.training, max_gpus=cat.training.max_gpus + 1))
    assert response.status_code == 200 and "needs a new version" in errors(response)
    cat.training.refresh_from_db()
    response = client.post(url, _template_form(cat.training, name="Training (renamed)"))
    assert response.status_code == 302, errors(response)
    cat.training.refresh_from_db()
    assert cat.training.name == "Training (renamed)"
    assert AuditEntry.objects.filter(action="template.update", target_id=str(cat.training.pk)).count() == 1


def test_a_bad_schema_and_bad_image_kinds_are_form_errors(as_user, cat) -> None:
    client = as_user("ops")
    response = client.post("/admin/workloads/servicetemplate/add/",
                           _template_form(cat.training, slug="other", parameters_schema='{"type": "nonsense"}'))
    assert response.status_code == 200 and errors(response)
    assert not ServiceTemplate.objects.filter(slug="other").exists()
    response = client.post("/admin/workloads/image/add/", {"name": "x", "reference": "registry.example/x:1",
                                                           "kinds": '["spaceship"]', "active": "on"})
    assert response.status_code == 200 and "template kinds" in errors(response)
    response = client.post("/admin/workloads/image/add/", {"name": "x", "reference": "registry.example/x:1",
                                                           "kinds": '["training"]', "active": "on"})
    assert response.status_code == 302, errors(response)
    image = Image.objects.get(name="x")
    assert AuditEntry.objects.get(action="image.create", target_id=str(image.pk)).actor_label == "ops"


def test_approval_rules_go_through_the_service(as_user, cast, cat) -> None:
    client = as_user("ops")
    data = {"project": cast.vision.pk, "template_slug": "training", "auto_approve_max_gpus": 2,
            "auto_approve_max_hours": 4, "member_priorities": '["batch"]', "admin_priorities": '["batch"]'}
    ApprovalRule.objects.filter(project=cast.vision, template_slug="training").delete()
    response = client.post("/admin/workloads/approvalrule/add/", data)
    assert response.status_code == 302, errors(response)
    assert AuditEntry.objects.filter(action="approval_rule.create", actor_label="ops").count() == 1
    response = client.post("/admin/workloads/approvalrule/add/", data)  # the service refuses a second one
    assert response.status_code == 200 and "exist" in errors(response)
    bad = client.post("/admin/workloads/approvalrule/add/", data | {"project": cast.nlp.pk, "member_priorities": '["production"]'})
    assert bad.status_code == 200 and "production" in errors(bad)

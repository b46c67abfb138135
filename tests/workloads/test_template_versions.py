"""A new template version retires the previous one for new submissions; requests made on it keep it."""

from __future__ import annotations

from collections import Counter

import pytest

from portal.exceptions import Invalid
from tenants.models import AuditEntry
from workloads import catalogue_services, services
from workloads.models import RequestState as S
from workloads.models import ServiceTemplate

from .factories import make_request

API = "/api/v1"
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}


def _edit_notebook_via_ops_page(as_user, cat) -> ServiceTemplate:
    """Ops lower the notebook's GPUs while a request uses v1: the edit becomes v2."""
    nb = cat.notebook
    form = {
        "kind": nb.kind, "slug": nb.slug, "name": nb.name, "description": nb.description,
        "parameters_schema": '{"type": "object", "properties": {}}',
        "allowed_flavors": [f.pk for f in nb.allowed_flavors.all()], "default_gpus": "1", "max_gpus": "1",
        "default_cpu": "4", "max_cpu": "16", "default_memory_gib": "32", "max_memory_gib": "128",
        "max_duration_hours": "8", "idle_timeout_minutes": "", "active": "on",
    }
    form = {f"template-{k}": v for k, v in form.items()}
    response = as_user("ops").post(f"/ops/templates/{nb.pk}/", form)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    return ServiceTemplate.objects.get(slug="notebook", version=nb.version + 1)


def test_a_new_version_retires_the_previous_one(cast, cat) -> None:
    v2 = catalogue_services.template_create(actor=cast.actor("ops"), kind=cat.training.kind, slug="training", name="Training",
                                  max_gpus=2, allowed_flavors=[cat.h100], parameters_schema=SCHEMA)
    cat.training.refresh_from_db()
    assert v2.version == 2 and v2.active and not cat.training.active
    assert AuditEntry.objects.filter(action="template.retire", target_id=str(cat.training.pk)).count() == 1
    # A draft (inactive) version retires nothing.
    catalogue_services.template_create(actor=cast.actor("ops"), kind="training", slug="training", name="Draft", active=False,
                             parameters_schema=SCHEMA)
    v2.refresh_from_db()
    assert v2.active


def test_catalogue_shows_one_entry_per_slug_after_an_edit(as_user, api, cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING, parameters={})
    v2 = _edit_notebook_via_ops_page(as_user, cat)
    for who in ("carol", "ops"):
        rows = api(who).get(f"{API}/templates/").json()["results"]
        assert Counter(row["slug"] for row in rows) == {"notebook": 1, "training": 1, "inference": 1, "batch-inference": 1}, who
        assert [row["id"] for row in rows if row["slug"] == "notebook"] == [v2.pk]
        page = as_user(who).get("/requests/new/")
        assert [t.pk for t in page.context["templates"] if t.slug == "notebook"] == [v2.pk], who
        assert page.content.decode().count(f"?template={cat.notebook.pk}") == 0
    # Ops may still list every version; the old one shows as retired.
    rows = api("ops").get(f"{API}/templates/?versions=all&slug=notebook").json()["results"]
    assert [(row["version"], row["active"]) for row in rows] == [(2, True), (1, False)]
    assert "v1" in as_user("ops").get("/ops/templates/?slug=notebook").content.decode()


def test_submitting_a_retired_version_is_refused_with_the_live_one_named(as_user, api, cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING, parameters={})
    v2 = _edit_notebook_via_ops_page(as_user, cat)
    body = {"project": "acme-vision", "template": str(cat.notebook.pk), "gpus": 2}
    response = api("carol").post(f"{API}/requests/", body, format="json")
    assert response.status_code == 400, response.content
    message = " ".join(response.json()["fields"]["template"])
    assert message == f"Version 1 of notebook is retired; use version 2 (id {v2.pk})."
    # By slug, the live version applies, with its new limit.
    response = api("carol").post(f"{API}/requests/", body | {"template": "notebook"}, format="json")
    assert response.status_code == 400 and "gpus" in response.json()["fields"]
    response = api("carol").post(f"{API}/requests/", body | {"template": "notebook", "gpus": 1}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["template"]["version"] == 2
    # The service refuses it too, whatever calls it.
    with pytest.raises(Invalid, match="retired; use version 2"):
        services.request_submit(actor=cast.actor("carol"), project=cast.vision, template=cat.notebook, gpus=1)


def test_a_request_on_the_old_version_keeps_it_and_may_stop_and_restart(as_user, cast, cat, django_capture_on_commit_callbacks) -> None:
    req = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING, parameters={}, gpus=2)
    _edit_notebook_via_ops_page(as_user, cat)
    with django_capture_on_commit_callbacks(execute=True):
        services.request_stop(actor=cast.actor("carol"), request=req)
    # Restarting is the same request under its original approval: it keeps v1 and its 2 GPUs.
    with django_capture_on_commit_callbacks(execute=True):
        services.request_restart(actor=cast.actor("carol"), request=req)
    req.refresh_from_db()
    assert req.state == S.APPROVED and req.template_id == cat.notebook.pk and req.gpus == 2


def test_restart_refused_when_the_template_is_withdrawn(cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.STOPPED, parameters={})
    catalogue_services.template_update(actor=cast.actor("ops"), template=cat.notebook, active=False)
    with pytest.raises(Invalid, match="no longer offered"):
        services.request_restart(actor=cast.actor("carol"), request=req)


def test_reactivating_an_old_version_makes_it_the_live_one(api, cast, cat) -> None:
    v2 = catalogue_services.template_create(actor=cast.actor("ops"), kind="training", slug="training", name="Training", max_gpus=2,
                                  parameters_schema=SCHEMA)
    response = api("ops").patch(f"{API}/templates/{cat.training.pk}/", {"active": True}, format="json")
    assert response.status_code == 200, response.content
    v2.refresh_from_db()
    assert not v2.active
    rows = api("carol").get(f"{API}/templates/?slug=training").json()["results"]
    assert [row["id"] for row in rows] == [cat.training.pk]

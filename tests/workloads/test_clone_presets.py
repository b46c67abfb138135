"""Submitting again: "Clone and edit" on a request's page opens the new-request form filled with its values;
``POST /api/v1/requests/{id}/clone/`` submits it again. Presets keep a form's values under a name, per user and
project: saved from the form, listed, applied, deleted, and the same through ``/api/v1/presets/``. Another
user's preset, another tenant's request: 404 everywhere.
"""

from __future__ import annotations

import re

import pytest

from tenants.models import AuditEntry
from workloads.models import RequestPreset, RequestState, WorkloadRequest

from .factories import make_request
from .test_views import text, training_form

pytestmark = pytest.mark.django_db
S = RequestState
API = "/api/v1"
PARAMS = {"command": "python train.py --lr 0.1", "args": ["--epochs", "3"], "env": {"SEED": "7"}, "retries": 2}


@pytest.fixture
def finished(cast, cat) -> WorkloadRequest:
    """carol's training job on MIG slices, ended: the one to submit again."""
    return make_request(cat, cast.vision, cast.carol, name="resnet", state=S.SUCCEEDED, flavor=cat.mig, gpus=2,
                        parameters=PARAMS, duration_hours=6, priority="batch")


def _value(body: str, name: str) -> str | None:
    tag = re.search(rf'<input[^>]*name="{name}"[^>]*>', body)
    found = re.search(r'value="([^"]*)"', tag.group(0)) if tag else None
    return found.group(1) if found else None


def _selected(body: str, name: str) -> str | None:
    select = re.search(rf'<select name="{name}".*?</select>', body, re.S)
    found = re.search(r'<option value="([^"]*)" selected>', select.group(0)) if select else None
    return found.group(1) if found else None


# Clone: the page ------------------------------------------------------------------------------------------


def test_clone_and_edit_opens_the_form_with_the_requests_values(as_user, cast, cat, finished) -> None:
    client = as_user("carol")
    detail = text(client.get(f"/requests/{finished.pk}/"))
    link = f"/requests/new/?template=training&amp;project=acme-vision&amp;clone={finished.pk}"
    assert link in detail and "Clone and edit" in detail

    form = text(client.get(link.replace("&amp;", "&")))
    assert "Starting from request resnet" in form
    assert _selected(form, "project") == "acme-vision" and _selected(form, "flavor") == str(cat.mig.pk)
    assert _value(form, "gpus") == "2" and _value(form, "duration_hours") == "6"
    assert "python train.py --lr 0.1" in form and "--epochs\n3" in form and "SEED=7" in form
    assert _value(form, "param_retries") == "2"
    assert _value(form, "name") is None  # a new name: the service makes one up when empty

    # Submitting it makes a second request with the same values.
    data = training_form(cat, flavor=str(cat.mig.pk), gpus="2", duration_hours="6", param_command=PARAMS["command"],
                         param_retries="2")
    response = client.post("/requests/new/?template=training", data)
    assert response.status_code == 302
    again = WorkloadRequest.objects.exclude(pk=finished.pk).get()
    assert (again.flavor, again.gpus, again.template) == (cat.mig, 2, cat.training)


def test_who_sees_the_clone_button(as_user, cast, cat, finished) -> None:
    assert "Clone and edit" in text(as_user("bob").get(f"/requests/{finished.pk}/"))  # may submit in the project
    assert "Clone and edit" not in text(as_user("dave").get(f"/requests/{finished.pk}/"))  # a viewer does not submit


@pytest.mark.parametrize("who", ["frank", "erin", "nobody"])
def test_cloning_a_request_you_cannot_see_is_404(as_user, cast, cat, finished, who) -> None:
    response = as_user(who).get(f"/requests/new/?template=training&clone={finished.pk}")
    assert response.status_code == 404
    assert as_user("carol").get("/requests/new/?template=training&clone=abc").status_code == 404


# Clone: the API -------------------------------------------------------------------------------------------


def test_api_clone_submits_again(api, token_client, cast, cat, finished) -> None:
    response = api("carol").post(f"{API}/requests/{finished.pk}/clone/", {"name": "resnet-again"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "resnet-again" and body["id"] != finished.pk
    assert response["Location"] == f"{API}/requests/{body['id']}/"
    again = WorkloadRequest.objects.get(pk=body["id"])
    assert (again.project, again.template, again.flavor, again.gpus, again.duration_hours) == (
        cast.vision, cat.training, cat.mig, 2, 6)
    assert again.parameters["command"] == PARAMS["command"] and again.parameters["env"] == {"SEED": "7"}
    assert again.requested_by == cast.carol

    # A pipeline's token (read+submit) clones too, with an Idempotency-Key: a retry is the same request.
    pipeline, _ = token_client("carol", cast.vision, "read+submit")
    first = pipeline.post(f"{API}/requests/{finished.pk}/clone/", {}, format="json", HTTP_IDEMPOTENCY_KEY="ci-42")
    retry = pipeline.post(f"{API}/requests/{finished.pk}/clone/", {}, format="json", HTTP_IDEMPOTENCY_KEY="ci-42")
    assert first.status_code == 201 and retry.status_code == 200 and retry["Idempotent-Replayed"] == "true"
    assert first.json()["id"] == retry.json()["id"]


def test_api_clone_refusals(api, token_client, cast, cat, finished) -> None:
    before = WorkloadRequest.objects.count()
    assert api("frank").post(f"{API}/requests/{finished.pk}/clone/", {}, format="json").status_code == 404
    assert api("nobody").post(f"{API}/requests/{finished.pk}/clone/", {}, format="json").status_code == 404
    assert api("dave").post(f"{API}/requests/{finished.pk}/clone/", {}, format="json").status_code == 403
    reader, _ = token_client("carol", cast.vision, "read")
    assert reader.post(f"{API}/requests/{finished.pk}/clone/", {}, format="json").status_code == 403
    bad = api("carol").post(f"{API}/requests/{finished.pk}/clone/", {"name": "Not A Name"}, format="json")
    assert bad.status_code == 400 and "name" in bad.json()["fields"]
    unknown = api("carol").post(f"{API}/requests/{finished.pk}/clone/", {"gpus": 9}, format="json")
    assert unknown.status_code == 400 and unknown.json()["fields"]["gpus"] == ["Unknown field."]
    assert WorkloadRequest.objects.count() == before


# Presets: the pages ---------------------------------------------------------------------------------------


def test_save_apply_and_delete_a_preset_from_the_form(as_user, cast, cat) -> None:
    client = as_user("carol")
    data = training_form(cat, project="acme-vision", flavor=str(cat.mig.pk), gpus="2", duration_hours="6",
                         param_command="python sweep.py", preset_name="mig sweep", action="save-preset")
    response = client.post("/requests/new/?template=training", data)
    preset = RequestPreset.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/requests/new/?template=training&project=acme-vision&preset={preset.pk}"
    assert (preset.owner, preset.project, preset.template_slug, preset.name) == (cast.carol, cast.vision, "training", "mig sweep")
    assert preset.values["flavor"] == cat.mig.name and preset.values["gpus"] == 2 and preset.values["cpu"] == "4"
    assert preset.values["parameters"]["command"] == "python sweep.py" and "name" not in preset.values
    assert not WorkloadRequest.objects.exists()  # saving a preset submits nothing
    assert AuditEntry.objects.filter(action="preset.save", project=cast.vision).exists()

    applied = text(client.get(response["Location"]))
    assert "Starting from your preset “mig sweep”" in applied
    assert _selected(applied, "flavor") == str(cat.mig.pk) and _value(applied, "gpus") == "2"
    assert "python sweep.py" in applied
    picker = text(client.get("/requests/new/"))
    assert "mig sweep" in picker and f"preset={preset.pk}" in picker

    # The same name again replaces it.
    client.post("/requests/new/?template=training", {**data, "gpus": "1"})
    assert RequestPreset.objects.get().values["gpus"] == 1

    deleted = client.post(f"/requests/presets/{preset.pk}/delete/", {"next": "/requests/new/?template=training"})
    assert deleted.status_code == 302 and deleted["Location"] == "/requests/new/?template=training"
    assert not RequestPreset.objects.exists()
    assert client.post(f"/requests/presets/{preset.pk}/delete/", {"next": "https://evil.example/"}).status_code == 404


def test_saving_a_preset_needs_a_name_and_keeps_the_form(as_user, cat) -> None:
    data = training_form(cat, param_command="python keep-me.py", preset_name="  ", action="save-preset")
    response = as_user("carol").post("/requests/new/?template=training", data)
    assert response.status_code == 200
    body = text(response)
    assert "Name the preset." in body and "python keep-me.py" in body
    assert not RequestPreset.objects.exists()


@pytest.mark.parametrize("who", ["bob", "frank", "erin", "nobody"])
def test_another_users_preset_is_404(as_user, cast, cat, who) -> None:
    preset = RequestPreset.objects.create(owner=cast.carol, project=cast.vision, template_slug="training", name="mine",
                                          values={"gpus": 3})
    client = as_user(who)
    assert client.get(f"/requests/new/?template=training&preset={preset.pk}").status_code == 404
    assert client.post(f"/requests/presets/{preset.pk}/delete/").status_code == 404
    assert "mine" not in text(client.get("/requests/new/"))
    assert RequestPreset.objects.filter(pk=preset.pk).exists()


def test_a_preset_outside_the_users_projects_is_out_of_reach(as_user, cast, cat) -> None:
    # carol's preset in a project she has left: it stays hers, but nothing shows or applies it there.
    preset = RequestPreset.objects.create(owner=cast.carol, project=cast.llm, template_slug="training", name="old",
                                          values={})
    assert as_user("carol").get(f"/requests/new/?template=training&preset={preset.pk}").status_code == 404


# Presets: the API -----------------------------------------------------------------------------------------


def test_presets_api(api, token_client, cast, cat) -> None:
    carol = api("carol")
    body = {"name": "small notebook", "project": "acme-vision", "template": "notebook", "flavor": cat.mig.name,
            "gpus": 1, "cpu": "2.5", "parameters": {"ide": "vscode"}}
    created = carol.post(f"{API}/presets/", body, format="json")
    assert created.status_code == 201, created.content
    preset = created.json()
    assert (preset["name"], preset["project"], preset["template"]) == ("small notebook", "acme-vision", "notebook")
    assert preset["values"] == {"flavor": cat.mig.name, "gpus": 1, "cpu": "2.5", "parameters": {"ide": "vscode"}}
    replaced = carol.post(f"{API}/presets/", {**body, "gpus": 2}, format="json")
    assert replaced.status_code == 200 and replaced.json()["id"] == preset["id"] and replaced.json()["values"]["gpus"] == 2
    carol.post(f"{API}/presets/", {**body, "project": "acme-nlp", "name": "nlp one"}, format="json")

    listed = carol.get(f"{API}/presets/").json()
    assert [p["name"] for p in listed["results"]] == ["nlp one", "small notebook"]
    assert [p["name"] for p in carol.get(f"{API}/presets/", {"project": "acme-nlp"}).json()["results"]] == ["nlp one"]
    assert carol.get(f"{API}/presets/", {"search": "small"}).json()["count"] == 1
    assert carol.get(f"{API}/presets/{preset['id']}/").json()["values"]["gpus"] == 2

    # A token sees its own project's presets only; a read token cannot save.
    pipeline, _ = token_client("carol", cast.nlp, "read+submit")
    assert [p["name"] for p in pipeline.get(f"{API}/presets/").json()["results"]] == ["nlp one"]
    assert pipeline.get(f"{API}/presets/{preset['id']}/").status_code == 404
    made = pipeline.post(f"{API}/presets/", {"name": "from ci", "template": "training"}, format="json")
    assert made.status_code == 201 and made.json()["project"] == "acme-nlp"
    reader, _ = token_client("carol", cast.vision, "read")
    assert reader.post(f"{API}/presets/", {"name": "x", "template": "training"}, format="json").status_code == 403

    # Nobody else sees or deletes carol's.
    for who in ("bob", "frank", "erin", "nobody"):
        other = api(who)
        assert other.get(f"{API}/presets/").json()["count"] == 0, who
        assert other.get(f"{API}/presets/{preset['id']}/").status_code == 404, who
        assert other.delete(f"{API}/presets/{preset['id']}/").status_code == 404, who
    assert carol.delete(f"{API}/presets/{preset['id']}/").status_code == 204
    assert carol.get(f"{API}/presets/{preset['id']}/").status_code == 404


@pytest.mark.parametrize(
    "body, field",
    [
        ({"template": "training"}, "name"),
        ({"name": "x"}, "template"),
        ({"name": "x", "template": "no-such"}, "template"),
        ({"name": "x", "template": "training", "project": "globex-llm"}, "project"),
        ({"name": "x", "template": "training", "gpus": "two"}, "gpus"),
        ({"name": "x", "template": "training", "parameters": []}, "parameters"),
        ({"name": "x", "template": "training", "colour": "red"}, "colour"),
        ({"name": "   ", "template": "training"}, "name"),
    ],
)
def test_presets_api_bad_input(api, cast, cat, body, field) -> None:
    response = api("carol").post(f"{API}/presets/", {"project": "acme-vision", **body}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]
    assert not RequestPreset.objects.exists()

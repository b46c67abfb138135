"""What a researcher trips on (issue 27, "Researchers"): arguments pasted as JSON, the viewer's note, the catalogue's
cards, presets that keep the typed name, preemption in plain words (and who may see the preemptor), and the running
line of a request that follows the cluster.
"""

from __future__ import annotations

import re

import pytest

from workloads.models import RequestEvent, RequestPreset, RequestState, WorkloadRequest
from workloads.notify import request_preempted_notify

from .factories import make_request
from .test_views import text, training_form

pytestmark = pytest.mark.django_db
S = RequestState
NEW = "/requests/new/?template=training"


# Arguments pasted as JSON -------------------------------------------------------------------------------------------


def test_arguments_pasted_as_a_json_list_are_a_list(as_user, cat) -> None:
    response = as_user("carol").post(NEW, training_form(cat, param_args='["--epochs", "3", 7]'))
    assert response.status_code == 302, text(response)
    assert WorkloadRequest.objects.get().parameters["args"] == ["--epochs", "3", "7"]


@pytest.mark.parametrize("pasted, said", [
    ('["--epochs", "3"', "not valid JSON"),
    ('[["--epochs"], "3"]', "Item 1 of the JSON list is not a string"),
])
def test_a_broken_json_list_is_refused_with_the_reason_and_kept(as_user, cat, pasted, said) -> None:
    response = as_user("carol").post(NEW, training_form(cat, param_args=pasted, param_command="python keep.py"))
    body = text(response)
    assert response.status_code == 200 and said in body and "python keep.py" in body
    assert not WorkloadRequest.objects.exists()


def test_one_argument_per_line_still_works(as_user, cat) -> None:
    as_user("carol").post(NEW, training_form(cat, param_args="--epochs\n3"))
    assert WorkloadRequest.objects.get().parameters["args"] == ["--epochs", "3"]


# The viewer and the catalogue ---------------------------------------------------------------------------------------


def test_a_viewer_is_told_his_role_only_reads(as_user, cat) -> None:
    for url in ("/requests/new/", NEW):
        body = text(as_user("dave").get(url))
        assert "is viewer, and it only reads" in body and "Vision" in body
        assert "Ask a tenant admin to make you a member of one" not in body
    # Someone with no role at all is still told to ask to become a member.
    assert "Ask a tenant admin to make you a member of one" in text(as_user("nobody").get("/requests/new/"))


def test_catalogue_cards_do_not_repeat_the_kind(as_user, cat) -> None:
    body = text(as_user("carol").get("/requests/new/"))
    cards = re.findall(r'<li class="card project-card">(.*?)</li>', body, re.S)
    assert cards
    for card in cards:
        title = re.search(r'<h2 class="card-title">(.*?)</h2>', card).group(1)
        badges = re.findall(r'<span class="badge[^"]*">(.*?)</span>', card)
        assert not [b for b in badges if b.lower() in title.lower()], (title, badges)


# Presets keep the typed name ----------------------------------------------------------------------------------------


def test_save_as_preset_keeps_the_typed_names(as_user, cat) -> None:
    client = as_user("carol")
    data = training_form(cat, name="sweep-7", preset_name="mig sweep", action="save-preset")
    response = client.post(NEW, data)
    assert response.status_code == 302
    preset = RequestPreset.objects.get()
    form = text(client.get(response["Location"]))
    assert re.search(r'name="name"[^>]*value="sweep-7"', form), "the request's name was thrown away"
    assert re.search(r'name="preset_name"[^>]*value="mig sweep"', form), "the preset's name was thrown away"
    assert preset.name == "mig sweep"


def test_submit_says_when_it_made_up_a_name(as_user, cat) -> None:
    client = as_user("carol")
    response = client.post(NEW, training_form(cat, name=""), follow=True)
    req = WorkloadRequest.objects.get()
    assert f"No name was given: it is called {req.name}" in text(response)
    client.post(NEW, training_form(cat, name="mine"), follow=True)
    assert "No name was given" not in text(client.get("/requests/"))


# Preemption in plain words ------------------------------------------------------------------------------------------


KUEUE = ("Preempted: Preempted to accommodate a workload (UID: {uid}, JobUID: 7f1c) due to {why}; preemptor path: "
         "{path}; preemptee path: /acme/acme-vision")


def _preempted(cat, cast, *, uid: str, why: str, path: str) -> WorkloadRequest:
    victim = make_request(cat, cast.vision, cast.carol, name="sweep", state=S.QUEUED, priority="batch")
    RequestEvent.objects.create(request=victim, from_state=S.RUNNING, to_state=S.PREEMPTED, actor_label="cluster",
                                message=KUEUE.format(uid=uid, why=why, path=path))
    RequestEvent.objects.create(request=victim, from_state=S.PREEMPTED, to_state=S.QUEUED, actor_label="cluster",
                                message="Requeued by the cluster.")
    return victim


def test_preemption_within_the_project_names_the_preemptor(as_user, cast, cat) -> None:
    make_request(cat, cast.vision, cast.bob, template=cat.notebook, name="nb-bob", state=S.RUNNING,
                 priority="interactive", workload_uid="uid-nb")
    victim = _preempted(cat, cast, uid="uid-nb", why="prioritization in the ClusterQueue", path="/acme/acme-vision")
    body = text(as_user("carol").get(f"/requests/{victim.pk}/"))
    assert "This request was preempted." in body
    assert "Preempted by request nb-bob (notebook of bob in project Vision), at interactive priority" in body
    assert "outranks this batch-priority request" in body and "What happens next" in body
    assert "Preempted to accommodate" not in body and "JobUID" not in body


def test_another_tenants_preemptor_is_not_named(as_user, cast, cat) -> None:
    make_request(cat, cast.llm, cast.frank, name="globex-secret", state=S.RUNNING, priority="production",
                 workload_uid="uid-globex")
    victim = _preempted(cat, cast, uid="uid-globex", why="reclamation within the cohort", path="/root/globex-llm")
    body = text(as_user("carol").get(f"/requests/{victim.pk}/"))
    assert "Preempted by higher-priority work in the cohort" in body
    assert "globex" not in body.lower()
    # ops may see every request: named for them.
    assert "Preempted by request globex-secret" in text(as_user("ops").get(f"/requests/{victim.pk}/"))


def test_the_requester_is_emailed_in_plain_words(cast, cat, mailoutbox) -> None:
    make_request(cat, cast.llm, cast.frank, name="globex-secret", state=S.RUNNING, workload_uid="uid-globex")
    victim = _preempted(cat, cast, uid="uid-globex", why="prioritization in the ClusterQueue", path="/root/globex-llm")
    request_preempted_notify(victim.pk)
    (mail,) = mailoutbox
    assert mail.to == [cast.carol.email] and "sweep was preempted" in mail.subject
    assert "higher-priority work in the cohort" in mail.body and "What happens next" in mail.body
    assert "globex" not in mail.body.lower() and f"/requests/{victim.pk}/" in mail.body


# Data volumes: a list of one's own, and a refusal that names them ---------------------------------------------------


def test_the_form_offers_ones_own_volumes_and_the_refusal_names_them(as_user, cast, cat) -> None:
    from workloads.models import Volume

    Volume.objects.create(project=cast.vision, name="carol-scratch", owner=cast.carol)
    Volume.objects.create(project=cast.vision, name="imagenet", owner=None)
    Volume.objects.create(project=cast.vision, name="bob-private", owner=cast.bob)
    client = as_user("carol")
    form = text(client.get(NEW + "&project=acme-vision"))
    datalist = re.search(r'<datalist id="data-volume-options">(.*?)</datalist>', form, re.S).group(1)
    assert 'value="carol-scratch"' in datalist and 'value="imagenet"' in datalist and "bob-private" not in form
    assert re.search(r'name="param_data_volume"[^>]*list="data-volume-options"', form)

    response = client.post(NEW, training_form(cat, param_data_volume="bob-private"))
    body = text(response)
    assert response.status_code == 200 and "You may mount: carol-scratch, imagenet." in body
    assert not WorkloadRequest.objects.exists()
    refused = client.post("/api/v1/requests/", {
        "project": "acme-vision", "template": "training", "flavor": cat.h100.name, "gpus": 1,
        "image": "nvcr.io/nvidia/pytorch:26.10-py3", "parameters": {"command": "x", "data_volume": "nope"}},
        content_type="application/json")
    assert refused.status_code == 400
    assert "You may mount: carol-scratch, imagenet." in refused.json()["fields"]["parameters.data_volume"][0]

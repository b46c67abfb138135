"""Requests in a real browser: a researcher submits from the generated form and watches the state change
live; an approver decides from the inbox and the researcher's open page follows; bad parameters are shown
next to their field; outsiders find nothing.

No cluster runs here: what the cluster would do (queue the job, run it) is done with ``states.move``, the
same call the status follower makes.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.pages import stay

from tests.workloads.factories import make_catalogue
from workloads.models import RequestState, WorkloadRequest
from workloads.states import move

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
S = RequestState


@pytest.fixture
def cat(cast):
    return make_catalogue(cast)


def test_researcher_submits_a_training_job_and_watches_it_run(signed_in, cast, cat) -> None:
    page = signed_in("carol")
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Approvals", exact=True)).to_have_count(0)
    nav.get_by_role("link", name="New request", exact=True).click()
    page.get_by_role("link", name="Use Training job template").click()
    expect(page.get_by_role("heading", name="New training job")).to_be_visible()
    expect(page.locator("#cost-estimate")).to_contain_text("Billing not configured")

    page.get_by_label("Name").fill("resnet-50")
    page.get_by_label("Command").fill("python train.py --arch resnet50")
    page.get_by_label("Arguments (optional)").fill("--epochs\n3")
    page.get_by_label("Environment (optional)").fill("SEED=7")
    page.get_by_label("GPUs").fill("2")
    page.get_by_role("button", name="Submit request").click()

    expect(page.get_by_role("heading", name="resnet-50")).to_be_visible()
    expect(page.get_by_role("status").first).to_contain_text("Request resnet-50 submitted and approved.")
    req = WorkloadRequest.objects.get(name="resnet-50")
    assert req.parameters["args"] == ["--epochs", "3"] and req.parameters["env"] == {"SEED": "7"} and req.gpus == 2

    nav.get_by_role("link", name="Requests", exact=True).click()
    row = page.locator("tr", has_text="resnet-50")
    expect(row.locator(".state")).to_have_text("Approved")

    # The cluster takes it: the list follows without a reload.
    stay(page)
    move(req, to=S.QUEUED, actor_label="materializer", reason="Objects created in the cluster.")
    expect(row.locator(".state")).to_have_text("Queued")
    move(req, to=S.RUNNING, actor_label="cluster", reason="Its pods run.")
    expect(row.locator(".state")).to_have_text("Running")
    assert page.evaluate("window.__stayed") is True

    row.get_by_role("link", name="resnet-50").click()
    timeline = page.get_by_role("list", name="Timeline")
    expect(timeline).to_contain_text("Its pods run.")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel request")).to_have_count(0)


def test_approver_decides_from_the_inbox_and_the_requester_sees_it(signed_in, cast, cat) -> None:
    carol = signed_in("carol")
    carol.goto("/requests/new/?template=inference")
    carol.get_by_label("Name").fill("llm-api")
    carol.get_by_label("Model").fill("hf://meta-llama/Llama-3.1-8B-Instruct")
    carol.get_by_role("button", name="Submit request").click()
    expect(carol.get_by_role("heading", name="llm-api")).to_be_visible()
    expect(carol.locator(".state-line .state")).to_have_text("Pending approval")
    expect(carol.locator(".pending")).to_contain_text("Awaiting approval by a project admin")
    expect(carol.locator(".pending")).to_contain_text("Inference services need a project admin's approval.")
    stay(carol)

    bob = signed_in("bob")
    bob.get_by_role("navigation", name="Main").get_by_role("link", name="Approvals", exact=True).click()
    item = bob.get_by_role("listitem").filter(has_text="llm-api")
    expect(item).to_contain_text("8 nominal + 2 borrowable")
    expect(item).to_contain_text("Billing not configured.")
    item.get_by_label("Comment on llm-api").fill("ok for the demo")
    stay(bob)
    item.get_by_role("button", name="Approve llm-api").click()
    expect(item).to_contain_text("llm-api approved.")
    expect(item.get_by_role("button")).to_have_count(0)
    assert bob.evaluate("window.__stayed") is True  # decided in place

    # carol's open page follows by itself.
    expect(carol.locator(".state-line .state")).to_have_text("Approved")
    expect(carol.get_by_role("list", name="Timeline")).to_contain_text("Approved by bob: ok for the demo")
    assert carol.evaluate("window.__stayed") is True
    req = WorkloadRequest.objects.get(name="llm-api")
    move(req, to=S.QUEUED, actor_label="materializer", reason="Objects created in the cluster.",
         fields={"pending_reason": "waiting for 1 x H100 80GB: asks for 1; the project has 8 and may not borrow (8 in use now); nothing is ahead of you"})
    expect(carol.locator(".state-line .state")).to_have_text("Queued")
    expect(carol.locator(".pending")).to_contain_text("asks for 1; the project has 8 and may not borrow (8 in use now)")

    bob.reload()
    expect(bob.get_by_text("Nothing waits for you.")).to_be_visible()


def test_an_invalid_parameter_is_shown_next_to_its_field(signed_in, cast, cat) -> None:
    page = signed_in("carol")
    page.goto("/requests/new/?template=training")
    page.get_by_label("Command").fill("python train.py")
    page.get_by_label("Retries (optional)").fill("99")
    page.get_by_role("button", name="Submit request").click()
    retries = page.get_by_label("Retries (optional)")
    expect(retries).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#id_param_retries_error")).to_contain_text("99 is greater than the maximum of 10")
    expect(retries).to_have_value("99")  # what was typed stays
    expect(page.get_by_label("Command")).to_have_value("python train.py")
    assert not WorkloadRequest.objects.exists()


def test_outsiders_find_no_request(signed_in, cast, cat) -> None:
    from tests.workloads.factories import make_request

    req = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, name="secret-run")
    frank = signed_in("frank")
    frank.goto(f"/requests/{req.pk}/")
    expect(frank.get_by_role("heading", name="Not found")).to_be_visible()
    frank.goto("/requests/?scope=projects")
    expect(frank.get_by_text("secret-run")).to_have_count(0)
    frank.goto("/approvals/")
    expect(frank.get_by_role("heading", name="Not found")).to_be_visible()
    assert re.search(r"/accounts/login/", frank.url) is None


@pytest.mark.parametrize("who, path", [("carol", "/requests/"), ("carol", "/requests/new/?template=training"),
                                       ("carol", "detail"), ("bob", "/approvals/"), ("ops", "/ops/requests/")])
def test_request_pages_fit_a_phone(signed_in, cast, cat, who, path) -> None:
    from tests.workloads.factories import make_request

    req = make_request(cat, cast.vision, cast.carol, state=S.PENDING_APPROVAL, name="a-rather-long-request-name-here")
    page = signed_in(who, width=375, height=740)
    page.goto(f"/requests/{req.pk}/" if path == "detail" else path)
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 375


def test_clone_a_request_and_keep_its_values_as_a_preset(signed_in, cast, cat) -> None:
    old = WorkloadRequest.objects.create(
        tenant=cast.acme, project=cast.vision, cluster=cat.cluster, template=cat.training, name="sweep-1",
        image="nvcr.io/nvidia/pytorch:26.10-py3", flavor=cat.mig, gpus=2, duration_hours=6, state=S.SUCCEEDED,
        parameters={"command": "python sweep.py --lr 0.1"}, requested_by=cast.carol,
    )
    page = signed_in("carol")
    page.goto(f"/requests/{old.pk}/")
    page.get_by_role("link", name="Clone and edit sweep-1").click()
    expect(page.get_by_role("heading", name="New training job")).to_be_visible()
    expect(page.get_by_role("note")).to_contain_text("Starting from request sweep-1")
    expect(page.get_by_label("Command")).to_have_value("python sweep.py --lr 0.1")
    expect(page.get_by_label("GPU flavor")).to_have_value(str(cat.mig.pk))
    expect(page.get_by_label("GPUs")).to_have_value("2")

    page.get_by_label("Preset", exact=True).fill("mig sweep")
    page.get_by_role("button", name="Save as preset").click()
    expect(page.get_by_role("status").first).to_contain_text("Preset “mig sweep” saved for Vision.")
    expect(page.get_by_label("Command")).to_have_value("python sweep.py --lr 0.1")  # started from the preset

    page.get_by_label("Name").fill("sweep-2")
    page.get_by_role("button", name="Submit request").click()
    expect(page.get_by_role("heading", name="sweep-2")).to_be_visible()
    new = WorkloadRequest.objects.get(name="sweep-2")
    assert (new.flavor, new.gpus, new.duration_hours, new.parameters["command"]) == (cat.mig, 2, 6, "python sweep.py --lr 0.1")

    page.goto("/requests/new/")
    presets = page.get_by_role("region", name="Start from one of your presets")
    presets.get_by_role("link", name="Use preset mig sweep").click()
    expect(page.get_by_label("GPUs")).to_have_value("2")
    page.goto("/requests/new/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete preset mig sweep").click()
    expect(page.get_by_role("status").first).to_contain_text("Preset “mig sweep” deleted.")
    expect(page.get_by_role("region", name="Start from one of your presets")).to_have_count(0)


def test_one_catalogue_card_per_template_after_an_edit(signed_in, cast, cat) -> None:
    """Ops edit the notebook (a new version, which retires the old one): the catalogue shows one Notebook card,
    and it opens the new version's form."""
    from workloads import catalogue_services

    v2 = catalogue_services.template_create(actor=cast.actor("ops"), kind=cat.notebook.kind, slug="notebook", name="Notebook",
                                  max_gpus=1, allowed_flavors=list(cat.notebook.allowed_flavors.all()),
                                  parameters_schema={"type": "object", "properties": {}})
    page = signed_in("carol")
    page.goto(page.url.split("/", 3)[0] + "//" + page.url.split("/", 3)[2] + "/requests/new/")
    cards = page.get_by_role("link", name="Use Notebook template")
    expect(cards).to_have_count(1)
    assert (cards.get_attribute("href") or "").endswith("template=notebook")  # by slug: always the live version
    cards.click()
    expect(page.get_by_role("heading", name="New notebook")).to_be_visible()
    expect(page.get_by_text(f"Notebook v{v2.version}").first).to_be_visible()

"""A researcher consents to spill over on the new-request form and sees on the request page that the job spilled
from H100 to A100 because H100 was full (docs/federation.md). Two sandbox clusters, one per GPU model."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from quotas.models import Flavor
from quotas.zones import spill_policy_set
from tenants.access import Actor
from tests.zones import two_zones, zones_wait
from workloads import services
from workloads.materialize import request_materialize
from workloads.models import RequestState, ServiceTemplate, WorkloadRequest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def test_a_consenting_job_spills_to_a100_when_h100_is_full_and_says_so(signed_in, cast, tmp_path) -> None:
    with two_zones(tmp_path, cast) as zones:
        spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=True, target_models=["a100-80gb"])
        h100 = Flavor.objects.get(cluster=zones["h100"], name="h100-80gb")
        training = ServiceTemplate.objects.get(slug="training")
        full = services.request_submit(actor=Actor(user=cast.carol), project=cast.vision, template=training, flavor=h100,
                                       gpus=2, duration_hours=1, parameters={"command": "python train.py"}, name="fills-h100")
        assert request_materialize(request_id=full.pk) == "queued"
        zones_wait(zones, full.pk, {RequestState.RUNNING})

        page = signed_in("carol")
        page.goto("/requests/new/?template=training&project=acme-vision")
        page.get_by_label("Name").fill("spills")
        page.get_by_label("Command").fill("python train.py")
        page.get_by_label("GPU flavor").select_option(str(h100.pk))
        page.get_by_label("GPUs").fill("2")
        page.get_by_label("Also accepts (2nd choice)").select_option("a100-80gb")
        page.get_by_label("It may spill over to an accepted model when its own is full").check()
        page.get_by_role("button", name="Submit request").click()

        expect(page.get_by_role("heading", name="spills")).to_be_visible()
        placement = page.locator("#placement")
        expect(placement).to_contain_text("a100-80gb")
        expect(placement).to_contain_text("spilled over from h100-80gb")
        expect(placement).to_contain_text("Spilled over from h100-80gb to a100-80gb in zone a100-inference: "
                                          "h100-80gb is full in every zone that offers it to the project")
        req = WorkloadRequest.objects.get(name="spills")
        assert req.cluster_id == zones["a100"].pk and req.spilled and req.spill_consent

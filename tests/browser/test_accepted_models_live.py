"""The new-request form's accepted-model lists follow the needs as they are typed (docs/federation.md, "What a job
declares"; static/js/models.js): a model whose card cannot run them leaves the lists without a submit, and comes back
when the need is cleared. The server still checks on submit (tests/workloads/test_federation_form.py)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from quotas.models import Flavor
from tests.workloads.factories import make_catalogue, make_quota
from workloads.models import WorkloadRequest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_typing_a_memory_need_hides_a_model_that_cannot_run_it_and_clearing_it_brings_it_back(signed_in, cast) -> None:
    cat = make_catalogue(cast)
    Flavor.objects.filter(pk=cat.h100.pk).update(gpu_memory_mib=81559, compute_capability="9.0")  # 79.6 GiB
    a100 = Flavor.objects.create(cluster=cat.cluster, name="a100", display_name="A100 80GB", kind=Flavor.Kind.WHOLE,
                                 gpu_model="a100-80gb", gpu_memory_mib=81920, compute_capability="8.0", order=15)
    cat.training.allowed_flavors.add(a100)
    make_quota(cast.vision, a100, 4)

    page = signed_in("carol")
    page.goto("/requests/new/?template=training&project=acme-vision")
    second = page.get_by_label("Also accepts (2nd choice)")
    third = page.get_by_label("Also accepts (3rd choice)")
    h100_option, a100_option = second.locator("option[value='h100-80gb']"), second.locator("option[value='a100-80gb']")
    expect(h100_option).to_have_count(1)
    expect(a100_option).to_have_count(1)
    second.select_option("h100-80gb")

    page.get_by_label("Minimum GPU memory (GiB)").fill("80")  # the H100's 79.6 GiB is too little
    expect(h100_option).to_have_count(0)
    expect(third.locator("option[value='h100-80gb']")).to_have_count(0)
    expect(a100_option).to_have_count(1)
    expect(second).to_have_value("")  # the chosen model went with it
    expect(page.locator("#id_accept_model_2-filtered")).to_have_text("Not offered for these needs: h100-80gb.")

    page.get_by_label("Minimum GPU memory (GiB)").fill("")
    expect(h100_option).to_have_count(1)
    expect(h100_option).to_contain_text("cc 9.0")
    expect(page.locator("#id_accept_model_2-filtered")).to_have_text("")

    # Compute capability too, and both at once: nothing is left but "None".
    page.get_by_label("Minimum CUDA compute capability").fill("9.0")
    expect(a100_option).to_have_count(0)
    expect(h100_option).to_have_count(1)
    page.get_by_label("Minimum GPU memory (GiB)").fill("80")
    expect(second.locator("option")).to_have_count(1)
    page.get_by_label("Minimum CUDA compute capability").fill("")
    # Each change also asks the server for a cost estimate (htmx, 400 ms later): wait for the last one's answer, so
    # that no request is still running on the test server when the database is emptied after the test.
    with page.expect_response(lambda r: "/requests/new/estimate/" in r.url):
        page.get_by_label("Minimum GPU memory (GiB)").fill("")
    expect(second.locator("option")).to_have_count(3)
    assert page.url.endswith("/requests/new/?template=training&project=acme-vision")  # no submit happened
    assert not WorkloadRequest.objects.exists()

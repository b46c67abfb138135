"""The new-request form's federation fields (docs/federation.md, "What a job declares"), through the Django test
client: the models it accepts after its flavor's own (only those that run the image's declared needs), the image's
needs, and consent to spill over (offered only where a project's policy allows it). Refusals are form errors and
create nothing. The spill itself, from the form, is in tests/workloads/test_federation.py and tests/browser."""

from __future__ import annotations

import re

import pytest

from quotas.models import Flavor
from quotas.zones import spill_policy_set
from tenants.access import Actor
from workloads.models import WorkloadRequest

from .factories import make_quota
from .test_views import text, training_form

pytestmark = pytest.mark.django_db
URL = "/requests/new/?template=training"


@pytest.fixture
def cards(cat, cast):
    """The catalogue's flavors know their cards, as GPU Feature Discovery says them."""
    Flavor.objects.filter(pk=cat.h100.pk).update(gpu_memory_mib=81559, compute_capability="9.0")
    a100 = Flavor.objects.create(cluster=cat.cluster, name="a100", display_name="A100 80GB", kind=Flavor.Kind.WHOLE,
                                 gpu_model="a100-80gb", gpu_memory_mib=81920, compute_capability="8.0", order=15)
    cat.training.allowed_flavors.add(a100)
    make_quota(cast.vision, a100, 4)
    return cat


def _options(body: str, field: str) -> list[str]:
    select = re.search(rf'<select name="{field}"[^>]*>(.*?)</select>', body, re.S)
    assert select, f"no {field} select"
    return [v for v in re.findall(r'<option value="([^"]*)"', select.group(1)) if v]


def test_accepted_models_are_offered_and_consent_only_where_a_policy_allows(as_user, cast, cards) -> None:
    body = text(as_user("carol").get(URL))
    assert _options(body, "accept_model_2") == ["a100-80gb", "h100-80gb"]
    assert "a100-80gb (80 GiB, cc 8.0)" in body and 'name="min_compute_capability"' in body
    assert 'name="spill_consent"' not in body  # no project of carol's allows spill-over

    spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=True, target_models=["a100-80gb"],
                     needs_approval=True)
    body = text(as_user("carol").get(URL))
    assert 'name="spill_consent"' in body
    assert "Allowed in acme-vision: a100-80gb (needs approval)." in body


def test_models_that_cannot_run_the_image_are_not_offered_and_refused_with_why(as_user, cast, cards) -> None:
    spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=True)
    before = WorkloadRequest.objects.count()
    response = as_user("carol").post(URL, training_form(cards, min_compute_capability="9.0",
                                                       accept_model_2="a100-80gb", spill_consent="on"))
    body = text(response)
    assert response.status_code == 200
    assert "Not offered: a100-80gb has compute capability 8.0; the image needs 9.0 or newer." in body
    assert _options(body, "accept_model_2") == ["h100-80gb"]  # only what runs a 9.0 image
    # The flavor's own model too: refused before dispatch, next to the flavor.
    body = text(as_user("carol").post(URL, training_form(cards, min_gpu_memory_gib="100")))
    assert "Incompatible: h100-80gb has 79.6 GiB per GPU; the image needs 100 GiB." in body
    body = text(as_user("carol").post(URL, training_form(cards, min_compute_capability="nine")))
    assert "A CUDA compute capability such as 8.0 or 9.0." in body
    assert WorkloadRequest.objects.count() == before


def test_consent_needs_a_model_and_a_project_that_allows_it(as_user, cast, cards) -> None:
    spill_policy_set(actor=Actor(user=cast.bob), project=cast.vision, allowed=True, target_models=["a100-80gb"])
    client = as_user("carol")
    body = text(client.post(URL, training_form(cards, spill_consent="on")))
    assert "Name a model it may spill over to, or leave spill-over unticked." in body
    body = text(client.post(URL, training_form(cards, project="acme-nlp", accept_model_2="a100-80gb", spill_consent="on")))
    assert "Project acme-nlp does not allow spill-over: its work waits for its own model." in body
    assert not WorkloadRequest.objects.exists()

    response = client.post(URL, training_form(cards, accept_model_2="a100-80gb", spill_consent="on",
                                              min_gpu_memory_gib="10", min_compute_capability="8.0"))
    assert response.status_code == 302, text(response)
    req = WorkloadRequest.objects.get()
    assert (req.accepted_models, req.spill_consent, req.min_gpu_memory_gib, req.min_compute_capability) == (
        ["h100-80gb", "a100-80gb"], True, 10, "8.0")
    # Without consent the models are recorded, and the job never runs on another.
    response = client.post(URL, training_form(cards, accept_model_2="a100-80gb", name="no-consent"))
    assert response.status_code == 302, text(response)
    req = WorkloadRequest.objects.get(name="no-consent")
    assert (req.accepted_models, req.spill_consent, req.flavor_id) == (["h100-80gb", "a100-80gb"], False, cards.h100.pk)

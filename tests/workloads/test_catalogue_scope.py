"""The new-request pages offer what ``selectors.catalogue_for`` and ``template_flavors_for`` offer: the live
templates, each with the flavors the projects in view can use (allowed, enforced, with quota there). The
picker and the form take the same selector, so a template or a flavor the page shows can be submitted.

Quotas (tests/workloads/factories.py): acme-vision has H100 and MIG slices, acme-nlp H100 only, globex-llm H100
only; nobody has CPU quota. carol is a member of acme-vision and acme-nlp here (conftest).
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from quotas.models import Quota
from workloads import selectors
from workloads.models import ServiceTemplate, WorkloadRequest

from .test_views import text, training_form

pytestmark = pytest.mark.django_db


def _flavor_options(body: str) -> set[str]:
    select = re.search(r'<select name="flavor".*?</select>', body, re.S)
    assert select is not None, "no flavor field"
    return set(re.findall(r'<option value="(\d+)"', select.group(0)))


def _template_cards(body: str) -> list[str]:
    return re.findall(r'\?template=([a-z0-9-]+)', body)


@pytest.fixture
def cpu_template(cat) -> ServiceTemplate:
    """A CPU-only batch template: no project has CPU quota yet."""
    template = ServiceTemplate.objects.create(
        kind="training", slug="cpu-batch", name="CPU batch", parameters_schema=cat.training.parameters_schema,
        default_gpus=0,
    )
    template.allowed_flavors.set([cat.cpu])
    return template


def test_the_form_offers_the_flavors_the_chosen_project_can_use(as_user, cat) -> None:
    client = as_user("carol")
    vision = _flavor_options(text(client.get("/requests/new/?template=training&project=acme-vision")))
    assert vision == {str(cat.h100.pk), str(cat.mig.pk)}
    nlp = _flavor_options(text(client.get("/requests/new/?template=training&project=acme-nlp")))
    assert nlp == {str(cat.h100.pk)}  # acme-nlp has no MIG quota
    anywhere = _flavor_options(text(client.get("/requests/new/?template=training")))
    assert anywhere == {str(cat.h100.pk), str(cat.mig.pk)}  # no project chosen: what any of hers can use
    frank = _flavor_options(text(as_user("frank").get("/requests/new/?template=training")))
    assert frank == {str(cat.h100.pk)}


def test_a_template_no_project_can_use_is_not_offered(as_user, cast, cat, cpu_template) -> None:
    client = as_user("carol")
    assert "cpu-batch" not in _template_cards(text(client.get("/requests/new/")))
    unusable = text(client.get("/requests/new/?template=cpu-batch"))
    assert "That template is not offered" in unusable and 'name="flavor"' not in unusable

    Quota.objects.create(tenant=cast.acme, project=cast.nlp, flavor=cat.cpu, resource="cpu", nominal=Decimal(16),
                         borrowing_limit=Decimal(0))
    # CPUs without memory could never be admitted (the queue's memory quota would be 0): still not offered.
    assert "cpu-batch" not in _template_cards(text(client.get("/requests/new/?project=acme-nlp")))
    Quota.objects.create(tenant=cast.acme, project=cast.nlp, flavor=cat.cpu, resource="memory", nominal=Decimal(64),
                         borrowing_limit=Decimal(0))
    assert "cpu-batch" in _template_cards(text(client.get("/requests/new/")))
    assert "cpu-batch" in _template_cards(text(client.get("/requests/new/?project=acme-nlp")))
    assert "cpu-batch" not in _template_cards(text(client.get("/requests/new/?project=acme-vision")))
    wrong_project = text(client.get("/requests/new/?template=cpu-batch&project=acme-vision"))
    assert "not offered (any more), or not in this project" in wrong_project
    form = text(client.get("/requests/new/?template=cpu-batch&project=acme-nlp"))
    assert _flavor_options(form) == {str(cat.cpu.pk)}


def test_the_picker_and_the_selector_agree(as_user, cast, cat, cpu_template) -> None:
    Quota.objects.create(tenant=cast.acme, project=cast.nlp, flavor=cat.cpu, resource="cpu", nominal=Decimal(16),
                         borrowing_limit=Decimal(0))
    for slug, projects in [("acme-nlp", [cast.nlp]), ("acme-vision", [cast.vision]), ("", [cast.vision, cast.nlp])]:
        page = as_user("carol").get("/requests/new/" + (f"?project={slug}" if slug else ""))
        shown = {t.pk: [f.pk for f in t.offered_flavors] for t in page.context["templates"]}
        expected = selectors.catalogue_for(actor=cast.actor("carol"), projects=projects)
        assert set(shown) == {t.pk for t in expected}, slug
        for template in expected:
            assert shown[template.pk] == [f.pk for f in selectors.template_flavors_for(template=template, projects=projects)]
    # The catalogue itself (the API's list) is every live template, whoever may use it.
    live = {t.slug for t in selectors.catalogue_for(actor=cast.actor("carol"))}
    assert {"training", "notebook", "inference", "cpu-batch"} <= live


def test_a_forged_flavor_no_project_can_use_is_refused_with_the_reason(as_user, cast, cat) -> None:
    body = training_form(cat, project="globex-llm", flavor=str(cat.mig.pk))
    response = as_user("frank").post("/requests/new/?template=training", body)
    page = text(response)
    error = re.search(r'<ul class="errorlist" id="id_flavor_error">(.*?)</ul>', page, re.S)
    assert response.status_code == 200 and error is not None
    assert "no project you may submit to has quota" in error.group(1)
    assert "python train.py" in page and "SEED=1" in page  # what was typed stays
    assert not WorkloadRequest.objects.exists()


def test_a_flavor_without_quota_in_the_chosen_project_is_refused_by_the_service(as_user, cast, cat) -> None:
    # Offered (acme-vision has MIG quota) but sent for acme-nlp: the service says why, next to the form.
    response = as_user("carol").post("/requests/new/?template=training",
                                     training_form(cat, project="acme-nlp", flavor=str(cat.mig.pk)))
    assert response.status_code == 200
    assert "has no quota for A100 1g.10gb" in text(response)
    assert not WorkloadRequest.objects.exists()

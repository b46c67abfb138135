"""The new-request form follows what is typed (issue 27): its cost estimate is asked again (htmx) whenever a field
changes, and the figure shown is the API's ``cost_estimate`` of the request it submits."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from playwright.sync_api import expect
from rest_framework.test import APIClient

from billing import services
from tests.workloads.factories import make_catalogue
from workloads.models import WorkloadRequest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_cost_estimate_follows_the_form_and_agrees_with_the_api(signed_in, cast) -> None:
    cat = make_catalogue(cast)
    services.price_create(actor=cast.actor("ops"), unit="gpu", key="h100-80gb", amount=Decimal("5.64"),
                          effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    page = signed_in("carol")
    page.goto("/requests/new/?template=training&project=acme-vision")
    page.get_by_label("GPU flavor").select_option(label=str(cat.h100))
    estimate = page.locator("#cost-estimate")
    expect(estimate).to_contain_text("EUR")
    at_defaults = estimate.inner_text()

    page.get_by_label("Name").fill("small-run")
    page.get_by_label("Command").fill("python train.py")
    page.get_by_label("Duration (hours)").fill("1")
    page.get_by_label("GPUs").fill("2")
    page.get_by_label("GPUs").blur()
    expect(estimate).to_contain_text("11.28 EUR")  # 2 GPUs x 1 h x 5.64
    assert estimate.inner_text() != at_defaults
    page.get_by_label("GPUs").fill("")
    page.get_by_label("GPUs").blur()
    expect(estimate).to_contain_text("No estimate until GPUs is valid")
    page.get_by_label("GPUs").fill("1")
    page.get_by_label("GPUs").blur()
    expect(estimate).to_contain_text("5.64 EUR")
    shown = estimate.locator("strong").inner_text()

    page.get_by_role("button", name="Submit request").click()
    expect(page.get_by_role("heading", name="small-run")).to_be_visible()
    req = WorkloadRequest.objects.get(name="small-run")
    api = APIClient()
    api.force_login(cast.carol)
    assert f"{api.get(f'/api/v1/requests/{req.pk}/').json()['cost_estimate']} EUR" == shown

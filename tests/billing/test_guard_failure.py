"""What a failing extension means (portal/extensions.py, docs/extending.md): the budget guard is enforcing, so a
billing fault refuses submissions ("budget check unavailable": 503 from the API, a form error on the page) instead
of letting them through; the advisory slots (what remains of the budget, the cost estimate) answer nothing and the
page still works. The fault is a real one: a corrupt price row (NaN) that makes billing's sums unusable."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection

from billing import budgets
from billing.models import Price
from workloads.models import WorkloadRequest

from ..workloads.test_views import training_form
from .test_budgets import API, TRAIN, _setup_costs

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql]


def _corrupt_prices() -> None:
    # What a bad import or a hand edit in the database leaves: not a number (PostgreSQL's numeric holds NaN),
    # written behind the services' back.
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Price._meta.db_table} SET amount = 'NaN'")


def _refusing_budget(cast, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        budgets.budget_create(actor=cast.actor("ops"), tenant=cast.acme, project=cast.vision,
                              amount=Decimal("10000"), refuse_when_spent=True)


def test_a_billing_fault_refuses_api_submissions_instead_of_accepting_them(token_client, cast, cat,
                                                                            django_capture_on_commit_callbacks) -> None:
    _setup_costs(cast, cat, minutes=30)
    _refusing_budget(cast, django_capture_on_commit_callbacks)
    _corrupt_prices()  # before anything reads the price list (each process keeps a copy)
    client, _ = token_client("carol", cast.vision, "read+submit")
    refused = client.post(f"{API}/requests/", TRAIN | {"name": "during"}, format="json")
    assert refused.status_code == 503, refused.content
    assert refused.json()["error"] == "unavailable"
    assert refused.json()["detail"].startswith("Budget check unavailable")
    assert not WorkloadRequest.objects.filter(name="during").exists()
    # A tenant without a refusing budget is not asked anything: its submissions go on.
    frank, _ = token_client("frank", cast.llm, "read+submit")
    assert frank.post(f"{API}/requests/", TRAIN | {"name": "other"}, format="json").status_code == 201


def test_the_request_page_shows_the_refusal_and_the_advisory_slots_answer_nothing(as_user, cast, cat,
                                                                                  django_capture_on_commit_callbacks) -> None:
    _setup_costs(cast, cat, minutes=30)
    _refusing_budget(cast, django_capture_on_commit_callbacks)
    _corrupt_prices()  # before anything reads the price list (each process keeps a copy)
    client = as_user("carol")
    form_url = f"/requests/new/?template=training&project={cast.vision.slug}"
    # Advisory: what remains of the budget cannot be said, so the form says nothing about it and still renders.
    page = client.get(form_url)
    assert page.status_code == 200 and "Remaining this month" not in page.content.decode()
    # Enforcing: the submission is refused with the reason next to the project field, the values kept.
    response = client.post("/requests/new/?template=training", training_form(cat, name="during"))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Budget check unavailable" in body and 'value="during"' in body
    assert not WorkloadRequest.objects.filter(name="during").exists()

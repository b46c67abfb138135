"""The cost estimate extension point (``portal.extensions.cost_estimator``): workloads asks, billing answers.

Billing registers its estimator in its ``AppConfig.ready()``; without a price list it has no answer, so every
estimate is null and the pages say billing is not configured. An estimator registered here shows in the API's
``cost_estimate``, in the approvals inbox's context and on the request form; one that fails is logged and shows
nothing. (Billing's own prices: tests/billing/test_estimate.py.)
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from portal.extensions import cost_estimator
from workloads.models import RequestState

from .factories import make_request

pytestmark = pytest.mark.django_db

API = "/api/v1"
S = RequestState


def per_gpu_hour(request: Any) -> Decimal | None:
    """2.125 a GPU-hour (rounded once, to the cent, by the kit); no answer without GPUs or hours."""
    if not request.gpus or not request.duration_hours:
        return None
    return Decimal("2.125") * request.gpus * (request.replicas or 1) * request.duration_hours


def broken(request: Any) -> Decimal:
    raise RuntimeError("price list unreachable")


def test_without_a_price_list_the_estimate_is_null_everywhere(api, as_user, cast, cat) -> None:
    assert cost_estimator.active  # billing's, with no prices yet
    req = make_request(cat, cast.vision, cast.carol, gpus=4, duration_hours=3)
    assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_estimate"] is None
    [row] = api("bob").get(f"{API}/approvals/").json()["results"]
    assert row["cost_estimate"] is None and row["context"]["cost_estimate"] is None
    form = as_user("carol").get("/requests/new/?template=training&project=acme-vision").content.decode()
    assert "Billing not configured: no price list yet, so no estimate." in form
    assert "Billing not configured." in as_user("bob").get("/approvals/").content.decode()


def test_a_registered_estimator_shows_in_the_api_the_inbox_and_the_form(api, as_user, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, gpus=4, duration_hours=3)
    other = make_request(cat, cast.llm, cast.frank, gpus=1, duration_hours=1)
    with cost_estimator.registered(per_gpu_hour, currency="EUR"):
        detail = api("carol").get(f"{API}/requests/{req.pk}/").json()
        assert detail["cost_estimate"] == "25.50"  # 2.125 x 4 x 3, a decimal string as the schema says
        listed = {row["id"]: row["cost_estimate"] for row in api("carol").get(f"{API}/requests/").json()["results"]}
        assert listed == {req.pk: "25.50"}  # still tenant-scoped: frank's request is not there
        assert api("carol").get(f"{API}/requests/{other.pk}/").status_code == 404
        [row] = api("bob").get(f"{API}/approvals/").json()["results"]
        assert row["context"]["cost_estimate"] == "25.50"
        inbox = as_user("bob").get("/approvals/").content.decode()
        assert "25.50 EUR" in inbox and "Billing not configured." not in inbox
        # The form estimates what it shows: the template's defaults (1 GPU for 8 hours).
        form = as_user("carol").get("/requests/new/?template=training&project=acme-vision").content.decode()
        assert "<strong>17.00 EUR</strong>" in form and "Billing not configured" not in form
        # After a refused POST, what was sent: 3 GPUs for 2 hours.
        sent = {"project": "acme-vision", "name": "Not A Name!", "image": "nvcr.io/nvidia/pytorch:26.10-py3",
                "custom_image": "", "flavor": str(cat.h100.pk), "gpus": "3", "cpu": "4", "memory_gib": "32",
                "duration_hours": "2", "priority": "batch", "idempotency_key": "", "param_command": "python train.py"}
        refused = as_user("carol").post("/requests/new/?template=training", sent)
        assert refused.status_code == 200 and "<strong>12.75 EUR</strong>" in refused.content.decode()
    assert cost_estimator.active  # billing's again, and it has no price list
    assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_estimate"] is None


def test_a_failing_estimator_is_logged_and_shows_nothing(api, as_user, cast, cat, caplog) -> None:
    req = make_request(cat, cast.vision, cast.carol, gpus=4, duration_hours=3)
    with cost_estimator.registered(broken, currency="EUR"):
        assert api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_estimate"] is None
        form = as_user("carol").get("/requests/new/?template=training&project=acme-vision").content.decode()
        assert "Billing not configured" in form
    assert "the cost estimate extension failed" in caplog.text and "price list unreachable" in caplog.text

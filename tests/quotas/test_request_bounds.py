"""Quota requests are bounded by what the cluster has, numbers are asked for in sensible units, and
in-use figures say when they were read. Pages through the test client; the API with its client.

The fleet (tests/quotas/factories.py): h100-80gb has 16 GPUs that count; vision has 4 of them.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from quotas.models import Cluster, Quota, QuotaRequest

from .factories import GPU, MIG_1G

pytestmark = pytest.mark.django_db

API = "/api/v1"
URL = "/projects/acme-vision/quota/request/"


def text(response) -> str:
    return response.content.decode()


def target(flavor, resource: str = GPU) -> str:
    return f"{flavor.pk}|{resource}"


def amount_error(response) -> str:
    found = re.search(r'id="id_qr-amount_error"[^>]*>(.*?)</ul>', text(response), re.S)
    return re.sub(r"<[^>]+>", "", found.group(1)).strip() if found else ""


# Capacity --------------------------------------------------------------------------------------


def test_a_request_beyond_the_cluster_is_refused_with_the_numbers(as_user, split) -> None:
    response = as_user("carol").post(URL, {"qr-target": target(split.h100), "qr-amount": "100000", "qr-reason": "All of it."})
    assert response.status_code == 200
    assert amount_error(response) == ("Cluster gpu-test has 16 h100-80gb GPUs in all; Vision already has 4, so it can ask "
                                      "for at most 12 more (asked for 100000).")
    assert not QuotaRequest.objects.exists()


def test_up_to_the_capacity_is_accepted(as_user, split) -> None:
    response = as_user("carol").post(URL, {"qr-target": target(split.h100), "qr-amount": "12", "qr-reason": "The rest."})
    assert response.status_code == 302
    assert QuotaRequest.objects.get().amount == 12
    # One more than the rest is refused.
    response = as_user("carol").post(URL, {"qr-target": target(split.h100), "qr-amount": "13", "qr-reason": "More."})
    assert "at most 12 more (asked for 13)" in amount_error(response)


def test_api_refuses_beyond_capacity_with_400(api, split) -> None:
    body = {"project": "acme-vision", "flavor": "h100-80gb", "amount": 100000, "reason": "All of it."}
    response = api("carol").post(f"{API}/quota-requests/", body, format="json")
    assert response.status_code == 400
    assert response.json()["fields"]["amount"] == [
        "Cluster gpu-test has 16 h100-80gb GPUs in all; Vision already has 4, so it can ask for at most 12 more (asked for 100000)."]
    assert not QuotaRequest.objects.exists()


def test_no_capacity_says_none_can_be_asked_for(api, split) -> None:
    from quotas.models import Node

    Node.objects.filter(cluster=split.cluster).update(ready=False)
    body = {"project": "acme-vision", "flavor": "h100-80gb", "amount": 1, "reason": "One."}
    response = api("carol").post(f"{API}/quota-requests/", body, format="json")
    assert response.status_code == 400
    assert "has no h100-80gb GPUs on nodes that count today" in response.json()["fields"]["amount"][0]


def test_mig_slices_are_bounded_too(api, split) -> None:
    body = {"project": "acme-vision", "flavor": split.mig.name, "resource": MIG_1G, "amount": 57, "reason": "x"}
    response = api("carol").post(f"{API}/quota-requests/", body, format="json")
    assert response.status_code == 400
    assert "56 a100-80gb-mig-1g.10gb MIG slices in all" in response.json()["fields"]["amount"][0]


# Units and huge numbers --------------------------------------------------------------------------


def test_the_request_form_never_asks_for_a_thousandth_of_a_gpu(as_user, split) -> None:
    body = text(as_user("carol").get("/projects/acme-vision/quota/"))
    field = re.search(r'<input[^>]*name="qr-amount"[^>]*>', body).group(0)
    assert 'type="text"' in field and 'inputmode="decimal"' in field
    assert "0.001" not in field and "min=" not in field and "step=" not in field
    assert "0.001" not in body


@pytest.mark.parametrize(("amount", "message"), [
    ("0", "Ask for at least 1: nvidia.com/gpu is counted in whole units."),
    ("0.001", "Ask for at least 1: nvidia.com/gpu is counted in whole units."),
    ("1.5", "nvidia.com/gpu is counted in whole units: ask for a whole number."),
    ("1e309", "This number is too large (at most 99999999999.999)."),
    ("", "This field is required."),
])
def test_gpu_amounts_are_whole_and_bounded(as_user, split, amount, message) -> None:
    response = as_user("carol").post(URL, {"qr-target": target(split.h100), "qr-amount": amount, "qr-reason": "x"})
    assert amount_error(response) == message
    assert "0.001" not in amount_error(response)
    assert not QuotaRequest.objects.exists()


def test_cpu_amounts_may_be_fractions(as_user, split) -> None:
    response = as_user("carol").post(URL, {"qr-target": target(split.cpu, "cpu"), "qr-amount": "0", "qr-reason": "x"})
    assert amount_error(response) == "Ask for more than 0."


@pytest.mark.parametrize("amount", ["1e309", 1e309])
def test_api_huge_amount_is_too_large_not_required(api, split, amount) -> None:
    raw = '{"project": "acme-vision", "flavor": "h100-80gb", "amount": %s, "reason": "x"}' % (
        f'"{amount}"' if isinstance(amount, str) else "1e309")
    response = api("carol").post(f"{API}/quota-requests/", raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["fields"]["amount"] == ["This number is too large (at most 99999999999.999)."]


# As of -------------------------------------------------------------------------------------------


def test_in_use_figures_say_when_they_were_read(as_user, split) -> None:
    page = text(as_user("carol").get("/projects/acme-vision/quota/"))
    assert "In use: not read from the cluster yet" in page
    read = timezone.now().replace(microsecond=0) - timedelta(minutes=3)
    Cluster.objects.filter(pk=split.cluster.pk).update(reconciled_at=read)
    Quota.objects.filter(project__slug="acme-vision").update(used=3, usage_at=read - timedelta(days=2))
    stamp = f'In use as of <time datetime="{read.isoformat()}">{read:%Y-%m-%d %H:%M} UTC</time>'
    for url in ("/projects/acme-vision/quota/", "/projects/acme-vision/"):
        assert stamp in text(as_user("carol").get(url)), url
    assert stamp in text(as_user("alice").get("/tenants/acme/quotas/"))
    assert stamp in text(as_user("ops").get(f"/ops/capacity/?cluster={split.cluster.name}"))


def test_api_quota_summary_has_the_reading_time(api, split) -> None:
    read = timezone.now().replace(microsecond=0)
    Cluster.objects.filter(pk=split.cluster.pk).update(reconciled_at=read)
    rows = api("carol").get(f"{API}/projects/acme-vision/quota/").json()["quotas"]
    assert rows and all(r["usage_read_at"] == read.isoformat().replace("+00:00", "Z") for r in rows)

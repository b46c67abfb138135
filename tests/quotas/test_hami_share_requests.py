"""HAMi quota in shares (issue 27, "HAMi shares people can size"): a member asks for one request in shares of a
HAMi flavor (its preset size, or GiB and % of the cores within bounds), not three raw-unit requests; the pages and
the API show it as people think of it; approval raises the vGPU slots, cores and memory rows together (all or none),
and the end of the request takes all three back. Quota tables show HAMi's GPU memory in GiB."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client as DjangoClient
from django.utils import timezone

from quotas import services
from quotas.models import Quota, QuotaRequest
from tenants.models import AuditEntry

from .factories import GPU

pytestmark = pytest.mark.django_db

API = "/api/v1"
CORES, MEM = "nvidia.com/total-gpucores", "nvidia.com/total-gpumem"
SHARE = "L40S shared (HAMi) · 11 GiB, 25 % of the cores"


@pytest.fixture
def hami(cast, fleet):
    """The fleet's L40S flavor with a quarter-card share (11 GiB, 25 %); acme holds half the cards' shares, all unassigned."""
    ops = cast.actor("ops")
    flavor = services.flavor_update(actor=ops, flavor=fleet.hami, display_name="L40S shared (HAMi)",
                                    hami_memory_mib=11264, hami_cores_percent=25)
    for resource, nominal in ((GPU, 20), (CORES, 200), (MEM, 92136)):
        services.quota_set(actor=ops, tenant=cast.acme, flavor=flavor, resource=resource, nominal=nominal)
    return flavor


def vision_rows(cast, flavor) -> dict[str, Decimal]:
    return {q.resource: q.nominal for q in Quota.objects.filter(project=cast.vision, flavor=flavor)}


def written() -> tuple[int, ...]:
    return Quota.objects.count(), QuotaRequest.objects.count(), AuditEntry.objects.count()


def ask(api, **changes):
    body = {"project": "acme-vision", "flavor": "l40s-hami", "shares": 4, "reason": "Try HAMi for inference tests.",
            **changes}
    body = {key: value for key, value in body.items() if value is not None}
    return api("carol").post(f"{API}/quota-requests/", body, format="json")


def test_api_asks_in_shares_and_approval_raises_the_three_rows(api, cast, hami) -> None:
    response = ask(api)
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["what"] == f"+4 shares of {SHARE}"
    assert (data["resource"], data["amount"], data["approver"]) == (GPU, "4.000", "project_admin")
    assert data["share"]["size"] == "11 GiB, 25 % of the cores"
    assert data["share"]["total"] == "44 GiB of GPU memory and 100 % of a card's cores"
    assert data["share"]["rows"] == [{"resource": GPU, "amount": "4"}, {"resource": CORES, "amount": "100"},
                                     {"resource": MEM, "amount": "45056"}]

    approved = api("bob").post(f"{API}/quota-requests/{data['id']}/approve/", {}, format="json")
    assert approved.status_code == 200, approved.content
    assert vision_rows(cast, hami) == {GPU: 4, CORES: 100, MEM: 45056}
    assert set(approved.json()["applied"]["rows"]) == {GPU, CORES, MEM}


def test_a_raw_row_of_a_hami_flavor_is_refused_with_the_reason(api, cast, hami) -> None:
    before = written()
    response = ask(api, shares=None, resource=MEM, amount=46068)
    assert response.status_code == 400, response.content
    assert "is asked for in shares" in str(response.json()["fields"]["resource"])
    assert written() == before


@pytest.mark.parametrize("changes, field, words", [
    ({"share_memory_gib": 64}, "share_memory_gib", "at most one card's memory: 45 GiB"),
    ({"share_memory_gib": 0}, "share_memory_gib", ""),
    ({"share_cores_percent": 150}, "share_cores_percent", ""),
    ({"shares": 17}, "amount", "at most 16 more shares of 11 GiB, 25 % of the cores"),
    ({"shares": 2, "amount": 3}, "shares", "not both"),
])
def test_bad_share_input_is_a_400_naming_the_field(api, cast, hami, changes, field, words) -> None:
    before = written()
    response = ask(api, **changes)
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"], response.json()
    assert words in str(response.json()["fields"][field])
    assert written() == before


def test_a_share_size_within_bounds_is_asked_for_and_applied(api, cast, hami) -> None:
    response = ask(api, shares=2, share_memory_gib="20", share_cores_percent=50)
    assert response.status_code == 201, response.content
    assert response.json()["what"] == "+2 shares of L40S shared (HAMi) · 20 GiB, 50 % of the cores"
    assert api("bob").post(f"{API}/quota-requests/{response.json()['id']}/approve/", {}, format="json").status_code == 200
    assert vision_rows(cast, hami) == {GPU: 2, CORES: 100, MEM: 40960}


def test_approval_is_all_or_nothing(api, cast, hami) -> None:
    """Asked when acme's unassigned quota covered all three rows (a project admin decides); then the tenant admin gave
    most of acme's GPU memory to acme-nlp. Bob's approval fails on the memory row: the slots and cores are not raised."""
    request_id = ask(api).json()["id"]
    services.quota_set(actor=cast.actor("alice"), project=cast.nlp, flavor=hami, resource=MEM, nominal=60000)
    response = api("bob").post(f"{API}/quota-requests/{request_id}/approve/", {}, format="json")
    assert response.status_code == 403, response.content
    assert "no longer covers" in str(response.json())
    assert vision_rows(cast, hami) == {}
    assert QuotaRequest.objects.get(pk=request_id).status == "pending"
    # A tenant admin may decide it: the tenant's pool grows by the memory shortfall, all three rows at once.
    assert api("alice").post(f"{API}/quota-requests/{request_id}/approve/", {}, format="json").status_code == 200
    assert vision_rows(cast, hami) == {GPU: 4, CORES: 100, MEM: 45056}


def test_the_end_of_a_share_request_takes_the_three_rows_back(api, cast, hami) -> None:
    until = timezone.now() + timedelta(days=1)
    request_id = ask(api, until=until.isoformat()).json()["id"]
    assert api("bob").post(f"{API}/quota-requests/{request_id}/approve/", {}, format="json").status_code == 200
    assert services.quota_request_revert(request_id=request_id, now=until + timedelta(minutes=1))
    assert vision_rows(cast, hami) == {GPU: 0, CORES: 0, MEM: 0}
    assert QuotaRequest.objects.get(pk=request_id).status == "reverted"


def test_the_pages_ask_show_and_approve_in_shares(cast, hami) -> None:
    carol, bob = DjangoClient(), DjangoClient()
    carol.force_login(cast.carol)
    bob.force_login(cast.bob)
    page = carol.get("/projects/acme-vision/quota/")
    labels = dict(page.context["form"].fields["target"].choices)
    assert labels[f"{hami.pk}|{GPU}"] == "L40S shared (HAMi) — shares of 11 GiB, 25 % of the cores"
    assert f"{hami.pk}|{MEM}" not in labels and f"{hami.pk}|{CORES}" not in labels  # no raw-unit requests

    sent = carol.post("/projects/acme-vision/quota/request/", {
        "qr-target": f"{hami.pk}|{GPU}", "qr-amount": "4", "qr-reason": "Try HAMi."}, follow=True)
    assert f"+4 shares of {SHARE}" in sent.content.decode()
    request = QuotaRequest.objects.get()
    assert (request.amount, request.share_memory_mib, request.share_cores_percent) == (4, 11264, 25)

    inbox = bob.get("/quota-requests/").content.decode()
    assert f"+4 shares of {SHARE}" in inbox
    assert "44 GiB of GPU memory and 100 % of a card&#x27;s cores in all" in inbox
    detail = bob.get(f"/quota-requests/{request.pk}/").content.decode()
    assert "vGPU slots +4, GPU cores +100 % of a card, GPU memory +44 GiB" in detail

    bob.post(f"/quota-requests/{request.pk}/decide/", {"decision": "approve"})
    assert vision_rows(cast, hami) == {GPU: 4, CORES: 100, MEM: 45056}
    table = carol.get("/projects/acme-vision/quota/").content.decode()
    assert "44 GiB" in table and "45056" not in table  # HAMi's GPU memory in GiB, not "total-gpumem 45056"
    assert "(GiB of GPU memory)" in table


def test_a_share_size_out_of_bounds_is_a_form_error(cast, hami) -> None:
    carol = DjangoClient()
    carol.force_login(cast.carol)
    page = carol.post("/projects/acme-vision/quota/request/", {
        "qr-target": f"{hami.pk}|{GPU}", "qr-amount": "1", "qr-share_memory_gib": "100", "qr-reason": "Big."})
    assert page.status_code == 200
    assert "at most one card" in str(page.context["form"].errors["share_memory_gib"])
    assert not QuotaRequest.objects.exists()

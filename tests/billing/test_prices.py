"""The price list through the API and the ops pages: ops write (audited), everyone signed in reads, tenants'
discounts and usage stay theirs, and nothing takes effect inside a finalised month."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import services
from billing.models import BillingPeriod, Discount, Price, UsageInterval
from tenants.models import AuditEntry

from ..workloads.factories import make_request

pytestmark = pytest.mark.django_db
API = "/api/v1"
T0 = "2026-01-01T00:00:00Z"


def _last_month_start() -> date:
    first = timezone.now().astimezone(UTC).date().replace(day=1)
    return (first - timedelta(days=1)).replace(day=1)


def test_ops_add_change_and_remove_prices_through_the_api_audited(api, cast) -> None:
    ops = api("ops")
    made = ops.post(f"{API}/prices/", {"unit": "gpu", "key": "h100-80gb", "amount": "2.500000", "effective_from": T0}, format="json")
    assert made.status_code == 201, made.json()
    body = made.json()
    assert body["currency"] == "EUR" and Decimal(body["amount"]) == Decimal("2.5") and body["created_by"] == "ops"
    changed = ops.patch(f"{API}/prices/{body['id']}/", {"amount": "3.1"}, format="json")
    assert changed.status_code == 200 and Decimal(changed.json()["amount"]) == Decimal("3.1")
    listed = ops.get(f"{API}/prices/?unit=gpu&key=h100-80gb").json()
    assert [p["id"] for p in listed["results"]] == [body["id"]]
    assert ops.delete(f"{API}/prices/{body['id']}/").status_code == 204
    assert not Price.objects.exists()
    actions = list(AuditEntry.objects.filter(action__startswith="price.").order_by("seq").values_list("action", "actor_label"))
    assert actions == [("price.create", "ops"), ("price.update", "ops"), ("price.delete", "ops")]
    update = AuditEntry.objects.get(action="price.update")
    assert update.before["amount"] != update.after["amount"]


@pytest.mark.parametrize(("sent", "field"), [
    ({"unit": "gpu", "amount": "2", "effective_from": T0}, "key"),  # a whole GPU is priced by model
    ({"unit": "cpu", "key": "x", "amount": "2", "effective_from": T0}, "key"),
    ({"unit": "cpu", "amount": "-1", "effective_from": T0}, "amount"),
    ({"unit": "cpu", "amount": "1e309", "effective_from": T0}, "amount"),
    ({"unit": "cpu", "amount": "1", "currency": "USD", "effective_from": T0}, "currency"),
    ({"unit": "teapot", "amount": "1", "effective_from": T0}, "unit"),
    ({"unit": "cpu", "amount": "1", "effective_from": "yesterday"}, "effective_from"),
    ({"unit": "cpu", "amount": "1", "effective_from": T0, "colour": "red"}, "colour"),
])
def test_bad_prices_are_400_with_the_field(api, cast, sent, field) -> None:
    answer = api("ops").post(f"{API}/prices/", sent, format="json")
    assert answer.status_code == 400, answer.json()
    assert field in str(answer.json()), answer.json()
    assert not Price.objects.exists()


def test_the_same_instant_twice_is_a_field_error(api, cast) -> None:
    sent = {"unit": "cpu", "amount": "0.05", "effective_from": T0}
    assert api("ops").post(f"{API}/prices/", sent, format="json").status_code == 201
    again = api("ops").post(f"{API}/prices/", sent, format="json")
    assert again.status_code == 400 and "effective_from" in str(again.json())


def test_tenant_users_read_prices_but_never_write_them(api, token_client, cast) -> None:
    price = services.price_create(actor=cast.actor("ops"), unit="cpu", amount=Decimal("0.04"),
                                  effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    for who in ("alice", "carol", "erin"):
        client = api(who)
        assert client.get(f"{API}/prices/").json()["count"] == 1
        assert client.post(f"{API}/prices/", {"unit": "memory", "amount": "1", "effective_from": T0}, format="json").status_code == 403
        assert client.patch(f"{API}/prices/{price.pk}/", {"amount": "0"}, format="json").status_code == 403
        assert client.delete(f"{API}/prices/{price.pk}/").status_code == 403
    client, _ = token_client("carol", cast.vision, "read+submit")
    assert client.post(f"{API}/prices/", {"unit": "memory", "amount": "1", "effective_from": T0}, format="json").status_code == 403
    price.refresh_from_db()
    assert price.amount == Decimal("0.04") and Price.objects.count() == 1
    assert api("nobody").get(f"{API}/prices/").status_code == 200  # signed in: the price list is public to users
    from rest_framework.test import APIClient
    assert APIClient().get(f"{API}/prices/").status_code in (401, 403)


def test_nothing_takes_effect_inside_a_finalised_month(api, cast) -> None:
    ops = cast.actor("ops")
    last = _last_month_start()
    inside = datetime(last.year, last.month, 10, tzinfo=UTC)
    early = services.price_create(actor=ops, unit="cpu", amount=Decimal("0.04"), effective_from=inside)
    services.period_finalise(actor=ops, month=last)
    assert BillingPeriod.objects.get(month=last).finalised_at is not None
    end = datetime(timezone.now().year, timezone.now().month, 1, tzinfo=UTC)

    added = api("ops").post(f"{API}/prices/", {"unit": "cpu", "amount": "0.05",
                                               "effective_from": (end - timedelta(hours=1)).isoformat()}, format="json")
    assert added.status_code == 400 and "effective_from" in str(added.json())
    assert "finalised" in str(added.json())
    changed = api("ops").patch(f"{API}/prices/{early.pk}/", {"amount": "0.01"}, format="json")
    assert changed.status_code == 400 and "finalised" in str(changed.json())
    moved = api("ops").patch(f"{API}/prices/{early.pk}/", {"effective_from": end.isoformat()}, format="json")
    assert moved.status_code == 400
    assert api("ops").delete(f"{API}/prices/{early.pk}/").status_code == 400
    early.refresh_from_db()
    assert early.amount == Decimal("0.04") and early.effective_from == inside
    # From the end of the finalised month on, prices change as usual (the new one splits usage at its instant).
    later = api("ops").post(f"{API}/prices/", {"unit": "cpu", "amount": "0.05", "effective_from": end.isoformat()}, format="json")
    assert later.status_code == 201
    # Discounts obey the same rule.
    refused = api("ops").post(f"{API}/discounts/", {"tenant": "acme", "percent": "10",
                                                    "effective_from": inside.isoformat()}, format="json")
    assert refused.status_code == 400 and "effective_from" in str(refused.json())
    with pytest.raises(Exception, match="after it ended"):
        services.period_finalise(actor=ops, month=timezone.now().date())


def test_discounts_are_ops_set_and_each_tenant_sees_only_its_own(api, cast) -> None:
    made = api("ops").post(f"{API}/discounts/", {"tenant": "acme", "percent": "12.5", "effective_from": T0}, format="json")
    assert made.status_code == 201, made.json()
    bad = api("ops").post(f"{API}/discounts/", {"tenant": "acme", "percent": "150", "effective_from": T0}, format="json")
    assert bad.status_code == 400 and "percent" in str(bad.json())
    assert api("ops").post(f"{API}/discounts/", {"tenant": "nope", "percent": "1", "effective_from": T0},
                           format="json").status_code == 400
    pk = made.json()["id"]
    assert [d["tenant"] for d in api("alice").get(f"{API}/discounts/").json()["results"]] == ["acme"]
    assert api("carol").get(f"{API}/discounts/{pk}/").status_code == 200
    assert api("erin").get(f"{API}/discounts/").json()["count"] == 0
    assert api("erin").get(f"{API}/discounts/{pk}/").status_code == 404
    assert api("erin").delete(f"{API}/discounts/{pk}/").status_code == 404
    assert api("alice").delete(f"{API}/discounts/{pk}/").status_code == 403
    assert api("alice").post(f"{API}/discounts/", {"tenant": "acme", "percent": "50", "effective_from": T0},
                             format="json").status_code == 403
    assert AuditEntry.objects.filter(action="discount.create", tenant=cast.acme).count() == 1
    assert api("ops").delete(f"{API}/discounts/{pk}/").status_code == 204
    assert not Discount.objects.exists()


def test_usage_is_seen_only_by_its_tenant(api, token_client, cast, cat) -> None:
    mine = make_request(cat, cast.vision, cast.carol, state="running")
    theirs = make_request(cat, cast.llm, cast.frank, state="running")
    start = datetime(2026, 1, 5, tzinfo=UTC)
    for req in (mine, theirs):
        UsageInterval.objects.create(request=req, tenant=req.tenant, project=req.project, cluster=cat.cluster,
                                     run_key=f"wl/u{req.pk}/x", source="workload", object_uid=f"u{req.pk}",
                                     object_name="w", unit="gpu", key="h100-80gb", quantity=Decimal(1), started_at=start)
    assert [u["request"] for u in api("carol").get(f"{API}/usage/").json()["results"]] == [mine.pk]
    assert [u["request"] for u in api("frank").get(f"{API}/usage/").json()["results"]] == [theirs.pk]
    assert api("nobody").get(f"{API}/usage/").json()["count"] == 0
    other = UsageInterval.objects.get(request=theirs).pk
    assert api("carol").get(f"{API}/usage/{other}/").status_code == 404
    assert api("carol").get(f"{API}/usage/?tenant=globex").json()["count"] == 0
    assert api("carol").get(f"{API}/usage/?request={theirs.pk}").json()["count"] == 0
    client, _ = token_client("alice", cast.nlp)
    assert client.get(f"{API}/usage/").json()["count"] == 0  # a token sees its project only
    assert api("ops").get(f"{API}/usage/?open=true").json()["count"] == 2
    # A request's cost so far is on its detail only for those who see it.
    assert api("carol").get(f"{API}/requests/{theirs.pk}/").status_code == 404


# ------------------------------------------------------------------------------------------------ pages
def test_the_ops_price_pages_list_filter_page_and_refuse_with_field_errors(as_user, cast) -> None:
    ops = cast.actor("ops")
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(30):
        services.price_create(actor=ops, unit="memory", amount=Decimal("0.01") + i, effective_from=base + timedelta(days=i))
    services.price_create(actor=ops, unit="gpu", key="h100-80gb", amount=Decimal("2.5"), effective_from=base)
    client = as_user("ops")
    listed = client.get("/ops/prices/")
    assert listed.status_code == 200 and "Price list (EUR)" in listed.content.decode()
    assert "page=2" in listed.content.decode()
    filtered = client.get("/ops/prices/?unit=gpu").content.decode()
    assert "h100-80gb" in filtered and "Memory, per GiB-hour" not in filtered.split("<tbody>")[1]
    bad = client.post("/ops/prices/new/", {"price-unit": "gpu", "price-key": "", "price-amount": "-2",
                                           "price-effective_from": "2026-02-01T00:00"})
    assert bad.status_code == 200
    text = bad.content.decode()
    assert "Ensure this value is greater than or equal to 0" in text
    missing_key = client.post("/ops/prices/new/", {"price-unit": "gpu", "price-key": "", "price-amount": "2",
                                                   "price-effective_from": "2026-02-01T00:00"})
    assert missing_key.status_code == 200 and "Name the GPU model" in missing_key.content.decode()
    good = client.post("/ops/prices/new/", {"price-unit": "mig", "price-key": "1g.10gb", "price-amount": "0.4",
                                            "price-effective_from": "2026-02-01T00:00", "price-note": "launch"})
    assert good.status_code == 302
    price = Price.objects.get(unit="mig")
    assert price.key == "1g.10gb" and price.effective_from == datetime(2026, 2, 1, tzinfo=UTC)
    edit = client.post(f"/ops/prices/{price.pk}/", {"price-unit": "mig", "price-key": "1g.10gb", "price-amount": "0.5",
                                                     "price-effective_from": "2026-02-01T00:00"})
    assert edit.status_code == 302
    assert client.post(f"/ops/prices/{price.pk}/delete/").status_code == 302
    assert not Price.objects.filter(unit="mig").exists()
    assert AuditEntry.objects.filter(action__in=["price.create", "price.update", "price.delete"], target_id=str(price.pk)).count() == 3


def test_tenant_users_get_404_on_the_ops_price_pages(as_user, cast) -> None:
    price = services.price_create(actor=cast.actor("ops"), unit="cpu", amount=Decimal("0.04"),
                                  effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    for who in ("alice", "carol"):
        client = as_user(who)
        assert client.get("/ops/prices/").status_code == 404
        assert client.get(f"/ops/prices/{price.pk}/").status_code == 404
        assert client.post("/ops/prices/new/", {"price-unit": "cpu", "price-amount": "9",
                                                "price-effective_from": "2026-02-01T00:00"}).status_code == 404
        assert client.post(f"/ops/prices/{price.pk}/delete/").status_code == 404
    assert Price.objects.count() == 1

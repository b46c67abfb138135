"""Monthly statements: drafted on demand (lines per project x unit, split at a price change and at month ends, in
UTC whatever the zone), rounded once per line, finalised by the beat task (numbered, immutable, once), scoped (a
member gets 404, a tenant admin their tenant, ops all), and downloaded as CSV."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.conf import settings

from billing import services
from billing.models import BillingPeriod, Statement, StatementCounter, StatementLine, UsageInterval
from billing.tasks import statements_finalise_task
from insights.models import MeasuredSample

from ..workloads.factories import make_request

pytestmark = pytest.mark.django_db
API = "/api/v1/statements"
JAN = datetime(2026, 1, 1, tzinfo=UTC)
FEB = datetime(2026, 2, 1, tzinfo=UTC)


def _price(cast, unit: str, amount: str, at: datetime, key: str = "") -> None:
    services.price_create(actor=cast.actor("ops"), unit=unit, key=key, amount=Decimal(amount), effective_from=at)


_runs = iter(range(1, 10**6))


def _interval(req, cat, unit: str, quantity: str, start: datetime, end: datetime | None, key: str = "") -> UsageInterval:
    return UsageInterval.objects.create(
        request=req, tenant=req.tenant, project=req.project, cluster=cat.cluster, run_key=f"wl/u/{next(_runs)}",
        source="workload", object_uid=f"uid-{req.pk}", object_name="job-x", unit=unit, key=key, quantity=Decimal(quantity),
        started_at=start, ended_at=end)


def _draft(api, who: str, tenant: str, month: str):
    response = api(who).post(f"{API}/draft/", {"tenant": tenant, "month": month}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def _lines(body) -> list[tuple[str, str, str, str, str]]:
    return [(ln["project"], ln["unit"], ln["key"], Decimal(ln["quantity"]).normalize().to_eng_string(), ln["amount"])
            for ln in body["lines"]]


def test_a_draft_has_lines_per_project_and_unit_and_splits_at_a_price_change(api, cast, cat) -> None:
    _price(cast, "gpu", "2.00", JAN, key="h100-80gb")
    _price(cast, "cpu", "0.10", JAN)
    change = datetime(2026, 1, 15, 12, tzinfo=UTC)
    _price(cast, "gpu", "3.00", change, key="h100-80gb")
    vision = make_request(cat, cast.vision, cast.carol, state="succeeded", gpus=2)
    nlp = make_request(cat, cast.nlp, cast.alice, state="succeeded", gpus=1)
    # 2 GPUs across the change: 2 h before it at 2.00, 3 h after at 3.00; 4 cores for the same 5 h.
    _interval(vision, cat, "gpu", "2", change - timedelta(hours=2), change + timedelta(hours=3), key="h100-80gb")
    _interval(vision, cat, "cpu", "4", change - timedelta(hours=2), change + timedelta(hours=3))
    _interval(nlp, cat, "gpu", "1", datetime(2026, 1, 3, tzinfo=UTC), datetime(2026, 1, 3, 10, tzinfo=UTC), key="h100-80gb")
    # globex's usage is not on acme's statement.
    other = make_request(cat, cast.llm, cast.frank, state="succeeded", gpus=1)
    _interval(other, cat, "gpu", "1", datetime(2026, 1, 4, tzinfo=UTC), datetime(2026, 1, 4, 1, tzinfo=UTC), key="h100-80gb")

    body = _draft(api, "alice", "acme", "2026-01")
    assert body["status"] == "draft" and body["number"] is None and body["month"] == "2026-01"
    assert _lines(body) == [
        ("acme-nlp", "gpu", "h100-80gb", "10", "20.00"),
        ("acme-vision", "cpu", "", "20", "2.00"),
        ("acme-vision", "gpu", "h100-80gb", "4", "8.00"),    # 2 GPUs x 2 h at 2.00
        ("acme-vision", "gpu", "h100-80gb", "6", "18.00"),   # 2 GPUs x 3 h at 3.00
    ]
    split = [ln for ln in body["lines"] if ln["project"] == "acme-vision" and ln["unit"] == "gpu"]
    assert split[0]["period_end"] == split[1]["period_start"] == "2026-01-15T12:00:00Z"
    assert body["projects"] == [{"project": "acme-nlp", "total": "20.00"}, {"project": "acme-vision", "total": "28.00"}]
    assert body["total"] == "48.00" and body["discount"] == "0.00"

    # A draft is recomputed on request: more usage, a discount from mid-month, a new total.
    services.discount_create(actor=cast.actor("ops"), tenant=cast.acme, percent=Decimal(50), effective_from=change)
    body = _draft(api, "alice", "acme", "2026-01")
    # After the change half off: 18.00 → 9.00 and the cpu line splits (8 core-h 0.80, 12 core-h 1.20 → 0.60).
    assert _lines(body)[1:3] == [("acme-vision", "cpu", "", "8", "0.80"), ("acme-vision", "cpu", "", "12", "0.60")]
    assert body["subtotal"] == "48.00" and body["discount"] == "9.60" and body["total"] == "38.40"
    assert Statement.objects.filter(tenant=cast.acme).count() == 1


def test_intervals_across_a_month_end_are_split_between_the_months(api, cast, cat) -> None:
    _price(cast, "gpu", "1.00", JAN, key="h100-80gb")
    req = make_request(cat, cast.vision, cast.carol, state="succeeded", gpus=1)
    _interval(req, cat, "gpu", "1", FEB - timedelta(hours=5), FEB + timedelta(hours=7), key="h100-80gb")
    jan, feb = _draft(api, "alice", "acme", "2026-01"), _draft(api, "alice", "acme", "2026-02")
    assert (jan["lines"][0]["quantity"], jan["total"]) == ("5.000000", "5.00")
    assert (feb["lines"][0]["quantity"], feb["total"]) == ("7.000000", "7.00")
    assert jan["lines"][0]["period_end"] == feb["lines"][0]["period_start"] == "2026-02-01T00:00:00Z"


def test_a_daylight_saving_change_shifts_nothing_months_are_utc(api, cast, cat, settings) -> None:
    settings.TIME_ZONE = "Europe/Berlin"  # the users' zone: CET → CEST on 2026-03-29 at 01:00 UTC
    _price(cast, "cpu", "1.00", JAN)
    req = make_request(cat, cast.vision, cast.carol, state="succeeded")
    # 00:00–04:00 UTC across the change: 4 hours (01:00–06:00 on Berlin's wall clock, which lost an hour).
    _interval(req, cat, "cpu", "1", datetime(2026, 3, 29, 0, tzinfo=UTC), datetime(2026, 3, 29, 4, tzinfo=UTC))
    # 22:30–00:30 UTC at the end of March: all April on Berlin's clock, yet 1.5 h of March and 0.5 h of April.
    _interval(req, cat, "cpu", "1", datetime(2026, 3, 31, 22, 30, tzinfo=UTC), datetime(2026, 4, 1, 0, 30, tzinfo=UTC))
    march, april = _draft(api, "alice", "acme", "2026-03"), _draft(api, "alice", "acme", "2026-04")
    assert march["total"] == "5.50" and april["total"] == "0.50"
    page = api("alice").get(f"/statements/{march['id']}/").content.decode()
    assert "March 2026 (UTC)" in page


def test_rounding_once_per_line_and_the_total_is_the_sum_of_the_lines(api, cast, cat) -> None:
    _price(cast, "cpu", "0.0040", JAN)
    _price(cast, "memory", "0.0013", JAN)
    req = make_request(cat, cast.vision, cast.carol, state="succeeded")
    # Three 15-minute pieces of 1 core: 0.001 each; rounded each they would be 0.00, the line rounds 0.003 once.
    for i in range(3):
        start = datetime(2026, 1, 2, i, tzinfo=UTC)
        _interval(req, cat, "cpu", "1", start, start + timedelta(minutes=15))
        _interval(req, cat, "memory", "3.3333", start, start + timedelta(minutes=17, seconds=13))
    body = _draft(api, "alice", "acme", "2026-01")
    amounts = [Decimal(ln["amount"]) for ln in body["lines"]]
    assert body["lines"][0]["amount"] == "0.00"  # 0.003 → 0.00
    assert Decimal(body["total"]) == sum(amounts)
    statement = Statement.objects.get(pk=body["id"])
    assert statement.total == sum(statement.lines.values_list("amount", flat=True))


def test_the_beat_task_finalises_numbers_and_freezes_once(api, cast, cat) -> None:
    assert settings.CELERY_BEAT_SCHEDULE["billing-statements-finalise"]["task"] == "billing.statements_finalise"
    _price(cast, "gpu", "2.00", JAN, key="h100-80gb")
    for project, who in ((cast.vision, cast.carol), (cast.llm, cast.frank)):
        req = make_request(cat, project, who, state="succeeded", gpus=1)
        _interval(req, cat, "gpu", "1", datetime(2026, 1, 5, tzinfo=UTC), datetime(2026, 1, 5, 3, tzinfo=UTC), key="h100-80gb")
    _draft(api, "alice", "acme", "2026-01")  # a draft first: finalising recomputes and numbers it

    assert statements_finalise_task.name == "billing.statements_finalise"
    assert "2026-01" in statements_finalise_task.apply().get()
    final = list(Statement.objects.filter(month="2026-01-01").order_by("number"))
    assert [(s.tenant.slug, s.number, s.status, s.total) for s in final] == [
        ("acme", "2026-000001", "final", Decimal("6.00")), ("globex", "2026-000002", "final", Decimal("6.00"))]
    assert BillingPeriod.objects.get(month="2026-01-01").finalised_at is not None
    # Every month up to last month is closed, in order, each once.
    assert not BillingPeriod.objects.filter(finalised_at__isnull=True, month__lt="2026-12-01").exists()
    last = StatementCounter.objects.get(year=2026).last

    assert statements_finalise_task.apply().get() == []  # again: nothing happens twice
    assert StatementCounter.objects.get(year=2026).last == last
    assert Statement.objects.filter(month="2026-01-01").count() == 2

    # A final statement never changes: not through a draft, not through the models.
    assert _draft(api, "alice", "acme", "2026-01")["number"] == "2026-000001"
    statement = final[0]
    statement.total = Decimal(1)
    with pytest.raises(PermissionError):
        statement.save()
    with pytest.raises(PermissionError):
        statement.delete()
    with pytest.raises(PermissionError):
        Statement.objects.filter(pk=statement.pk).update(total=0)
    with pytest.raises(PermissionError):
        StatementLine.objects.filter(statement=statement).update(amount=0)
    with pytest.raises(PermissionError):
        StatementLine.objects.filter(statement=statement).delete()
    # Nor can a price reach back into the closed month.
    response = api("ops").post("/api/v1/prices/", {"unit": "gpu", "key": "h100-80gb", "amount": "9",
                                                   "effective_from": "2026-01-20T00:00:00Z"}, format="json")
    assert response.status_code == 400
    assert Statement.objects.get(pk=statement.pk).total == Decimal("6.00")


def test_scoping_of_every_statement_endpoint(api, as_user, cast, cat) -> None:
    _price(cast, "gpu", "2.00", JAN, key="h100-80gb")
    for project, who in ((cast.vision, cast.carol), (cast.llm, cast.frank)):
        req = make_request(cat, project, who, state="succeeded", gpus=1)
        _interval(req, cat, "gpu", "1", datetime(2026, 1, 5, tzinfo=UTC), datetime(2026, 1, 5, 1, tzinfo=UTC), key="h100-80gb")
    acme = _draft(api, "alice", "acme", "2026-01")["id"]
    globex = _draft(api, "erin", "globex", "2026-01")["id"]
    # A tenant admin cannot draft another tenant's statement.
    assert api("alice").post(f"{API}/draft/", {"tenant": "globex", "month": "2026-01"}, format="json").status_code == 400
    urls = lambda pk: [f"{API}/{pk}/", f"{API}/{pk}/csv/", f"/statements/{pk}/", f"/statements/{pk}/csv/"]
    for who, sees, hidden in (("alice", [acme], [globex]), ("erin", [globex], [acme]), ("ops", [acme, globex], []),
                              ("carol", [], [acme, globex]), ("bob", [], [acme, globex]), ("nobody", [], [acme, globex])):
        client = api(who)
        listed = {s["id"] for s in client.get(f"{API}/?month=2026-01").json()["results"]}
        assert listed == set(sees), who
        for pk in sees:
            assert all(client.get(u).status_code == 200 for u in urls(pk)), who
        for pk in hidden:
            assert all(client.get(u).status_code == 404 for u in urls(pk)), who
        assert client.get("/statements/").status_code == (200 if sees else 404), who
        # "Draft this month" (the page's button): the tenant's admins and ops.
        assert client.post("/statements/draft/", {"tenant": "acme"}).status_code == (302 if who in ("alice", "ops") else 404), who
    # Ops filter all tenants' statements by month and tenant.
    ops = api("ops")
    assert [s["tenant"] for s in ops.get(f"{API}/?tenant=globex&month=2026-01").json()["results"]] == ["globex"]
    assert ops.get(f"{API}/?month=2026-02").json()["results"] == []
    page = ops.get("/statements/?tenant=acme").content.decode()
    assert "Acme Research" in page and "Globex AI" not in page.split("<tbody>")[1]


def test_statements_print_the_tenants_one_cost_centre(api, cast, cat) -> None:
    """One cost centre, the tenant's: what the tenant pages show (CC-1001) is printed on its statements, with no
    billing profile; ops changing it on the billing page change the tenant's, which the tenant page then shows."""
    from billing.models import BillingProfile
    from tenants.services import tenant_update

    assert "cost_centre" not in {f.name for f in BillingProfile._meta.get_fields()}  # no second field of that name
    tenant_update(actor=cast.actor("alice"), tenant=cast.acme, cost_centre="CC-1001")
    assert "cost centre CC-1001" in api("alice").get("/tenants/acme/").content.decode()
    body = _draft(api, "alice", "acme", "2026-01")
    assert body["cost_centre"] == "CC-1001"
    assert '<dd id="cost-centre">CC-1001</dd>' in api("alice").get(f"/statements/{body['id']}/").content.decode()
    assert "CC-1001" in api("alice").get(f"{API}/{body['id']}/csv/").content.decode()
    page = api("ops").get("/ops/tenants/acme/billing/").content.decode()
    assert 'value="CC-1001"' in page
    assert api("ops").post("/ops/tenants/acme/billing/", {"mode": "chargeback", "cost_centre": "CC-2040"}).status_code == 302
    cast.acme.refresh_from_db()
    assert cast.acme.cost_centre == "CC-2040"
    assert "cost centre CC-2040" in api("alice").get("/tenants/acme/").content.decode()
    assert _draft(api, "alice", "acme", "2026-01")["cost_centre"] == "CC-2040"


def test_csv_and_the_page_show_lines_totals_and_cost_centre(api, cast, cat) -> None:
    _price(cast, "gpu", "2.50", JAN, key="h100-80gb")
    req = make_request(cat, cast.vision, cast.carol, state="succeeded", gpus=2)
    _interval(req, cat, "gpu", "2", datetime(2026, 1, 5, tzinfo=UTC), datetime(2026, 1, 5, 1, 30, tzinfo=UTC), key="h100-80gb")
    # Ops set chargeback with a cost centre (the page form), printed from the next draft on.
    response = api("ops").post("/ops/tenants/acme/billing/", {"mode": "chargeback", "cost_centre": "CC-4711"})
    assert response.status_code == 302
    assert api("alice").post("/ops/tenants/acme/billing/", {"mode": "showback"}).status_code == 404
    body = _draft(api, "alice", "acme", "2026-01")
    assert (body["mode"], body["cost_centre"]) == ("chargeback", "CC-4711")
    response = api("alice").get(f"{API}/{body['id']}/csv/")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["project"], r["unit"], r["key"], r["quantity"], r["quantity_unit"], r["unit_price"], r["amount"])
            for r in rows] == [
        ("acme-vision", "gpu", "h100-80gb", "3", "GPU-hour", "2.5", "7.50"),
        ("acme-vision", "project total", "", "", "", "", "7.50"),
        ("", "subtotal", "", "", "", "", "7.50"),
        ("", "discount", "", "", "", "", "0.00"),
        ("", "total", "", "", "", "", "7.50"),
    ]
    assert {r["cost_centre"] for r in rows} == {"CC-4711"} and {r["mode"] for r in rows} == {"chargeback"}
    page = api("alice").get(f"/statements/{body['id']}/").content.decode()
    assert '<dd id="cost-centre">CC-4711</dd>' in page and "7.50 EUR" in page


def test_the_statement_page_shows_the_measured_idle_share_as_information(api, cast, cat) -> None:
    """docs/measured-use.md, "On statements": the month's measured idle share of the tenant's allocated GPU-hours,
    from its samples (not another tenant's, not another month's); the charges and the CSV are unchanged."""
    _price(cast, "gpu", "2.00", JAN, key="h100-80gb")
    req = make_request(cat, cast.vision, cast.carol, state="succeeded", gpus=2)
    _interval(req, cat, "gpu", "2", datetime(2026, 1, 5, tzinfo=UTC), datetime(2026, 1, 5, 1, tzinfo=UTC), key="h100-80gb")
    before = _draft(api, "alice", "acme", "2026-01")
    page = api("alice").get(f"/statements/{before['id']}/").content.decode()
    assert 'id="measured-idle"' not in page  # no samples: nothing said

    def sample(r, at: datetime, util: float) -> None:
        MeasuredSample.objects.create(at=at, request=r, cluster_id=r.cluster_id, tenant_id=r.tenant_id,
                                      project_id=r.project_id, flavor_id=r.flavor_id, seconds=300, gpus=r.gpus,
                                      memory_mib=81920, util_avg=util, sm_active_avg=0.1, fb_used_max=1000)

    # 3 slots idle (1 %) and 1 busy (80 %), 2 GPUs each: 0.5 of 0.667 GPU-hours idle = 75 %
    for i, util in enumerate((1, 1, 1, 80)):
        sample(req, datetime(2026, 1, 5, tzinfo=UTC) + timedelta(minutes=5 * (i + 1)), util)
    sample(req, datetime(2026, 2, 2, tzinfo=UTC), 80)  # February: not January's
    other = make_request(cat, cast.llm, cast.frank, state="succeeded", gpus=1)
    sample(other, datetime(2026, 1, 6, tzinfo=UTC), 90)  # another tenant's
    after = _draft(api, "alice", "acme", "2026-01")
    page = api("alice").get(f"/statements/{after['id']}/").content.decode()
    assert ("measured idle (below 5 % utilisation, DCGM) for 0.50 of 0.67 allocated GPU-hours: a measured idle share "
            "of 75.00 %. Charges are for allocation and do not change.") in page
    assert (after["total"], after["subtotal"]) == (before["total"], before["subtotal"]) == ("4.00", "4.00")
    assert "idle" not in api("alice").get(f"{API}/{after['id']}/csv/").content.decode()

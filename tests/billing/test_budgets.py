"""Budgets: who sets them (field errors, scoping), spend and forecast, alerts once per threshold and month (even
when the check runs twice or at once), the refusal of new submissions when ops switch it on, and the costs API
and pages scoped per actor (docs/billing.md, "Budgets and cost views")."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing import budgets, costs, services
from billing.models import Budget, BudgetAlert, UsageInterval
from tenants.models import AuditEntry
from workloads.models import WorkloadRequest

from ..workloads.factories import make_request

API = "/api/v1"
TRAIN = {"template": "training", "flavor": "h100", "gpus": 1, "duration_hours": 4,
         "parameters": {"command": "python train.py"}}


def _setup_costs(cast, cat, *, minutes: int = 30) -> None:
    """GPU-hours at 60.00 EUR (1.00 a minute): carol ran ``minutes`` in acme-vision, frank 10 in globex-llm,
    both ending a minute ago (inside this month)."""
    services.price_create(actor=cast.actor("ops"), unit="gpu", key="h100-80gb", amount=Decimal(60),
                          effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    end = timezone.now() - timedelta(minutes=1)
    for project, user, mins in ((cast.vision, cast.carol, minutes), (cast.llm, cast.frank, 10)):
        req = make_request(cat, project, user, state="succeeded")
        start = max(end - timedelta(minutes=mins), costs.month_start())
        UsageInterval.objects.create(request=req, tenant=req.tenant, project=req.project, cluster=cat.cluster,
                                     run_key=f"wl/{req.pk}", source="workload", object_uid=f"u{req.pk}", object_name="w",
                                     unit="gpu", key="h100-80gb", quantity=Decimal(1), started_at=start, ended_at=end)


def _spent(minutes: int) -> Decimal:
    return Decimal(min(minutes, int((timezone.now() - costs.month_start()).total_seconds() // 60) - 1)).quantize(Decimal("0.01"))


# ------------------------------------------------------------------------------------------------ CRUD and scoping
@pytest.mark.django_db
def test_budget_crud_with_field_errors_and_scoping(api, cast, cat) -> None:
    # A tenant admin sets the tenant's budget; a project admin their project's; a member neither.
    made = api("alice").post(f"{API}/budgets/", {"tenant": "acme", "amount": "1000.00"}, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["thresholds"] == [50, 80, 100] and made.json()["project"] is None
    project = api("bob").post(f"{API}/budgets/", {"project": cast.vision.slug, "amount": "200", "thresholds": [90, 50]}, format="json")
    assert project.status_code == 201, project.json()
    assert project.json()["thresholds"] == [50, 90]
    assert api("carol").post(f"{API}/budgets/", {"tenant": "acme", "amount": "5"}, format="json").status_code == 403
    assert api("carol").patch(f"{API}/budgets/{project.json()['id']}/", {"amount": "1"}, format="json").status_code == 403
    assert api("bob").post(f"{API}/budgets/", {"tenant": "acme", "amount": "5"}, format="json").status_code == 403
    # Field errors.
    for sent, field in [({"tenant": "acme", "amount": "0"}, "amount"), ({"tenant": "acme", "amount": "1e309"}, "amount"),
                        ({"tenant": "acme", "amount": "-3"}, "amount"),
                        ({"tenant": "acme", "amount": "10", "thresholds": [0]}, "thresholds"),
                        ({"tenant": "acme", "amount": "10", "thresholds": []}, "thresholds"),
                        ({"tenant": "acme", "amount": "10"}, "tenant"),  # one per tenant
                        ({"tenant": "globex", "amount": "10"}, "tenant"),  # not alice's
                        ({"tenant": "acme", "amount": "10", "refuse_when_spent": True}, "refuse_when_spent"),
                        ({"amount": "10", "colour": "red"}, "colour")]:
        answer = api("alice").post(f"{API}/budgets/", sent, format="json")
        assert answer.status_code == 400, (sent, answer.json())
        assert field in str(answer.json()), (sent, answer.json())
    # Ops switch the refusal on; a tenant admin may not switch it off.
    tenant_budget = made.json()["id"]
    assert api("ops").patch(f"{API}/budgets/{tenant_budget}/", {"refuse_when_spent": True}, format="json").json()["refuse_when_spent"]
    off = api("alice").patch(f"{API}/budgets/{tenant_budget}/", {"refuse_when_spent": False}, format="json")
    assert off.status_code == 400 and "refuse_when_spent" in str(off.json())
    assert api("alice").patch(f"{API}/budgets/{tenant_budget}/", {"amount": "1500"}, format="json").json()["amount"] == "1500.00"
    # Who sees what: the other tenant gets 404; a member sees their project's budget, not the tenant's.
    assert api("erin").get(f"{API}/budgets/{tenant_budget}/").status_code == 404
    assert api("erin").delete(f"{API}/budgets/{tenant_budget}/").status_code == 404
    assert api("erin").get(f"{API}/budgets/").json()["count"] == 0
    assert [b["project"] for b in api("carol").get(f"{API}/budgets/").json()["results"]] == [cast.vision.slug]
    assert api("alice").get(f"{API}/budgets/").json()["count"] == 2
    assert api("ops").get(f"{API}/budgets/").json()["count"] == 2
    assert api("bob").delete(f"{API}/budgets/{project.json()['id']}/").status_code == 204
    actions = list(AuditEntry.objects.filter(action__startswith="budget.").values_list("action", flat=True))
    assert actions.count("budget.create") == 2 and "budget.update" in actions and "budget.delete" in actions


# ------------------------------------------------------------------------------------------------ spend and forecast
def test_forecast_is_linear_over_the_elapsed_month() -> None:
    start, end = datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 5, 1, tzinfo=UTC)  # 30 days
    assert costs.forecast(Decimal(100), since=start, until=end, now=start + timedelta(days=10)) == Decimal(300)
    assert costs.forecast(Decimal(45), since=start, until=end, now=start + timedelta(days=15)) == Decimal(90)
    assert costs.forecast(Decimal(7), since=start, until=end, now=start + timedelta(minutes=5)) == Decimal(7)
    assert costs.forecast(Decimal(90), since=start, until=end, now=end + timedelta(days=2)) == Decimal(90)


@pytest.mark.django_db
def test_spend_sums_closed_and_running_usage_and_forecasts(api, cast, cat) -> None:
    _setup_costs(cast, cat, minutes=30)
    budget = api("alice").post(f"{API}/budgets/", {"project": cast.vision.slug, "amount": "100"}, format="json").json()
    spent = _spent(30)
    assert Decimal(budget["spent"]) == spent
    assert Decimal(budget["remaining"]) == Decimal(100) - spent
    since, until = costs.month_bounds()
    elapsed = Decimal((timezone.now() - since).total_seconds())
    expected = spent * Decimal((until - since).total_seconds()) / elapsed
    assert abs(Decimal(budget["forecast"]) - expected) <= Decimal("0.05") * max(expected, Decimal(1))
    # The sum agrees with the per-request figure the request page shows.
    from billing.selectors import request_cost_so_far
    per_request = sum((request_cost_so_far(r) for r in {iv.request for iv in UsageInterval.objects.filter(project=cast.vision)}), Decimal(0))
    assert Decimal(budget["spent"]) == per_request.quantize(Decimal("0.01"))


# ------------------------------------------------------------------------------------------------ alerts
@pytest.mark.django_db
def test_each_alert_goes_out_once_per_threshold_and_month(cast, cat, django_capture_on_commit_callbacks) -> None:
    _setup_costs(cast, cat, minutes=30)
    spent = _spent(30)
    budget = Budget.objects.create(tenant=cast.acme, project=cast.vision,
                                   amount=(spent / Decimal("0.85")).quantize(Decimal("0.01")))
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets.budgets_check() == 1  # 50 % and 80 % crossed at once: only 80 % is sent
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets.budgets_check() == 0
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [50, 80]  # 50 % covered, never sent
    # One message per recipient (the tenant's admins and the project's), for the highest threshold only.
    recipients = {cast.alice.email, cast.bob.email} - {""}
    assert {a for m in mail.outbox for a in m.to} == recipients
    assert len(mail.outbox) == len(recipients)
    month = timezone.now().strftime("%B %Y")
    assert {m.subject for m in mail.outbox} == {
        f"[GPU portal] Budget alert: project {cast.vision.slug} reached 80% of its {month} budget"}
    assert "http://" in mail.outbox[0].body and "/tenants/acme/budgets/" in mail.outbox[0].body
    # Later the spend passes 100 %: that one alert follows.
    mail.outbox.clear()
    Budget.objects.filter(pk=budget.pk).update(amount=(spent / Decimal("1.5")).quantize(Decimal("0.01")))
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets.budgets_check() == 1
    assert {m.subject for m in mail.outbox} == {
        f"[GPU portal] Budget alert: project {cast.vision.slug} reached 100% of its {month} budget"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_checks_send_each_alert_once(cast, cat) -> None:
    _setup_costs(cast, cat, minutes=30)
    Budget.objects.create(tenant=cast.acme, amount=Decimal("1.00"))  # far over: 50, 80 and 100 %
    barrier, results = threading.Barrier(4), []

    def run() -> None:
        try:
            barrier.wait()
            results.append(budgets.budgets_check())
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == 1 and BudgetAlert.objects.count() == 3  # one alert, the highest: 100 %
    assert len(mail.outbox) == len({cast.alice.email} - {""})
    assert all("reached 100%" in m.subject and m.subject.startswith("[GPU portal] ") for m in mail.outbox)


# ------------------------------------------------------------------------------------------------ refusal
@pytest.mark.django_db
def test_a_spent_budget_refuses_submissions_only_when_ops_say_so(api, token_client, cast, cat, django_capture_on_commit_callbacks) -> None:
    _setup_costs(cast, cat, minutes=30)
    client, _ = token_client("carol", cast.vision, "read+submit")
    budget = budgets.budget_create(actor=cast.actor("alice"), tenant=cast.acme, project=cast.vision, amount=Decimal("1.00"))
    # Spent, but no refusal: submissions go on, and the guard reads nothing (once its flag is cached).
    assert budgets.submission_guard(cast.vision) is None
    with CaptureQueriesContext(connection) as ctx:
        assert budgets.submission_guard(cast.vision) is None
    assert len(ctx.captured_queries) == 0
    assert client.post(f"{API}/requests/", TRAIN | {"name": "fine"}, format="json").status_code == 201
    with django_capture_on_commit_callbacks(execute=True):
        budgets.budget_update(actor=cast.actor("ops"), budget=budget, refuse_when_spent=True)
    refused = client.post(f"{API}/requests/", TRAIN | {"name": "refused"}, format="json")
    assert refused.status_code == 400
    # The refusal is the project field's one error, and names the spent budget with its figures.
    assert list(refused.json()["fields"]) == ["project"], refused.json()
    [reason] = refused.json()["fields"]["project"]
    assert reason.startswith(f"The monthly budget of project {cast.vision.slug} is spent ("), reason
    assert " of 1.00 EUR): new requests are refused" in reason, reason
    assert not WorkloadRequest.objects.filter(name="refused").exists()  # nothing was made
    # The other tenant is not refused, and a raised budget lets submissions through again.
    frank, _ = token_client("frank", cast.llm, "read+submit")
    assert frank.post(f"{API}/requests/", TRAIN | {"name": "other"}, format="json").status_code == 201
    with django_capture_on_commit_callbacks(execute=True):
        budgets.budget_update(actor=cast.actor("alice"), budget=budget, amount=Decimal("10000"))
    assert client.post(f"{API}/requests/", TRAIN | {"name": "again"}, format="json").status_code == 201


# ------------------------------------------------------------------------------------------------ costs API and pages
@pytest.mark.django_db
def test_costs_api_is_scoped_per_actor(api, cast, cat) -> None:
    _setup_costs(cast, cat, minutes=30)
    vision, llm = _spent(30), _spent(10)

    def by_project(who: str, query: str = "") -> dict[str, Decimal]:
        answer = api(who).get(f"{API}/costs/?group_by=project{query}")
        assert answer.status_code == 200, answer.json()
        return {r["key"]: Decimal(r["cost"]) for r in answer.json()["rows"]}

    assert by_project("carol") == {cast.vision.slug: vision}
    assert by_project("alice") == {cast.vision.slug: vision}
    assert by_project("frank") == {cast.llm.slug: llm}
    assert by_project("ops") == {cast.vision.slug: vision, cast.llm.slug: llm}
    assert by_project("nobody") == {}
    assert by_project("ops", f"&project={cast.llm.slug}") == {cast.llm.slug: llm}
    assert by_project("ops", "&flavor=nope") == {}
    assert by_project("frank", "&tenant=acme") == {}
    days = api("ops").get(f"{API}/costs/?group_by=day").json()
    assert Decimal(days["total"]) == vision + llm and days["currency"] == "EUR"
    assert api("ops").get(f"{API}/costs/?group_by=colour").status_code == 400
    empty = api("ops").get(f"{API}/costs/?since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z")
    assert empty.status_code == 200 and empty.json()["rows"] == [] and Decimal(empty.json()["total"]) == 0  # an empty window


@pytest.mark.django_db
def test_cost_pages_are_scoped(as_user, cast, cat) -> None:
    _setup_costs(cast, cat, minutes=30)
    budgets.budget_create(actor=cast.actor("alice"), tenant=cast.acme, amount=Decimal("500"))
    project_url, tenant_url = f"/costs/projects/{cast.vision.slug}/", "/costs/tenants/acme/"
    page = as_user("carol").get(project_url)
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="cost-day-chart"' in text and "carol" in text and "Cost per flavor" in text
    assert as_user("carol").get(tenant_url).status_code == 404  # members: their project, not the tenant
    tenant_page = as_user("alice").get(tenant_url).content.decode()
    assert "Budget burn-down" in tenant_page and cast.vision.slug in tenant_page
    assert as_user("frank").get(project_url).status_code == 404
    assert as_user("erin").get(tenant_url).status_code == 404
    assert as_user("alice").get("/ops/costs/").status_code == 404
    ops = as_user("ops").get("/ops/costs/").content.decode()
    assert "acme" in ops and "globex" in ops


@pytest.mark.django_db
def test_the_request_form_shows_what_remains_of_the_budget(as_user, cast, cat) -> None:
    _setup_costs(cast, cat, minutes=30)
    budgets.budget_create(actor=cast.actor("bob"), tenant=cast.acme, project=cast.vision, amount=Decimal("100"))
    page = as_user("carol").get(f"/requests/new/?template=training&project={cast.vision.slug}").content.decode()
    left = (Decimal(100) - _spent(30)).quantize(Decimal("0.01"))
    assert f"Remaining this month: project {cast.vision.slug}: {left} EUR of 100.00 EUR" in page


@pytest.mark.django_db
def test_the_demo_seeds_prices_and_a_budget_that_alerts(cast, cat, django_capture_on_commit_callbacks) -> None:
    from billing.demo import DEMO_BUDGET, seed_billing_demo

    seed_billing_demo()
    seed_billing_demo()  # idempotent
    budget = Budget.objects.get(project=cast.vision)
    assert budget.amount == DEMO_BUDGET and not budget.refuse_when_spent
    from billing.models import Price
    assert Price.objects.filter(unit="gpu", key="h100-80gb").count() == 1
    # Three simulated GPU-hours of H100 in the month cross every threshold.
    req = make_request(cat, cast.vision, cast.carol, state="succeeded")
    end = timezone.now() - timedelta(seconds=1)
    start = max(end - timedelta(hours=3), costs.month_start())
    UsageInterval.objects.create(request=req, tenant=req.tenant, project=req.project, cluster=cat.cluster, run_key="wl/demo",
                                 source="workload", object_uid="d", object_name="w", unit="gpu", key="h100-80gb",
                                 quantity=Decimal(1), started_at=start, ended_at=end)
    with django_capture_on_commit_callbacks(execute=True):
        budgets.budgets_check_task.apply()
    if end - start >= timedelta(hours=2):
        assert BudgetAlert.objects.filter(budget=budget).count() == 3
    assert mail.outbox


@pytest.mark.django_db
def test_links_to_costs_and_statements_appear_only_for_who_may_follow_them(as_user, cast) -> None:
    """The project page links its costs for whoever sees the project; the tenant pages link the tenant's costs and
    statements for its admins; the navigation has "Statements" for tenant admins, the ops console's tabs for ops. Nobody else sees a link."""
    project_page, tenant_page = f"/projects/{cast.vision.slug}/", "/tenants/acme/"
    project_costs, tenant_costs = f'href="/costs/projects/{cast.vision.slug}/"', 'href="/costs/tenants/acme/"'
    statements, nav_statements = 'href="/statements/?tenant=acme"', 'href="/statements/"'
    for who in ("ops", "alice", "bob", "carol", "dave"):
        client = as_user(who)
        page = client.get(project_page)
        assert page.status_code == 200 and project_costs in page.content.decode(), who
        assert client.get(f"/costs/projects/{cast.vision.slug}/").status_code == 200, who  # the link leads somewhere
    for who in ("ops", "alice"):
        client = as_user(who)
        text = client.get(tenant_page).content.decode()
        assert tenant_costs in text and statements in text, who
        # tenant admins in the top menu; ops (whose top menu is full) in the ops console's tabs
        assert nav_statements in client.get("/ops/tenants/" if who == "ops" else "/").content.decode(), who
        assert client.get("/costs/tenants/acme/").status_code == 200 and client.get("/statements/?tenant=acme").status_code == 200
    for who in ("bob", "carol", "dave"):  # members and project admins: no tenant costs, no statements
        client = as_user(who)
        assert client.get(tenant_page).status_code in (403, 404), who
        home = client.get("/").content.decode()
        assert nav_statements not in home and tenant_costs not in home, who
        assert tenant_costs not in client.get(project_page).content.decode(), who
    for who in ("erin", "frank", "nobody"):  # another tenant's admin and member, and someone in no tenant
        client = as_user(who)
        assert client.get(project_page).status_code == 404, who
        assert client.get(tenant_page).status_code in (403, 404), who
        assert client.get(f"/costs/projects/{cast.vision.slug}/").status_code == 404, who
        assert client.get("/costs/tenants/acme/").status_code == 404, who
        for url in ("/", f"/projects/{cast.llm.slug}/"):
            text = client.get(url).content.decode()
            assert project_costs not in text and tenant_costs not in text and statements not in text, (who, url)
    # erin administers globex: her own tenant's links, never acme's
    erin = as_user("erin").get("/tenants/globex/").content.decode()
    assert 'href="/costs/tenants/globex/"' in erin and 'href="/statements/?tenant=globex"' in erin
    assert tenant_costs not in erin
    assert f'href="/costs/projects/{cast.llm.slug}/"' in as_user("frank").get(f"/projects/{cast.llm.slug}/").content.decode()

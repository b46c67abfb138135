"""The Budgets page (``/tenants/<slug>/budgets/``): tenant admins (and ops) set and raise the tenant's and its
projects' monthly budgets, see the spend and the forecast, and the history of changes; refusals are shown next to
their fields and change nothing; anyone else gets a 404."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.models import Budget

from .test_budgets import _setup_costs, _spent

pytestmark = [pytest.mark.django_db]
PAGE, SET = "/tenants/acme/budgets/", "/tenants/acme/budgets/set/"


def text(response) -> str:
    return response.content.decode()


def test_a_tenant_admin_sets_and_raises_budgets_and_sees_forecast_and_history(as_user, cast, cat) -> None:
    _setup_costs(cast, cat, minutes=30)
    alice = as_user("alice")
    page = alice.get(PAGE)
    assert page.status_code == 200
    body = text(page)
    assert 'href="/tenants/acme/budgets/" aria-current="page">Budgets</a>' in body  # a tab of the tenant pages
    assert "No budget has been set yet." in body and "Set a budget" in body

    made = alice.post(SET, {"budget-scope": "", "budget-amount": "100", "budget-thresholds": "50, 80, 100"})
    assert made.status_code == 302 and made["Location"] == PAGE
    raised = alice.post(SET, {"budget-scope": "", "budget-amount": "250.50", "budget-thresholds": "90"})
    assert raised.status_code == 302
    budget = Budget.objects.get(tenant=cast.acme, project__isnull=True)
    assert budget.amount == Decimal("250.50") and budget.thresholds == [90]
    alice.post(SET, {"budget-scope": cast.vision.slug, "budget-amount": "40"})
    assert Budget.objects.get(project=cast.vision).thresholds == [50, 80, 100]

    body = text(alice.get(PAGE))
    spent = _spent(30)
    row = body[body.index('id="budget-tenant"'):body.index("</tr>", body.index('id="budget-tenant"'))]
    assert "250.50 EUR" in row and f"{spent} EUR" in row
    assert f"{Decimal('250.50') - spent} EUR" in row  # remaining
    assert "EUR" in row.split('data-label="Forecast to month end">')[1]  # the forecast, in the currency
    history = body[body.index('id="budget-history"'):]
    assert "100.00 → 250.50 EUR" in history and "alerts at 50, 80, 100 → 90 %" in history
    assert "set to 100.00 EUR" in history and "set to 40.00 EUR" in history and "alice" in history
    # The costs page leads there.
    assert 'href="/tenants/acme/budgets/" id="budgets-link"' in text(alice.get("/costs/tenants/acme/"))


def test_bad_input_is_shown_on_the_field_and_changes_nothing(as_user, cast, cat) -> None:
    alice = as_user("alice")
    for amount, thresholds, message in [("0", "", "greater than or equal to 0.01"), ("abc", "", "Enter a number"),
                                        ("10", "fifty", "Whole percentages"), ("10", "0", "from 1 to 1000")]:
        answer = alice.post(SET, {"budget-scope": "", "budget-amount": amount, "budget-thresholds": thresholds})
        assert answer.status_code == 400, (amount, thresholds)
        assert message in text(answer), (amount, thresholds, message)
        assert f'value="{amount}"' in text(answer)  # what was typed stays
    assert not Budget.objects.exists()
    # A project of another tenant is no scope here.
    assert alice.post(SET, {"budget-scope": cast.llm.slug, "budget-amount": "5"}).status_code == 404


def test_only_tenant_admins_and_ops_see_the_page(as_user, cast) -> None:
    assert as_user("ops").get(PAGE).status_code == 200
    for who in ("bob", "carol", "dave", "erin"):
        assert as_user(who).get(PAGE).status_code == 404, who
        assert as_user(who).post(SET, {"budget-scope": "", "budget-amount": "5"}).status_code == 404, who
    assert not Budget.objects.exists()
    globex = text(as_user("erin").get("/tenants/globex/"))
    assert 'href="/tenants/globex/budgets/"' in globex and "/tenants/acme/" not in globex

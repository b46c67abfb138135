"""Cost pages: a project's, a tenant's and the ops view across tenants (docs/billing.md, "Budgets and cost views").

Reads go through ``billing.selectors.usage_for`` (what the caller sees) and are summed in the database by
``billing.costs``. Each chart is drawn by ``static/js/charts.js`` (Chart.js, served locally) and its numbers are
in a table under it, so a chart never relies on colour alone."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404

from portal.quantities import round_money
from tenants.guards import actor_of, ops_only
from tenants.selectors import admin_tenants_for, projects_for
from tenants.ui import page

from . import budgets, costs, policy, selectors
from .models import Budget, UsageInterval

# Distinct hues plus the labels and the tables: colour is never the only cue.
COLOURS = ["#1f6feb", "#d97706", "#059669", "#9333ea", "#dc2626", "#0891b2", "#65a30d", "#db2777"]


def _month(request: HttpRequest) -> tuple[datetime, datetime]:
    text = request.GET.get("month", "")
    try:
        picked = datetime.strptime(text, "%Y-%m").replace(tzinfo=UTC) if text else None
    except ValueError:
        picked = None
    start = costs.month_start(picked)
    return start, selectors.month_end(start.date())


def _chart(title: str, rows: list[tuple[str, Decimal]], label: str, cur: str) -> dict[str, Any]:
    return {"type": "bar", "title": title, "labels": [r[0] for r in rows], "stacked": False, "notes": [],
            "unit": cur, "datasets": [{"label": label, "data": [float(round_money(r[1])) for r in rows],
                                       "color": [COLOURS[i % len(COLOURS)] for i in range(len(rows))]}]}


def _burn(days: list[tuple[str, Decimal]], budget: Budget | None, cur: str) -> tuple[dict[str, Any] | None, list[Any]]:
    if budget is None:
        return None, []
    left, table = budget.amount, []
    for day, cost in days:
        left -= round_money(cost)
        table.append((day, round_money(cost), left))
    chart = {"type": "bar", "title": f"Budget burn-down: what remains of {budget.amount} {cur} at the end of each day",
             "labels": [t[0] for t in table], "stacked": False, "notes": [], "unit": cur,
             "datasets": [{"label": "Budget remaining", "data": [float(t[2]) for t in table], "color": "#059669"}]}
    return chart, table


def _cost_page(request: HttpRequest, *, title: str, intervals: QuerySet[UsageInterval], groups: list[str],
               budget: Budget | None, context: dict[str, Any]) -> HttpResponse:
    since, until = _month(request)
    cur = selectors.currency()
    names = {"day": "Cost per day", "flavor": "Cost per flavor", "project": "Cost per project", "user": "Cost per user",
             "tenant": "Cost per tenant"}
    sections = []
    days: list[tuple[str, Decimal]] = []
    total = Decimal(0)
    for group in groups:
        rows = costs.labelled(costs.cost_rows(intervals, since=since, until=until, by=(group,)), group)
        if group == "day":
            days = rows
            total = sum((r[1] for r in rows), Decimal(0))
        sections.append({"id": f"cost-{group}", "title": names[group], "group": group,
                         "chart": _chart(names[group], rows, f"Cost ({cur})", cur) if rows else None,
                         "rows": [(k, round_money(v)) for k, v in rows]})
    burn_chart, burn_rows = _burn(days, budget, cur)
    status = budgets.status_of(budget) if budget is not None and since == costs.month_start() else None
    return page(request, "billing/costs.html", context | {
        "title": title, "since": since, "until": until, "currency": cur, "sections": sections,
        "total": round_money(total), "budget": budget, "budget_status": status, "burn_chart": burn_chart,
        "burn_rows": burn_rows, "month": since.strftime("%Y-%m"), "priced": bool(selectors.price_rates()),
        "top": sections[-1] if sections else None,
    })


@login_required
def project_costs(request: HttpRequest, slug: str) -> HttpResponse:
    actor = actor_of(request)
    project = get_object_or_404(projects_for(actor=actor).select_related("tenant"), slug=slug)
    if not policy.may_view_project_costs(actor, project):  # the rule the project page's "Costs" link asks
        raise Http404("No such project.")
    budget = budgets.budgets_for(actor=actor).filter(project=project).first()
    return _cost_page(request, title=f"Costs of {project.name}", budget=budget,
                      intervals=selectors.usage_for(actor=actor).filter(project=project),
                      groups=["day", "flavor", "user"], context={"project": project, "tenant": project.tenant})


@login_required
def tenant_costs(request: HttpRequest, slug: str) -> HttpResponse:
    actor = actor_of(request)
    tenant = get_object_or_404(admin_tenants_for(actor=actor), slug=slug)
    if not policy.may_view_tenant_costs(actor, tenant):  # the rule the tenant pages' "Costs" tab asks
        raise Http404("No such tenant.")
    budget = budgets.budgets_for(actor=actor).filter(tenant=tenant, project__isnull=True).first()
    return _cost_page(request, title=f"Costs of {tenant.name}", budget=budget,
                      intervals=selectors.usage_for(actor=actor).filter(tenant=tenant),
                      groups=["day", "flavor", "project", "user"], context={"tenant": tenant})


@login_required
def ops_costs(request: HttpRequest) -> HttpResponse:
    actor = ops_only(request)
    return _cost_page(request, title="Costs across all tenants", budget=None, intervals=selectors.usage_for(actor=actor),
                      groups=["day", "flavor", "project", "tenant"], context={"tab": "costs"})



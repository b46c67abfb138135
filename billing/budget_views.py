"""The Budgets page of a tenant (``/tenants/<slug>/budgets/``): its tenant admins (and ops) set and raise the
tenant's monthly budget and its projects', see this month's spend and forecast for each, and the history of
changes (the audit log's ``budget.*`` entries). Writes go through ``billing.budgets`` (the API's services), whose
refusals are shown next to their fields; anyone else gets a 404 (docs/billing.md, "Budgets and cost views")."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.forms import DecimalField
from portal.ui import Pager
from tenants.guards import actor_of
from tenants.models import AuditEntry, Tenant
from tenants.selectors import admin_tenants_for, projects_for
from tenants.ui import page

from . import budgets, policy, selectors
from .models import Budget

HISTORY_ACTIONS = ("budget.create", "budget.update", "budget.delete")


class BudgetForm(forms.Form):
    """One budget: the tenant's (``scope`` empty) or a project's (its slug). Thresholds as ``50, 80, 100``."""

    scope = forms.CharField(required=False, widget=forms.HiddenInput)
    amount = DecimalField(label="Monthly budget", max_digits=14, decimal_places=2, min_value=Decimal("0.01"))
    thresholds = forms.CharField(label="Alert at (% of the budget)", required=False, max_length=60,
                                 help_text="Comma-separated percentages, e.g. 50, 80, 100. Only the highest one "
                                           "reached is emailed.")

    def clean_thresholds(self) -> list[int] | None:
        text = self.cleaned_data.get("thresholds", "").strip()
        if not text:
            return None
        try:
            return [int(part) for part in text.replace(";", ",").split(",") if part.strip()]
        except ValueError:
            raise forms.ValidationError("Whole percentages separated by commas, e.g. 50, 80, 100.") from None


def _tenant(request: HttpRequest, slug: str) -> tuple[Any, Tenant]:
    actor = actor_of(request)
    tenant = get_object_or_404(admin_tenants_for(actor=actor), slug=slug)
    if not policy.may_view_tenant_costs(actor, tenant):  # tenant admins and ops, never a token
        raise Http404("No such tenant.")
    return actor, tenant


def _page(request: HttpRequest, actor: Any, tenant: Tenant, *, form: BudgetForm | None = None,
          status: int = 200) -> HttpResponse:
    cur = selectors.currency()
    projects = list(projects_for(actor=actor).filter(tenant=tenant, archived_at__isnull=True).order_by("name"))
    kept = {(b.project_id or 0): b for b in Budget.objects.filter(tenant=tenant).select_related("tenant", "project")}
    status_of = {(st.budget.project_id or 0): st for st in budgets.spends(list(kept.values()))}
    rows = []
    for key, label, scope in [(0, f"Tenant {tenant.name} (all projects)", ""),
                              *((p.pk, f"Project {p.name}", p.slug) for p in projects)]:
        budget = kept.get(key)
        bound = form if form is not None and form.data.get("budget-scope", "") == scope else None
        initial = {"scope": scope, "amount": budget.amount if budget else None,
                   "thresholds": ", ".join(str(t) for t in budget.thresholds) if budget else "50, 80, 100"}
        rows.append({"label": label, "scope": scope, "budget": budget, "status": status_of.get(key),
                     "form": bound or BudgetForm(prefix="budget", initial=initial, auto_id=f"id_budget_{scope or 'tenant'}_%s")})
    history = (AuditEntry.objects.filter(tenant=tenant, action__in=HISTORY_ACTIONS)
               .order_by("-created_at", "-id").only("created_at", "actor_label", "action", "target_repr", "before", "after"))
    pager = Pager(request, history, param="history_page")
    return page(request, "billing/budgets.html", {
        "tenant": tenant, "tab": "budgets", "rows": rows, "currency": cur, "pager": pager,
        "priced": bool(selectors.price_rates()),
    }, status=status)


@login_required
def tenant_budgets(request: HttpRequest, slug: str) -> HttpResponse:
    actor, tenant = _tenant(request, slug)
    return _page(request, actor, tenant)


@login_required
@require_POST
def tenant_budget_set(request: HttpRequest, slug: str) -> HttpResponse:
    """Set (create) or change one budget of the tenant: the amount and the alert thresholds."""
    actor, tenant = _tenant(request, slug)
    form = BudgetForm(request.POST, prefix="budget")
    scope = request.POST.get("budget-scope", "")
    project = None
    if scope:
        project = projects_for(actor=actor).filter(tenant=tenant, slug=scope).first()
        if project is None:
            raise Http404("No such project.")
    if form.is_valid():
        data = form.cleaned_data
        budget = Budget.objects.filter(tenant=tenant, project=project).first()
        try:
            if budget is None:
                budget = budgets.budget_create(actor=actor, tenant=tenant, project=project, amount=data["amount"],
                                               thresholds=data["thresholds"])
            else:
                changes: dict[str, Any] = {"amount": data["amount"]}
                if data["thresholds"] is not None:
                    changes["thresholds"] = data["thresholds"]
                budget = budgets.budget_update(actor=actor, budget=budget, **changes)
        except PortalError as exc:
            form.add_error(exc.field if exc.field in ("amount", "thresholds") else None, exc.message)
        else:
            who = f"project {project.name}" if project else tenant.name
            messages.success(request, f"The monthly budget of {who} is now {budget.amount} {selectors.currency()}.")
            return redirect("tenant-budgets", slug=tenant.slug)
    return _page(request, actor, tenant, form=form, status=400)

"""Statement pages: tenant admins see their tenants' statements, ops everyone's (filtered by month and tenant,
paginated); a "draft this month" button; a print-friendly statement page and its CSV. Anyone else: 404."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.extensions import measured_idle_share
from portal.ui import Pager, filtered
from tenants.guards import actor_of, ops_only
from tenants.models import Tenant
from tenants.ui import page

from . import statements
from .filters import StatementFilter
from .models import BillingProfile

LABELS = {"month": "Month (YYYY-MM)", "tenant": "Tenant slug", "status": "Status"}


@login_required
def statement_list(request: HttpRequest) -> HttpResponse:
    actor = actor_of(request)
    tenants = list(statements.statement_tenants_for(actor=actor))
    if not tenants:
        raise Http404("No such page.")
    filterset = filtered(StatementFilter, request, statements.statements_for(actor=actor), labels=LABELS)
    return page(request, "billing/statements.html", {
        "filterset": filterset, "pager": Pager(request, filterset.qs), "tenants": tenants,
        "this_month": timezone.now(), "is_ops": actor.is_ops,
    })


@login_required
@require_POST
def statement_draft(request: HttpRequest) -> HttpResponse:
    actor = actor_of(request)
    tenant = statements.statement_tenants_for(actor=actor).filter(slug=request.POST.get("tenant", "")).first()
    if tenant is None:
        raise Http404("No such tenant.")
    try:
        month = statements.parse_month(request.POST["month"]) if request.POST.get("month") else timezone.now().date()
        statement = statements.statement_draft(actor=actor, tenant=tenant, month=month)
    except PortalError as exc:
        messages.error(request, exc.message)
        return redirect("statements")
    messages.success(request, f"Statement for {tenant.name}, {statement.month:%Y-%m}: "
                              f"{'drafted' if not statement.is_final else 'final'}.")
    return redirect("statement", pk=statement.pk)


def _statement(request: HttpRequest, pk: int):
    actor = actor_of(request)
    return get_object_or_404(statements.statements_for(actor=actor).prefetch_related("lines"), pk=pk)


@login_required
def statement_detail(request: HttpRequest, pk: int) -> HttpResponse:
    statement = _statement(request, pk)
    start = datetime(statement.month.year, statement.month.month, 1, tzinfo=UTC)
    end = datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)
    return page(request, "billing/statement.html", {
        "statement": statement, "groups": statements.lines_by_project(statement),
        # information only: what the tenant's GPUs were measured doing (insights answers; charges are allocation)
        "measured_idle": measured_idle_share.call(statement.tenant, start, end),
    })


@login_required
def statement_csv(request: HttpRequest, pk: int) -> HttpResponse:
    statement = _statement(request, pk)
    response = HttpResponse(statements.csv_of(statement), content_type="text/csv; charset=utf-8")
    name = statement.number or f"draft-{statement.tenant.slug}-{statement.month:%Y-%m}"
    response["Content-Disposition"] = f'attachment; filename="statement-{name}.csv"'
    return response


@login_required
def billing_profile(request: HttpRequest, slug: str) -> HttpResponse:
    """(Ops) showback or chargeback, and the cost centre, of one tenant."""
    actor = ops_only(request)
    tenant = get_object_or_404(Tenant, slug=slug)
    profile = statements.profile_of(tenant)
    if request.method == "POST":
        try:
            statements.billing_profile_set(actor=actor, tenant=tenant, mode=request.POST.get("mode", ""),
                                           cost_centre=request.POST.get("cost_centre"))
        except PortalError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"Billing of {tenant.name} saved.")
            return redirect("statements")
    return page(request, "billing/billing_profile.html", {
        "tenant": tenant, "profile": profile, "modes": BillingProfile.Mode.choices,
    })

"""Monthly budgets: who sets them, what is spent and forecast, alerts once per threshold and month, and the
refusal of new submissions once a budget is spent (docs/billing.md, "Budgets and cost views").

Who: ops everywhere; tenant admins for their tenant's budget and its projects'; project admins for their
project's. Only ops switch ``refuse_when_spent``. Everyone who sees a project sees its budget; a tenant's budget, its admins (and ops).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from celery import shared_task
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from portal.cache import read_forget, read_with_versions
from portal.events import after_commit
from portal.exceptions import Invalid
from portal.notify import notify_send, portal_link
from portal.quantities import format_money, round_money
from tenants.access import Actor, ops_role
from tenants.audit import audit_record, snapshot
from tenants.guards import require
from tenants.models import Project, Tenant
from tenants.policy import holders, may_change_project, may_change_tenant, may_operate, with_holders
from tenants.selectors import admin_tenants_for, projects_for

from . import costs, selectors
from .models import Budget, BudgetAlert, UsageInterval

logger = logging.getLogger(__name__)
FIELDS = ["tenant", "project", "amount", "thresholds", "refuse_when_spent"]
MAX_AMOUNT = Decimal("999999999999.99")
REFUSING_KEY = "billing:refusing-tenants"


# ------------------------------------------------------------------------------------------------ who
def _budget_holders(tenant: Tenant, project: Project | None = None) -> Any:
    """``may_set_budget``'s twin."""
    return holders("change_tenant", tenant) if project is None else holders("change_project", project)


@with_holders(_budget_holders)
def may_set_budget(actor: Actor, tenant: Tenant, project: Project | None = None) -> bool:
    """Tenant budgets: tenant admins and ops. A project's: its project admins too."""
    if project is not None:
        return may_change_project(actor, project)
    return may_change_tenant(actor, tenant)


# ------------------------------------------------------------------------------------------------ reads
def budgets_for(*, actor: Actor) -> QuerySet[Budget]:
    base = Budget.objects.select_related("tenant", "project").order_by("tenant__slug", "project__slug")
    if actor.is_ops:
        return base
    return base.filter(Q(project__isnull=True, tenant__in=admin_tenants_for(actor=actor).values("pk"))
                       | Q(project__in=projects_for(actor=actor).values("pk")))


def _intervals_of(budget: Budget) -> QuerySet[UsageInterval]:
    if budget.project_id:
        return UsageInterval.objects.filter(project_id=budget.project_id)
    return UsageInterval.objects.filter(tenant_id=budget.tenant_id)


@dataclass
class Status:
    budget: Budget
    spent: Decimal
    forecast: Decimal
    month_start: datetime
    month_end: datetime

    @property
    def remaining(self) -> Decimal:
        return max(self.budget.amount - round_money(self.spent), Decimal(0))

    @property
    def percent(self) -> Decimal:
        return round_money(self.spent * 100 / self.budget.amount)

    @property
    def spent_out(self) -> bool:
        return round_money(self.spent) >= self.budget.amount


def spends(budgets: list[Budget], *, now: datetime | None = None) -> list[Status]:
    """Each budget's spend this month and its forecast, from one aggregate query for all of them."""
    now = now or timezone.now()
    since, until = costs.month_bounds(now)
    if not budgets:
        return []
    tenant_ids = {b.tenant_id for b in budgets}
    rows = costs.cost_rows(UsageInterval.objects.filter(tenant_id__in=tenant_ids), since=since, until=until,
                           by=("tenant", "project"), now=now)
    by_tenant: dict[int, Decimal] = {}
    by_project: dict[int, Decimal] = {}
    for row in rows:
        by_tenant[row["tenant"]] = by_tenant.get(row["tenant"], Decimal(0)) + row["cost"]
        by_project[row["project"]] = by_project.get(row["project"], Decimal(0)) + row["cost"]
    out = []
    for b in budgets:
        spent = by_project.get(b.project_id, Decimal(0)) if b.project_id else by_tenant.get(b.tenant_id, Decimal(0))
        out.append(Status(b, spent, costs.forecast(spent, since=since, until=until, now=now), since, until))
    return out


def status_of(budget: Budget, *, now: datetime | None = None) -> Status:
    return spends([budget], now=now)[0]


# ------------------------------------------------------------------------------------------------ writes
def _check(budget: Budget) -> None:
    try:
        amount = Decimal(str(budget.amount))
    except (InvalidOperation, TypeError, ValueError):
        raise Invalid("An amount, e.g. 500.00.", field="amount") from None
    if not amount.is_finite() or amount <= 0:
        raise Invalid("A budget is more than zero.", field="amount")
    if amount > MAX_AMOUNT:
        raise Invalid(f"At most {MAX_AMOUNT}.", field="amount")
    if amount != amount.quantize(Decimal("0.01")):
        raise Invalid("At most two decimal places.", field="amount")
    budget.amount = amount
    values = budget.thresholds
    if not isinstance(values, list) or not values or len(values) > 10:
        raise Invalid("A list of 1 to 10 percentages, e.g. [50, 80, 100].", field="thresholds")
    if any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1000 for v in values):
        raise Invalid("Each threshold is a whole percentage from 1 to 1000.", field="thresholds")
    budget.thresholds = sorted(set(values))


def _refusing_changed() -> None:
    read_forget(REFUSING_KEY)  # the rest of this request reads it again
    after_commit(cache.delete, REFUSING_KEY)


@transaction.atomic
def budget_create(*, actor: Actor, tenant: Tenant, project: Project | None = None, amount: Any,
                  thresholds: list[int] | None = None, refuse_when_spent: bool = False) -> Budget:
    require(may_set_budget(actor, tenant, project), "You may not set this budget.")
    if project is not None and project.tenant_id != tenant.pk:
        raise Invalid("The project is not in this tenant.", field="project")
    if refuse_when_spent and not may_operate(actor):
        raise Invalid("Only platform ops refuse submissions once a budget is spent.", field="refuse_when_spent")
    budget = Budget(tenant=tenant, project=project, amount=amount,
                    thresholds=[50, 80, 100] if thresholds is None else thresholds, refuse_when_spent=refuse_when_spent)
    _check(budget)
    try:
        with transaction.atomic():
            budget.save()
    except IntegrityError:
        raise Invalid(f"{'This project' if project else 'This tenant'} has a budget already; change that one.",
                      field="project" if project else "tenant") from None
    _refusing_changed()
    audit_record(actor=actor, action="budget.create", target=budget, tenant=tenant, after=snapshot(budget, FIELDS))
    return budget


@transaction.atomic
def budget_update(*, actor: Actor, budget: Budget, **changes: Any) -> Budget:
    budget = Budget.objects.select_for_update(of=("self",)).select_related("tenant", "project").get(pk=budget.pk)
    require(may_set_budget(actor, budget.tenant, budget.project), "You may not set this budget.")
    before = snapshot(budget, FIELDS)
    for name, value in changes.items():
        if name not in ("amount", "thresholds", "refuse_when_spent"):
            raise Invalid(f"Unknown field {name}.", field=name)
        if name == "refuse_when_spent" and value != budget.refuse_when_spent and not may_operate(actor):
            raise Invalid("Only platform ops refuse submissions once a budget is spent.", field="refuse_when_spent")
        setattr(budget, name, value)
    _check(budget)
    budget.save()
    _refusing_changed()
    audit_record(actor=actor, action="budget.update", target=budget, tenant=budget.tenant, before=before,
                 after=snapshot(budget, FIELDS))
    return budget


@transaction.atomic
def budget_delete(*, actor: Actor, budget: Budget) -> None:
    budget = Budget.objects.select_for_update(of=("self",)).select_related("tenant", "project").get(pk=budget.pk)
    require(may_set_budget(actor, budget.tenant, budget.project), "You may not remove this budget.")
    audit_record(actor=actor, action="budget.delete", target=budget, tenant=budget.tenant, before=snapshot(budget, FIELDS))
    budget.delete()
    _refusing_changed()


# ------------------------------------------------------------------------------------------------ alerts
def _recipients(budget: Budget) -> list[str]:
    """Who may set the budget (``may_set_budget``'s holders: the tenant's admins, a project's admins too), less
    platform ops, with an email address."""
    people = holders(may_set_budget, budget.tenant, budget.project).exclude(ops_role()).exclude(email="")
    return sorted(set(people.values_list("email", flat=True)))


def _alert_send(alert_id: int) -> None:
    alert = BudgetAlert.objects.select_related("budget__tenant", "budget__project").filter(pk=alert_id).first()
    if alert is None:
        return
    budget = alert.budget
    scope = f"project {budget.project.slug}" if budget.project_id else f"tenant {budget.tenant.slug}"
    cur = selectors.currency()
    subject = f"[GPU portal] Budget alert: {scope} reached {alert.threshold}% of its {alert.month:%B %Y} budget"
    body = (f"The {scope} has spent {format_money(alert.spent, cur)} of its monthly budget of "
            f"{format_money(budget.amount, cur)} ({alert.threshold}% threshold) in {alert.month:%B %Y}.\n")
    if budget.refuse_when_spent:
        body += "New submissions are refused once the budget is spent.\n"
    body += f"\nThe budgets: {portal_link(f'/tenants/{budget.tenant.slug}/budgets/')}\n"
    notify_send(subject=subject, body=body, to=_recipients(budget), topic="budget",
                payload={"event": "budget.alert", "tenant": budget.tenant.slug,
                         "project": budget.project.slug if budget.project_id else None, "month": alert.month.isoformat(),
                         "threshold": alert.threshold, "spent": str(alert.spent), "amount": str(budget.amount),
                         "currency": cur})


def budgets_check(*, now: datetime | None = None) -> int:
    """Send, per budget, the alert of the highest threshold this month's spend reached, unless it was sent
    already; returns how many. A spend that jumps past several thresholds at once (50 %, 80 % and 100 % of a
    budget at 4,000 %) sends one alert, the highest: the lower ones are recorded as covered and never sent.

    Each alert is claimed by inserting its ``BudgetAlert`` row (unique per budget, month and threshold) before it
    is sent, after commit: of two runs at once, one inserts and sends, the other finds the row and sends nothing."""
    now = now or timezone.now()
    statuses = spends(list(Budget.objects.select_related("tenant", "project")), now=now)
    sent = 0
    for st in statuses:
        percent = st.spent * 100 / st.budget.amount
        crossed = sorted(t for t in st.budget.thresholds if percent >= t)
        if not crossed:
            continue
        month, spent = st.month_start.date(), round_money(st.spent)
        with transaction.atomic():
            alert, created = BudgetAlert.objects.get_or_create(
                budget=st.budget, month=month, threshold=crossed[-1], defaults={"spent": spent})
            if created:
                BudgetAlert.objects.bulk_create(
                    [BudgetAlert(budget=st.budget, month=month, threshold=t, spent=spent) for t in crossed[:-1]],
                    ignore_conflicts=True)
                after_commit(_alert_send, alert.pk)
                sent += 1
    return sent


@shared_task(name="billing.budgets_check")
def budgets_check_task() -> int:
    return budgets_check()


# ------------------------------------------------------------------------------------------------ submissions
def _refusing_tenants() -> set[int]:
    known = read_with_versions(REFUSING_KEY)  # fetched with the request's cache versions: no round trip of its own
    if known is None:
        known = sorted(set(Budget.objects.filter(refuse_when_spent=True).order_by().values_list("tenant_id", flat=True)))
        cache.set(REFUSING_KEY, known, None)
    return set(known)


def submission_guard(project: Any) -> str | None:
    """(``portal.extensions.submission_guard``) Why a new request in ``project`` is refused, or None.

    No query unless the project's tenant has a budget that refuses (a cached list of such tenants, dropped on
    every budget write)."""
    tenant_id = getattr(project, "tenant_id", None)
    if tenant_id is None or tenant_id not in _refusing_tenants():
        return None
    budgets = list(Budget.objects.filter(Q(project__isnull=True) | Q(project_id=project.pk), tenant_id=tenant_id,
                                         refuse_when_spent=True).select_related("tenant", "project"))
    for st in spends(budgets):
        if st.spent_out:
            b = st.budget
            scope = f"project {b.project.slug}" if b.project_id else f"tenant {b.tenant.slug}"
            cur = selectors.currency()
            return (f"The monthly budget of {scope} is spent ({format_money(round_money(st.spent), cur)} of "
                    f"{format_money(b.amount, cur)}): new requests are refused until next month or until a tenant "
                    f"admin raises the budget.")
    return None


def budget_remaining(request_like: Any) -> str | None:
    """(``portal.extensions.budget_remaining``) "Remaining this month: X of Y" for the project's budget (and its
    tenant's); None without a budget."""
    project = getattr(request_like, "project", None)
    if project is None or not selectors.price_rates():
        return None
    budgets = list(Budget.objects.filter(Q(project__isnull=True) | Q(project_id=project.pk), tenant_id=project.tenant_id)
                   .select_related("tenant", "project"))
    if not budgets:
        return None
    cur = selectors.currency()
    parts = []
    for st in sorted(spends(budgets), key=lambda s: s.budget.project_id is None):
        who = f"project {st.budget.project.slug}" if st.budget.project_id else f"tenant {st.budget.tenant.slug}"
        parts.append(f"{who}: {format_money(st.remaining, cur)} of {format_money(st.budget.amount, cur)}")
    return "Remaining this month: " + "; ".join(parts) + "."

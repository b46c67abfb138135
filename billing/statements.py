"""Monthly statements: rating a month in the database, drafts on demand, the month close, CSV (docs/billing.md).

**Rating is one SQL aggregation** (``rate_month``): every usage interval touching the month is clipped to the
month (``GREATEST`` / ``LEAST`` of its ends and the month's), an open one ends at its cluster's "now" (the
observed cluster time moved on by the portal time since, as ``selectors.cluster_now`` says); it is joined to each
price window of its unit and key (a price's ``effective_from`` to the next one's) and to each discount window of
its tenant, clipped again to both, and ``SUM(seconds x quantity)`` is grouped by tenant, project, unit, key, price
window and discount window. So a price (or discount) change mid-month splits a line at that instant, as
``pricing.split`` does for one interval, and no interval is loaded into Python.

**SQLite (the laptop demo) rates in Python, PostgreSQL in SQL.** ``RATE_SQL`` is PostgreSQL's (``'infinity'``,
``GREATEST``/``LEAST``, ``EXTRACT``, ``= ANY``); on any other database ``_rate_python`` reads the month's intervals
(only the columns needed) and makes the same windows and sums, in the same order. Only the summing differs; turning
the sums into ``Rated`` lines is shared, and tests/billing/test_portable_sums.py requires both to give identical
lines on the same PostgreSQL data.

A line's amount is rounded to the cent once (``round_money``); a statement's total is the sum of its lines.

A **draft** is recomputed whenever it is asked for (``statement_draft``). The beat task
``billing.statements_finalise`` (``finalise_due``) finalises every month that ended and is not yet closed:
recomputes its drafts, numbers them from the year's counter (a row locked with ``select_for_update``: gapless
under concurrency) and closes the ``BillingPeriod`` (``services.period_finalise``). Running it again finds the
month closed and does nothing. A final statement never changes (``models.Statement`` refuses).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from portal.exceptions import Invalid
from portal.quantities import round_money
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.guards import require
from tenants.models import Project, Tenant
from tenants.selectors import admin_tenants_for
from tenants.services import tenant_update

from . import policy, pricing, selectors, services, statement_states
from .models import (
    HOURS_PER_MONTH,
    BillingPeriod,
    BillingProfile,
    Discount,
    Price,
    Statement,
    StatementCounter,
    StatementLine,
    Unit,
    UsageInterval,
)

HOUR = Decimal(3600)
HUNDRED = Decimal(100)

RATE_SQL = """
WITH prices AS (
    SELECT id, unit, key, amount, effective_from AS p_from,
           COALESCE(LEAD(effective_from) OVER (PARTITION BY unit, key ORDER BY effective_from),
                    'infinity'::timestamptz) AS p_to
      FROM billing_price
     WHERE currency = %(currency)s
), disc AS (
    SELECT tenant_id, percent, effective_from AS d_from,
           COALESCE(LEAD(effective_from) OVER (PARTITION BY tenant_id ORDER BY effective_from),
                    'infinity'::timestamptz) AS d_to
      FROM billing_discount
    UNION ALL  -- before a tenant's first discount (or without any): none
    SELECT t.id, 0, '-infinity'::timestamptz, COALESCE(MIN(d.effective_from), 'infinity'::timestamptz)
      FROM tenants_tenant t LEFT JOIN billing_discount d ON d.tenant_id = t.id
     GROUP BY t.id
), iv AS (
    SELECT u.tenant_id, u.project_id, u.unit, u.key, u.quantity,
           GREATEST(u.started_at, %(m0)s) AS s,
           LEAST(COALESCE(u.ended_at, c.cluster_time + GREATEST(%(now)s - c.seen_at, interval '0'), u.started_at),
                 %(m1)s) AS e
      FROM billing_usageinterval u
      LEFT JOIN billing_clusterclock c ON c.cluster_id = u.cluster_id
     WHERE u.started_at < %(m1)s AND (u.ended_at IS NULL OR u.ended_at > %(m0)s) {tenant_filter}
)
SELECT iv.tenant_id, iv.project_id, iv.unit, iv.key, p.amount, d.percent,
       GREATEST(p.p_from, d.d_from, %(m0)s) AS w_start,
       LEAST(p.p_to, d.d_to, %(m1)s) AS w_end,
       SUM(EXTRACT(EPOCH FROM (LEAST(iv.e, p.p_to, d.d_to) - GREATEST(iv.s, p.p_from, d.d_from))) * iv.quantity)
  FROM iv
  JOIN prices p ON p.unit = iv.unit AND p.key = iv.key AND p.p_from < iv.e AND p.p_to > iv.s
  JOIN disc d ON d.tenant_id = iv.tenant_id AND d.d_from < iv.e AND d.d_to > iv.s
 WHERE LEAST(iv.e, p.p_to, d.d_to) > GREATEST(iv.s, p.p_from, d.d_from)
 GROUP BY iv.tenant_id, iv.project_id, iv.unit, iv.key, p.id, p.amount, p.p_from, p.p_to, d.percent, d.d_from, d.d_to
 ORDER BY iv.tenant_id, iv.project_id, iv.unit, iv.key, w_start
"""


@dataclass(frozen=True)
class Rated:
    """One line as the database rated it (exact, unrounded)."""

    project_id: int
    unit: str
    key: str
    unit_price: Decimal
    discount_percent: Decimal
    period_start: datetime
    period_end: datetime
    quantity: Decimal  # unit-hours (storage: unit-months)

    @property
    def gross(self) -> Decimal:
        return round_money(self.quantity * self.unit_price)

    @property
    def amount(self) -> Decimal:
        return round_money(self.quantity * self.unit_price * (HUNDRED - self.discount_percent) / HUNDRED)


def month_start(value: date | datetime) -> date:
    return date(value.year, value.month, 1)


def month_bounds(month: date) -> tuple[datetime, datetime]:
    month = month_start(month)
    return datetime(month.year, month.month, 1, tzinfo=UTC), selectors.month_end(month)


def parse_month(text: str) -> date:
    """``2026-03`` → 2026-03-01; anything else is a 400 on ``month``."""
    try:
        return datetime.strptime((text or "").strip()[:7], "%Y-%m").date()
    except ValueError:
        raise Invalid("A month as YYYY-MM (e.g. 2026-03).", field="month") from None


def rate_month(month: date, *, tenant_ids: list[int] | None = None, now: datetime | None = None,
               in_python: bool | None = None) -> dict[int, list[Rated]]:
    """tenant id → its lines for ``month``. Rated by one aggregate query on PostgreSQL (``_rate_sql``: no interval is
    loaded here); elsewhere (SQLite, the laptop demo) or with ``in_python`` the same sums are made in Python
    (``_rate_python``)."""
    m0, m1 = month_bounds(month)
    if tenant_ids is not None and not tenant_ids:
        return {}
    now = now or timezone.now()
    if in_python is None:
        in_python = connection.vendor != "postgresql"
    out: dict[int, list[Rated]] = defaultdict(list)
    for tenant_id, project_id, unit, key, amount, percent, w_start, w_end, unit_seconds in (
            (_rate_python if in_python else _rate_sql)(m0, m1, tenant_ids=tenant_ids, now=now)):
        hours = Decimal(unit_seconds) / HOUR
        quantity = hours / HOURS_PER_MONTH if unit == Unit.STORAGE else hours
        out[tenant_id].append(Rated(project_id, unit, key, Decimal(amount), Decimal(percent), w_start, w_end, quantity))
    return out


def _rate_sql(m0: datetime, m1: datetime, *, tenant_ids: list[int] | None, now: datetime) -> list[tuple[Any, ...]]:
    """``RATE_SQL``'s rows: (tenant, project, unit, key, price, discount %, window start, window end, unit-seconds)."""
    params: dict[str, Any] = {"currency": selectors.currency(), "m0": m0, "m1": m1, "now": now}
    tenant_filter = ""
    if tenant_ids is not None:
        tenant_filter = "AND u.tenant_id = ANY(%(tenants)s)"
        params["tenants"] = list(tenant_ids)
    with connection.cursor() as cursor:
        cursor.execute(RATE_SQL.format(tenant_filter=tenant_filter), params)
        return cursor.fetchall()


FOREVER = datetime.max.replace(tzinfo=UTC)  # 'infinity'::timestamptz
NEVER = datetime.min.replace(tzinfo=UTC)  # '-infinity'::timestamptz


def _windows(rows: list[tuple[datetime, Any]]) -> list[tuple[datetime, datetime, Any]]:
    """(effective_from, value) in time order → (from, to, value): each until the next one (``LEAD()``)."""
    return [(at, rows[i + 1][0] if i + 1 < len(rows) else FOREVER, value) for i, (at, value) in enumerate(rows)]


def _rate_python(m0: datetime, m1: datetime, *, tenant_ids: list[int] | None, now: datetime) -> list[tuple[Any, ...]]:
    """``_rate_sql``'s rows, in its order, computed in Python: the month's intervals (only the columns needed) are
    clipped to the month, an open one ends at its cluster's now (``COALESCE(ended_at, cluster now, started_at)``),
    then to each price window of its unit and key and each discount window of its tenant (0 % before the first)."""
    prices: dict[tuple[str, str], list[tuple[datetime, Any]]] = defaultdict(list)
    for price_id, unit, key, amount, at in (Price.objects.filter(currency=selectors.currency())
                                            .order_by("effective_from").values_list("id", "unit", "key", "amount", "effective_from")):
        prices[(unit, key)].append((at, (price_id, amount)))
    price_windows = {k: _windows(v) for k, v in prices.items()}
    discounts: dict[int, list[tuple[datetime, Any]]] = defaultdict(list)
    for tenant_id, percent, at in Discount.objects.order_by("effective_from").values_list("tenant_id", "percent", "effective_from"):
        discounts[tenant_id].append((at, percent))
    discount_windows: dict[int, list[tuple[datetime, datetime, Any]]] = {}
    clocks = selectors.cluster_nows(now=now)
    intervals = UsageInterval.objects.filter(started_at__lt=m1).filter(Q(ended_at__isnull=True) | Q(ended_at__gt=m0))
    if tenant_ids is not None:
        intervals = intervals.filter(tenant_id__in=tenant_ids)
    sums: dict[tuple[Any, ...], Decimal] = defaultdict(Decimal)
    for tenant_id, project_id, unit, key, quantity, started_at, ended_at, cluster_id in intervals.values_list(
            "tenant_id", "project_id", "unit", "key", "quantity", "started_at", "ended_at", "cluster_id").iterator(chunk_size=5000):
        s = max(started_at, m0)
        e = min(ended_at if ended_at is not None else clocks.get(cluster_id, started_at), m1)
        if tenant_id not in discount_windows:
            own = discounts.get(tenant_id, [])
            discount_windows[tenant_id] = [(NEVER, own[0][0] if own else FOREVER, Decimal(0)), *_windows(own)]
        for p_from, p_to, (price_id, amount) in price_windows.get((unit, key), []):
            if not (p_from < e and p_to > s):
                continue
            for d_from, d_to, percent in discount_windows[tenant_id]:
                a, b = max(s, p_from, d_from), min(e, p_to, d_to)
                if d_from < e and d_to > s and b > a:
                    group = (tenant_id, project_id, unit, key, price_id, amount, p_from, p_to, percent, d_from, d_to)
                    sums[group] += pricing.seconds(b - a) * quantity
    rows = [(tenant_id, project_id, unit, key, amount, percent, max(p_from, d_from, m0), min(p_to, d_to, m1), total)
            for (tenant_id, project_id, unit, key, _, amount, p_from, p_to, percent, d_from, d_to), total in sums.items()]
    return sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3], r[6]))


# ------------------------------------------------------------------------------------------------ reads
def statements_for(*, actor: Actor) -> QuerySet[Statement]:
    """Tenant admins: their tenants' statements; ops: everyone's; anyone else (and tokens): none."""
    base = Statement.objects.select_related("tenant").order_by("-month", "tenant__slug")
    if actor.is_ops:
        return base
    return base.filter(tenant__in=admin_tenants_for(actor=actor).values("pk"))


def statement_tenants_for(*, actor: Actor) -> QuerySet[Tenant]:
    """The tenants whose statements ``actor`` may draft and read."""
    return admin_tenants_for(actor=actor).order_by("slug")


def lines_by_project(statement: Statement) -> list[dict[str, Any]]:
    """The lines grouped per project, each group with its total (for pages and the CSV)."""
    groups: dict[str, dict[str, Any]] = {}
    for line in statement.lines.all():
        group = groups.setdefault(line.project_slug, {"project": line.project_slug, "lines": [], "total": Decimal(0)})
        group["lines"].append(line)
        group["total"] += line.amount
    return list(groups.values())


def profile_of(tenant: Tenant) -> BillingProfile:
    return BillingProfile.objects.filter(tenant=tenant).first() or BillingProfile(tenant=tenant)


def unit_label(unit: str) -> str:
    return {Unit.GPU: "GPU-hour", Unit.MIG: "slice-hour", Unit.HAMI_MEMORY: "GiB-hour", Unit.HAMI_CORES: "card-hour",
            Unit.CPU: "core-hour", Unit.MEMORY: "GiB-hour", Unit.STORAGE: "GiB-month"}.get(unit, unit)


CSV_HEADER = ["statement", "status", "tenant", "month", "mode", "cost_centre", "currency", "project", "unit", "key",
              "period_start", "period_end", "quantity", "quantity_unit", "unit_price", "gross", "discount_percent", "amount"]


def csv_of(statement: Statement) -> str:
    """The statement as CSV: one row per line (times in UTC), then a total row per project and for the tenant."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    head = [statement.number or "draft", statement.status, statement.tenant.slug, f"{statement.month:%Y-%m}",
            statement.mode, statement.cost_centre, statement.currency]
    for group in lines_by_project(statement):
        for line in group["lines"]:
            writer.writerow([*head, line.project_slug, line.unit, line.key, line.period_start.astimezone(UTC).isoformat(),
                             line.period_end.astimezone(UTC).isoformat(), f"{line.quantity.normalize():f}",
                             unit_label(line.unit), f"{line.unit_price.normalize():f}", f"{line.gross:.2f}",
                             f"{line.discount_percent:.2f}", f"{line.amount:.2f}"])
        writer.writerow([*head, group["project"], "project total", *[""] * 8, f"{group['total']:.2f}"])
    writer.writerow([*head, "", "subtotal", *[""] * 8, f"{statement.subtotal:.2f}"])
    writer.writerow([*head, "", "discount", *[""] * 8, f"{-statement.discount:.2f}"])
    writer.writerow([*head, "", "total", *[""] * 8, f"{statement.total:.2f}"])
    return out.getvalue()


# ------------------------------------------------------------------------------------------------ writes
def _lock_period(month: date) -> BillingPeriod:
    BillingPeriod.objects.get_or_create(month=month)
    return BillingPeriod.objects.select_for_update().get(month=month)


def _write(month: date, rated: dict[int, list[Rated]], tenants: list[Tenant], *, now: datetime) -> list[Statement]:
    """Create or recompute the drafts of ``tenants`` for ``month`` from ``rated`` in a handful of queries (final
    statements are left as they are and returned too), in the order of ``tenants``."""
    projects = _projects(rated)
    profiles = {p.tenant_id: p for p in BillingProfile.objects.filter(tenant__in=[t.pk for t in tenants])}
    existing = {s.tenant_id: s for s in Statement.objects.select_for_update().filter(tenant__in=[t.pk for t in tenants], month=month)}
    drafts = [s.pk for s in existing.values() if not s.is_final]
    StatementLine.objects.filter(statement_id__in=drafts).delete()
    fresh, changed, out = [], [], []
    for tenant in tenants:
        statement = existing.get(tenant.pk)
        if statement is not None and statement.is_final:
            out.append(statement)
            continue
        rows = rated.get(tenant.pk, [])
        profile = profiles.get(tenant.pk) or BillingProfile(tenant=tenant)
        if statement is None:
            statement = Statement(tenant=tenant, month=month)
            fresh.append(statement)
        else:
            changed.append(statement)
        statement.currency = selectors.currency()
        statement.mode, statement.cost_centre = profile.mode, tenant.cost_centre
        statement.subtotal = sum((r.gross for r in rows), Decimal(0))
        statement.total = sum((r.amount for r in rows), Decimal(0))
        statement.discount = statement.subtotal - statement.total
        statement.generated_at = now
        out.append(statement)
    Statement.objects.bulk_create(fresh, batch_size=1000)
    Statement.objects.bulk_update(changed, ["currency", "mode", "cost_centre", "subtotal", "total", "discount",
                                            "generated_at"], batch_size=1000)
    StatementLine.objects.bulk_create([
        StatementLine(statement=statement, project_id=r.project_id, project_slug=projects.get(r.project_id, str(r.project_id)),
                      unit=r.unit, key=r.key, period_start=r.period_start, period_end=r.period_end,
                      quantity=r.quantity.quantize(Decimal("0.000001")), unit_price=r.unit_price, gross=r.gross,
                      discount_percent=r.discount_percent, amount=r.amount)
        for statement in fresh + changed for r in rated.get(statement.tenant_id, [])
    ], batch_size=2000)
    return out


def _projects(rated: dict[int, list[Rated]]) -> dict[int, str]:
    ids = {r.project_id for rows in rated.values() for r in rows}
    return dict(Project.objects.filter(pk__in=ids).values_list("pk", "slug"))


@transaction.atomic
def statement_draft(*, actor: Actor, tenant: Tenant, month: date, now: datetime | None = None) -> Statement:
    """(Re)compute ``tenant``'s draft for ``month`` (this month: usage so far). A closed month's statement is final
    and is returned as it is."""
    require(policy.may_view_statements(actor, tenant), "Only the tenant's admins and ops draft its statements.")
    now = now or timezone.now()
    month = month_start(month)
    if month > month_start(now):
        raise Invalid("That month has not begun.", field="month")
    period = _lock_period(month)
    if period.finalised_at is not None:
        final = Statement.objects.filter(tenant=tenant, month=month).first()
        if final is None:
            raise Invalid("That month is closed and had no statement for this tenant.", field="month")
        return final
    return _write(month, rate_month(month, tenant_ids=[tenant.pk], now=now), [tenant], now=now)[0]


@transaction.atomic
def finalise_month(month: date, *, now: datetime | None = None) -> list[Statement]:
    """Recompute, number and finalise every statement of ``month`` (tenants with usage in it, or a draft), then close
    the month. A month already closed: nothing happens (the empty list)."""
    now = now or timezone.now()
    month = month_start(month)
    if selectors.month_end(month) > now:
        raise Invalid("A month can be finalised only after it ended.", field="month")
    period = _lock_period(month)
    if period.finalised_at is not None:
        return []
    rated = rate_month(month, now=now)
    tenant_ids = set(rated) | set(Statement.objects.filter(month=month).values_list("tenant_id", flat=True))
    drafts = _write(month, rated, list(Tenant.objects.filter(pk__in=tenant_ids).order_by("slug")), now=now)
    StatementCounter.objects.get_or_create(year=month.year)
    counter = StatementCounter.objects.select_for_update().get(year=month.year)
    numbers = {}
    for statement in drafts:  # all drafts: the month was open, under its lock
        counter.last += 1
        numbers[statement.pk] = f"{month.year}-{counter.last:06d}"
    statement_states.finalise(drafts, numbers=numbers, now=now)
    counter.save(update_fields=["last"])
    services.period_finalise(actor=Actor.system(), month=month)
    audit_record(actor=Actor.system(), action="billing.statements_finalise", target=period,
                 after={"month": f"{month:%Y-%m}", "statements": len(drafts),
                        "numbers": [s.number for s in drafts][:1] + [s.number for s in drafts][-1:]})
    return drafts


def finalise_due(*, now: datetime | None = None) -> list[str]:
    """(Beat) finalise, oldest first, every month that ended and is not closed: from the month after the last closed
    one (or the month of the first usage) to last month. Idempotent: a closed month is skipped."""
    now = now or timezone.now()
    last_month = month_start(month_start(now) - timedelta(days=1))
    closed = BillingPeriod.objects.filter(finalised_at__isnull=False).order_by("-month").first()
    if closed is not None:
        start = _next_month(closed.month)
    else:
        first = UsageInterval.objects.order_by("started_at").values_list("started_at", flat=True).first()
        start = month_start(first) if first is not None else last_month
    done = []
    month = start
    while month <= last_month:
        if finalise_month(month, now=now):
            done.append(f"{month:%Y-%m}")
        month = _next_month(month)
    return done


def _next_month(month: date) -> date:
    return date(month.year + (month.month == 12), month.month % 12 + 1, 1)


@transaction.atomic
def billing_profile_set(*, actor: Actor, tenant: Tenant, mode: str, cost_centre: str | None = None) -> BillingProfile:
    """Showback or chargeback for a tenant (ops), and (``cost_centre`` given) the tenant's cost centre, which is
    ``Tenant.cost_centre``, the one the tenant pages show too. Drafts pick them up when recomputed; final statements
    keep what they printed."""
    require(policy.may_manage_prices(actor), "Only platform ops set how a tenant is billed.")
    if mode not in BillingProfile.Mode.values:
        raise Invalid("showback or chargeback.", field="mode")
    profile = BillingProfile.objects.select_for_update().filter(tenant=tenant).first() or BillingProfile(tenant=tenant)
    before = {"mode": profile.mode} if profile.pk else None
    profile.mode = mode
    profile.save()
    audit_record(actor=actor, action="billing.profile_set", target=profile, tenant=tenant, before=before,
                 after={"mode": profile.mode})
    if cost_centre is not None and cost_centre.strip() != tenant.cost_centre:
        tenant_update(actor=actor, tenant=tenant, cost_centre=cost_centre.strip())
        tenant.refresh_from_db(fields=["cost_centre"])
    return profile

"""Every billing write: prices, tenant discounts and the month close. Each checks the rules, writes and audits.

The rule that keeps statements true: nothing may take effect inside a finalised month (``selectors.
finalised_through``): a price (or discount) cannot be added with an earlier ``effective_from``, and a row that
took effect before it cannot be changed or removed. A price change is a new row from the instant it applies, so
usage before it keeps the old price (docs/billing.md).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.exceptions import Invalid
from tenants.access import Actor
from tenants.audit import audit_record, snapshot
from tenants.guards import require
from tenants.models import Tenant

from . import policy, rollup, selectors
from .models import KEYED_UNITS, BillingPeriod, Discount, Price, Unit

PRICE_FIELDS = ["unit", "key", "amount", "currency", "effective_from", "note"]
DISCOUNT_FIELDS = ["tenant", "percent", "effective_from", "note"]
MAX_AMOUNT = Decimal("99999999.999999")


def _month_of(when: datetime) -> date:
    when = when.astimezone(UTC)
    return date(when.year, when.month, 1)


def _lock_month(when: datetime) -> None:
    """Serialise with a month close of the same month (``period_finalise`` locks the row too)."""
    BillingPeriod.objects.get_or_create(month=_month_of(when))
    BillingPeriod.objects.select_for_update().filter(month=_month_of(when)).first()


def _not_retroactive(when: datetime, *, what: str, field: str = "effective_from") -> None:
    final = selectors.finalised_through()
    if final is not None and when < final:
        raise Invalid(f"{what} cannot take effect before {final:%Y-%m-%d %H:%M} UTC: the months up to then are "
                      f"finalised. Choose a later date.", field=field)


def _check_price(price: Price) -> None:
    if price.unit not in Unit.values:
        raise Invalid(f"One of: {', '.join(Unit.values)}.", field="unit")
    price.key = (price.key or "").strip()
    if price.unit in KEYED_UNITS and not price.key:
        raise Invalid("Name the GPU model (whole GPUs) or the MIG profile (slices).", field="key")
    if price.unit not in KEYED_UNITS and price.key:
        raise Invalid("Only whole-GPU and MIG prices have a key; leave it empty.", field="key")
    if price.currency != selectors.currency():
        raise Invalid(f"The price list is in {selectors.currency()}.", field="currency")
    if price.amount is None or price.amount < 0:
        raise Invalid("A price cannot be negative.", field="amount")
    if price.amount > MAX_AMOUNT:
        raise Invalid(f"At most {MAX_AMOUNT}.", field="amount")
    if timezone.is_naive(price.effective_from):
        raise Invalid("Give a time zone (e.g. 2026-12-01T00:00:00Z).", field="effective_from")


def _save_unique(obj: Any, message: str) -> None:
    try:
        with transaction.atomic():
            obj.save()
    except IntegrityError:
        raise Invalid(message, field="effective_from") from None


@transaction.atomic
def price_create(*, actor: Actor, unit: str, amount: Decimal, effective_from: datetime, key: str = "",
                 currency: str | None = None, note: str = "") -> Price:
    require(policy.may_manage_prices(actor), "Only platform ops set prices.")
    price = Price(unit=unit, key=key, amount=amount, currency=(currency or selectors.currency()).upper(),
                  effective_from=effective_from, note=note,
                  created_by=actor.user if actor.user is not None and actor.user.is_authenticated else None)
    _check_price(price)
    _lock_month(price.effective_from)
    _not_retroactive(price.effective_from, what="A price")
    _save_unique(price, "This unit already has a price from that instant; change that one.")
    selectors.price_list_changed()
    rollup.mark_changed(price.effective_from)
    audit_record(actor=actor, action="price.create", target=price, after=snapshot(price, PRICE_FIELDS))
    return price


@transaction.atomic
def price_update(*, actor: Actor, price: Price, **changes: Any) -> Price:
    require(policy.may_manage_prices(actor), "Only platform ops set prices.")
    price = Price.objects.select_for_update().get(pk=price.pk)
    before = snapshot(price, PRICE_FIELDS)
    before_from = price.effective_from
    _lock_month(price.effective_from)
    _not_retroactive(price.effective_from, what="This price took effect in a finalised month; it")
    for name, value in changes.items():
        if name not in PRICE_FIELDS:
            raise Invalid(f"Unknown field {name}.", field=name)
        setattr(price, name, value.upper() if name == "currency" and isinstance(value, str) else value)
    _check_price(price)
    _lock_month(price.effective_from)
    _not_retroactive(price.effective_from, what="A price")
    _save_unique(price, "This unit already has a price from that instant; change that one.")
    selectors.price_list_changed()
    rollup.mark_changed(min(price.effective_from, before_from))
    audit_record(actor=actor, action="price.update", target=price, before=before, after=snapshot(price, PRICE_FIELDS))
    return price


@transaction.atomic
def price_delete(*, actor: Actor, price: Price) -> None:
    require(policy.may_manage_prices(actor), "Only platform ops set prices.")
    price = Price.objects.select_for_update().get(pk=price.pk)
    _lock_month(price.effective_from)
    _not_retroactive(price.effective_from, what="This price took effect in a finalised month; it")
    before = snapshot(price, PRICE_FIELDS)
    selectors.price_list_changed()
    rollup.mark_changed(price.effective_from)
    audit_record(actor=actor, action="price.delete", target=price, before=before)
    price.delete()


@transaction.atomic
def discount_create(*, actor: Actor, tenant: Tenant, percent: Decimal, effective_from: datetime, note: str = "") -> Discount:
    require(policy.may_manage_prices(actor), "Only platform ops set discounts.")
    if percent is None or not Decimal(0) <= percent <= Decimal(100):
        raise Invalid("A percentage from 0 to 100.", field="percent")
    if timezone.is_naive(effective_from):
        raise Invalid("Give a time zone (e.g. 2026-12-01T00:00:00Z).", field="effective_from")
    discount = Discount(tenant=tenant, percent=percent, effective_from=effective_from, note=note)
    _lock_month(effective_from)
    _not_retroactive(effective_from, what="A discount")
    _save_unique(discount, "This tenant already has a discount from that instant.")
    selectors.price_list_changed()
    rollup.mark_changed(effective_from)
    audit_record(actor=actor, action="discount.create", target=discount, tenant=tenant, after=snapshot(discount, DISCOUNT_FIELDS))
    return discount


@transaction.atomic
def discount_delete(*, actor: Actor, discount: Discount) -> None:
    require(policy.may_manage_prices(actor), "Only platform ops set discounts.")
    discount = Discount.objects.select_for_update().select_related("tenant").get(pk=discount.pk)
    _lock_month(discount.effective_from)
    _not_retroactive(discount.effective_from, what="This discount took effect in a finalised month; it")
    selectors.price_list_changed()
    rollup.mark_changed(discount.effective_from)
    audit_record(actor=actor, action="discount.delete", target=discount, tenant=discount.tenant,
                 before=snapshot(discount, DISCOUNT_FIELDS))
    discount.delete()


@transaction.atomic
def period_finalise(*, actor: Actor, month: date) -> BillingPeriod:
    """Close a month: from now on no price or discount may take effect in it or before it. (The statement work
    calls this once the month's statements are final.) Every earlier month is finalised with it."""
    require(policy.may_manage_prices(actor), "Only platform ops close a month.")
    month = date(month.year, month.month, 1)
    if selectors.month_end(month) > timezone.now():
        raise Invalid("A month can be closed only after it ended.", field="month")
    period, _ = BillingPeriod.objects.get_or_create(month=month)
    period = BillingPeriod.objects.select_for_update().get(pk=period.pk)
    if period.finalised_at is None:
        period.finalised_at = timezone.now()
        period.finalised_by = actor.user if actor.user is not None and actor.user.is_authenticated else None
        period.save(update_fields=["finalised_at", "finalised_by"])
        BillingPeriod.objects.filter(month__lt=month, finalised_at__isnull=True).update(
            finalised_at=period.finalised_at, finalised_by=period.finalised_by)
        audit_record(actor=actor, action="billing.period_finalise", target=period, after={"month": month.isoformat()})
    return period

"""Every billing read that depends on who asks, and the figures built from the rows (cost so far, estimates).

Prices are the platform's public price list: every signed-in user (and token) reads them; only ops write.
Discounts and usage belong to a tenant: ops see all, everyone else only what belongs to requests / tenants they
see (``workloads.selectors.requests_for``, ``tenants.selectors.tenants_for``).
"""

from __future__ import annotations

import uuid
from calendar import monthrange
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import QuerySet
from django.utils import timezone

from portal.cache import version_forget, version_key
from portal.events import after_commit
from tenants.access import Actor
from tenants.selectors import tenants_for
from workloads import kinds
from workloads.selectors import requests_for

from . import pricing
from .models import BillingPeriod, ClusterClock, Discount, Price, Unit, UsageInterval


def currency() -> str:
    return str(getattr(settings, "BILLING_CURRENCY", "EUR"))


def prices_for(*, actor: Actor) -> QuerySet[Price]:
    """The whole price list, past and future rows too (it is public to signed-in users)."""
    return Price.objects.select_related("created_by").order_by("unit", "key", "-effective_from")


def discounts_for(*, actor: Actor) -> QuerySet[Discount]:
    base = Discount.objects.select_related("tenant").order_by("tenant__slug", "-effective_from")
    if actor.is_ops:
        return base
    return base.filter(tenant__in=tenants_for(actor=actor).values("pk"))


def usage_for(*, actor: Actor) -> QuerySet[UsageInterval]:
    """Usage intervals of the requests ``actor`` sees (a token: its project's)."""
    base = UsageInterval.objects.select_related("request", "tenant", "project").order_by("-started_at", "-id")
    if actor.is_ops:
        return base
    return base.filter(request__in=requests_for(actor=actor).values("pk"))


def periods() -> QuerySet[BillingPeriod]:
    return BillingPeriod.objects.order_by("-month")


def month_end(month: Any) -> datetime:
    """The first instant after the month that starts on ``month`` (a date), UTC."""
    days = monthrange(month.year, month.month)[1]
    return datetime(month.year, month.month, 1, tzinfo=UTC) + timedelta(days=days)


def finalised_through() -> datetime | None:
    """The end of the last finalised month: nothing may take effect before it (prices, discounts)."""
    last = BillingPeriod.objects.filter(finalised_at__isnull=False).order_by("-month").first()
    return None if last is None else month_end(last.month)


# The price list and the discounts are read once per process and version, not once per row: a list of 100 requests
# asks the estimator 100 times. The version lives in the shared cache; every price or discount write sets a new one
# after commit (``price_list_changed``), so every process reloads. It is looked up once per HTTP request (reset on
# ``request_started``), and on every call outside one (tasks, the shell).
VERSION_KEY = "billing:price-list-version"
_memo: dict[str, Any] = {"version": None, "prices": None, "discounts": {}}


def _version() -> str:
    # Read with the request's other versions in one round trip (portal.cache.version_key).
    return version_key(VERSION_KEY)


def _fresh() -> dict[str, Any]:
    version = _version()
    if _memo["version"] != version:
        _memo.update(version=version, prices=None, discounts={})
    return _memo


def request_started(**kwargs: Any) -> None:
    """(Signal) a new HTTP request: look the version up again once (``portal.cache`` resets it)."""


def price_list_changed() -> None:
    """Forget this process's copy now, and every process's once the write commits."""
    _memo.update(version=None, prices=None, discounts={})
    version_forget(VERSION_KEY)
    after_commit(_bump)


def _bump() -> None:
    cache.set(VERSION_KEY, uuid.uuid4().hex, None)
    _memo.update(version=None, prices=None, discounts={})
    version_forget(VERSION_KEY)


def price_rates() -> dict[tuple[str, str], list[pricing.Rate]]:
    """(unit, key) → its prices in time order, in the price list's currency."""
    memo = _fresh()
    if memo["prices"] is None:
        out: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for row in Price.objects.filter(currency=currency()).order_by("effective_from"):
            out[(row.unit, row.key)].append(row)
        memo["prices"] = {k: pricing.rates(v, "amount") for k, v in out.items()}
    return memo["prices"]


def discount_rates(tenant_id: int | None) -> list[pricing.Rate]:
    if tenant_id is None:
        return []
    memo = _fresh()
    if tenant_id not in memo["discounts"]:
        memo["discounts"][tenant_id] = pricing.rates(Discount.objects.filter(tenant_id=tenant_id), "percent")
    return memo["discounts"][tenant_id]


def price_list_at(when: datetime | None = None) -> dict[tuple[str, str], Decimal]:
    """The price of each (unit, key) in force at ``when`` (now)."""
    when = when or timezone.now()
    out = {}
    for key, rates in price_rates().items():
        value = pricing.rate_at(rates, when)
        if value is not None:
            out[key] = value
    return out


# ------------------------------------------------------------------------------------------------ clock
def cluster_now(cluster_id: int, *, now: datetime | None = None) -> datetime | None:
    """The cluster's "now" for an open interval: its latest observed time moved on by the portal time since it
    was observed (docs/billing.md, "Clocks"). None before the follower has seen the cluster."""
    clock = ClusterClock.objects.filter(cluster_id=cluster_id).first()
    if clock is None:
        return None
    now = now or timezone.now()
    return clock.cluster_time + max(now - clock.seen_at, timedelta(0))


def cluster_nows(*, now: datetime | None = None) -> dict[int, datetime]:
    """cluster id → its "now" (``cluster_now``) for every cluster whose clock is known, in one query."""
    now = now or timezone.now()
    return {cluster_id: cluster_time + max(now - seen_at, timedelta(0))
            for cluster_id, cluster_time, seen_at in ClusterClock.objects.values_list("cluster_id", "cluster_time", "seen_at")}


# ------------------------------------------------------------------------------------------------ costs
def intervals_cost(intervals: list[UsageInterval], *, until: datetime | None = None, now: datetime | None = None) -> Decimal:
    """The exact (unrounded) cost of ``intervals``: closed ones in full, open ones up to their cluster's now
    (or ``until``, for a statement's month end)."""
    if not intervals:
        return Decimal(0)
    prices = price_rates()
    discounts: dict[int, list[pricing.Rate]] = {}
    clocks: dict[int, datetime | None] = {}
    total = Decimal(0)
    for iv in intervals:
        end = iv.ended_at
        if end is None:
            if iv.cluster_id not in clocks:
                clocks[iv.cluster_id] = cluster_now(iv.cluster_id, now=now)
            end = clocks[iv.cluster_id] or iv.started_at
        if until is not None:
            end = min(end, until)
        if iv.tenant_id not in discounts:
            discounts[iv.tenant_id] = discount_rates(iv.tenant_id)
        total += pricing.span_cost(unit=iv.unit, quantity=iv.quantity, start=iv.started_at, end=max(end, iv.started_at),
                                   prices=prices.get((iv.unit, iv.key), []), discounts=discounts[iv.tenant_id])
    return total


def request_cost_so_far(request: Any, *, now: datetime | None = None) -> Decimal | None:
    """Closed intervals plus open ones up to now, for one request; None while there is no price list."""
    if not price_rates():
        return None
    return intervals_cost(list(UsageInterval.objects.filter(request_id=request.pk)), now=now)


def estimate(request_like: Any) -> Decimal | None:
    """What a request (or a half-filled form) would cost over its duration at today's prices, less today's discount.

    None when there is no price list, or nothing to price yet (no flavor, no duration). A notebook's home volume
    (``parameters.home_size_gib``, else 20 GiB) is priced for the duration too.
    """
    now = timezone.now()
    prices = price_list_at(now)  # first: without a price list nothing else is read
    if not prices:
        return None
    hours = getattr(request_like, "duration_hours", None)
    if hours in (None, ""):
        return None
    flavor = getattr(request_like, "flavor", None)
    if flavor is None:
        return None
    template = getattr(request_like, "template", None)
    kind = kinds.KINDS.get(str(getattr(template, "kind", "")))  # what a request holds is its kind's to say
    replicas = getattr(request_like, "replicas", None) or 1
    parameters = getattr(request_like, "parameters", None) or {}
    pods = kind.billed_pods(replicas, parameters) if kind else replicas
    held = pricing.shares(flavor, gpus=getattr(request_like, "gpus", None), cpu=getattr(request_like, "cpu", None),
                          memory_gib=getattr(request_like, "memory_gib", None), pods=pods,
                          hami_share=getattr(request_like, "hami_share", None))
    storage = kind.storage_gib(parameters) if kind else 0
    if storage:
        held.append(pricing.Share(Unit.STORAGE, "", Decimal(storage)))
    per_hour = sum((pricing.hourly(s.unit, prices.get((s.unit, s.key), Decimal(0))) * s.quantity for s in held), Decimal(0))
    tenant = getattr(request_like, "tenant", None)
    off = pricing.rate_at(discount_rates(getattr(tenant, "pk", None)), now) or Decimal(0)
    return per_hour * Decimal(str(hours)) * (Decimal(100) - off) / Decimal(100)

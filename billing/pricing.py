"""Pure pricing: what a request holds in priced units, and what a span of time of it costs under a price list.

No queries here: the callers (``selectors``, ``metering``, the estimator) load the rows. Amounts stay exact
``Decimal``s; nothing is rounded here (``portal.quantities.round_money`` rounds once, at the line shown).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from .models import HOURS_PER_MONTH, Unit

HOUR = Decimal(3600)


@dataclass(frozen=True)
class Share:
    unit: str
    key: str
    quantity: Decimal


@dataclass(frozen=True)
class Rate:
    """One price row as the pure code sees it (``Price`` or ``Discount`` rows fit: ``effective_from`` + value)."""

    effective_from: datetime
    value: Decimal


def _dec(value: Any, default: Decimal = Decimal(0)) -> Decimal:
    if value is None or value == "":
        return default
    try:
        return Decimal(str(value))
    except ArithmeticError:
        return default


def shares(flavor: Any, *, gpus: Any, cpu: Any, memory_gib: Any, pods: Any,
           hami_share: tuple[int, int] | None = None) -> list[Share]:
    """What ``pods`` pods of this shape hold, per priced unit (zero quantities left out).

    Whole GPUs by the flavor's GPU model, MIG slices by profile, HAMi vGPUs by their memory (GiB) and compute
    (cores % / 100 of a card): each vGPU's ``hami_share`` (MiB, cores %), the request's own, else the flavor's
    preset; every pod's CPU cores and memory GiB on top.
    """
    pods_n, gpus_n = _dec(pods, Decimal(1)), _dec(gpus)
    out: list[Share] = []
    kind = getattr(flavor, "kind", None)
    if flavor is not None and gpus_n:
        if kind == "whole":
            out.append(Share(Unit.GPU, flavor.gpu_model or flavor.gpu_product or flavor.name, gpus_n * pods_n))
        elif kind == "mig":
            out.append(Share(Unit.MIG, flavor.mig_profile, gpus_n * pods_n))
        elif kind == "hami":
            memory_mib, cores_percent = (hami_share if hami_share and all(hami_share)
                                         else (flavor.hami_memory_mib, flavor.hami_cores_percent))
            out.append(Share(Unit.HAMI_MEMORY, "", gpus_n * pods_n * Decimal(memory_mib or 0) / Decimal(1024)))
            out.append(Share(Unit.HAMI_CORES, "", gpus_n * pods_n * Decimal(cores_percent or 0) / Decimal(100)))
    out.append(Share(Unit.CPU, "", _dec(cpu) * pods_n))
    out.append(Share(Unit.MEMORY, "", _dec(memory_gib) * pods_n))
    return [s for s in out if s.quantity > 0]


def hourly(unit: str, amount: Decimal) -> Decimal:
    """A price per hour of one unit (storage is priced per month)."""
    return amount / HOURS_PER_MONTH if unit == Unit.STORAGE else amount


def rate_at(rates: Sequence[Rate], when: datetime) -> Decimal | None:
    """The value in force at ``when`` (``rates`` sorted by ``effective_from``), None before the first."""
    found = None
    for rate in rates:
        if rate.effective_from <= when:
            found = rate.value
        else:
            break
    return found


def split(start: datetime, end: datetime, *rate_lists: Sequence[Rate]) -> list[tuple[datetime, datetime]]:
    """``[start, end)`` cut at every instant a rate changes inside it."""
    cuts = sorted({r.effective_from for rates in rate_lists for r in rates if start < r.effective_from < end})
    edges = [start, *cuts, end]
    return [(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def span_cost(*, unit: str, quantity: Decimal, start: datetime, end: datetime, prices: Sequence[Rate],
              discounts: Sequence[Rate] = ()) -> Decimal:
    """What ``quantity`` units held from ``start`` to ``end`` cost: each piece between price (or discount)
    changes at the price in force then, less the tenant's discount then. Unpriced pieces cost nothing."""
    if end <= start or quantity <= 0:
        return Decimal(0)
    total = Decimal(0)
    for a, b in split(start, end, prices, discounts):
        price = rate_at(prices, a)
        if price is None:
            continue
        off = rate_at(discounts, a) or Decimal(0)
        hours = Decimal((b - a) // timedelta(microseconds=1)) / Decimal(1_000_000) / HOUR
        total += hourly(unit, price) * quantity * hours * (Decimal(100) - off) / Decimal(100)
    return total


def seconds(span: timedelta) -> Decimal:
    """A span in exact seconds (as PostgreSQL's ``EXTRACT(EPOCH FROM interval)``)."""
    return Decimal(span // timedelta(microseconds=1)) / Decimal(1_000_000)


def rates(rows: Iterable[Any], field: str) -> list[Rate]:
    return sorted((Rate(r.effective_from, Decimal(getattr(r, field))) for r in rows), key=lambda r: r.effective_from)

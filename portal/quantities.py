"""Numbers for people and for Kubernetes: quantities in the portal's units, and money.

The portal counts GPUs and other extended resources in units, CPUs in cores and memory in GiB
(``Quota``, ``WorkloadRequest``). Kubernetes writes quantities as strings ("500m", "1152Gi"); parsing
them is ``kubernetes.utils.parse_quantity``'s job, wrapped here for the portal's units.

- :func:`fmt`: a quantity as people read it in messages ("12", "0.5", "unlimited" for None);
- :func:`parse_quantity`: a Kubernetes quantity as a Decimal of base units ("" and None are 0);
- :func:`in_portal_units`: the same, in the portal's unit for the resource (memory in GiB);
- :func:`kube_quantity`: the other way, a number in the portal's unit as a Kubernetes quantity string;
- :func:`format_money`: an amount with its currency, rounded once to the cent.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any

GIB = Decimal(2**30)
CENT = Decimal("0.01")


def fmt(value: Any) -> str:
    """A quantity for people: ``12`` rather than ``12.000``, ``0.5`` rather than ``5E-1``; None is ``unlimited``."""
    if value is None:
        return "unlimited"
    text = format(Decimal(value).normalize(), "f")
    return "0" if text in ("-0", "") else text


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("96", "500m", "2Ti", "1152Gi", "1e3", 4) as a Decimal of base units.

    None and "" are 0; anything else that is not a quantity raises ValueError.
    """
    if value is None or value == "":
        return Decimal(0)
    if isinstance(value, float):
        value = str(value)  # 0.1, not the float's binary expansion
    if isinstance(value, str):
        value = value.strip()
    from kubernetes.utils.quantity import parse_quantity as kube_parse  # loads the client package: only when parsing

    return kube_parse(value)


# The unit of each resource's figures in the portal (quotas, capacity, usage): what tables print next to them.
RESOURCE_UNITS = {
    "memory": "GiB",
    "cpu": "cores",
    "nvidia.com/total-gpumem": "MiB of GPU memory",
    "nvidia.com/total-gpucores": "% of a GPU's cores",
}


def resource_unit(resource: str) -> str:
    """``memory`` → ``GiB``, ``nvidia.com/total-gpumem`` → ``MiB of GPU memory``; GPUs, MIG slices and vGPU slots
    (counts) → ``count``."""
    return RESOURCE_UNITS.get(resource, "count")


def in_portal_units(resource: str, value: Any) -> Decimal:
    """A Kubernetes quantity of ``resource`` in the portal's unit: memory in GiB, CPUs in cores, the rest as counted."""
    amount = parse_quantity(value)
    return amount / GIB if resource == "memory" else amount


def kube_quantity(resource: str, value: Decimal | int | str) -> str:
    """A number in the portal's unit as a Kubernetes quantity string (stable: same number, same text):
    memory ``4`` → ``4Gi``, ``1.5`` → ``1536Mi``; cpu ``0.5`` → ``500m``; otherwise the plain number."""
    value = value if isinstance(value, Decimal) else Decimal(str(value))
    if resource == "memory":
        if value == value.to_integral_value():
            return f"{int(value)}Gi"
        return f"{int((value * 1024).to_integral_value())}Mi"
    if resource == "cpu" and value != value.to_integral_value():
        return f"{int((value * 1000).to_integral_value())}m"
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def round_money(amount: Decimal | int | float | str) -> Decimal:
    """An amount rounded to the cent (half up), once."""
    if isinstance(amount, float):
        amount = str(amount)
    return Decimal(amount).quantize(CENT, rounding=ROUND_HALF_UP)


def format_money(amount: Decimal | int | float | str, currency: str) -> str:
    """``1234.5`` in EUR → ``1,234.50 EUR``: rounded to the cent once, then written with its currency."""
    return f"{round_money(amount):,.2f} {currency}".strip()

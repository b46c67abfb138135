"""Who may do what with prices, discounts and billing periods (see ``tenants/policy.py``)."""

from __future__ import annotations

from tenants.access import Actor
from tenants.policy import may_operate


def may_manage_prices(actor: Actor) -> bool:
    """Prices, tenant discounts and the month close: platform ops."""
    return may_operate(actor)

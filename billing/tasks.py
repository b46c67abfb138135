"""Celery entry points for billing. Thin: call one function.

Beat schedule (portal/settings.py): ``billing.statements_finalise`` hourly. Running it twice is harmless: a month
whose ``BillingPeriod`` is closed is skipped (``billing.statements.finalise_due``). ``billing.cost_rollup_refresh``
hourly: each day is replaced whole in one transaction, so a second run writes the same rows.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="billing.statements_finalise")
def statements_finalise_task() -> list[str]:
    from .statements import finalise_due

    return finalise_due()


@shared_task(name="billing.cost_rollup_refresh")
def cost_rollup_refresh_task() -> dict[str, int]:
    """Roll up yesterday, the day before, dirty days and recent days not rolled up (``billing.rollup.refresh``)."""
    from .rollup import refresh

    return refresh()

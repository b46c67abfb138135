"""Celery entry points for billing. Thin: call one function.

Beat schedule (portal/settings.py): ``billing.statements_finalise`` hourly. Running it twice is harmless: a month
whose ``BillingPeriod`` is closed is skipped (``billing.statements.finalise_due``). The cost rollup
is refreshed by ``portal.rollups_refresh`` (portal/rollups.py).
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="billing.statements_finalise")
def statements_finalise_task() -> list[str]:
    from .statements import finalise_due

    return finalise_due()

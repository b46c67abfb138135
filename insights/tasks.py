"""Celery entry points for insights. Thin: call one function.

Beat schedule (portal/settings.py): ``insights.samples_take`` every 5 minutes (the rollups are
refreshed by ``portal.rollups_refresh``, portal/rollups.py). Running it twice in one 5-minute slot
replaces that slot's samples (``insights.samples.samples_take``), so a retry or an overlapping run never duplicates.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="insights.samples_take")
def samples_take_task() -> dict[str, int]:
    from .samples import samples_take

    return samples_take()


@shared_task(name="insights.measured_take")
def measured_take_task() -> dict:
    from .idle import idle_detect
    from .measured import measured_take

    taken = measured_take()
    return {**taken, "idle": idle_detect()}  # the samples just written decide who is idle

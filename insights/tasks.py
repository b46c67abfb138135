"""Celery entry points for insights. Thin: call one function.

Beat schedule (portal/settings.py): ``insights.samples_take`` every 5 minutes, ``insights.rollups_refresh`` and
``insights.sample_rollups_refresh`` hourly. Running it twice in one 5-minute slot
replaces that slot's samples (``insights.samples.samples_take``), so a retry or an overlapping run never duplicates.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="insights.samples_take")
def samples_take_task() -> dict[str, int]:
    from .samples import samples_take

    return samples_take()


@shared_task(name="insights.rollups_refresh")
def rollups_refresh_task() -> dict[str, int]:
    """Recompute the request rollup's recent, dirty and changed days (``insights.rollups.rollups_refresh``)."""
    from .rollups import rollups_refresh

    return rollups_refresh()


@shared_task(name="insights.sample_rollups_refresh")
def sample_rollups_refresh_task() -> dict[str, int]:
    """Recompute the hourly sample rollup's last closed, dirty and changed hours
    (``insights.sample_rollups.sample_rollups_refresh``)."""
    from .sample_rollups import sample_rollups_refresh

    return sample_rollups_refresh()

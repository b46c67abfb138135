"""The one rollup seam (portal/rollups.py): every rollup registered, one beat task, one command, one marker."""

from __future__ import annotations

import io
from datetime import UTC, date, datetime, timedelta

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from billing.models import CostRollupDay
from insights.models import MeasuredDay, RollupDay, SampleHour
from portal import rollups
from portal.celery import rollups_refresh


def test_every_rollup_is_registered_once_with_its_owner() -> None:
    assert [(r.name, r.owner) for r in rollups.registered()] == [
        ("costs", "billing.rollup"), ("requests", "insights.rollups"), ("samples", "insights.sample_rollups"),
        ("measured", "insights.measured_rollup")]


def test_one_beat_task_refreshes_them_all() -> None:
    tasks = [e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()]
    assert "portal.rollups_refresh" in tasks
    assert not [t for t in tasks if "rollup" in t and t != "portal.rollups_refresh"]


@pytest.mark.django_db
def test_the_task_answers_for_each_rollup() -> None:
    out = rollups_refresh.apply().get()
    assert set(out) == {"costs", "requests", "samples", "measured"}
    assert all("error" not in counts and counts["seconds"] >= 0 for counts in out.values())


@pytest.mark.django_db
def test_one_failing_rollup_does_not_stop_the_others() -> None:
    def broken(now=None):
        raise RuntimeError("disk full")

    real = rollups.named(["requests"])[0]
    rollups.register(rollups.Rollup(name="requests", owner=real.owner, grain=real.grain, refresh=broken,
                                    backfill=real.backfill, mark=real.mark))
    try:
        out = rollups.refresh_all()
        assert out["requests"] == {"error": "RuntimeError: disk full"}
        assert "error" not in out["costs"] and "error" not in out["samples"]
        err = io.StringIO()
        with pytest.raises(CommandError, match="refresh failed for requests"):
            call_command("rollups", "refresh", stdout=io.StringIO(), stderr=err)
        assert "requests: failed: RuntimeError: disk full" in err.getvalue()
    finally:
        rollups.register(real)


@pytest.mark.django_db
def test_mark_makes_every_period_from_an_instant_dirty() -> None:
    day = date(2026, 11, 2)
    since = datetime(2026, 11, 3, 5, tzinfo=UTC)
    for d in (day, day + timedelta(days=1), day + timedelta(days=2)):
        CostRollupDay.objects.create(day=d, dirty=False)
        RollupDay.objects.create(day=d, dirty=False, computed_at=timezone.now(), admit_target_minutes=30)
        MeasuredDay.objects.create(day=d, dirty=False, computed_at=timezone.now(), idle_percent=5.0)
    for h in range(3):
        SampleHour.objects.create(hour=since + timedelta(hours=h - 1), dirty=False, computed_at=timezone.now())
    for name in ("costs", "requests", "samples", "measured"):
        assert rollups.mark(name, since) == 2
    assert list(CostRollupDay.objects.filter(dirty=True).order_by("day").values_list("day", flat=True)) == [
        day + timedelta(days=1), day + timedelta(days=2)]
    assert not RollupDay.objects.get(day=day).dirty and RollupDay.objects.get(day=day + timedelta(days=1)).dirty
    assert list(SampleHour.objects.filter(dirty=False).values_list("hour", flat=True)) == [since - timedelta(hours=1)]
    assert list(MeasuredDay.objects.filter(dirty=False).values_list("day", flat=True)) == [day]


@pytest.mark.django_db
def test_the_command_lists_refreshes_and_refuses_bad_input() -> None:
    out = io.StringIO()
    call_command("rollups", "list", stdout=out)
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["costs", "requests", "samples", "measured"]
    out = io.StringIO()
    call_command("rollups", "refresh", only=["costs"], stdout=out)
    assert out.getvalue().startswith("costs: ") and "requests" not in out.getvalue()
    with pytest.raises(CommandError, match="no rollup called nope: choose from costs, requests, samples, measured"):
        call_command("rollups", "refresh", only=["nope"])
    with pytest.raises(CommandError, match="backfill needs --since"):
        call_command("rollups", "backfill")
    with pytest.raises(CommandError, match="--until must be after --since"):
        call_command("rollups", "backfill", since="2026-11-05", until="2026-11-05")
    with pytest.raises(CommandError, match="--until must be a day"):
        call_command("rollups", "backfill", since="2026-11-05", until="tomorrow")


@pytest.mark.django_db
def test_backfill_reports_each_rollup_as_it_finishes() -> None:
    out = io.StringIO()
    since = (timezone.now() - timedelta(days=2)).date()
    call_command("rollups", "backfill", since=since.isoformat(), stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"backfilling 4 rollup(s) from {since}"
    assert [line.split(":")[0] for line in lines[1:]] == ["costs", "requests", "samples", "measured"]
    assert CostRollupDay.objects.filter(dirty=False).count() == 2 and RollupDay.objects.filter(dirty=False).count() == 2
    assert MeasuredDay.objects.filter(dirty=False).count() == 2

"""``manage.py insights_sample_rollup --since YYYY-MM-DD``: roll up the queue and pool samples of every closed hour
from that day on, and every whole closed day from its hours (docs/insights.md, "Rollups"). Safe to run again: each
hour and day is replaced whole."""

from __future__ import annotations

import time
from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from insights.sample_rollups import backfill


class Command(BaseCommand):
    help = "Backfill the hourly and daily sample rollups of the fairness and efficiency metrics from --since (a UTC day)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", required=True, help="first UTC day to roll up, YYYY-MM-DD")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            since = date.fromisoformat(options["since"])
        except ValueError as exc:
            raise CommandError("--since must be a day, YYYY-MM-DD") from exc
        started = time.monotonic()
        done = backfill(since)
        self.stdout.write(f"rolled up {done['hours']} hours and {done['days']} days ({done['rows']} rows) in {time.monotonic() - started:.1f} s")

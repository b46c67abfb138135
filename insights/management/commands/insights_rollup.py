"""``manage.py insights_rollup --since YYYY-MM-DD``: roll up every closed day from that day on, then the weeks they
fall in (docs/insights.md, "Rollups"). Safe to run again: each day and week is replaced whole."""

from __future__ import annotations

import time
from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from insights.rollups import backfill


class Command(BaseCommand):
    help = "Backfill the daily request rollup of the scheduling metrics from --since (a UTC day) to yesterday."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", required=True, help="first UTC day to roll up, YYYY-MM-DD")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            since = date.fromisoformat(options["since"])
        except ValueError as exc:
            raise CommandError("--since must be a day, YYYY-MM-DD") from exc
        started = time.monotonic()
        done = backfill(since)
        self.stdout.write(f"rolled up {done['days']} days ({done['rows']} rows) and {done['weeks']} weeks "
                          f"({done['week_rows']} rows) in {time.monotonic() - started:.1f} s")

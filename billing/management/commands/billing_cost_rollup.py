"""``manage.py billing_cost_rollup --since YYYY-MM-DD``: roll up the cost of every closed day from that day on
(docs/billing.md, "Cost rollup"). Safe to run again: each day is replaced whole."""

from __future__ import annotations

import time
from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.rollup import backfill


class Command(BaseCommand):
    help = "Backfill the daily cost rollup from --since (a UTC day) to yesterday."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", required=True, help="first UTC day to roll up, YYYY-MM-DD")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            since = date.fromisoformat(options["since"])
        except ValueError as exc:
            raise CommandError("--since must be a day, YYYY-MM-DD") from exc
        started = time.monotonic()
        done = backfill(since)
        self.stdout.write(f"rolled up {done['days']} days ({done['rows']} rows) in {time.monotonic() - started:.1f} s")

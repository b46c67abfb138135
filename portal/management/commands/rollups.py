"""``manage.py rollups``: the one command for every rollup (portal/rollups.py).

``manage.py rollups list``: the rollups, their owners and grains.
``manage.py rollups refresh [--only NAME ...]``: what the hourly beat task ``portal.rollups_refresh`` runs.
``manage.py rollups backfill --since YYYY-MM-DD [--until YYYY-MM-DD] [--only NAME ...]``: roll up every closed period
from a UTC day on (run once after an upgrade or a restore). Safe to repeat: each period is replaced whole.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal import rollups


def _day(value: str | None, option: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError as exc:
        raise CommandError(f"{option} must be a day, YYYY-MM-DD (got {value!r})") from exc


def _counts(counts: dict[str, Any]) -> str:
    return ", ".join(f"{v} {k}" for k, v in counts.items() if k != "seconds")


class Command(BaseCommand):
    help = "List, refresh or backfill the rollups (costs, requests, samples)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "refresh", "backfill"])
        parser.add_argument("--since", help="backfill: first UTC day to roll up, YYYY-MM-DD")
        parser.add_argument("--until", help="backfill: first UTC day not to roll up (default: today)")
        parser.add_argument("--only", action="append", metavar="NAME", help="only this rollup (repeatable)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            chosen = rollups.named(options["only"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        only = [r.name for r in chosen]
        if options["action"] == "list":
            for r in chosen:
                self.stdout.write(f"{r.name:10} {r.grain:16} {r.owner}")
            return
        if options["action"] == "refresh":
            failed = []
            for name, counts in rollups.refresh_all(only=only).items():
                if "error" in counts:
                    failed.append(name)
                    self.stderr.write(f"{name}: failed: {counts['error']}")
                else:
                    self.stdout.write(f"{name}: {_counts(counts)} in {counts['seconds']:.1f} s")
            if failed:
                raise CommandError(f"refresh failed for {', '.join(failed)} (they stay dirty and are read live)")
            return
        since = _day(options["since"], "--since")
        if since is None:
            raise CommandError("backfill needs --since YYYY-MM-DD")
        until = _day(options["until"], "--until")
        if until is not None and until <= since:
            raise CommandError("--until must be after --since")
        self.stdout.write(f"backfilling {len(chosen)} rollup(s) from {since}" + (f" to {until}" if until else ""))

        def progress(rollup: rollups.Rollup, counts: dict[str, int], seconds: float) -> None:
            self.stdout.write(f"{rollup.name}: rolled up {_counts(counts)} in {seconds:.1f} s")

        rollups.backfill_all(since, until, only=only, progress=progress)

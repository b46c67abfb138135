"""``manage.py audit_verify``: check the audit log's hash chain against itself and against the anchors (the head
published outside the database, ``tenants/anchor.py``); exit 1 unless it is intact (docs/security.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tenants.audit import audit_verify


class Command(BaseCommand):
    help = ("Verify the audit log's hash chain and compare it with the anchors published outside the database. "
            "Prints the head; exits 1 at the first break, and when there is no anchor at all.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--expect-head", metavar="HASH", help="a head printed by an earlier run: it must still be in the chain")
        parser.add_argument("--allow-unanchored", action="store_true",
                            help="a new installation: accept a log no anchor was published for yet (and anchor it now)")

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit_verify(allow_unanchored=options["allow_unanchored"])
        if report.broken_at is not None:
            raise CommandError(
                f"audit log NOT intact: broken at entry #{report.broken_at}: {report.problem} "
                f"({report.entries} entries before it are intact)",
                returncode=1,
            )
        if report.unanchored:
            raise CommandError(
                f"audit log: no anchor: cannot tell whether entries were removed ({report.entries} entries chained, "
                f"head #{report.head_seq} {report.head_hash or '-'}; no anchor file or Redis key holds a head). "
                "On a new installation run it once with --allow-unanchored.",
                returncode=1,
            )
        expected = options.get("expect_head")
        if expected and not _in_chain(expected):
            raise CommandError(f"audit log NOT intact: it does not contain the expected head {expected}: it was rewritten", returncode=1)
        where = ", ".join(f"#{a.seq} in {a.source}" for a in report.anchors) or "none yet (anchored now)"
        self.stdout.write(f"audit log intact: {report.entries} entries, head #{report.head_seq} {report.head_hash or '-'}; "
                          f"anchors: {where}")


def _in_chain(entry_hash: str) -> bool:
    from tenants.models import AuditEntry

    return AuditEntry.objects.filter(entry_hash=entry_hash).exists()

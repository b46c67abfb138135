"""``manage.py audit_verify``: check the audit log's hash chain; exit 1 at the first break."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tenants.audit import audit_verify


class Command(BaseCommand):
    help = "Verify the audit log's hash chain. Prints the head (keep it elsewhere to compare later); exits 1 at the first break."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--expect-head", metavar="HASH", help="a head printed by an earlier run: it must still be in the chain")

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit_verify()
        if not report.ok:
            raise CommandError(
                f"audit log chain broken at entry #{report.broken_at}: {report.problem} "
                f"({report.entries} entries before it are intact)",
                returncode=1,
            )
        expected = options.get("expect_head")
        if expected and not _in_chain(expected):
            raise CommandError(f"audit log does not contain the expected head {expected}: it was rewritten", returncode=1)
        self.stdout.write(f"audit log intact: {report.entries} entries, head #{report.head_seq} {report.head_hash or '-'}")


def _in_chain(entry_hash: str) -> bool:
    from tenants.models import AuditEntry

    return AuditEntry.objects.filter(entry_hash=entry_hash).exists()

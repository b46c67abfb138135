"""The audit log is a hash chain: tampering through raw SQL (as the tables' owner could, around the
append-only triggers) shows in ``manage.py audit_verify``, at the first entry it broke."""

from __future__ import annotations

import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from tenants import services
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.models import AuditEntry

TABLE = AuditEntry._meta.db_table


def verify() -> str:
    """``audit_verify``'s output; raises CommandError (exit status 1) on a broken chain."""
    from io import StringIO

    out = StringIO()
    call_command("audit_verify", stdout=out)
    return out.getvalue()


def broken() -> str:
    with pytest.raises(CommandError) as failure:
        verify()
    assert failure.value.returncode == 1
    return str(failure.value)


def tamper(sql: str, params: list | None = None) -> None:
    """Raw SQL around the append-only triggers, as the tables' owner can do it."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL session_replication_role = replica")  # row triggers off
        else:
            cursor.execute("DROP TRIGGER IF EXISTS tenants_auditentry_no_update")
        cursor.execute(sql, params or [])


@pytest.fixture
def log(cast):
    """A log of at least six entries, including awkward values (IPv6, floats, non-ASCII, nesting)."""
    alice = Actor(user=cast.alice, ip="2001:DB8:0:0::1")
    services.project_update(actor=alice, project=cast.vision, description="Ünïcode — vision")
    audit_record(actor=Actor(user=cast.ops, ip="10.0.0.7"), action="test.values", target=cast.acme,
                 before={"gpus": 1.5, "big": 10**20, "nested": {"b": [1, None, True], "a": "é"}}, after=None)
    services.project_update(actor=alice, project=cast.nlp, description="nlp")
    entries = list(AuditEntry.objects.order_by("seq"))
    assert len(entries) >= 6
    return entries


def test_an_untouched_log_verifies(log) -> None:
    assert [entry.seq for entry in log] == list(range(1, len(log) + 1))
    assert log[0].prev_hash == "" and all(b.prev_hash == a.entry_hash for a, b in zip(log, log[1:]))
    assert f"audit log intact: {len(log)} entries, head #{len(log)} {log[-1].entry_hash}" in verify()


def test_a_changed_entry_is_the_first_break(log) -> None:
    middle = log[3]
    tamper(f"UPDATE {TABLE} SET actor_label = 'someone else' WHERE id = %s", [middle.pk])
    assert f"broken at entry #{middle.seq}: entry #{middle.seq} (id {middle.pk}) was changed" in broken()


def test_a_changed_entry_with_its_hash_recomputed_breaks_the_next_link(log) -> None:
    from tenants.audit import entry_digest

    middle = log[2]
    middle.action = "forged"
    tamper(f"UPDATE {TABLE} SET action = 'forged', entry_hash = %s WHERE id = %s", [entry_digest(middle), middle.pk])
    assert f"broken at entry #{middle.seq + 1}: entry #{middle.seq + 1} does not follow entry #{middle.seq}" in broken()


def test_a_deleted_middle_entry_is_the_first_break(log) -> None:
    middle = log[2]
    tamper(f"DELETE FROM {TABLE} WHERE id = %s", [middle.pk])
    assert f"broken at entry #{middle.seq}: entry #{middle.seq} is missing" in broken()


def test_deleted_last_entries_show_against_the_head(log) -> None:
    tamper(f"DELETE FROM {TABLE} WHERE seq > %s", [len(log) - 2])
    assert f"entries #{len(log) - 1}..#{len(log)} are missing at the end" in broken()


def test_a_truncated_log_is_a_break(log) -> None:
    tamper(f"TRUNCATE {TABLE}" if connection.vendor == "postgresql" else f"DELETE FROM {TABLE}")
    assert f"broken at entry #1: entries #1..#{len(log)} are missing at the end (the log was cut or emptied)" in broken()
    # Entries written after the cut do not hide it.
    audit_record(actor=Actor.system(), action="test.after", target=log[0])
    assert f"entries #1..#{len(log)} are missing" in broken()


def test_an_entry_inserted_outside_the_portal_is_a_break(log) -> None:
    tamper(
        f"INSERT INTO {TABLE} (created_at, actor_label, action, target_type, target_id, target_repr, prev_hash, entry_hash)"
        " VALUES (%s, 'x', 'forged', 't', '1', 'r', '', '')",
        [log[0].created_at],
    )
    assert "has no place in the chain" in broken()


@pytest.mark.django_db(transaction=True)
def test_parallel_appends_keep_one_chain(cast) -> None:
    before = AuditEntry.objects.count()
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def append(n: int) -> None:
        try:
            start.wait()
            for i in range(5):
                with transaction.atomic():
                    audit_record(actor=Actor.system(), action=f"test.parallel.{n}.{i}", target=cast.acme)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=append, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert AuditEntry.objects.count() == before + 40
    assert list(AuditEntry.objects.order_by("seq").values_list("seq", flat=True)) == list(range(1, before + 41))
    assert f"audit log intact: {before + 40} entries" in verify()

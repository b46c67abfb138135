"""The audit log is a hash chain: tampering through raw SQL (as the tables' owner could, around the
append-only triggers) shows in ``manage.py audit_verify``, at the first entry it broke; and a log emptied
or cut consistently (entries and head together) shows against the anchor published outside the
database (the anchor file, the Redis key, ``/metrics``)."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
import redis
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from prometheus_client.parser import text_string_to_metric_families

from tenants import services
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.models import AuditChainHead, AuditEntry

TABLE = AuditEntry._meta.db_table
HEAD_TABLE = AuditChainHead._meta.db_table


@pytest.fixture(autouse=True)
def anchor(settings, tmp_path):
    """Each test its own anchor file and Redis key (Redis when the run has it, else a local one: CI has it)."""
    settings.AUDIT_ANCHOR_FILE = str(tmp_path / "anchor" / "audit-anchor.json")
    settings.REDIS_URL = settings.REDIS_URL or "redis://127.0.0.1:6379/15"
    settings.AUDIT_ANCHOR_REDIS_KEY = f"test-audit-anchor-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield tmp_path / "anchor" / "audit-anchor.json", client, settings.AUDIT_ANCHOR_REDIS_KEY
    client.delete(settings.AUDIT_ANCHOR_REDIS_KEY)
    client.close()


def verify(*args: str) -> str:
    """``audit_verify``'s output; raises CommandError (exit status 1) on a broken chain."""
    from io import StringIO

    out = StringIO()
    call_command("audit_verify", *args, stdout=out)
    return out.getvalue()


def broken(*args: str) -> str:
    with pytest.raises(CommandError) as failure:
        verify(*args)
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
def log(cast, django_capture_on_commit_callbacks):
    """A log of at least six entries, including awkward values (IPv6, floats, non-ASCII, nesting), anchored as
    each commit would anchor it (the test's transaction never commits: its after-commit handlers run here), the
    Redis anchor sent (its sender may be resting, holding the last head)."""
    from tenants.anchor import anchor_flush

    alice = Actor(user=cast.alice, ip="2001:DB8:0:0::1")
    with django_capture_on_commit_callbacks(execute=True):
        services.project_update(actor=alice, project=cast.vision, description="Ünïcode — vision")
    with django_capture_on_commit_callbacks(execute=True):
        audit_record(actor=Actor(user=cast.ops, ip="10.0.0.7"), action="test.values", target=cast.acme,
                     before={"gpus": 1.5, "big": 10**20, "nested": {"b": [1, None, True], "a": "é"}}, after=None)
    with django_capture_on_commit_callbacks(execute=True):
        services.project_update(actor=alice, project=cast.nlp, description="nlp")
    entries = list(AuditEntry.objects.order_by("seq"))
    assert len(entries) >= 6
    assert anchor_flush()
    return entries


def test_an_untouched_log_verifies(log) -> None:
    assert [entry.seq for entry in log] == list(range(1, len(log) + 1))
    assert log[0].prev_hash == "" and all(b.prev_hash == a.entry_hash for a, b in zip(log, log[1:], strict=False))
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


# The anchor: the head published outside the database --------------------------------------------------------------


def test_the_anchor_is_in_the_file_and_in_redis(log, anchor) -> None:
    path, client, key = anchor
    stored = json.loads(path.read_text())
    assert (stored["seq"], stored["hash"]) == (log[-1].seq, log[-1].entry_hash)
    assert f"anchors: #{len(log)} in the file {path}, #{len(log)} in the Redis key {key}" in verify()
    assert client.hget(key, "seq") == str(log[-1].seq).encode() and client.hget(key, "hash") == log[-1].entry_hash.encode()


def test_truncating_entries_and_head_is_not_intact(log, anchor) -> None:
    path, _, _ = anchor
    if connection.vendor == "postgresql":
        tamper(f"TRUNCATE {TABLE}, {HEAD_TABLE}")
    else:
        tamper(f"DELETE FROM {TABLE}")
        tamper(f"DELETE FROM {HEAD_TABLE}")
    message = broken()
    assert "audit log NOT intact: broken at entry #1" in message
    assert f"the log ends at #0 but the file {path} records #{len(log)}: entries #1..#{len(log)} are missing" in message


def test_the_redis_anchor_alone_catches_an_emptied_log(log, anchor) -> None:
    path, _, key = anchor
    path.unlink()
    tamper(f"DELETE FROM {TABLE}")
    tamper(f"DELETE FROM {HEAD_TABLE}")
    assert f"the log ends at #0 but the Redis key {key} records #{len(log)}" in broken()


def test_a_cut_tail_with_an_older_hash_in_the_head_is_not_intact(log, anchor) -> None:
    path, _, _ = anchor
    keep = len(log) - 2
    tamper(f"DELETE FROM {TABLE} WHERE seq > %s", [keep])
    tamper(f"UPDATE {HEAD_TABLE} SET seq = %s, hash = %s WHERE id = 1", [keep, log[keep - 1].entry_hash])
    message = broken()
    assert f"NOT intact: broken at entry #{keep + 1}: the log ends at #{keep} but the file {path} records #{len(log)}" in message
    # Entries appended after the cut do not hide it: the anchor only moves forward, and its entry differs.
    for n in range(3):
        with transaction.atomic():
            audit_record(actor=Actor.system(), action=f"test.after.{n}", target=log[0])
    assert json.loads(path.read_text())["seq"] == len(log)
    assert f"broken at entry #{len(log)}: entry #{len(log)} has hash" in broken()


def test_a_chain_recomputed_from_the_start_is_not_intact(log, anchor) -> None:
    """Even a whole chain rewritten consistently (every hash and the head recomputed) differs at the anchor."""
    from tenants.audit import entry_digest

    prev = ""
    for entry in AuditEntry.objects.order_by("seq"):
        if entry.seq == 1:
            entry.action = "forged"
        entry.prev_hash = prev
        entry.entry_hash = prev = entry_digest(entry)
        tamper(f"UPDATE {TABLE} SET action = %s, prev_hash = %s, entry_hash = %s WHERE id = %s",
               [entry.action, entry.prev_hash, entry.entry_hash, entry.pk])
    tamper(f"UPDATE {HEAD_TABLE} SET hash = %s WHERE id = 1", [prev])
    assert f"broken at entry #{len(log)}: entry #{len(log)} has hash {prev[:16]}" in broken()


def test_an_empty_log_without_an_anchor_cannot_be_called_intact(db, anchor) -> None:
    assert AuditEntry.objects.count() == 0
    assert "no anchor: cannot tell whether entries were removed" in broken()
    # A new installation says so once.
    assert "audit log intact: 0 entries" in verify("--allow-unanchored")


def test_a_log_with_no_anchor_anywhere_is_not_called_intact(log, anchor) -> None:
    path, client, key = anchor
    path.unlink()
    client.delete(key)
    assert "no anchor: cannot tell whether entries were removed" in broken()
    assert "anchors: none yet (anchored now)" in verify("--allow-unanchored")
    assert json.loads(path.read_text())["seq"] == len(log)
    assert f"anchors: #{len(log)} in the file" in verify()


def test_a_damaged_anchor_file_is_not_called_intact(log, anchor) -> None:
    path, _, _ = anchor
    path.write_text("{}")
    assert "is unreadable" in broken()


def test_a_rolled_back_append_does_not_move_the_anchor(log, anchor) -> None:
    path, _, _ = anchor
    with pytest.raises(RuntimeError), transaction.atomic():
        audit_record(actor=Actor.system(), action="test.rolled.back", target=log[0])
        raise RuntimeError
    assert json.loads(path.read_text())["seq"] == len(log)
    assert f"audit log intact: {len(log)} entries" in verify()


@pytest.mark.django_db(transaction=True)
def test_an_api_write_publishes_the_head_to_the_file_and_metrics(api, cast, anchor, settings) -> None:
    path, client, key = anchor
    settings.METRICS_TOKEN = "scrape-me"
    assert api("alice").patch("/api/v1/tenants/acme/", {"cost_centre": "CC-7"}, format="json").status_code == 200
    last = AuditEntry.objects.order_by("-seq").first()
    assert last.action.startswith("tenant.")
    assert json.loads(path.read_text())["seq"] == last.seq and json.loads(path.read_text())["hash"] == last.entry_hash
    answer = api("nobody").get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me")
    assert answer.status_code == 200
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for family in text_string_to_metric_families(answer.content.decode()) for s in family.samples}
    assert found[("gpuportal_audit_head_seq", ())] == last.seq
    assert found[("gpuportal_audit_head_info", (("hash", last.entry_hash[:16]), ("seq", str(last.seq))))] == 1
    assert found[("gpuportal_audit_anchor_seq", (("store", "file"),))] == last.seq
    assert found[("gpuportal_audit_anchor_seq", (("store", "redis"),))] == last.seq
    assert client.hget(key, "seq") == str(last.seq).encode() and client.hget(key, "hash") == last.entry_hash.encode()


def test_the_redis_anchor_sends_the_latest_head_once_per_rest_and_at_once_when_flushed(anchor, settings) -> None:
    """After a send the sender rests: heads published meanwhile wait (no round trip, no wake-up per commit) and the
    latest of them goes out when the rest ends, or at once when a reader flushes; an older head never follows a newer."""
    from tenants.anchor import _RedisSender

    _, client, key = anchor
    sender = _RedisSender()
    sender.REST = 60.0  # longer than the test: only a flush ends it here
    sender.submit(settings.REDIS_URL, key, 1, "a" * 64)
    assert sender.flush(5.0)
    assert client.hget(key, "seq") == b"1"
    for seq in (2, 3, 4):
        sender.submit(settings.REDIS_URL, key, seq, f"{seq}" * 64)
    sender.submit(settings.REDIS_URL, key, 3, "3" * 64)  # a late writer with an older head
    assert client.hget(key, "seq") == b"1"  # resting: nothing sent yet
    assert sender.flush(5.0)
    assert client.hmget(key, "seq", "hash") == [b"4", b"4" * 64]
    assert sender.flush(0.5)  # nothing waits: a flush returns at once


# Rows written along with the entries ----------------------------------------------------------------------------------
def test_rows_along_are_written_with_the_entries_in_one_statement(cast, django_capture_on_commit_callbacks) -> None:
    from django.test.utils import CaptureQueriesContext

    from tenants.audit import audit_append, audit_entry
    from workloads.models import RequestEvent

    from ..workloads.factories import make_catalogue, make_request

    req = make_request(make_catalogue(cast), cast.vision, cast.carol)
    events = [RequestEvent(request=req, to_state="submitted", actor_label="test", message=f"along {i}")
              for i in range(3)]
    entries = [audit_entry(actor=Actor.system(), action=f"test.along.{i}", target=cast.acme) for i in range(2)]
    with django_capture_on_commit_callbacks(execute=True), CaptureQueriesContext(connection) as ctx:
        audit_append(entries, along=events)
    if connection.vendor == "postgresql":
        assert len(ctx.captured_queries) == 1, [q["sql"][:80] for q in ctx.captured_queries]
    written = list(RequestEvent.objects.filter(message__startswith="along ").order_by("pk"))
    assert [e.message for e in written] == ["along 0", "along 1", "along 2"]
    assert [e.pk for e in events] == [e.pk for e in written]  # each row's key, in the order given
    assert all(e.at is not None and not e._state.adding for e in events)
    assert [e.seq for e in entries] == [entries[0].seq, entries[0].seq + 1]
    assert "audit log intact" in verify()


def test_rows_along_are_written_once_when_the_chain_has_no_head_yet(cast) -> None:
    """With no head row the one statement writes nothing (not even the rows along): the long way writes them all."""
    from tenants.audit import audit_append, audit_entry
    from workloads.models import RequestEvent

    from ..workloads.factories import make_catalogue, make_request

    req = make_request(make_catalogue(cast), cast.vision, cast.carol)
    tamper(f"DELETE FROM {TABLE}")  # a new log: no entry, no head row
    tamper(f"DELETE FROM {HEAD_TABLE}")
    events = [RequestEvent(request=req, to_state="submitted", actor_label="test", message=f"headless {i}")
              for i in range(2)]
    audit_append([audit_entry(actor=Actor.system(), action="test.headless", target=cast.acme)], along=events)
    assert RequestEvent.objects.filter(message__startswith="headless ").count() == 2
    assert all(e.pk is not None for e in events)
    assert AuditChainHead.objects.get(pk=1).seq == 1 and AuditEntry.objects.get().action == "test.headless"

"""Writing and verifying the audit log. Services call ``audit_record`` inside their transaction.

The log is a hash chain. Entry ``seq`` n stores ``prev_hash`` (entry n-1's ``entry_hash``, "" for
the first) and ``entry_hash`` = sha256 over the canonical JSON (sorted keys, no spaces, UTF-8) of
``HASHED_FIELDS`` plus ``prev_hash``. Appends lock the one ``AuditChainHead`` row (on SQLite the
write transaction itself serialises them), so concurrent writers take turns and the chain never
forks; the lock is held until the caller's transaction ends, which is why services audit last.

``audit_verify()`` walks the chain in ``seq`` order and returns the first break: a changed entry
(its hash no longer matches), a removed one (a gap in ``seq``, or a next entry whose ``prev_hash``
does not match), an inserted one, or entries missing at the end (the head records more, as after
TRUNCATE). Someone who can rewrite both tables can empty or shorten the chain consistently, so each
commit that appends publishes the new head outside the database (``tenants/anchor.py``) and
``audit_verify`` also compares the chain with those anchors: shorter than an anchor, or another hash
at the anchor's ``seq``, is a break; no anchor at all is a break too unless the caller allows it (a
new installation). Keep the runtime database role away from UPDATE/DELETE/TRUNCATE on both tables
(docs/security.md).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, overload

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.utils import timezone
from portal.compiled import prepared_cursor
from portal.events import Handler, after_commit

from .access import Actor
from .anchor import Anchor, AnchorUnreadable, anchor_publish, anchors_read
from .models import AuditChainHead, AuditEntry, Project, Tenant

HASHED_FIELDS = [
    "seq",
    "created_at",
    "actor_id",
    "token_id",
    "actor_label",
    "action",
    "target_type",
    "target_id",
    "target_repr",
    "tenant_id",
    "project_id",
    "before",
    "after",
    "client_address",
    "prev_hash",
]


def _canonical(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


def entry_digest(entry: Any) -> str:
    """The sha256 of an entry (a model instance, historical ones too): its fields and ``prev_hash``."""
    data = {name: _canonical(getattr(entry, name)) for name in HASHED_FIELDS}
    payload = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, cls=DjangoJSONEncoder)
    return hashlib.sha256(payload.encode()).hexdigest()


def _as_stored(value: dict[str, Any] | None) -> dict[str, Any] | None:
    # What the JSON column gives back later, so the hash is over the same values then.
    return None if value is None else json.loads(json.dumps(value, cls=DjangoJSONEncoder))


@overload
def snapshot(obj: models.Model, fields: list[str]) -> dict[str, Any]: ...
@overload
def snapshot(obj: None, fields: list[str]) -> None: ...
@overload
def snapshot(obj: models.Model | None, fields: list[str]) -> dict[str, Any] | None: ...
def snapshot(obj: models.Model | None, fields: list[str]) -> dict[str, Any] | None:
    """A small before/after summary of ``obj``: the named fields, as JSON-friendly values."""
    if obj is None:
        return None
    out: dict[str, Any] = {}
    for name in fields:
        value = getattr(obj, name)
        if isinstance(value, models.Model):
            value = str(value)
        elif hasattr(value, "isoformat"):
            value = value.isoformat()
        out[name] = value
    return out


def audit_entry(
    *,
    actor: Actor,
    action: str,
    target: models.Model,
    tenant: Tenant | None = None,
    project: Project | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEntry:
    """An unsaved entry, for ``audit_append`` (several entries of one change under one lock of the chain)."""
    user = actor.user if actor.user is not None and actor.user.is_authenticated else None
    address = AuditEntry._meta.get_field("client_address").get_prep_value(actor.ip)
    return AuditEntry(
        created_at=timezone.now(),
        actor=user,
        token=actor.token,
        actor_label=actor.label[:200],
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        target_repr=str(target)[:200],
        tenant=tenant,
        project=project,
        before=_as_stored(before),
        after=_as_stored(after),
        client_address=address or None,
    )


def audit_append(entries: list[AuditEntry], *, along: list[models.Model] | None = None) -> list[AuditEntry]:
    """Chain ``entries`` (from ``audit_entry``) in their order and write them: the head read under its lock, one
    INSERT for all of them, the head written once. Inside the caller's transaction (no savepoint of its own).

    ``along``: unsaved rows of one other table that belong to the same change (a request's timeline entries),
    written with the entries: on PostgreSQL in the same statement (one round trip less), elsewhere by one
    ``bulk_create`` first. Their primary keys are set, in their order."""
    along = along or []
    if not entries:
        if along:
            type(along[0]).objects.bulk_create(along)
        return entries
    if not (connection.vendor == "postgresql" and _append_in_one_statement(entries, along)):
        if along:
            type(along[0]).objects.bulk_create(along)
        _append_the_long_way(entries)
    _anchor_on_commit(entries[-1].seq, entries[-1].entry_hash)
    return entries


def _anchor_on_commit(seq: int, entry_hash: str) -> None:
    """Publish the new head once the transaction commits: one handler per transaction, holding its last head (no
    write before the commit, none at all on a rollback, no round trip while the head's lock is held). Only a
    handler of the same savepoint is reused: one an inner savepoint's rollback keeps must not name its entries."""
    if connection.in_atomic_block:
        here = set(connection.savepoint_ids)
        for sids, handler, _ in connection.run_on_commit:
            if isinstance(handler, Handler) and handler.fn is anchor_publish and sids == here:
                handler.kwargs.update(seq=seq, entry_hash=entry_hash)
                return
    after_commit(anchor_publish, seq=seq, entry_hash=entry_hash)


def _append_the_long_way(entries: list[AuditEntry]) -> None:
    with transaction.atomic(savepoint=False):
        head, _ = AuditChainHead.objects.select_for_update().get_or_create(pk=1)
        seq, prev = head.seq, head.hash
        for entry in entries:
            seq += 1
            entry.seq, entry.prev_hash = seq, prev
            entry.entry_hash = prev = entry_digest(entry)
        AuditEntry.objects.bulk_create(entries)
        head.seq, head.hash = seq, prev
        head.save(update_fields=["seq", "hash"])


_STORED = [f for f in AuditEntry._meta.concrete_fields if not f.primary_key]
_CHAINED = {"seq", "prev_hash", "entry_hash"}


def _digest_parts(entry: AuditEntry) -> list[str] | None:
    """The canonical JSON of ``entry_digest`` cut around ``prev_hash`` and ``seq``: the database puts them in
    (``prefix "prev" middle seq suffix``). None if the cut is not clean (then the chain is written the long way)."""
    marker = secrets.token_hex(16)
    data = {name: _canonical(getattr(entry, name)) for name in HASHED_FIELDS}
    data["prev_hash"], data["seq"] = f"p{marker}", f"s{marker}"
    payload = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, cls=DjangoJSONEncoder)
    first = payload.split(f'"p{marker}"')
    if len(first) != 2:
        return None
    second = first[1].split(f'"s{marker}"')
    if len(second) != 2 or "\x00" in payload:
        return None
    return [first[0], second[0], second[1]]


def _along_fields(model: type[models.Model]) -> list[Any]:
    return [f for f in model._meta.concrete_fields if not f.primary_key]


def _along_insert(model: type[models.Model], count: int) -> str:
    """The CTE that inserts ``count`` rows of ``model`` in their order, once the head is read (none without a head
    row: then the caller writes them the long way), returning their ids."""
    fields = _along_fields(model)
    values = []
    for n in range(count):
        cells = [str(n), *(f"CAST(%s AS {field.db_type(connection)})" for field in fields)]
        values.append(f"({', '.join(cells)})")
    names = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    aliases = ", ".join(f"c{i}" for i in range(len(fields)))
    return (f"along AS (INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({names}) SELECT {aliases} "
            f"FROM (VALUES {', '.join(values)}) AS v(n, {aliases}), head ORDER BY v.n "
            f"RETURNING {connection.ops.quote_name(model._meta.pk.column)})")


_COLUMNS = [f for f in _STORED if f.column not in _CHAINED]
# The statement's text for each shape (entries, the model and number of rows along): the same for every call of a
# shape, and writing it (a column type and a cast per value) took longer than computing the values.
_STATEMENTS: dict[tuple[int, Any, int], str] = {}


def _statement(entries: int, model: type[models.Model] | None, along: int) -> str:
    key = (entries, model, along)
    sql = _STATEMENTS.get(key)
    if sql is not None:
        return sql
    table = connection.ops.quote_name(AuditEntry._meta.db_table)
    head_table = connection.ops.quote_name(AuditChainHead._meta.db_table)
    steps = ["head AS (SELECT seq, hash FROM " + head_table + " WHERE id = 1 FOR UPDATE)"]
    prev = "head"
    for n in range(1, entries + 1):
        digest = ("encode(sha256(convert_to(CAST(%s AS text) || '\"' || " + prev + ".hash || '\"' || CAST(%s AS text) || ("
                  + prev + ".seq + 1)::text || CAST(%s AS text), 'UTF8')), 'hex')")
        steps.append(f"e{n} AS (SELECT {prev}.seq + 1 AS seq, {prev}.hash AS prev, {digest} AS hash FROM {prev})")
        prev = f"e{n}"
    casts = ", ".join(f"CAST(%s AS {field.db_type(connection)})" for field in _COLUMNS)
    selects = [f"SELECT {casts}, e{n}.seq, e{n}.prev, e{n}.hash FROM e{n}" for n in range(1, entries + 1)]
    names = ", ".join(connection.ops.quote_name(f.column) for f in _COLUMNS)
    steps.append(f"ins AS (INSERT INTO {table} ({names}, seq, prev_hash, entry_hash) "
                 + " UNION ALL ".join(selects) + " RETURNING id, seq)")
    if model is not None:
        steps.append(_along_insert(model, along))
    also = ", (SELECT array_agg(id ORDER BY id) FROM along)" if model is not None else ""
    sql = (f"WITH {', '.join(steps)} UPDATE {head_table} AS h SET seq = {prev}.seq, hash = {prev}.hash FROM {prev}, head "
           f"WHERE h.id = 1 RETURNING head.seq, head.hash, h.hash, (SELECT array_agg(id ORDER BY seq) FROM ins){also}")
    _STATEMENTS[key] = sql
    return sql


def _append_in_one_statement(entries: list[AuditEntry], along: list[models.Model] | None = None) -> bool:
    """PostgreSQL: lock the head, chain and insert the entries and move the head in one statement (the database
    computes each sha256 from the canonical JSON cut around ``prev_hash`` and ``seq``), and insert the rows
    ``along`` in it too. The hashes are computed again here and must agree, or the transaction fails. False when
    there is no head row yet or an entry cannot be cut (nothing is written then): the caller writes the chain the
    long way."""
    parts = [_digest_parts(entry) for entry in entries]
    if any(p is None for p in parts):
        return False
    model = type(along[0]) if along else None
    if along and any(type(row) is not model for row in along):
        raise TypeError("audit_append: the rows along must be of one model.")
    params: list[Any] = []
    for cut in parts:
        params.extend(cut)  # type: ignore[arg-type]
    for entry in entries:
        params.extend(field.get_db_prep_save(getattr(entry, field.attname), connection) for field in _COLUMNS)
    if along:
        fields = _along_fields(model)  # type: ignore[arg-type]
        for row in along:
            params.extend(field.get_db_prep_save(field.pre_save(row, True), connection) for field in fields)
    sql = _statement(len(entries), model, len(along or []))
    with transaction.atomic(savepoint=False), prepared_cursor() as cursor:  # planned once per connection and shape
        cursor.execute(sql, params)
        row = cursor.fetchone()
        if row is None:
            return False  # no head row yet (nothing was inserted either)
        seq, prev_hash, head_hash, ids = row[:4]
        for written, pk in zip(along or [], row[4] if along else [], strict=True):
            written.pk = pk
            written._state.adding, written._state.db = False, connection.alias
        for entry, pk in zip(entries, ids, strict=True):
            seq += 1
            entry.pk, entry.seq, entry.prev_hash = pk, seq, prev_hash
            entry.entry_hash = prev_hash = entry_digest(entry)
            entry._state.adding, entry._state.db = False, connection.alias
        if prev_hash != head_hash:
            raise RuntimeError("The audit chain's hashes computed by the database and here differ: nothing is written.")
    return True


def audit_record(
    *,
    actor: Actor,
    action: str,
    target: models.Model,
    tenant: Tenant | None = None,
    project: Project | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEntry:
    entry = audit_entry(actor=actor, action=action, target=target, tenant=tenant, project=project, before=before,
                        after=after)
    return audit_append([entry])[0]


@dataclass(frozen=True)
class ChainReport:
    """What ``audit_verify`` found: the entries checked, the head, and the first break (None: intact). ``anchors``:
    the heads published outside the database that the chain was compared with; ``unanchored``: there were none."""

    entries: int
    head_seq: int
    head_hash: str
    broken_at: int | None = None  # the seq where the chain first breaks
    problem: str = ""
    anchors: tuple[Anchor, ...] = ()
    unanchored: bool = False

    @property
    def ok(self) -> bool:
        return self.broken_at is None and not self.unanchored


def audit_verify(*, allow_unanchored: bool = False) -> ChainReport:
    """Walk the chain from the first entry; report the first break. Then compare it with the anchors (read first:
    an anchor is published after its commit, so every entry it names is visible to the walk): a chain that ends
    before an anchor, or holds another hash at its ``seq``, was cut or rewritten. With no anchor anywhere the
    report is ``unanchored`` (not ok) unless ``allow_unanchored``. An intact chain's head is published again."""
    try:
        anchors = tuple(anchors_read())
    except AnchorUnreadable as exc:
        return ChainReport(0, 0, "", broken_at=0, problem=f"{exc}: the chain cannot be compared with it")
    except Exception as exc:  # Redis configured but silent: an anchor not read is no reason to say "intact"
        return ChainReport(0, 0, "", broken_at=0, problem=f"the anchors cannot be read ({exc.__class__.__name__}: {exc})")
    report = _chain_walk({anchor.seq for anchor in anchors})
    if not isinstance(report, ChainReport):
        count, head_hash, pinned = report
        report = _anchors_compare(count, head_hash, pinned, anchors)
    if report.broken_at is not None:
        return report
    if not anchors and not allow_unanchored:
        return ChainReport(report.entries, report.head_seq, report.head_hash, unanchored=True)
    anchor_publish(seq=report.head_seq, entry_hash=report.head_hash)
    return report


def _anchors_compare(count: int, head_hash: str, pinned: dict[int, str], anchors: tuple[Anchor, ...]) -> ChainReport:
    for anchor in sorted(anchors, key=lambda a: -a.seq):
        if anchor.seq > count:
            missing = f"entries #{count + 1}..#{anchor.seq} are" if anchor.seq > count + 1 else f"entry #{anchor.seq} is"
            return ChainReport(count, count, head_hash, broken_at=count + 1, anchors=anchors,
                               problem=f"the log ends at #{count} but {anchor.source} records #{anchor.seq}: "
                                       f"{missing} missing (the log was cut or emptied)")
        if pinned.get(anchor.seq) != anchor.entry_hash:
            return ChainReport(count, count, head_hash, broken_at=anchor.seq, anchors=anchors,
                               problem=f"entry #{anchor.seq} has hash {pinned.get(anchor.seq, '')[:16]}…, "
                                       f"{anchor.source} records {anchor.entry_hash[:16]}… (the log was rewritten)")
    return ChainReport(count, count, head_hash, anchors=anchors)


def _chain_walk(pin: set[int]) -> ChainReport | tuple[int, str, dict[int, str]]:
    """The first break as a report, else (entries, head hash, the hashes at the ``pin`` seqs)."""
    pinned: dict[int, str] = {}
    unchained = AuditEntry.objects.filter(seq__isnull=True).order_by("id").first()
    if unchained is not None:
        return ChainReport(0, 0, "", broken_at=0, problem=f"entry id {unchained.pk} has no place in the chain (inserted behind the portal's back)")
    prev_hash, expected, count = "", 1, 0
    for entry in AuditEntry.objects.order_by("seq").iterator(chunk_size=2000):
        if entry.seq != expected:
            last = f"entries #{expected}..#{entry.seq - 1} are" if entry.seq - 1 > expected else f"entry #{expected} is"
            return ChainReport(count, expected - 1, prev_hash, broken_at=expected, problem=f"{last} missing (removed)")
        if entry.prev_hash != prev_hash:
            return ChainReport(count, expected - 1, prev_hash, broken_at=expected,
                               problem=f"entry #{expected} does not follow entry #{expected - 1} (an entry before it was changed or replaced)")
        if entry_digest(entry) != entry.entry_hash:
            return ChainReport(count, expected - 1, prev_hash, broken_at=expected,
                               problem=f"entry #{expected} (id {entry.pk}) was changed after it was written")
        if entry.seq in pin:
            pinned[entry.seq] = entry.entry_hash
        prev_hash, expected, count = entry.entry_hash, expected + 1, count + 1
    head = AuditChainHead.objects.filter(pk=1).first()
    if head is not None and (head.seq, head.hash) != (count, prev_hash):
        if head.seq > count:
            problem = f"entries #{count + 1}..#{head.seq} are missing at the end (the log was cut or emptied)"
        else:
            problem = f"the chain head records #{head.seq}, the log ends at #{count} with another hash"
        return ChainReport(count, count, prev_hash, broken_at=count + 1, problem=problem)
    return count, prev_hash, pinned

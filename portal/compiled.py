"""Hot queries compiled once per process and shape, then run with each call's values.

Django builds a queryset and compiles its SQL on every call. For the API's hottest reads (a token with its user,
project, tenant and memberships; the session's user; a request's row with its related values and timeline) building
and compiling took longer than the database took to plan and run them (docs/performance.md, "Compiled once").

``Compiled(build)`` calls ``build`` with stand-in values (one per argument: a string, an int, an aware datetime, or
a tuple of ints whose length is part of the shape), compiles it once, notes where the stand-ins landed among the SQL's parameters, and keeps
the SQL text and the compiler. ``rows(*values)`` then runs the kept SQL with the stand-ins replaced by ``values``
through a copy of that compiler: Django's own converters and model construction (``select_related`` objects,
annotations, ``values()`` dicts), so a call returns what ``list(build(*values))`` would.

``build`` must put its arguments into the query as they are (filters, lookups), never decide anything on them: the
SQL kept from the stand-ins serves every later value. What can change the SQL's text, not only its parameters, is in
the shape: the number of ids in an ``IN`` (counted here), and whatever else the caller chooses between (``key``, or
one ``Compiled`` per variant). A stand-in that does not appear among the parameters exactly where a
value goes (Django folded it into the text, or dropped it) makes that shape uncompilable: it then runs ``build``
every time, as before. An ``IN ()`` of no ids matches nothing and asks no query, as Django does.

On PostgreSQL the kept SQL also runs as a prepared statement (server-side binding, ``PREPARE`` once per connection):
the server then skips parsing and planning, which took longer than executing these queries (0.2-0.45 ms against
under 0.1 ms). Nothing else in the portal is prepared (Django's cursors bind on the client). psycopg forgets the
connection's prepared statements after a rollback and prepares them again when next used. ``DB_PREPARE=0`` turns it
off (a transaction-mode pooler older than PgBouncer 1.21 cannot keep prepared statements).

After five executions PostgreSQL may run a prepared statement with a generic plan, made without the values. That
is what a lookup by key wants, and a trap for a statement whose good plan needs its values: a partial index whose
condition the values must match (``idempotency_key <> ''``, ``state IN (live states)``), or an ``OR`` under a
``LIMIT`` (the submission's replay check became a scan of every request, 0.4 ms at 2,000 rows and growing with N).
``Compiled(build, prepare=False)`` keeps such a statement unprepared: compiled once, planned with its values. A statement the server
refuses to prepare (a parameter whose type it cannot infer) runs unprepared from then on; tests/test_compiled.py
runs every ``Compiled`` of the portal on PostgreSQL and fails on such a one.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from collections.abc import Callable, Hashable
from typing import Any

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import DatabaseError, connections
from django.db.models import QuerySet

# Stand-ins: values no caller passes (negative ids near -2**31; a string with control characters; the year 1001).
_INT_BASE = -2_147_480_000
_DATETIME_BASE = datetime(1001, 1, 1, tzinfo=UTC)
_EMPTY = object()
_SLOW = object()


def _stand_in(index: int, value: Any, counter: list[int]) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str, tuple, datetime)):
        raise TypeError(f"Compiled takes ints, strings, aware datetimes and tuples of ints, not {type(value).__name__}.")
    if isinstance(value, tuple):
        return tuple(_stand_in(index, v, counter) for v in value)
    counter[0] += 1
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise TypeError("Compiled takes aware datetimes only.")
        return _DATETIME_BASE + timedelta(microseconds=counter[0])
    if isinstance(value, int):
        return _INT_BASE - counter[0]
    return f"\x1fcompiled-{index}-{counter[0]}\x1f"


def _shape(value: Any) -> Hashable:
    return ("tuple", len(value)) if isinstance(value, tuple) else type(value).__name__


def _flat(values: tuple[Any, ...]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        out.extend(value if isinstance(value, tuple) else (value,))
    return out


def _shallow(obj: Any, **changes: Any) -> Any:
    """A copy of ``obj`` sharing its attributes (not ``copy.copy``: pickling a queryset's state would run it)."""
    twin = object.__new__(type(obj))
    twin.__dict__.update(obj.__dict__, **changes)
    return twin


ALL: list[Compiled] = []  # every Compiled made (module-level constants): tests check each one prepares
_NEVER_BY_COUNT = 2**31 - 1  # psycopg prepares only what is asked to (never by counting executions)


def _parse_cache_for_kept_statements() -> None:
    """psycopg remembers how it cut a statement around its ``%s`` (an LRU of 128) only for statements of at most 50
    parameters. The request's kept INSERT has 56 and runs on every submission: cutting it again took 0.19 ms a call.
    Raised to 64 (once, on PostgreSQL's first kept statement); the cache stays bounded by its 128 entries."""
    try:
        from psycopg import _queries
    except ImportError:  # pragma: no cover - psycopg is the PostgreSQL driver here
        return
    if getattr(_queries, "MAX_CACHED_STATEMENT_PARAMS", 64) < 64:
        _queries.MAX_CACHED_STATEMENT_PARAMS = 64


def _preparing_cursor_class() -> Any:
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparingCursor(ServerBindingCursor):
        """Binds on the server and prepares every statement it runs (once per connection and SQL text)."""

        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None) -> Any:
            return super().execute(query, params, prepare=True, binary=binary)

    return PreparingCursor


_cursor_class: list[Any] = []


class _Preparing:
    """The database connection as the kept compiler sees it: its cursors prepare their statement."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapper, name)

    def cursor(self) -> Any:
        wrapper = self._wrapper
        wrapper.close_if_health_check_failed()
        wrapper.ensure_connection()
        raw = wrapper.connection
        if raw.prepare_threshold is None:  # Django turns preparing off; allow it, for the statements that ask
            raw.prepare_threshold = _NEVER_BY_COUNT
        if not _cursor_class:
            _parse_cache_for_kept_statements()
            _cursor_class.append(_preparing_cursor_class())
        with wrapper.wrap_database_errors:
            wrapper.validate_thread_sharing()
            cursor = _cursor_class[0](raw)
            if wrapper.queries_logged:  # DEBUG, or a test capturing queries: log the SQL with its values in place
                from django.db.backends.utils import CursorDebugWrapper

                return CursorDebugWrapper(cursor, _Composing(wrapper))
            return wrapper.make_cursor(cursor)


class _Composing:
    """The connection for the query log: a prepared statement's SQL is written out with its values, as Django's
    client-side cursors log it (psycopg keeps no text of a statement it ran by name)."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper
        self.ops = _ComposingOps(wrapper.ops)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapper, name)


class _ComposingOps:
    def __init__(self, ops: Any) -> None:
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def last_executed_query(self, cursor: Any, sql: str, params: Any) -> str:
        return self._ops.compose_sql(sql, params)


def _prepares(alias: str) -> bool:
    return connections[alias].vendor == "postgresql" and getattr(settings, "DB_PREPARE", True)


def prepared_cursor(alias: str = "default") -> Any:
    """A cursor whose statements run prepared on PostgreSQL (Django's own cursor elsewhere, or with DB_PREPARE=0),
    for a hot hand-written statement of a fixed text whose every parameter has a type the server can tell (a column
    compared with it, or a ``CAST``)."""
    wrapper = connections[alias]
    return _Preparing(wrapper).cursor() if _prepares(alias) else wrapper.cursor()


class Compiled:
    def __init__(self, build: Callable[..., QuerySet], *, prepare: bool = True) -> None:
        self._build = build
        self._prepare = prepare
        # (alias, key, shapes) -> (queryset, compiler, sql, params, where each stand-in goes) | _EMPTY | _SLOW
        self._kept: dict[Hashable, Any] = {}
        self._unpreparable: set[Hashable] = set()  # shapes the server would not prepare
        ALL.append(self)

    def rows(self, *values: Any, key: Hashable = None) -> list[Any]:
        """``list(build(*values))``: model instances or ``values()`` dicts, from the SQL kept for this shape."""
        alias = "default"
        shape = (alias, key, tuple(_shape(v) for v in values))
        kept = self._kept.get(shape)
        if kept is None:
            kept = self._kept[shape] = self._compile(values, alias)
        if kept is _EMPTY:
            return []
        if kept is _SLOW:
            return list(self._build(*values))
        queryset, compiler, sql, params, slots, converters = kept
        params = list(params)
        for slot, value in zip(slots, _flat(values), strict=True):
            for position in slot:
                params[position] = value
        wrapper = connections[alias]
        if not self._prepare or shape in self._unpreparable or not _prepares(alias):
            return self._run(queryset, compiler, sql, params, wrapper, converters)
        try:
            return self._run(queryset, compiler, sql, params, _Preparing(wrapper), converters)
        except DatabaseError:
            # The server would not prepare it (or the query failed): never prepared again in this process. Outside a
            # transaction it runs again at once, unprepared; inside one the transaction is lost and the error stands
            # (tests/test_compiled.py prepares every Compiled of the portal, so this is for code not yet tested).
            self._unpreparable.add(shape)
            if wrapper.in_atomic_block:
                raise
            return self._run(queryset, compiler, sql, params, wrapper, converters)

    @staticmethod
    def _run(queryset: QuerySet, compiler: Any, sql: str, params: list[Any], connection: Any,
             converters: dict[int, Any]) -> list[Any]:
        run = _shallow(compiler, connection=connection)
        run.as_sql = lambda *args, **kwargs: (sql, tuple(params))  # the compiler's setup (select, columns) is kept
        run.get_converters = lambda expressions: converters  # worked out once, with the SQL
        query = _shallow(queryset.query)
        query.get_compiler = lambda *args, **kwargs: run
        return list(_shallow(queryset, _query=query))

    def _compile(self, values: tuple[Any, ...], alias: str) -> Any:
        counter = [0]
        stand_ins = tuple(_stand_in(i, v, counter) for i, v in enumerate(values))
        queryset = self._build(*stand_ins)
        if queryset._result_cache is not None or queryset.db != alias:
            return _SLOW
        compiler = queryset.query.get_compiler(using=alias)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:
            return _EMPTY
        params = tuple(params)
        slots = []
        for stand_in in _flat(stand_ins):
            positions = [i for i, p in enumerate(params) if type(p) is type(stand_in) and p == stand_in]
            if not positions:
                return _SLOW
            slots.append(positions)
        converters = compiler.get_converters([column[0] for column in compiler.select[0:compiler.col_count]])
        return queryset, compiler, sql, params, slots, converters


class KeptInsert:
    """``obj.save(force_insert=True)`` for new rows of one model, from an INSERT written once per process and run
    prepared on PostgreSQL (``prepared_cursor``).

    Django writes a model's INSERT afresh for every row (a placeholder and a column per field: 0.3 ms for a request's
    56 columns) and the server parses and plans it each time. Here the text is written from the first row and kept;
    each call computes the values as Django's compiler does (each field's ``pre_save`` and ``get_db_prep_save``),
    sends ``pre_save`` and ``post_save`` as ``save`` does, and sets the returned primary key. A row whose values
    include an expression, one with its primary key set, and every other database run ``save`` itself.
    """

    def __init__(self, model: type) -> None:
        self.model = model
        meta = model._meta
        self._fields = [f for f in meta.local_concrete_fields if not f.generated and f is not meta.auto_field]
        self._returning = list(meta.db_returning_fields)
        self._sql: dict[str, str] = {}
        if meta.parents:
            raise TypeError("KeptInsert writes one table: not for a model with parents.")

    def insert(self, obj: Any, using: str = "default") -> None:
        from django.db.models import signals

        if not _prepares(using) or obj.pk is not None:
            obj.save(force_insert=True, using=using)
            return
        connection = connections[using]
        obj._prepare_related_fields_for_save(operation_name="save")
        signals.pre_save.send(sender=self.model, instance=obj, raw=False, using=using, update_fields=None)
        values = [f.pre_save(obj, True) for f in self._fields]
        if any(hasattr(v, "resolve_expression") for v in values):
            obj.save(force_insert=True, using=using)  # pre_save signalled twice then; only for expressions
            return
        params = [f.get_db_prep_save(v, connection) for f, v in zip(self._fields, values, strict=True)]
        sql = self._sql.get(using) or self._write(obj, using)
        with prepared_cursor(using) as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        for field, value in zip(self._returning, row, strict=True):
            setattr(obj, field.attname, value)
        obj._state.adding, obj._state.db = False, using
        signals.post_save.send(sender=self.model, instance=obj, created=True, update_fields=None, raw=False,
                               using=using)

    def _write(self, obj: Any, using: str) -> str:
        from django.db.models import sql

        query = sql.InsertQuery(self.model)
        query.insert_values(self._fields, [copy.copy(obj)])  # a copy: the compiler runs pre_save (auto_now) on it
        compiler = query.get_compiler(using=using)
        compiler.returning_fields = self._returning
        ((text, _params),) = compiler.as_sql()
        self._sql[using] = text
        return text

"""Hot queries compiled once per process and shape, then run with each call's values.

Django builds a queryset and compiles its SQL on every call. For the API's hottest reads (a token with its user,
project, tenant and memberships; the session's user; a request's row with its related values and timeline) building
and compiling took longer than the database took to plan and run them (docs/performance.md, "Compiled once").

``Compiled(build)`` calls ``build`` with stand-in values (one per argument: a string, an int, or a tuple of ints whose
length is part of the shape), compiles it once, notes where the stand-ins landed among the SQL's parameters, and keeps
the SQL text and the compiler. ``rows(*values)`` then runs the kept SQL with the stand-ins replaced by ``values``
through a copy of that compiler: Django's own converters and model construction (``select_related`` objects,
annotations, ``values()`` dicts), so a call returns what ``list(build(*values))`` would.

``build`` must put its arguments into the query as they are (filters, lookups), never decide anything on them: the
SQL kept from the stand-ins serves every later value. What can change the SQL's text, not only its parameters, is in
the shape: the number of ids in an ``IN`` (counted here), and whatever else the caller chooses between (``key``, or
one ``Compiled`` per variant). A stand-in that does not appear among the parameters exactly where a
value goes (Django folded it into the text, or dropped it) makes that shape uncompilable: it then runs ``build``
every time, as before. An ``IN ()`` of no ids matches nothing and asks no query, as Django does.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import QuerySet

# Stand-ins: values no caller passes (negative ids near -2**31; a string with control characters).
_INT_BASE = -2_147_480_000
_EMPTY = object()
_SLOW = object()


def _stand_in(index: int, value: Any, counter: list[int]) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str, tuple)):
        raise TypeError(f"Compiled takes ints, strings and tuples of ints, not {type(value).__name__}.")
    if isinstance(value, tuple):
        return tuple(_stand_in(index, v, counter) for v in value)
    counter[0] += 1
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


class Compiled:
    def __init__(self, build: Callable[..., QuerySet]) -> None:
        self._build = build
        # (alias, key, shapes) -> (queryset, compiler, sql, params, where each stand-in goes) | _EMPTY | _SLOW
        self._kept: dict[Hashable, Any] = {}

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
        queryset, compiler, sql, params, slots = kept
        params = list(params)
        for slot, value in zip(slots, _flat(values)):
            for position in slot:
                params[position] = value
        run = _shallow(compiler, connection=connections[alias])
        run.as_sql = lambda *args, **kwargs: (sql, tuple(params))  # the compiler's setup (select, converters) is kept
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
        return queryset, compiler, sql, params, slots

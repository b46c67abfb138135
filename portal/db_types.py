"""PostgreSQL values read by psycopg's C loaders where Django's backend registers Python ones.

Django reads ``timestamptz`` through a Python subclass of psycopg's pure-Python loader (so that each value carries
the connection's time zone object), and ``jsonb``/``inet``/``cidr`` through the pure-Python ``TextLoader``. With
psycopg's binary build installed, the same values have C loaders: about 2 µs a timestamp instead of 9 on the machine
of docs/performance.md, which is a tenth of an API page of 50 requests (seven timestamps a row).

:func:`use_c_loaders` (on ``connection_created``) registers them on a new connection when the results are the same:
Django's time zone for the connection is UTC, which it also sets as the session's, so psycopg's C loader answers
``datetime`` values with ``tzinfo=datetime.timezone.utc``, as Django's does. Another time zone, SQLite, or psycopg
without its C build keep Django's loaders.
"""

from __future__ import annotations

import datetime
from functools import cache
from typing import Any

TEXT_KINDS = ("jsonb", "inet", "cidr")  # what Django reads as text (its JSONField decodes the text itself)


@cache
def _c_module() -> Any | None:
    try:
        import psycopg
    except ImportError:  # SQLite only: no psycopg at all
        return None
    if psycopg.pq.__impl__ != "binary":
        return None
    from psycopg_binary import _psycopg

    return _psycopg


@cache
def _utc_timestamptz_loader() -> type | None:
    c = _c_module()
    if c is None:
        return None
    from psycopg.adapt import Loader

    c_loader = c.TimestamptzLoader

    class UtcTimestamptzLoader(Loader):
        """psycopg's C ``timestamptz`` loader, behind the ``timezone`` attribute Django's cursors compare with their
        connection's (a C loader class cannot be subclassed): its ``load`` is the C loader's own bound method."""

        timezone = datetime.UTC

        def __init__(self, oid: int, context: Any = None):
            super().__init__(oid, context)
            self.load = c_loader(oid, context).load  # type: ignore[method-assign]

        def load(self, data: Any) -> datetime.datetime:  # replaced per instance above
            raise NotImplementedError

    return UtcTimestamptzLoader


def use_c_loaders(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: the C loaders on a new PostgreSQL connection (see the module's text)."""
    if connection.vendor != "postgresql" or connection.timezone is not datetime.UTC:
        return
    c, loader = _c_module(), _utc_timestamptz_loader()
    if c is None or loader is None:
        return
    adapters = connection.connection.adapters
    adapters.register_loader("timestamptz", loader)
    for kind in TEXT_KINDS:
        adapters.register_loader(kind, c.TextLoader)

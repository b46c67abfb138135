"""The embedded Celery broker: kombu's SQLAlchemy transport on an SQLite file, made crash-safe.

``make run`` without ``REDIS_URL`` uses ``portal+sqlite:///var/celery-broker.sqlite3`` (the transport
alias ``portal`` is registered by ``portal/celery.py``). Every put and get is one SQLite transaction, so a
reader never sees half a message (the filesystem transport did: a worker read a file its writer had
not finished and died on ``JSONDecodeError``). On top of kombu's transport this one:

- deletes a message when it is acknowledged (kombu only hides it, so the table grew for ever);
- hands a message back by making its row visible again (not by inserting a copy), so a warm
  shutdown's restore and a later ``restore_unacked()`` never both deliver it;
- waits for SQLite locks (WAL journal, 30 s busy timeout) instead of failing;
- polls every 0.1 s (kombu's default for virtual transports is 1 s per empty poll);
- tolerates two processes creating the same queue row at once.

A consumer that is killed (SIGKILL, OOM) leaves its delivered-but-unacknowledged rows hidden;
``restore_unacked()`` makes them visible again. ``deploy/devstack.py`` calls it before it (re)starts
the worker, the only consumer of the embedded broker, so a killed worker's tasks run again (tasks
are idempotent, docs/conventions.md). Rows hidden longer than ``VISIBILITY_TIMEOUT`` come back anyway.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from json import loads
from pathlib import Path

from kombu.transport import sqlalchemy as kombu_sqla
from kombu.utils.encoding import bytes_to_str
from sqlalchemy import delete, event, text, update
from sqlalchemy.exc import IntegrityError

ALIAS = "portal"  # registered in portal/celery.py
VISIBILITY_TIMEOUT = 3600  # seconds, as Redis's default: longer than any countdown our tasks use
_OWN_OPTIONS = ("polling_interval", "visibility_timeout")


def sqlite_path(url: str) -> Path | None:
    """The SQLite file of a ``portal+sqlite:///...`` or ``sqla+sqlite:///...`` broker URL, else None."""
    for prefix in (f"{ALIAS}+sqlite:///", "sqla+sqlite:///", "sqlalchemy+sqlite:///"):
        if url.startswith(prefix):
            return Path(url[len(prefix):])
    return None


def restore_unacked(url: str, older_than: float = 0.0) -> int:
    """Make every delivered but unacknowledged message visible again; returns how many.

    Only safe while no consumer is running (or with ``older_than`` above the longest task).
    """
    path = sqlite_path(url)
    if path is None or not path.exists():
        return 0
    with sqlite3.connect(path, timeout=30) as db:
        query, args = "UPDATE kombu_message SET visible = 1 WHERE visible = 0", ()
        if older_than:
            query += " AND timestamp <= datetime('now', 'localtime', ?)"
            args = (f"-{int(older_than)} seconds",)
        try:
            cursor = db.execute(query, args)
        except sqlite3.OperationalError:  # no table yet: nothing was ever delivered
            return 0
        return cursor.rowcount


class Channel(kombu_sqla.Channel):
    _last_sweep = 0.0

    def __init__(self, connection, **kwargs) -> None:
        self._rows: dict[str, int] = {}
        self._rows_lock = threading.Lock()
        super().__init__(connection, **kwargs)

    def _engine_from_config(self):
        conninfo = self.connection.client
        options = conninfo.transport_options
        saved = {k: options.pop(k) for k in _OWN_OPTIONS if k in options}
        try:
            if conninfo.hostname.startswith("sqlite"):
                options.setdefault("connect_args", {"timeout": 30})
            engine = super()._engine_from_config()
        finally:
            options.update(saved)
        if engine.dialect.name == "sqlite":

            @event.listens_for(engine, "connect")
            def _pragmas(dbapi_connection, _record) -> None:
                dbapi_connection.execute("PRAGMA journal_mode=WAL")
                dbapi_connection.execute("PRAGMA synchronous=NORMAL")
                dbapi_connection.execute("PRAGMA busy_timeout=30000")

        return engine

    def _get_or_create(self, queue):
        try:
            return super()._get_or_create(queue)
        except IntegrityError:  # another process created it first
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()

    def _get(self, queue):
        self._sweep()
        obj = self._get_or_create(queue)
        if self.session.bind.name == "sqlite":
            self.session.execute(text("BEGIN IMMEDIATE TRANSACTION"))
        try:
            msg = (
                self.session.query(self.message_cls)
                .with_for_update()
                .filter(self.message_cls.queue_id == obj.id)
                .filter(self.message_cls.visible != False)
                .order_by(self.message_cls.sent_at)
                .order_by(self.message_cls.id)
                .limit(1)
                .first()
            )
            if msg is None:
                raise kombu_sqla.Empty()
            msg.visible = False
            payload = loads(bytes_to_str(msg.payload))
            tag = (payload.get("properties") or {}).get("delivery_tag")
            if tag:
                with self._rows_lock:
                    self._rows[tag] = msg.id
            return payload
        finally:
            self.session.commit()

    def _sweep(self) -> None:
        """Rows hidden for longer than the visibility timeout belong to a dead consumer: show them again."""
        now = time.monotonic()
        if now - self._last_sweep < 60:
            return
        self._last_sweep = now
        timeout = self.connection.client.transport_options.get("visibility_timeout", VISIBILITY_TIMEOUT)
        url = f"sqla+{self.connection.client.hostname}"
        if sqlite_path(url):
            restore_unacked(url, older_than=timeout)

    def _row(self, tag: str) -> int | None:
        with self._rows_lock:
            return self._rows.pop(tag, None)

    # Acks come from the pool's threads: they use a connection of their own, never the channel's session.
    def _delete_row(self, row: int | None) -> None:
        if row is None:
            return
        engine, _ = self._open()
        with engine.begin() as db:
            db.execute(delete(self.message_cls.__table__).where(self.message_cls.__table__.c.id == row))

    def basic_ack(self, delivery_tag, multiple=False) -> None:
        super().basic_ack(delivery_tag, multiple=multiple)
        self._delete_row(self._row(delivery_tag))

    def basic_reject(self, delivery_tag, requeue=False) -> None:
        if requeue:
            super().basic_reject(delivery_tag, requeue=True)  # _restore shows the row again
            return
        super().basic_reject(delivery_tag, requeue=False)
        self._delete_row(self._row(delivery_tag))

    def _restore(self, message) -> None:
        row = self._row(message.delivery_tag)
        if row is None:
            super()._restore(message)
            return
        engine, _ = self._open()
        table = self.message_cls.__table__
        with engine.begin() as db:
            db.execute(update(table).where(table.c.id == row).values(visible=True))


class Transport(kombu_sqla.Transport):
    Channel = Channel
    polling_interval = 0.1

    def __init__(self, client, **kwargs) -> None:
        super().__init__(client, **kwargs)
        self.polling_interval = client.transport_options.get("polling_interval", self.polling_interval)


"""The embedded broker (portal/broker.py) through kombu's interface, on a real SQLite file.

A message is delivered once, an ack removes it, a consumer that goes away cleanly hands it back, and one
that is killed leaves it for ``restore_unacked()`` (which devstack calls before it restarts the worker).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from kombu import Connection

import portal.celery  # noqa: F401 - registers the "portal" transport alias
from portal.broker import restore_unacked


def rows(path: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT id, visible FROM kombu_message ORDER BY id").fetchall()


def test_ack_removes_the_message_and_nothing_is_delivered_twice(tmp_path: Path) -> None:
    url = f"portal+sqlite:///{tmp_path / 'broker.sqlite3'}"
    with Connection(url) as conn:
        queue = conn.SimpleQueue("q")
        queue.put({"n": 1})
        queue.put({"n": 2})
        first = queue.get(timeout=5)
        second = queue.get(timeout=5)
        assert (first.payload, second.payload) == ({"n": 1}, {"n": 2})
        first.ack()
        assert [visible for _, visible in rows(tmp_path / "broker.sqlite3")] == [0]  # only the unacked one is left
        second.ack()
        assert rows(tmp_path / "broker.sqlite3") == []
        assert queue.qsize() == 0
        queue.close()


def test_a_consumer_that_closes_hands_unacked_messages_back_once(tmp_path: Path) -> None:
    url = f"portal+sqlite:///{tmp_path / 'broker.sqlite3'}"
    with Connection(url) as conn:
        queue = conn.SimpleQueue("q")
        queue.put({"n": 1})
        assert queue.get(timeout=5).payload == {"n": 1}  # not acked
        queue.close()
    # The row was made visible again, not copied: one message, delivered once more.
    assert [visible for _, visible in rows(tmp_path / "broker.sqlite3")] == [1]
    with Connection(url) as conn:
        queue = conn.SimpleQueue("q")
        message = queue.get(timeout=5)
        assert message.payload == {"n": 1}
        message.ack()
        assert queue.qsize() == 0
        queue.close()
    assert restore_unacked(url) == 0


def test_a_killed_consumer_leaves_its_message_for_restore_unacked(tmp_path: Path) -> None:
    url = f"portal+sqlite:///{tmp_path / 'broker.sqlite3'}"
    with Connection(url) as conn:
        conn.SimpleQueue("q").put({"n": 1})
    consumer = textwrap.dedent(f"""
        import os, signal
        from kombu import Connection
        import portal.celery
        with Connection({url!r}) as conn:
            message = conn.SimpleQueue("q").get(timeout=5)
            assert message.payload == {{"n": 1}}
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = subprocess.run([sys.executable, "-c", consumer], cwd=Path(__file__).resolve().parent.parent, timeout=60, check=False)
    assert result.returncode == -9
    assert [visible for _, visible in rows(tmp_path / "broker.sqlite3")] == [0]
    with Connection(url) as conn:
        queue = conn.SimpleQueue("q")
        assert queue.qsize() == 0  # taken, never acked: invisible until restored
        assert restore_unacked(url) == 1
        message = queue.get(timeout=5)
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()
    assert rows(tmp_path / "broker.sqlite3") == []

"""The audit chain's anchor: its head (``seq`` and ``entry_hash``) kept outside the database (docs/security.md).

Whoever owns the audit tables can empty both of them, or cut the tail and copy an older hash into the head: the
chain left behind is consistent, so ``audit_verify`` alone would call it intact. The anchor is what the database
cannot rewrite. After every commit that appended entries, ``anchor_publish`` writes the new head

* to a file (``AUDIT_ANCHOR_FILE``, default ``<var dir>/audit-anchor.json``; "" turns it off), rewritten in place
  under a lock (one fixed-size write) and only ever moved forward;
* to Redis when ``REDIS_URL`` is set (the hash ``AUDIT_ANCHOR_REDIS_KEY``, moved forward only, by one script), from
  a thread of its own: the commit waits for no round trip (the thread sends the latest head at most once per
  ``_RedisSender.REST``);
* to the log (one line ``audit anchor #<seq> <hash>`` with ``audit_seq`` / ``audit_hash`` fields);

and ``/metrics`` shows the database's head and the stored anchors at each scrape (``AnchorCollector``), so
Prometheus keeps a history of its own. The anchor is written after the commit, never before, so it never names an
entry a rolled-back transaction did not write; at worst (a crash between commit and write, two processes racing)
it is a few entries behind, which still pins everything up to it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

log = logging.getLogger("tenants.audit")

# Moves the anchor forward only: a late writer with an older head changes nothing.
_FORWARD = """
local cur = redis.call('HGET', KEYS[1], 'seq')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'seq', ARGV[1], 'hash', ARGV[2], 'at', ARGV[3])
return 1
"""


@dataclass(frozen=True)
class Anchor:
    """A head published earlier: entry ``seq`` had ``entry_hash``. ``source`` says where it was kept."""

    seq: int
    entry_hash: str
    source: str


class AnchorUnreadable(Exception):
    """An anchor store exists but says nothing usable (a damaged file): verification cannot rely on it."""


# ------------------------------------------------------------------------------------------------ where
def anchor_file() -> Path | None:
    path = getattr(settings, "AUDIT_ANCHOR_FILE", "")
    return Path(path) if path else None


def _redis_key() -> str:
    return getattr(settings, "AUDIT_ANCHOR_REDIS_KEY", "") if getattr(settings, "REDIS_URL", "") else ""


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def _redis(url: str) -> tuple[Any, Any]:
    """One client (and registered script) per process and URL; thread-safe, connections from its pool."""
    with _clients_lock:
        pair = _clients.get(url)
        if pair is None:
            import redis

            client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
            pair = _clients[url] = (client, client.register_script(_FORWARD))
    return pair


# ------------------------------------------------------------------------------------------------ write
def anchor_publish(*, seq: int, entry_hash: str) -> None:
    """Record ``seq``/``entry_hash`` as the chain's head in every store (after the commit that wrote it). A store
    that fails is logged and the others still get it."""
    if seq <= 0:
        return
    log.info("audit anchor #%s %s", seq, entry_hash, extra={"audit_seq": seq, "audit_hash": entry_hash})
    path = anchor_file()
    if path is not None:
        try:
            _file_forward(path, seq, entry_hash)
        except OSError:
            log.exception("audit anchor: cannot write %s", path)
    key = _redis_key()
    if key:
        _sender.submit(settings.REDIS_URL, key, seq, entry_hash)


def anchor_flush(timeout: float = 5.0) -> bool:
    """Wait until the heads this process published have reached Redis (or failed to, logged). False on timeout."""
    return _sender.flush(timeout)


class _RedisSender:
    """Sends the heads to Redis from one thread per process, so a commit waits for no round trip: ``submit`` keeps
    the latest head per key and wakes the thread, which sends whatever is latest when it gets to it. After a send the
    thread rests ``REST`` seconds, woken by no commit, and then sends the latest head of those that came meanwhile:
    a busy process costs Redis one round trip and the thread one wake-up per rest, not one per commit (each wake-up
    took the commit's thread 1-3 ms of CPU and GIL, measured on a 2-core machine). ``flush`` cuts the rest short
    when a head waits. Readers in this process (``anchors_read``) flush first."""

    REST = 0.25

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked worker starts with no thread and a free lock

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._wanted: dict[tuple[str, str], tuple[int, str]] = {}
        self._busy = False
        self._resting = False  # the thread rests after a send: a commit does not wake it
        self._flushing = 0  # callers of ``flush`` waiting: the rest ends at once
        self._thread: threading.Thread | None = None

    def submit(self, url: str, key: str, seq: int, entry_hash: str) -> None:
        with self._cond:
            current = self._wanted.get((url, key))
            if current is None or current[0] < seq:
                self._wanted[(url, key)] = (seq, entry_hash)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="audit-anchor", daemon=True)
                self._thread.start()
            if not self._resting:
                self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: not self._wanted and not self._busy, timeout)
            finally:
                self._flushing -= 1

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._wanted))
                batch, self._wanted, self._busy = self._wanted, {}, True
            try:
                for (url, key), (seq, entry_hash) in batch.items():
                    try:
                        _, forward = _redis(url)
                        forward(keys=[key], args=[seq, entry_hash, _now()])
                    except Exception:  # Redis down: the file and the log still hold it
                        log.exception("audit anchor: cannot write the Redis key %s", key)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
                    self._resting = True
                    self._cond.wait_for(lambda: self._flushing > 0 and bool(self._wanted), self.REST)
                    self._resting = False


_sender = _RedisSender()
atexit.register(anchor_flush, 2.0)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_RECORD = 160  # bytes: every record is padded to this length, so a rewrite in place is one short pwrite
_files: dict[str, tuple[int, int, int]] = {}  # path -> (fd, st_dev, st_ino), kept open by this process
_files_lock = threading.Lock()


def _files_forget() -> None:
    """In a forked child: its copies of the parent's descriptors share the parent's file locks, so open its own."""
    global _files_lock  # noqa: PLW0603 a forked child needs its own lock, not the parent's copy
    for fd, _, _ in _files.values():
        os.close(fd)
    _files.clear()
    _files_lock = threading.Lock()


os.register_at_fork(after_in_child=_files_forget)


def _file_fd(path: Path) -> int:
    """This process's descriptor of the anchor file, opened again when the file was removed or replaced."""
    key = str(path)
    kept = _files.get(key)
    try:
        now = os.stat(path)
        if kept is not None and (kept[1], kept[2]) == (now.st_dev, now.st_ino):
            return kept[0]
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
    if kept is not None:
        os.close(kept[0])
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    stat = os.fstat(fd)
    _files[key] = (fd, stat.st_dev, stat.st_ino)
    return fd


def _file_forward(path: Path, seq: int, entry_hash: str) -> None:
    """Rewrite the file with the new head unless it already holds a later one: under an exclusive lock of the file
    (readers take a shared one), read, compare, one fixed-size write in place. No open, rename or fsync per append:
    a crash can lose the last few heads (an older anchor, still true), never make one up. The file lock keeps other
    processes out; the threads of this one share its descriptor (and so its lock) and take turns on ``_files_lock``."""
    with _files_lock:
        fd = _file_fd(path)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            raw = os.pread(fd, _RECORD, 0)
            if raw.strip():
                try:
                    if _parse(raw, str(path)).seq >= seq:
                        return
                except AnchorUnreadable:
                    os.ftruncate(fd, 0)  # damaged (or longer than a record): replaced by a good one
            record = json.dumps({"seq": seq, "hash": entry_hash, "at": _now()}).encode()
            os.pwrite(fd, record.ljust(_RECORD - 1) + b"\n", 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _file_read(path: Path) -> bytes:
    with open(path, "rb") as file:
        fcntl.flock(file.fileno(), fcntl.LOCK_SH)
        return file.read()


# ------------------------------------------------------------------------------------------------ read
def _parse(raw: bytes, source: str) -> Anchor:
    try:
        data = json.loads(raw)
        seq, entry_hash = int(data["seq"]), str(data["hash"])
    except (ValueError, KeyError, TypeError) as exc:
        raise AnchorUnreadable(f"the anchor in {source} is unreadable ({exc.__class__.__name__})") from exc
    if seq <= 0 or len(entry_hash) != 64:
        raise AnchorUnreadable(f"the anchor in {source} is unreadable (seq {seq}, hash {entry_hash[:16]!r})")
    return Anchor(seq, entry_hash, source)


def anchors_read() -> list[Anchor]:
    """Every stored anchor (none where nothing was ever published). Raises ``AnchorUnreadable`` for a damaged
    store, and whatever Redis raises when it is configured but does not answer: an anchor that cannot be read is
    no reason to call the log intact."""
    found: list[Anchor] = []
    path = anchor_file()
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            found.append(_parse(_file_read(path), f"the file {path}"))
    key = _redis_key()
    if key:
        anchor_flush()  # this process's own latest heads first
        client, _ = _redis(settings.REDIS_URL)
        stored = client.hgetall(key)
        if stored:
            value = {k.decode(): v.decode() for k, v in stored.items()}
            found.append(_parse(json.dumps(value).encode(), f"the Redis key {key}"))
    return found


# ------------------------------------------------------------------------------------------------ /metrics
class AnchorCollector:
    """``/metrics`` at scrape time: the database's chain head (``gpuportal_audit_head_seq``, and its hash's first 16
    hex digits as ``gpuportal_audit_head_info``) and each stored anchor's seq (``gpuportal_audit_anchor_seq``).
    A head below an earlier scrape's, or below the anchor, means entries were removed (docs/security.md)."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        from .models import AuditChainHead

        head = AuditChainHead.objects.filter(pk=1).values_list("seq", "hash").first() or (0, "")
        seq = GaugeMetricFamily("gpuportal_audit_head_seq", "The audit chain's head in the database: the last "
                                "entry's sequence number.")
        seq.add_metric([], head[0])
        yield seq
        info = InfoMetricFamily("gpuportal_audit_head", "The audit chain's head in the database: the first 16 hex "
                                "digits of the last entry's hash.")
        info.add_metric([], {"seq": str(head[0]), "hash": head[1][:16]})
        yield info
        anchored = GaugeMetricFamily("gpuportal_audit_anchor_seq", "The audit chain's head as last published "
                                     "outside the database, by store.", labels=["store"])
        try:
            for anchor in anchors_read():
                anchored.add_metric(["redis" if anchor.source.startswith("the Redis") else "file"], anchor.seq)
        except Exception:  # a damaged or silent store shows as a missing series; audit_verify says why
            log.exception("audit anchor: cannot read the stored anchors for /metrics")
        yield anchored

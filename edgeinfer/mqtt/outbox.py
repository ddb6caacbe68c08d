"""The durable outbox: every result waits on disk (SQLite, WAL) until the broker acknowledged it.

    outbox = Outbox(paths.outbox_path(state_dir, dev, host, port), config.outbox)
    outbox.put("door", 17, "edgeinfer/pi/door/result", payload, 1)   # from an emit thread
    for msg in outbox.take(100): ...                                 # the publisher
    outbox.ack(msg.id)                                               # after the PUBACK

Durability. ``put`` commits before it returns, one transaction per result: a committed
transaction is in the WAL, so a ``kill -9`` (a crash, the OOM killer, the watchdog) loses nothing
put. ``synchronous=NORMAL`` rather than ``FULL``, deliberately: FULL fsyncs every commit (143 us
a put here instead of 10, milliseconds and flash wear on an SD card); with NORMAL a *power cut*
can lose the results committed since the last checkpoint that the kernel had not written back
yet (seconds), never corrupting the file. ``synchronous="FULL"`` is there where that matters.

A batching writer thread was rejected: a put would return before its row is in the WAL, which
breaks the ``kill -9`` guarantee, for little gain at ~10 us a put. Acks *are* batched
(``ack_many``): a lost ack only means a duplicate, which QoS 1 allows and ``seq`` drops.
Threads share one connection behind a lock: a connection per thread put ~10 % more through
with three writers, but SQLite's busy handler then stalled single puts by up to 180 ms (20 ms
with the lock).

Ids come from SQLite (``AUTOINCREMENT``: increasing, never reused, even after the table was
empty), so ``take`` can read ``WHERE id > cursor``. Its bookkeeping row costs a second page
write per put (15.6 -> 23-24 us a put here, 20,000 puts of 300 bytes); ids given by the process
were cheaper but let two processes on one file collide and publish each other's rows.

One process at a time: the outbox holds an exclusive ``flock`` on ``<file>.lock`` for its life,
so no other process ever writes rows that this one would publish (a second one gets
``AlreadyRunningError`` naming the first). The file also records whom it is for (``owner``:
device and broker); a file that belongs to another owner is moved aside, never published to
this broker.

A damaged file (not a database, truncated, a corrupt page, a folder in its place) is moved aside
as ``<name>.damaged-<UTC time>``, the rows that can still be read are copied into a fresh file,
and ``recovered`` says so (see ``edgeinfer.mqtt._outbox_file``). A file that cannot be created (a
full disk, a read-only folder) raises ``StorageError`` naming it.

Bounds: past ``max_messages`` or ``max_mb`` of payload the oldest results are dropped, so are
results older than ``max_age_s``; a full disk drops the oldest (or, if that frees no room, the
new one). Drops are counted by reason in ``stats()`` and never raise into the emit thread.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

from ..config.mqtt import OutboxConfig
from ..errors import StateError
from ..statelock import StateLock
from ._outbox_file import Salvage, is_full, open_file

__all__ = ["Message", "Outbox"]

logger = logging.getLogger(__name__)

_INSERT = ("INSERT INTO messages (pipeline, seq, topic, payload, qos, created) "
           "VALUES (?, ?, ?, ?, ?, ?)")
_RETURNING = "RETURNING id, pipeline, seq, length(payload)"
# Before this wall time (2020-01-01) the clock is not set yet (a board without an RTC before NTP):
# such rows have no meaningful age and are never expired by age.
_PLAUSIBLE_EPOCH = 1_577_836_800.0
_EXPIRE_EVERY_S = 1.0
_DISK_FULL_CHUNK = 0.01  # share of the backlog dropped to make room on a full disk
# A full disk is reported until puts have gone through without it for this long (one warning
# per episode, not one per chunk dropped).
_DISK_FULL_QUIET_S = 60.0


@dataclass(frozen=True, slots=True)
class Message:
    """One waiting result, as ``take`` hands it to the publisher."""

    id: int
    pipeline: str
    seq: int
    topic: str
    payload: bytes
    qos: int


class Outbox:
    """A bounded, durable FIFO of results (thread-safe).

    Args:
        path: The SQLite file; its folder is created.
        config: Bounds (``max_messages``, ``max_mb``, ``max_age_s``).
        synchronous: ``"NORMAL"`` (default: a power cut can lose the last seconds) or
            ``"FULL"`` (fsync per put). Either way a process crash loses nothing put.
        owner: Whom the results are for (e.g. ``"pi-door@broker:1883"``); recorded in a new
            file, and a file recording another owner is moved aside (``None``: not checked).

    Raises:
        AlreadyRunningError: another process has the file open.
        StorageError: the file cannot be created or opened (full disk, permissions).

    Attributes:
        recovered: How a damaged (or foreign) file found at open was handled, else ``None``.
    """

    def __init__(self, path: str | Path, config: OutboxConfig | None = None, *,
                 synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
                 owner: str | None = None) -> None:
        self.path = Path(path)
        self.config = config or OutboxConfig()
        self.owner = owner
        self.recovered: Salvage | None
        self._max_bytes = int(self.config.max_mb * 1024 * 1024)
        self._lock = threading.Lock()
        self._flock = StateLock(f"{self.path}.lock", what=f"outbox {self.path}",
                                remedy="its own outbox (mqtt.outbox.path)").acquire()
        try:
            self._conn, self.recovered = open_file(self.path, owner=owner,
                                                   synchronous=synchronous)
        except BaseException:
            self._flock.release()
            raise
        depth, nbytes = self._conn.execute(
            "SELECT count(*), coalesce(sum(length(payload)), 0) FROM messages").fetchone()
        self._depth: int = depth
        self._bytes: int = nbytes
        self._cursor = 0  # highest id handed out by take(); rows above it are pending
        self._in_flight: set[int] = set()
        self._closed = False
        self._disk_full_at = 0.0  # when a put last found the disk full
        self._last_expire = 0.0
        self.puts = 0
        self.acked = 0
        self.dropped: dict[str, int] = {"max_messages": 0, "max_mb": 0, "max_age": 0,
                                        "disk_full": 0}

    # -- writing --------------------------------------------------------------------------------
    def put(self, pipeline: str, seq: int, topic: str, payload: bytes, qos: int = 1) -> None:
        """Store one result; durable against a process crash when this returns.

        Makes room first when a bound would be exceeded (oldest dropped, counted). A full
        disk is handled the same way and never raises.
        """
        now = time.time()
        with self._lock:
            self._check_open()
            row = (pipeline, seq, topic, payload, qos, now)
            try:
                if now - self._last_expire >= _EXPIRE_EVERY_S:
                    self._expire(now)
                self._insert(row)
            except sqlite3.OperationalError as exc:
                if not is_full(exc):
                    raise
                self._rollback()
                self._on_disk_full(row)
            else:
                if self._disk_full_at and now - self._disk_full_at > _DISK_FULL_QUIET_S:
                    self._disk_full_at = 0.0
                    logger.warning("outbox %s: the disk has room again", self.path)
            self.puts += 1

    def _insert(self, row: tuple[Any, ...]) -> None:
        size = len(row[3])
        over_rows = self._depth + 1 - self.config.max_messages
        over_bytes = self._bytes + size - self._max_bytes
        if over_rows <= 0 and over_bytes <= 0:
            self._conn.execute(_INSERT, row)  # autocommit: one transaction
        else:
            with self._transaction():
                self._drop_oldest(over_rows, over_bytes,
                                  "max_messages" if over_rows > 0 else "max_mb")
                self._conn.execute(_INSERT, row)
        self._depth += 1
        self._bytes += size

    def _on_disk_full(self, row: tuple[Any, ...]) -> None:
        if not self._disk_full_at:
            logger.warning("outbox %s: the disk is full; dropping the oldest results", self.path)
        self._disk_full_at = row[5]
        try:
            # Whole pages must be freed for a new row to fit, so drop a chunk, not one row.
            with self._transaction():
                self._drop_oldest(max(64, int(self._depth * _DISK_FULL_CHUNK)), 0, "disk_full")
            self._conn.execute(_INSERT, row)
        except sqlite3.OperationalError as exc:
            if not is_full(exc):
                raise
            self._rollback()
            self.dropped["disk_full"] += 1  # not even that freed room: this result is lost
            return
        self._depth += 1
        self._bytes += len(row[3])

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction; on failure the counters go back with the data."""
        saved = (self._depth, self._bytes, self.acked, dict(self.dropped), set(self._in_flight))
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            self._depth, self._bytes, self.acked, dropped, self._in_flight = saved
            self.dropped.update(dropped)
            raise

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _drop_oldest(self, rows: int, nbytes: int, reason: str) -> None:
        """Delete the fewest oldest rows that free ``rows`` rows and ``nbytes`` bytes."""
        count = freed = 0
        cut = None
        cur = self._conn.execute("SELECT id, length(payload) FROM messages ORDER BY id")
        try:
            for msg_id, size in cur:
                count, freed, cut = count + 1, freed + size, msg_id
                if count >= rows and freed >= nbytes:
                    break
        finally:
            cur.close()
        if cut is not None:
            self.dropped[reason] += self._delete("id <= ?", (cut,))

    def _delete(self, where: str, args: Iterable[Any], *, remember: bool = True) -> int:
        """Delete rows inside the caller's transaction, keeping the counters and (with
        ``remember``) ``last_seq`` right; returns how many went."""
        gone = self._conn.execute(f"DELETE FROM messages WHERE {where} {_RETURNING}",
                                  tuple(args)).fetchall()
        if not gone:
            return 0
        top: dict[str, int] = {}
        for msg_id, pipeline, seq, size in gone:
            if seq > top.get(pipeline, -1):
                top[pipeline] = seq
            self._bytes -= size
            self._in_flight.discard(msg_id)
        self._depth -= len(gone)
        if not remember:
            return len(gone)
        # A row leaving the table takes its seq with it: remember the highest per pipeline.
        self._conn.executemany(
            "INSERT INTO last_seq (pipeline, seq) VALUES (?, ?) ON CONFLICT (pipeline) "
            "DO UPDATE SET seq = max(seq, excluded.seq)", top.items())
        return len(gone)

    def copy_in(self, rows: list[tuple[Any, ...]], seqs: Iterable[tuple[str, int]] = ()) -> None:
        """Append results taken from another outbox file, in the order given, in one
        transaction: ``(pipeline, seq, topic, payload, qos, created)`` rows, and the
        ``(pipeline, seq)`` that file remembered as sent (they only ever raise ``last_seq``)."""
        with self._lock:
            self._check_open()
            with self._transaction():
                self._conn.executemany(_INSERT, rows)
                self._conn.executemany(
                    "INSERT INTO last_seq (pipeline, seq) VALUES (?, ?) ON CONFLICT (pipeline) "
                    "DO UPDATE SET seq = max(seq, excluded.seq)", list(seqs))
                self._depth += len(rows)
                self._bytes += sum(len(r[3]) for r in rows)

    def remembered_seqs(self) -> list[tuple[str, int]]:
        """The ``(pipeline, seq)`` pairs this file remembers as put (``copy_in``'s ``seqs``)."""
        with self._lock:
            self._check_open()
            rows = self._conn.execute("SELECT pipeline, seq FROM last_seq").fetchall()
        return [(str(p), int(q)) for p, q in rows]

    def topics(self, *, prefix: str = "", limit: int | None = None) -> list[tuple[int, str]]:
        """``(id, topic)`` of the waiting results whose topic starts with ``prefix``, oldest
        first, at most ``limit``."""
        with self._lock:
            self._check_open()
            rows = self._conn.execute(
                "SELECT id, topic FROM messages WHERE substr(topic, 1, ?) = ? ORDER BY id "
                "LIMIT ?", (len(prefix), prefix, -1 if limit is None else limit)).fetchall()
        return [(int(i), str(t)) for i, t in rows]

    def move_to(self, target: Outbox, ids: Sequence[int], *, remember: bool = True) -> int:
        """Move the results ``ids`` into ``target``, in id order: copied there in one
        transaction, then deleted here in another (a crash between the two only means
        duplicates, as QoS 1 allows). With ``remember`` their seqs stay this file's
        ``last_seq`` (they were put here); without, they leave with the rows (a file shared by
        devices, whose seqs were never this file's own). Returns how many moved."""
        moved = 0
        with self._lock:
            self._check_open()
            for i in range(0, len(ids), 500):  # SQLite caps the number of parameters
                part = list(ids[i:i + 500])
                marks = ",".join("?" * len(part))
                rows = self._conn.execute(
                    f"SELECT pipeline, seq, topic, payload, qos, created FROM messages WHERE id "
                    f"IN ({marks}) ORDER BY id", part).fetchall()
                target.copy_in(rows)
                with self._transaction():
                    self._delete(f"id IN ({marks})", part, remember=remember)
                moved += len(rows)
        return moved

    # -- expiry ---------------------------------------------------------------------------------
    def expire(self) -> int:
        """Drop results older than ``max_age_s`` now; returns how many (``put`` also does this,
        at most once a second)."""
        with self._lock:
            self._check_open()
            return self._expire(time.time())

    def _expire(self, now: float) -> int:
        self._last_expire = now
        if self.config.max_age_s is None:
            return 0
        cutoff = now - self.config.max_age_s
        oldest = self._conn.execute("SELECT created FROM messages ORDER BY id LIMIT 1").fetchone()
        if oldest is None or not _PLAUSIBLE_EPOCH <= oldest[0] < cutoff:
            return 0  # the usual case, answered from the first row without a scan
        try:
            with self._transaction():
                n = self._delete("created < ? AND created >= ?", (cutoff, _PLAUSIBLE_EPOCH))
                self.dropped["max_age"] += n
        except sqlite3.OperationalError as exc:
            if not is_full(exc):
                raise
            return 0  # retried later; the put itself decides what a full disk costs
        return n

    # -- reading (the publisher) ----------------------------------------------------------------
    def take(self, limit: int) -> list[Message]:
        """Up to ``limit`` of the oldest results not in flight, oldest first (so in order per
        pipeline); they count as in flight until ``ack``-ed or ``requeue``-d."""
        with self._lock:
            self._check_open()
            rows = self._conn.execute(
                "SELECT id, pipeline, seq, topic, payload, qos FROM messages WHERE id > ? "
                "ORDER BY id LIMIT ?", (self._cursor, limit)).fetchall()
            if rows:
                self._cursor = rows[-1][0]
                self._in_flight.update(r[0] for r in rows)
        return [Message(*r) for r in rows]

    def ack(self, msg_id: int) -> None:
        """The broker acknowledged ``msg_id``: delete it (unknown ids are ignored)."""
        self.ack_many((msg_id,))

    def ack_many(self, ids: Iterable[int]) -> int:
        """Delete every acknowledged id in one transaction; returns how many were still there."""
        batch = list(ids)
        if not batch:
            return 0
        with self._lock:
            self._check_open()
            n = 0
            with self._transaction():
                for i in range(0, len(batch), 500):  # SQLite caps the number of parameters
                    part = batch[i:i + 500]
                    n += self._delete(f"id IN ({','.join('?' * len(part))})", part)
            self.acked += n
        return n

    def requeue(self) -> int:
        """Put every in-flight result back (after a disconnect): ``take`` starts again from the
        oldest. Returns how many were in flight."""
        with self._lock:
            n = len(self._in_flight)
            self._in_flight.clear()
            self._cursor = 0
        return n

    def last_seq(self, pipeline: str) -> int:
        """The highest seq ever put for ``pipeline`` (0 if none): a restarted daemon goes on
        from here. After a damaged file lost results, at least the time of that recovery in
        milliseconds (the lost seqs are unknown; a seq may jump ahead, never go back)."""
        with self._lock:
            self._check_open()
            (waiting,) = self._conn.execute(
                "SELECT max(seq) FROM messages WHERE pipeline = ?", (pipeline,)).fetchone()
            row = self._conn.execute(
                "SELECT seq FROM last_seq WHERE pipeline = ?", (pipeline,)).fetchone()
            floor = self._conn.execute(
                "SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'seq_floor'").fetchone()
        return max(waiting or 0, row[0] if row else 0, floor[0] if floor else 0)

    # -- state ----------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Results waiting, in flight included."""
        return self._depth

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def max_id(self) -> int:
        """The id of the newest waiting result (0 when empty)."""
        with self._lock:
            self._check_open()
            (top,) = self._conn.execute("SELECT max(id) FROM messages").fetchone()
        return int(top or 0)

    def stats(self) -> dict[str, Any]:
        """``depth``, ``bytes``, ``oldest_age_s``, ``in_flight``, ``put``, ``acked``,
        ``dropped`` (total) and ``dropped_by`` reason, ``disk_full`` (within the last minute)."""
        with self._lock:
            oldest = None
            if not self._closed:
                row = self._conn.execute(
                    "SELECT created FROM messages ORDER BY id LIMIT 1").fetchone()
                oldest = row[0] if row else None
            return {
                "depth": self._depth, "bytes": self._bytes,
                "oldest_age_s": round(time.time() - oldest, 3) if oldest is not None else 0.0,
                "in_flight": len(self._in_flight), "put": self.puts, "acked": self.acked,
                "dropped": sum(self.dropped.values()), "dropped_by": dict(self.dropped),
                "disk_full": bool(self._disk_full_at), "path": str(self.path),
                "recovered": self.recovered.to_dict() if self.recovered else None,
            }

    def close(self) -> None:
        """Checkpoint and close; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass  # a full disk must not keep the file open; the WAL is replayed on open
            self._conn.close()
            self._flock.release()

    def _check_open(self) -> None:
        if self._closed:
            raise StateError(f"outbox {self.path} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

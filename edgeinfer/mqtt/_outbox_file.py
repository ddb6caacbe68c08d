"""The outbox's file: its schema, opening it, and what to do when it is not what it should be.

- An older file (ids given by the process, not SQLite) is migrated to an AUTOINCREMENT table.
- A file recording another owner (device and broker) is moved to ``<name>.foreign-<UTC time>``:
  its results are for another broker and are never published to this one.
- A damaged file (not a database, truncated, a corrupt page, a folder in its place) must not
  keep the daemon from starting (systemd would restart it into its start limit and every new
  result would be lost): it is moved to ``<name>.damaged-<UTC time>`` (its WAL with it), a fresh
  file started, and every row that can still be read copied into it. Rows are read by id range;
  a range whose pages cannot be read is halved until the readable ids around the damage are
  found, within a budget of queries, so a badly damaged file costs a bounded time at start.
- A file that cannot be created (a full disk, a read-only folder) is a ``StorageError`` naming it.
- ``adopt_legacy``: the results of the one ``outbox.sqlite3`` older versions shared go to the
  outbox of the device they are for; ``set_aside_others``: results another device wrote into a
  file before files recorded their owner are moved to ``<name>.foreign-<UTC time>``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import StorageError

logger = logging.getLogger(__name__)

__all__ = ["Salvage", "is_full", "open_file"]

_DAMAGE_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_CHUNK = 1024  # ids per range query
_BUDGET = 20_000  # range queries at most per file
_COLUMNS = "id, pipeline, seq, topic, payload, qos, created"

_MESSAGES = """
CREATE TABLE IF NOT EXISTS {name} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    seq INTEGER NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    created REAL NOT NULL
);
"""
_SCHEMA = _MESSAGES.format(name="messages") + """
CREATE TABLE IF NOT EXISTS last_seq (pipeline TEXT PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_INSERT = ("INSERT INTO messages (pipeline, seq, topic, payload, qos, created) "
           "VALUES (?, ?, ?, ?, ?, ?)")
_COPY = ("INSERT INTO messages (id, pipeline, seq, topic, payload, qos, created) "
         "VALUES (?, ?, ?, ?, ?, ?, ?)")

Row = tuple[int, str, int, str, bytes, int, float]


class Damaged(Exception):
    """``PRAGMA quick_check`` found problems (the message lists the first ones)."""


def is_damage(exc: BaseException) -> bool:
    """A sqlite error that says the file's content is bad (as opposed to a full disk, a
    read-only folder or missing permissions, which moving the file aside would not cure)."""
    if isinstance(exc, Damaged):
        return True
    return isinstance(exc, sqlite3.DatabaseError) and \
        getattr(exc, "sqlite_errorcode", None) in _DAMAGE_CODES


@dataclass(frozen=True, slots=True)
class Salvage:
    """What happened to a damaged outbox (shown in stats and on the status topic)."""

    moved_to: str
    reason: str
    salvaged: int
    unreadable: bool  # some rows could not be read (or the file was not a database at all)
    at: float

    def to_dict(self) -> dict[str, object]:
        return {"moved_to": self.moved_to, "reason": self.reason, "salvaged": self.salvaged,
                "unreadable": self.unreadable, "at": round(self.at, 3)}


def is_full(exc: sqlite3.Error) -> bool:
    """The disk (or SQLite's page cap) is full."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "full" in str(exc)


class _Foreign(Exception):
    """The file records another owner (device and broker) than the one opening it."""


def open_file(path: Path, *, owner: str | None, synchronous: str
              ) -> tuple[sqlite3.Connection, Salvage | None]:
    """Open (or create) the outbox at ``path``; a damaged file or one recording another
    ``owner`` is moved aside and replaced (the second value says how, else ``None``).

    Raises:
        StorageError: the file cannot be created or opened (full disk, permissions).
    """
    opener = _Opener(path, owner, synchronous)
    return opener._open(), opener.recovered


class _Opener:
    def __init__(self, path: Path, owner: str | None, synchronous: str) -> None:
        self.path = path
        self.owner = owner
        self._synchronous = synchronous
        self.recovered: Salvage | None = None

    def _open(self) -> sqlite3.Connection:
        """Open (or create) the file; a damaged or foreign one is moved aside and replaced."""
        try:
            if self.path.is_dir():
                raise Damaged("a folder is in its place")
            return self._connect()
        except (sqlite3.DatabaseError, Damaged, _Foreign) as exc:
            if not isinstance(exc, _Foreign) and not is_damage(exc):
                raise self._storage_error(exc) from exc
            return self._replace(exc)

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the folder of the outbox {self.path}: "
                               f"{exc.strerror or exc}") from exc
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # a bad header fails here (not a database)
            problems = [r[0] for r in conn.execute("PRAGMA quick_check(3)")]
            if problems != ["ok"]:
                raise Damaged("; ".join(problems))
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            # Keep the WAL from staying large after a burst (it is reused, not shrunk, otherwise).
            conn.execute("PRAGMA journal_size_limit=4194304")
            conn.executescript(_SCHEMA)
            self._migrate(conn)
            self._check_owner(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Files from before SQLite gave the ids: the same rows in an AUTOINCREMENT table."""
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()
        if "AUTOINCREMENT" in sql.upper():
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_MESSAGES.format(name="messages_v2"))
            conn.execute("INSERT INTO messages_v2 SELECT id, pipeline, seq, topic, payload, qos, "
                         "created FROM messages ORDER BY id")
            conn.execute("DROP TABLE messages")
            conn.execute("ALTER TABLE messages_v2 RENAME TO messages")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _check_owner(self, conn: sqlite3.Connection) -> None:
        if self.owner is None:
            return
        row = conn.execute("SELECT value FROM meta WHERE key = 'owner'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta (key, value) VALUES ('owner', ?)", (self.owner,))
        elif row[0] != self.owner:
            raise _Foreign(f"it holds results for {row[0]}, not {self.owner}")

    def _replace(self, exc: BaseException) -> sqlite3.Connection:
        """Move the file aside, start a fresh one, copy into it what can be read."""
        foreign = isinstance(exc, _Foreign)
        reason = str(exc) or type(exc).__name__
        try:
            aside = move_aside(self.path, "foreign" if foreign else "damaged")
        except OSError as err:
            raise StorageError(f"the outbox {self.path} is unusable ({reason}) and cannot be "
                               f"moved aside: {err.strerror or err}") from err
        try:
            conn = self._connect()
        except sqlite3.Error as err:
            raise self._storage_error(err) from err
        if foreign:  # kept for whoever it belongs to; nothing of it is published here
            self.recovered = Salvage(str(aside), reason, 0, False, time.time())
            logger.warning("outbox %s: %s; moved it aside to %s and started an empty one",
                           self.path, reason, aside)
            return conn
        salvaged, unreadable = self._copy_from(conn, aside)
        if unreadable:
            # The seqs of what was lost are unknown, and a consumer drops any seq at or below
            # the last it saw: from now on every pipeline counts on from the time in ms (above
            # any earlier seq unless a pipeline made over 1,000 results a second).
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('seq_floor', ?)",
                         (str(int(time.time() * 1000)),))
        self.recovered = Salvage(str(aside), reason, salvaged, unreadable, time.time())
        logger.warning("outbox %s was damaged (%s): moved it aside to %s and started a fresh "
                       "one with the %d results that could be read%s", self.path, reason,
                       aside, salvaged, " (some could not)" if unreadable else "")
        return conn

    @staticmethod
    def _copy_from(conn: sqlite3.Connection, damaged: Path) -> tuple[int, bool]:
        last_seq, batches, gaps = read_rows(damaged)
        n = 0
        try:
            conn.executemany("INSERT INTO last_seq (pipeline, seq) VALUES (?, ?) ON CONFLICT "
                             "(pipeline) DO UPDATE SET seq = max(seq, excluded.seq)", last_seq)
            for rows in batches:
                conn.execute("BEGIN")
                conn.executemany(_COPY, rows)
                conn.execute("COMMIT")
                n += len(rows)
        except sqlite3.Error as exc:  # a full disk: what was copied stays, the rest is kept aside
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            logger.warning("outbox: copying from %s stopped: %s", damaged, exc)
            return n, True
        return n, gaps[0]

    def _storage_error(self, exc: BaseException) -> StorageError:
        why = "the disk is full" if isinstance(exc, sqlite3.Error) and is_full(exc) else exc
        return StorageError(f"cannot open the outbox {self.path}: {why}")


def move_aside(path: Path, label: str = "damaged") -> Path:
    """Rename ``path`` (file or folder) and its ``-wal`` to ``<name>.<label>-<UTC time>``; the
    ``-shm`` index is rebuilt from the WAL, so it is removed."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.{label}-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.{label}-{stamp}-{n}")
        n += 1
    os.rename(path, aside)
    wal = Path(f"{path}-wal")
    if wal.exists():
        os.rename(wal, f"{aside}-wal")
    try:
        os.unlink(f"{path}-shm")
    except (FileNotFoundError, IsADirectoryError):
        pass
    return aside


def read_rows(path: Path) -> tuple[list[tuple[str, int]], Iterator[list[Row]], list[bool]]:
    """Open the damaged copy at ``path`` and return its ``last_seq`` rows, an iterator over
    batches of readable message rows (ascending id) and a one-element flag list set to True
    once something could not be read. Never raises for the content of the file."""
    gaps = [False]
    try:
        src = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error:
        gaps[0] = True
        return [], iter(()), gaps
    last_seq: list[tuple[str, int]] = []
    try:
        # A truncated file (its header counts more pages than it has) is refused outright
        # unless the schema is "writable"; this connection only reads.
        src.execute("PRAGMA writable_schema=ON")
        last_seq = src.execute("SELECT pipeline, seq FROM last_seq").fetchall()
    except sqlite3.Error:
        gaps[0] = True
    return last_seq, _batches(src, gaps), gaps


def _bounds(src: sqlite3.Connection, gaps: list[bool]) -> tuple[int, int] | None:
    try:
        lo, hi = src.execute("SELECT min(id), max(id) FROM messages").fetchone()
        return (lo, hi) if lo is not None else None
    except sqlite3.Error:
        gaps[0] = True
    # The b-tree's edges are unreadable: AUTOINCREMENT's counter is on a page of its own.
    try:
        row = src.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
    except sqlite3.Error:
        return None
    return (1, int(row[0])) if row else None


def _batches(src: sqlite3.Connection, gaps: list[bool]) -> Iterator[list[Row]]:
    try:
        bounds = _bounds(src, gaps)
        if bounds is None:
            return
        budget = _BUDGET
        # Ranges to read, lowest last so that pop() goes in ascending order.
        todo = [(a, min(a + _CHUNK - 1, bounds[1]))
                for a in range(bounds[0], bounds[1] + 1, _CHUNK)][::-1]
        while todo:
            if budget <= 0:
                gaps[0] = True
                return
            budget -= 1
            a, b = todo.pop()
            try:
                rows = src.execute(f"SELECT {_COLUMNS} FROM messages WHERE id BETWEEN ? AND ? "
                                   "ORDER BY id", (a, b)).fetchall()
            except sqlite3.Error:
                gaps[0] = True
                if a < b:
                    mid = (a + b) // 2
                    todo += [(mid + 1, b), (a, mid)]
                continue
            if rows:
                yield rows
    finally:
        src.close()

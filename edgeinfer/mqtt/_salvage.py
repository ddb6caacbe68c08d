"""A damaged outbox file: recognised, moved aside (kept), and what can still be read copied out.

A file that is not a database (a bad header), truncated, with a corrupt page, or a folder in its
place must not keep the daemon from starting (systemd would restart it into its start limit and
every new result would be lost). The outbox moves it to ``<name>.damaged-<UTC time>`` (its WAL
with it), starts a fresh file and copies into it every row this module can still read.

Rows are read by id range: a range whose pages cannot be read is halved until the readable ids
around the damage are found, within a budget of queries, so a badly damaged file costs a bounded
time at start.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Salvage", "is_damage", "move_aside", "read_rows"]

_DAMAGE_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_CHUNK = 1024  # ids per range query
_BUDGET = 20_000  # range queries at most per file
_COLUMNS = "id, pipeline, seq, topic, payload, qos, created"

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

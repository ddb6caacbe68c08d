"""Zone and line totals kept across restarts in one small JSON file.

The file is replaced atomically (a temporary file, fsync, rename, fsync of the folder), so it
holds the old totals or the new ones, never a mix. The scene calls `CounterStore.maybe_save`
on every frame; it writes at most once a second and only when the totals changed, so a crash
loses at most a second of counts. A file that cannot be read as totals (corrupt, or written by
something else) is renamed ``<name>.corrupt-<utc>`` with a warning and counting starts at zero::

    {"format": "edgeinfer-counters", "version": 1,
     "zones": {"door": {"entered": 3, "exited": 2, "loiter": 0}},
     "lines": {"gate": {"in": 5, "out": 4}}}
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from .._durable import write_atomic

__all__ = ["LINE_KEYS", "ZONE_KEYS", "CounterStore"]

logger = logging.getLogger(__name__)

FORMAT = "edgeinfer-counters"
VERSION = 1
ZONE_KEYS = ("entered", "exited", "loiter")
LINE_KEYS = ("in", "out")


class CounterStore:
    """The totals file of one pipeline's scene.

    Args:
        path: The JSON file; its folder is created (mode 0700) at the first save.
        interval_s: Least time between two saves by `maybe_save`.
    """

    def __init__(self, path: Path, interval_s: float = 1.0) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self._saved: dict[str, Any] | None = None
        self._saved_at: float | None = None
        # maybe_save hands the totals to a writer thread: two fsyncs (milliseconds on an SD
        # card, sometimes tens) never stall the pipeline's emit thread.
        self._cv = threading.Condition()
        self._queued: dict[str, Any] | None = None
        self._writing = False
        self._writer: threading.Thread | None = None

    def load(self) -> dict[str, Any]:
        """Read the totals.

        Returns:
            ``{"zones": {name: {"entered", "exited", "loiter"}}, "lines": {name: {"in",
            "out"}}}``; empty maps when there is no file or it was unusable (then it is renamed
            aside with a warning).
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {"zones": {}, "lines": {}}
        except OSError as exc:
            logger.warning("counters %s cannot be read (%s); counting starts at zero",
                           self.path, exc)
            return {"zones": {}, "lines": {}}
        try:
            counts = _parse(raw)
        except ValueError as exc:
            aside = self._set_aside()
            logger.warning("counters %s are unusable (%s); moved to %s, counting starts at zero",
                           self.path, exc, aside)
            return {"zones": {}, "lines": {}}
        self._saved = counts
        return counts

    def save(self, counts: dict[str, Any]) -> None:
        """Write ``counts`` (the shape `load` returns) now, after any save `maybe_save`
        queued.

        Raises:
            OSError: The folder or file cannot be written.
        """
        self.flush()
        totals = {"zones": _only(counts.get("zones", {}), ZONE_KEYS),
                  "lines": _only(counts.get("lines", {}), LINE_KEYS)}
        self._write(totals)
        self._saved_at = time.monotonic()

    def _write(self, totals: dict[str, Any]) -> None:
        data = json.dumps({"format": FORMAT, "version": VERSION, **totals}, sort_keys=True)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(self.path, data.encode(), 0o600)
        self._saved = totals

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the save `maybe_save` queued is on disk; ``False`` if it took longer than
        ``timeout``."""
        with self._cv:
            return self._cv.wait_for(lambda: self._queued is None and not self._writing,
                                     timeout)

    def maybe_save(self, counts: dict[str, Any], now: float) -> bool:
        """Save ``counts`` if they differ from the last saved and ``interval_s`` has passed since
        the last save.

        Args:
            counts: Totals, as for `save`.
            now: A monotonic time (s).

        Returns:
            Whether ``counts`` are on disk now (just saved, or unchanged); ``False`` means call
            again later. A failed write is logged and returns ``False``.
        """
        totals = {"zones": _only(counts.get("zones", {}), ZONE_KEYS),
                  "lines": _only(counts.get("lines", {}), LINE_KEYS)}
        with self._cv:
            if totals == (self._queued or self._saved):
                return True
            if self._saved_at is not None and now - self._saved_at < self.interval_s:
                return False
            self._saved_at = now  # a failed write is retried after the interval too
            self._queued = totals
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_queued, daemon=True,
                                                name=f"counters-{self.path.stem}")
                self._writer.start()
            self._cv.notify_all()
        return True

    def _write_queued(self) -> None:
        while True:
            with self._cv:
                if not self._cv.wait_for(lambda: self._queued is not None, 5.0):
                    self._writer = None  # idle: a later save starts a new one
                    return
                totals, self._queued, self._writing = self._queued, None, True
            try:
                self._write(totals)  # type: ignore[arg-type]
            except OSError as exc:
                logger.warning("counters %s cannot be saved: %s", self.path, exc)
            finally:
                with self._cv:
                    self._writing = False
                    self._cv.notify_all()

    def _set_aside(self) -> Path | None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside


def _only(table: Any, keys: tuple[str, ...]) -> dict[str, dict[str, int]]:
    return {str(name): {k: int(v.get(k, 0)) for k in keys} for name, v in table.items()}


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file")
    if doc.get("version") != VERSION:
        raise ValueError(f"version {doc.get('version')!r}, expected {VERSION}")
    return {"zones": _table(doc.get("zones"), ZONE_KEYS, "zones"),
            "lines": _table(doc.get("lines"), LINE_KEYS, "lines")}


def _table(table: Any, keys: tuple[str, ...], what: str) -> dict[str, dict[str, int]]:
    if not isinstance(table, dict):
        raise ValueError(f"{what} is not a map")
    out: dict[str, dict[str, int]] = {}
    for name, row in table.items():
        if not isinstance(row, dict):
            raise ValueError(f"{what}.{name} is not a map")
        values = {k: row.get(k, 0) for k in keys}
        # bool is an int subclass; a negative or non-integer total is not ours either.
        if any(type(v) is not int or v < 0 for v in values.values()):
            raise ValueError(f"{what}.{name} holds a value that is not a count")
        out[name] = values
    return out

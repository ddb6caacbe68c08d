"""Event snapshots: written by a thread of their own as soon as the frame they show is encoded,
so a clip being written (seconds of video encoding) never delays one.

An event's record says the truth at every moment: at emission ``snapshot`` is ``null`` and
``snapshot_pending`` names the file to come; once the file is on disk (written atomically: it
appears whole or not at all) ``snapshot`` names it, and when it cannot be written
``snapshot_missing`` says why. A file that cannot be opened for a moment (``EMFILE`` while a
flood of web clients holds every descriptor) is retried for about 1.5 s before the event is
told. The record is updated by replacing values of keys it already has, so a reader in another
thread (the web view) never sees it change size.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EdgeInferError
from .clips import Entry
from .draw import Geometry, boxes_shapes, decode_jpeg, draw_scene, draw_shapes, encode_jpeg
from .media import MediaStore

__all__ = ["SNAPSHOT_KEYS", "SnapJob", "SnapRequest", "SnapshotWriter", "settle"]

logger = logging.getLogger(__name__)

SNAPSHOT_KEYS = ("snapshot", "snapshot_pending", "snapshot_missing")
_TRIES = 6  # 50 ms doubling: about 1.5 s of waiting in all before the event is told
_FIRST_DELAY_S = 0.05


@dataclass(frozen=True, slots=True)
class SnapRequest:
    """One event's snapshot still to be written.

    Attributes:
        path: Where the file goes.
        track_id: The event's track (highlighted).
        event: The event's record, told the outcome (``None``: nobody to tell).
    """

    path: Path
    track_id: int
    event: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class SnapJob:
    """A request with the encoded frame it shows (held in the frame buffer until written)."""

    request: SnapRequest
    entry: Entry


def settle(event: dict[str, Any] | None, path: Path | None, missing: str | None) -> None:
    """Tell ``event`` that its snapshot is at ``path``, or is missing because of ``missing``."""
    if event is None:
        return
    event["snapshot_missing"] = missing
    event["snapshot"] = str(path.absolute()) if path is not None else None
    event["snapshot_pending"] = None


class SnapshotWriter:
    """The thread that draws and writes snapshots.

    Args:
        pipeline: The pipeline's name (thread name, logs).
        store: The media folder.
        quality: JPEG quality.
        geometry: The zones and lines to draw.
        release: Called with each job's entry once written (or given up).
        count: Called with a stats key: ``snapshots_written`` or ``snapshots_missed``.
        nice: Lowers the thread's priority (called in the thread first).
    """

    def __init__(self, pipeline: str, store: MediaStore, quality: int,
                 geometry: Callable[[], Geometry], release: Callable[[Entry], None],
                 count: Callable[[str], None], nice: Callable[[], None]) -> None:
        self._store, self._quality, self._geometry = store, quality, geometry
        self._release, self._count, self._nice = release, count, nice
        self._jobs: queue.SimpleQueue[SnapJob | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"rec-snap-{pipeline}",
                                         daemon=True)
        self.pipeline = pipeline
        self._closing = False

    def start(self) -> None:
        self._thread.start()

    def put(self, job: SnapJob) -> None:
        """Write ``job`` soon (jobs are written in order)."""
        self._jobs.put(job)

    def missed(self, request: SnapRequest, why: str) -> None:
        """Give up ``request``: its event told ``why``, and counted."""
        settle(request.event, None, why)
        self._count("snapshots_missed")

    def close(self, timeout: float | None = None) -> bool:
        """Write what is queued and end the thread; ``True`` if it ended within ``timeout``
        (calling again waits again)."""
        if not self._closing:
            self._closing = True
            self._jobs.put(None)
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        self._nice()
        while (job := self._jobs.get()) is not None:
            try:
                why = self._write(job)
            except Exception as exc:  # a bad frame or geometry must not stop the writer
                logger.warning("pipeline %s: cannot write snapshot %s", self.pipeline,
                               job.request.path, exc_info=True)
                why = f"drawing the snapshot failed: {type(exc).__name__}: {exc}"
            finally:
                self._release(job.entry)
            if why is None:  # the event first: a reader that saw the count sees the path
                settle(job.request.event, job.request.path, None)
                self._count("snapshots_written")
            else:
                self.missed(job.request, why)

    def _write(self, job: SnapJob) -> str | None:
        entry, request = job.entry, job.request
        try:
            image = decode_jpeg(entry.jpeg)
            draw_shapes(image, boxes_shapes(entry.boxes), entry.scale)  # under the boxes
            draw_scene(image, entry.boxes, self._geometry(), scale=entry.scale,
                       highlight=request.track_id)
            data = encode_jpeg(image, self._quality)
        except EdgeInferError as exc:
            return f"the frame could not be drawn: {exc}"
        return self._store.save(request.path, data, tries=_TRIES, delay_s=_FIRST_DELAY_S)

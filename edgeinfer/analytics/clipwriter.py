"""Event clips: encoded and written by a thread of their own once their post-roll is in, so
that the encoder keeping frames never waits for seconds of video encoding (``record.clips``).
A clip of a camera whose packets are kept (``sources.packets.PacketRing``: RTSP H.264/H.265
through PyAV) is instead cut from them by remuxing: no decoding, no encoding, the camera's own
resolution and frame rate, nothing drawn. The thread's CPU time per clip is counted for each way
(``remux_cpu_s``, ``encode_cpu_s`` on the recorder's stats).

A clip is written atomically into the media folder (``media.MediaStore``: retention, the
free-space floor). OpenCV says only that it cannot open a file, and a moment without a free
descriptor (``EMFILE`` under a flood of web clients) passes, so a failed write is tried again,
bounded. A clip that cannot be written tells its events why (``clip_missing``, ``clip`` back
to ``None``), replacing values of keys their records already have.
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import StorageError
from .clips import ClipFormat, Entry, PendingClip, write_clip
from .draw import Geometry
from .media import MediaStore

if TYPE_CHECKING:
    from ..sources.packets import PacketRing

__all__ = ["ClipWriter"]

logger = logging.getLogger("edgeinfer.analytics.recorder")  # the recorder's, which filters use

_TRIES = 4  # 0.2 s doubling: 1.4 s of waiting in all
_RETRY_S = 0.2


class ClipWriter:
    """The thread that writes event clips, in the order they are put.

    Args:
        pipeline: The pipeline's name (thread name, logs).
        store: The media folder.
        fps: The clips' frame rate (``clips.fps``).
        min_free_mb: ``retention.min_free_mb``, named when the disk is too full.
        geometry: The zones and lines to draw.
        release: Called with each clip's frames once it is written (or given up).
        count: Called with a stats key: ``clips_written``, ``clips_missed`` or ``errors``.
        nice: Lowers the thread's priority (called in the thread first).
        spent: Called with ``remux`` or ``encode`` and the CPU seconds a clip took.

    Attributes:
        thread: The writer thread (started by ``start``).
        hurry: Set when closing took too long: the clip being written ends at its next frame.
        ring: The camera's packets, for clips marked ``remux``.
    """

    def __init__(self, pipeline: str, store: MediaStore, fps: float, min_free_mb: float,
                 geometry: Callable[[], Geometry], release: Callable[[Sequence[Entry]], None],
                 count: Callable[[str], None], nice: Callable[[], None],
                 spent: Callable[[str, float], None] | None = None) -> None:
        self.pipeline = pipeline
        self.ring: PacketRing | None = None
        self._spent = spent
        self._store, self._fps, self._min_free_mb = store, fps, min_free_mb
        self._geometry, self._release, self._count, self._nice = geometry, release, count, nice
        self._format: ClipFormat | None = None
        self._jobs: queue.SimpleQueue[PendingClip | None] = queue.SimpleQueue()
        self.hurry = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"rec-write-{pipeline}",
                                       daemon=True)

    def start(self, fmt: ClipFormat | None) -> None:
        """Start the thread; clips are written as ``fmt`` (``None``: none can be written)."""
        self._format = fmt
        self.thread.start()

    def put(self, clip: PendingClip) -> None:
        """Write ``clip`` once the ones put before it are written."""
        self._jobs.put(clip)

    def finish(self) -> None:
        """No more clips: the thread ends after writing those queued."""
        self._jobs.put(None)

    def _loop(self) -> None:
        self._nice()
        while (job := self._jobs.get()) is not None:
            try:
                self._write(job)
            except Exception:  # a bad frame or geometry must not stop the writer for good
                self._count("errors")
                logger.warning("pipeline %s: cannot write event media", self.pipeline,
                               exc_info=True)
            finally:
                self._release(job.frames)
                if job.remux and self.ring is not None:
                    self.ring.unpin(job.start)

    def _write(self, clip: PendingClip) -> None:
        if clip.remux:
            self._remux(clip)
            return
        if self._format is None:
            return
        if not clip.frames:
            self._missing(clip, "no frame of its span was kept (the encoder lagged)")
            return
        if not self._store.has_room():
            self._missing(clip, f"the disk had less than retention.min_free_mb "
                                f"({self._min_free_mb:g} MiB) free")
            return
        for attempt in range(1, _TRIES + 1):
            try:
                with self._store.atomic(clip.path) as temp:
                    cpu = time.thread_time()
                    write_clip(temp, self._format, clip.frames, self._geometry(), clip.track_id,
                               self._fps, self.hurry)
                    if self._spent is not None:
                        self._spent("encode", time.thread_time() - cpu)
            except (StorageError, OSError) as exc:
                # OpenCV says only that it cannot open the file: no descriptor left (EMFILE
                # under a flood of web clients) passes, so it is tried again, bounded.
                if attempt == _TRIES or self.hurry.is_set():
                    self._count("errors")
                    logger.warning("pipeline %s: %s (%d tries)", self.pipeline, exc, attempt)
                    detail = (f"{exc.strerror} ({errno.errorcode.get(exc.errno or 0, '?')})"
                              if isinstance(exc, OSError) else "OpenCV cannot open it")
                    self._missing(clip, f"cannot write clip {clip.path.name}: {detail} "
                                        f"({attempt} tries)")
                    return
                self._store.retried()
                time.sleep(_RETRY_S * 2 ** (attempt - 1))
            else:
                self._count("clips_written")
                return

    def _remux(self, clip: PendingClip) -> None:
        ring = self.ring
        assert ring is not None, "a remux clip without the camera's packets"
        if not self._store.has_room():
            self._missing(clip, f"the disk had less than retention.min_free_mb "
                                f"({self._min_free_mb:g} MiB) free")
            return
        cpu = time.thread_time()
        try:
            with self._store.atomic(clip.path) as temp:
                if ring.cut(clip.start, clip.end, temp) is None:
                    raise _Gone()
        except _Gone:
            self._missing(clip, "the camera's packets from a keyframe before the clip's start "
                                "were gone (the stream reconnected, the packet buffer, "
                                "clips.buffer_mb, was full, or the camera sends keyframes "
                                "too rarely: more than 20 s apart)")
            return
        except Exception as exc:  # FFmpeg's muxer, or the disk
            self._count("errors")
            logger.warning("pipeline %s: cannot remux clip %s: %s", self.pipeline,
                           clip.path.name, exc)
            self._missing(clip, f"cannot remux clip {clip.path.name}: {exc}")
            return
        if self._spent is not None:
            self._spent("remux", time.thread_time() - cpu)
        self._count("clips_written")
        self._count("clips_remuxed")

    def _missing(self, clip: PendingClip, why: str) -> None:
        self._count("clips_missed")
        for event in clip.events:  # values of keys the records have: they keep their size
            event["clip"] = None
            event["clip_missing"] = why


class _Gone(Exception):
    """The packets a remux clip needs are no longer held."""

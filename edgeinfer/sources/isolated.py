"""A live camera read in a process of its own (``isolation: process``, what ``auto`` picks for
``camera`` sources): reading, demuxing and decoding do not take turns with inference and
results on the daemon's interpreter lock, and a native crash in a decoder costs this camera a
restart, not the daemon.

The capture process (``capture_child.py``) runs the same source class as in-process
(``CameraSource`` or ``PyAvSource``) and writes each frame into a shared-memory ring
(``framering.py``); this side wraps the slot in an array without copying it and yields the
same ``Frame`` the in-process source would. The child's stats, health and log lines come along
(every ``capture_child.STATS_S``); the camera's own packets too, into this side's
``PacketRing``, when a clip recorder asked for them before the pipeline started.

When the child dies (a segfault in FFmpeg, the OOM killer) the source says so on its health
(``reconnecting``, the reason naming the signal) and starts a new one after a backoff (0.5 s
doubling to ``RESTART_MAX_S``; back to 0.5 s after ``RESTART_RESET_S`` of running), counted as
``capture.restarts``. A camera that gives up (``reconnect.max_attempts``) raises its
``SourceError`` here, as in-process.

One-shot and paced sources (pictures, files, synthetic frames, audio, serial, MQTT) stay in
the daemon's process: they are read at the pipeline's pace or carry little data, so a process
costs more (its start, its memory) than it saves.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from .._child import describe_exit, emit_record, spawn, wait_exit
from ..config.sources import CameraSource as CameraConfig
from ..config.sources import VideoSource as VideoConfig
from ..errors import SourceError
from ..frames import Frame
from ..health import Health
from .base import Source, SourceStats
from .camera import check_config, redact
from .files import VideoSource
from .capture_child import FRAME
from .framering import DEFAULT_RING_BYTES, Layout, RingReader
from .packets import PacketRing

__all__ = ["CaptureStats", "ProcessSource"]

logger = logging.getLogger("edgeinfer.sources.camera")

RESTART_INITIAL_S = 0.5
RESTART_MAX_S = 10.0
RESTART_RESET_S = 30.0  # a child that ran this long starts the backoff over when it dies
_POLL_S = 0.25
# frames received and not yet taken: a camera's older ones go, a file's receiver waits
_MAX_PENDING = 4
_OPEN_MARGIN_S = 10.0  # beyond open_timeout_s: the child's start, the probe of a silent camera
_COUNTED = ("skipped", "corrupt", "reconnects", "retries", "errors")


@dataclasses.dataclass(slots=True)
class CaptureStats(SourceStats):
    """``SourceStats`` summed over the capture processes, with what only the child knows
    (``main_stream`` of a substream camera) and the process and ring (``capture``)."""

    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    capture: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = SourceStats.to_dict(self)
        d.update(self.extra)
        d["capture"] = dict(self.capture)
        return d


class ProcessSource(Source):
    """A ``camera`` source whose reading runs in a capture process (see the module).

    Args:
        config: The ``camera`` source config.
        reader: ``pyav`` or ``opencv``: which source class the child runs.
        ring_bytes: The shared-memory ring's budget (at least ``framering.MIN_SLOTS`` frames).
        **context: Ignored (what other sources need).
    """

    live = True

    def __init__(self, config: CameraConfig | VideoConfig, reader: str, *,
                 ring_bytes: int = DEFAULT_RING_BYTES, **context: Any) -> None:
        super().__init__(config)
        # a video file waits for the pipeline (nothing skipped), a camera does not
        self.live = reader != "video"
        self._what = "camera" if self.live else "video"
        self._name = redact(config.uri) if self.live else str(config.uri)
        self._reader = reader
        self._ring_bytes = ring_bytes
        self.stats: CaptureStats = CaptureStats()
        # the recorder asks for packets (``keep``) before the pipeline starts the source
        self.packets = PacketRing() if reader == "pyav" else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._ring: RingReader | None = None
        self._memfd = -1
        self._base = dict.fromkeys(_COUNTED, 0)  # counters of the children that ended
        self._own = dict.fromkeys(_COUNTED, 0)  # this side's: deaths (errors), restarts
        self._child: dict[str, Any] = {}  # the running child's last stats
        self._health: Health | None = Health("starting", f"starting the capture process of "
                                                         f"{self._what} {self._name}")
        self._waiting = False
        self._full = 0
        self._full_base = 0
        self._restarts = 0
        self._restarts_in_row = 0
        self._down: tuple[str, float] | None = None  # why the child is gone, when it is retried
        self._started_at = 0.0
        self._last_exit = ""
        # The child starts now, while the rest of the pipeline is built (its imports overlap),
        # and waits for ``_open``; a source dropped unstarted takes its child along.
        self._cond = threading.Condition()
        self._pending: collections.deque[Frame] = collections.deque()
        self._late = 0  # frames let go because nobody took them (``_MAX_PENDING``)
        self._index_base = 0  # added to a restarted child's frame indexes
        self._next_index = 0
        self._receiver: threading.Thread | None = None
        self._opened = False  # the child made its first attempt to open the camera
        self._finished = False  # the receiver ended: the stream ended, failed or was stopped
        self._error: str | None = None  # why the camera gave up (raised to the reader)
        self._procs: list[subprocess.Popen[bytes] | None] = [None]
        weakref.finalize(self, _reap, self._procs)
        self._start_child()

    @property
    def name(self) -> str:
        return self._name

    @property
    def reader(self) -> str:
        """``pyav`` or ``opencv``: the source class the capture process runs."""
        return self._reader

    @property
    def pid(self) -> int | None:
        """The capture process's pid (``None`` while none runs)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def waiting(self) -> bool:
        return (self._down is not None or self._waiting) and not self.stopped

    def health(self) -> Health | None:
        down = self._down
        if down is not None:
            return Health("reconnecting", down[0], self.stats.retries, down[1])
        return self._health

    def stop(self) -> None:
        super().stop()
        self._tell(("stop",))
        with self._cond:
            self._cond.notify_all()

    # -- the child ------------------------------------------------------------------------------
    def _open(self) -> None:
        if self._reader == "opencv":
            check_config(self.config)  # a config that cannot work here fails at start
        if self._proc is None:
            self._start_child()
        self._tell(("open", self.packets is not None and self.packets.wanted))
        self._receiver = threading.Thread(target=self._receive, daemon=True,
                                          name="edgeinfer-capture-receive")
        self._receiver.start()
        # As entering the in-process source does: wait for the first attempt to open the camera,
        # so health and stats say how it went; a config its reader refuses raises here.
        deadline = (time.monotonic() + getattr(self.config, "open_timeout_s", 0.0)
                    + _OPEN_MARGIN_S)
        with self._cond:
            while not (self._opened or self._finished or self._down or self.stopped) \
                    and time.monotonic() < deadline:
                self._cond.wait(_POLL_S)
        if self._error is not None and not self._opened:
            raise SourceError(self._error)

    def _start_child(self) -> None:
        self._memfd = os.memfd_create(f"edgeinfer-capture-{os.getpid()}")
        try:
            self._proc, self._conn = spawn("edgeinfer.sources.capture_child",
                                           extra_fds=(self._memfd,))
        except OSError as exc:
            os.close(self._memfd)
            self._memfd = -1
            self._proc = self._conn = None
            raise SourceError(f"camera {self._name}: cannot start its capture process: "
                              f"{exc}") from exc
        self._ring = RingReader(self._memfd)
        self._started_at = time.monotonic()
        self._child = {}
        self._update_capture()
        self._procs[:] = [self._proc]
        init = {"config": self.config, "reader": self._reader, "ring_bytes": self._ring_bytes,
                "log_level": logging.getLogger("edgeinfer").getEffectiveLevel()}
        self._tell(list(sys.path))
        self._tell(init)

    def _tell(self, message: Any) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            with self._send_lock:
                conn.send_bytes(pickle.dumps(message))
        except OSError:
            pass  # the child is gone: the receiver sees it

    def _end_child(self, timeout: float) -> int | None:
        """Close this side of the child and wait for it; its exit code (``None``: none ran)."""
        proc, conn, ring = self._proc, self._conn, self._ring
        self._proc = self._conn = self._ring = None
        if conn is not None:
            conn.close()
        if ring is not None:
            ring.close()
        if self._memfd >= 0:
            os.close(self._memfd)  # frames still held keep their own map of it
            self._memfd = -1
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        return wait_exit(proc)

    def _close(self) -> None:
        self._stop.set()  # left: not read again
        self._tell(("stop",))
        receiver = self._receiver
        if receiver is not None and receiver is not threading.current_thread():
            receiver.join(5.0)
        self._end_child(3.0)

    # -- reading --------------------------------------------------------------------------------
    def _frames(self) -> Iterator[Frame]:
        cond, pending = self._cond, self._pending
        while True:
            with cond:
                while not pending and not self._finished and not self.stopped:
                    cond.wait(_POLL_S)
                if not pending:
                    break
                frame = pending.popleft()
                cond.notify_all()  # the receiver of a file may wait for room
            self.stats.frames += 1
            yield frame
        if self._error is not None and not self.stopped:
            raise SourceError(self._error)

    def _receive(self) -> None:
        """The receiver thread: frames into ``_pending``, the rest handled as it comes (stats,
        packets, logs), whether or not anyone is iterating; a dead child restarted."""
        try:
            while not self.stopped:
                conn, ring = self._conn, self._ring
                if conn is None or ring is None:
                    if not self._restart():
                        return
                    continue
                try:
                    if not conn.poll(_POLL_S):
                        if self._proc is not None and self._proc.poll() is not None:
                            raise EOFError
                        continue
                    message = conn.recv_bytes()
                except (EOFError, OSError):
                    if not self.stopped and not self._died():
                        return
                    continue
                if message[:1] == b"F":
                    self._arrived(message, ring)
                elif self._message(pickle.loads(message), ring):
                    return
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def _arrived(self, message: bytes, ring: RingReader) -> None:
        (_, slot, region, index, ts, wall, start, ndim, h, w, c, dw, dh) = FRAME.unpack(message)
        layout = ring.layout
        if layout is None or layout.offset != region:
            return  # a region never announced: not a frame of ours
        try:
            data = ring.frame(slot, (h, w, c)[:ndim])
        except ValueError as exc:
            self.stats.corrupt += 1
            self.stats.last_error = f"camera {self._name}: {exc}"
            return
        index += self._index_base  # counting on across restarts, as across reconnects
        self._next_index = index + 1
        frame = Frame(index, ts, wall, data, "image", start=None if start != start else start,
                      display=(dw, dh) if dw else None)
        with self._cond:
            pending = self._pending
            if not self.live:  # a file waits for the pipeline: the child, for a free slot
                while len(pending) >= _MAX_PENDING and not self.stopped:
                    self._cond.wait(_POLL_S)
            pending.append(frame)
            if self.live and len(pending) > _MAX_PENDING:  # nobody reads: keep the newest
                pending.popleft()
                self._late += 1
            self._cond.notify()

    def _message(self, message: tuple[Any, ...], ring: RingReader) -> bool:
        """Handle a message other than a frame; ``True``: the stream ended."""
        kind = message[0]
        if kind == "stats":
            _, stats, health, waiting, full = message
            self._child = stats
            self._health = Health(**health) if health is not None else None
            self._waiting = bool(waiting)
            self._full = full
            self._update()
        elif kind == "packet":
            if self.packets is not None:
                self.packets.push(*message[1:])
        elif kind == "reset":
            if self.packets is not None:
                self.packets.reset(message[1])
        elif kind == "layout":
            ring.adopt(Layout(*message[1:]))
            self._update_capture()
        elif kind == "log":
            emit_record(message[1])
        elif kind == "opened":
            with self._cond:
                self._opened = True
                self._cond.notify_all()
        elif kind in ("error", "end"):
            self._error = message[1] if kind == "error" else None
            self._end_child(3.0)
            return True
        return False

    def _died(self) -> bool:
        """The child is gone without saying why: restart it after a backoff (a camera), or
        end the stream with the reason (a file: read again from the start, its frames would
        come twice)."""
        ran = time.monotonic() - self._started_at
        code = self._end_child(5.0)
        self._fold()
        self._index_base = self._next_index
        if not self.live:
            how = describe_exit(code if code is not None else -1)
            self._error = f"video {self._name}: its capture process {how}"
            return False
        if ran >= RESTART_RESET_S:
            self._restarts_in_row = 0
        self._restarts_in_row += 1
        delay = min(RESTART_MAX_S, RESTART_INITIAL_S * 2 ** (self._restarts_in_row - 1))
        how = describe_exit(code if code is not None else -1)
        self._last_exit = how
        reason = (f"the capture process of camera {self._name} {how}; restarting it in "
                  f"{delay:.1f} s")
        logger.warning("camera %s: capture process %s after %.1f s; restarting in %.1f s "
                       "(restart %d)", self._name, how, ran, delay, self._restarts + 1)
        self._own["errors"] += 1
        with self._cond:
            self._down = (reason, time.time() + delay)
            self._cond.notify_all()
        self._update()
        self.stats.last_error = reason
        return True

    def _restart(self) -> bool:
        """Wait out the backoff and start a new child; ``False``: stopped meanwhile."""
        down = self._down
        if down is not None and self._stop.wait(max(0.0, down[1] - time.time())):
            return False
        self._restarts += 1
        self._own["retries"] += 1
        try:
            self._start_child()
        except SourceError as exc:
            logger.warning("%s", exc)
            self._down = (str(exc), time.time() + RESTART_MAX_S)
            return not self.stopped
        self._tell(("open", self.packets is not None and self.packets.wanted))
        self._down = None
        self._health = Health("starting", f"restarted the capture process of camera "
                                          f"{self._name} (its last {self._last_exit})")
        return True

    def _fold(self) -> None:
        """The ended child's counters join the totals."""
        for key in _COUNTED:
            self._base[key] += int(self._child.get(key, 0))
        self._full_base += self._full
        self._child, self._full = {}, 0

    def _update(self) -> None:
        stats, child = self.stats, self._child
        for key in _COUNTED:
            setattr(stats, key, self._base[key] + self._own[key] + int(child.get(key, 0)))
        if child.get("last_error"):
            stats.last_error = child["last_error"]
        extra = {k: v for k, v in child.items() if k not in SourceStats.__slots__}
        main = extra.get("main_stream")
        if isinstance(main, dict) and self.packets is not None:
            extra["main_stream"] = {**main, "packets": self.packets.stats()}
        stats.extra = extra
        self._update_capture()

    def _update_capture(self) -> None:
        ring = self._ring
        layout = ring.layout if ring is not None else None
        self.stats.capture = {
            "isolation": "process", "pid": self.pid, "restarts": self._restarts,
            "last_exit": self._last_exit or None,
            "ring": {"slots": layout.slots if layout else None,
                     "slot_bytes": layout.slot_bytes if layout else None,
                     "copied": ring.copied if ring is not None else 0,
                     "late": self._late,
                     "full": self._full_base + self._full}}


def _reap(procs: list[subprocess.Popen[bytes] | None]) -> None:
    """A source garbage collected with its child running (built, never started or closed)."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def open_video(config: VideoConfig, **context: Any) -> Source:
    """The source for a ``video`` config: read ahead in a capture process with ``isolation:
    process``, else (``auto``, ``thread``) in the pipeline's thread."""
    if config.isolation == "process":
        return ProcessSource(config, "video", **context)
    return VideoSource(config, **context)

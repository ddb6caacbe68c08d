"""Snapshots and clips of scene events (``record:`` on a detect pipeline).

The pipeline's emit thread offers every frame; frames are kept at ``clips.fps`` (on the scene
clock) and handed, by reference, to an encoder thread through a small drop-oldest queue. The
encoder scales each kept frame to ``clips.max_width`` and JPEG-encodes it once; the encoded
frame then lives in a ring buffer of ``pre_s`` seconds, in the clips still collecting frames,
and as the best-scoring frame of each live track. Every encoded frame is counted once however
many of these hold it, and the total is kept under ``buffer_mb`` by dropping the oldest.

An event gets a snapshot and a clip (``pre_s`` before to ``post_s`` after the event); events
that arrive while a clip collects its post-roll join it. The snapshot shows, with
``snapshot: event``, the event's own frame: ``on_event`` comes before the frame's ``offer``,
which then keeps that frame whatever ``clips.fps`` says, and the encoder never drops it for
lagging (up to ``_PINNED`` such frames wait; past that the next frame encoded serves). An
``exit`` shows the last kept frame its track was seen in. With ``snapshot: best`` it is the
track's best-scoring kept frame. Snapshots have a thread of their own (``snapshots``) and are
written as soon as their frame is encoded; clips are written later by theirs (``clipwriter``),
atomically into the media folder (``media.MediaStore``: retention, free-space floor).

On Linux the threads lower their own priority (the encoder's and the snapshot writer's nice
value by 5, the clip writer's by 10, relative to the thread that started them) so that media
work yields the CPU to inference on a 2- or 4-core board; encoding a VP8 clip takes tens of
milliseconds a frame.

A camera that keeps its own packets (``use_packets``: RTSP H.264/H.265 through PyAV) gets its
clips cut from them instead (``clips.remux``): the packets from the keyframe at or before the
pre-roll's start to the post-roll's end, remuxed into MP4 without decoding or encoding, at the
camera's resolution and frame rate, with nothing drawn. Snapshots still come from the decoded
frames (a substream's, with ``detect_uri``).
"""

# Over 450 lines: the emit thread's hand-off and the encoder thread share one lock, inbox and buffer.

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..config.analytics import ClipConfig, RecordConfig
from ..errors import EdgeInferError, StateError
from ..frames import Frame
from .clips import ClipFormat, Entry, FrameBuffer, PendingClip, probe_format
from .clipwriter import ClipWriter
from .draw import Boxed, Geometry, encode_jpeg
from .media import MediaStore
from .snapshots import SNAPSHOT_KEYS, SnapJob, SnapRequest, SnapshotWriter

if TYPE_CHECKING:
    from ..sources.packets import PacketRing

__all__ = ["Recorder"]

logger = logging.getLogger(__name__)

_QUEUE = 4  # raw frames waiting for the encoder: each may be megabytes
_PINNED = 16  # event frames waiting for the encoder (never dropped for lagging, up to this)
_MAX_CLIP_S = 60.0
_STALL_S = 5.0  # no frames this long (wall time): clips waiting for post-roll are cut
_MIB = 1024 * 1024
_ENCODER_NICE = 5
_WRITER_NICE = 10
_SNAPSHOT_NICE = 5
_SNAPSHOT_GRACE_S = 10.0
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True, slots=True)
class _Event:
    seq: int  # the last frame offered before the event
    track_id: int
    snapshot: SnapRequest | None  # taken from the buffer: the best or the last frame
    kind: str  # "best" or "last" (which frame of the buffer), "frame": the next one encoded
    clip: PendingClip | None


@dataclass(slots=True)
class _Item:
    seq: int
    frame: Frame
    clock: float
    boxes: tuple[Boxed, ...]
    kept: bool  # on the clips.fps grid: goes into the ring and clips
    snaps: tuple[SnapRequest, ...] = ()  # the events this frame is the snapshot of


class Recorder:
    """Keeps encoded frames of one pipeline and writes event snapshots and clips.

    Use as a context manager, or call ``start`` and ``close``. ``offer`` and ``on_event`` are
    called from one thread (the pipeline's emit thread): an event's ``on_event`` before the
    ``offer`` of the frame it was decided in; ``snapshot`` and ``stats`` from any.

    Args:
        pipeline: The pipeline's name (for logs).
        config: The pipeline's ``record:`` section.
        directory: The pipeline's media folder (``<state>/media/<pipeline>``).
        geometry: Returns the zones and lines to draw, in pixels (called by the writer threads).
    """

    def __init__(self, pipeline: str, config: RecordConfig, directory: Path, *,
                 geometry: Callable[[], Geometry] | None = None) -> None:
        self.pipeline = pipeline
        self.config = config
        self._clip_cfg: ClipConfig = config.clips or ClipConfig(pre_s=0.0)
        self._store = MediaStore(Path(directory), config.retention)
        self._geometry = geometry
        self._events = frozenset(config.events)
        self._period = 1.0 / self._clip_cfg.fps
        self._pre = self._clip_cfg.pre_s if config.clips is not None else 0.0
        self._on = config.snapshots or config.clips is not None
        self._own_frame = config.snapshot == "event"
        self._format: ClipFormat | None = None
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._inbox: deque[_Item] = deque()
        self._pending_events: deque[_Event] = deque()
        self._wanted: list[SnapRequest] = []  # events of the frame about to be offered
        self._snaps = SnapshotWriter(pipeline, self._store, self._clip_cfg.quality, self._scene,
                                     self._release, self._count,
                                     functools.partial(_lower_priority, _SNAPSHOT_NICE))
        self._clips = ClipWriter(pipeline, self._store, self._clip_cfg.fps,
                                 config.retention.min_free_mb, self._scene, self._release_all,
                                 self._count, functools.partial(_lower_priority, _WRITER_NICE),
                                 self._spent)
        self._ring: PacketRing | None = None
        self._cpu = {"remux": 0.0, "encode": 0.0}
        self._buf = FrameBuffer(self._pre, self._period, self._clip_cfg.buffer_mb * _MIB)
        self._open: PendingClip | None = None
        self._threads: list[threading.Thread] = []
        self._deferred: list[_Event] = []  # snapshots waiting for a frame to be encoded
        self._state = "new"
        self._seq = 0
        self._due = float("-inf")  # next clock to keep, minus a small tolerance
        self._last_kept = float("-inf")
        self._last_entry = time.monotonic()
        self._in_flight = 0
        self._n = dict.fromkeys(("kept", "encoded", "dropped_queue", "errors",
                                 "clips_written", "clips_missed", "snapshots_written",
                                 "snapshots_missed", "clips_remuxed"), 0)

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def use_packets(self, ring: PacketRing) -> None:
        """Cut clips from the camera's own packets (``clips.remux``), asking ``ring`` to keep
        the pre-roll (whole GOPs) within ``clips.buffer_mb``. Call before ``start``."""
        cfg = self.config.clips
        if cfg is None or not cfg.remux:
            return
        self._ring = self._clips.ring = ring
        ring.keep(cfg.pre_s, int(cfg.buffer_mb * _MIB))

    def start(self) -> None:
        """Prepare the media folder (retention), pick the clip format and start the threads.

        Raises:
            StateError: Started twice, or after ``close``.
        """
        if self._state != "new":
            raise StateError(f"recorder of {self.pipeline} is {self._state}; start it once")
        self._store.prepare()
        if self.config.clips is not None:
            self._format = probe_format(self.config.clips.format)
            if self._format is None:
                logger.warning("pipeline %s: OpenCV cannot write any clip format; events get "
                               "no clips", self.pipeline)
            else:
                logger.info("pipeline %s: event clips as %s", self.pipeline, self._format.name)
        encoder = threading.Thread(target=self._encode_loop, name=f"rec-enc-{self.pipeline}",
                                   daemon=True)
        self._threads = [encoder, self._clips.thread]
        self._state = "running"
        encoder.start()
        self._clips.start(self._format)
        self._snaps.start()

    def offer(self, frame: Frame, clock: float, boxes: Sequence[Boxed]) -> None:
        """Offer a processed frame (every one) at scene ``clock`` seconds with its boxes.

        Frames are kept at ``clips.fps``, and so is every frame an event was just decided in
        (``snapshot: event``); a kept frame is queued by reference for the encoder (the oldest
        queued one is dropped when the encoder lags, an event's frame only past ``_PINNED``).
        Others return at once.
        """
        if self._last_kept <= clock < self._due and not self._wanted:
            return
        if not self._on or self._state != "running":
            return
        wanted = self._wanted
        kept = not (self._last_kept <= clock < self._due)
        if kept:
            due = self._due + self._period * 1.05  # undo the tolerance, step one period
            if clock >= due or clock < self._last_kept:  # late, or the clock went back (a loop)
                due = clock + self._period
            self._due = due - self._period * 0.05
            self._last_kept = clock
        with self._cv:
            if wanted:
                self._wanted = []
            if len(self._inbox) >= _QUEUE:
                self._drop_one()
            self._seq += 1
            self._inbox.append(_Item(self._seq, frame, clock, tuple(boxes), kept, tuple(wanted)))
            self._n["kept"] += 1
            self._cv.notify()

    def on_event(self, event_id: str, event_type: str, track_id: int, clock: float,
                 event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start the media of event ``event_id``; the files are written in the background.

        Args:
            event_id: The event's id (the files' stem).
            event_type: ``enter``, ``exit``, ``cross`` or ``loiter``.
            track_id: The event's track.
            clock: The scene clock of the event's frame.
            event: The event's record: the media keys are set in it (before anything is
                queued) and its snapshot keys are updated once the file is written or given
                up (``snapshots.settle``).

        Returns:
            ``event`` (or a new dict) with ``snapshot`` (``None``: not written yet),
            ``snapshot_pending`` (the absolute path it will have), ``snapshot_missing`` (why
            there is none), ``clip`` (the absolute path the clip will have) and
            ``clip_format``, ``clip_missing`` (why the clip could not be written: then
            ``clip`` is ``None`` again), ``clip_remux`` (cut from the camera's packets, not
            encoded); all ``None`` for event types not in ``record.events``.
        """
        media = event if event is not None else {}
        media.update(dict.fromkeys((*SNAPSHOT_KEYS, "clip", "clip_format", "clip_missing",
                                    "clip_remux")))
        if event_type not in self._events or self._state != "running":
            return media
        name = _safe_name(event_id)
        request = None
        if self.config.snapshots:
            path = self._store.snapshots / f"{name}.jpg"
            media["snapshot_pending"] = str(path.absolute())
            request = SnapRequest(path, track_id, media)
        own = request is not None and self._own_frame and event_type != "exit"
        with self._cv:
            clip = self._clip_for(name, track_id, clock)
            if clip is not None:
                media["clip"] = str(clip.path.absolute())
                media["clip_format"] = self._clip_format(clip)
                media["clip_remux"] = clip.remux
                clip.events.append(media)
            if own:
                assert request is not None
                self._wanted.append(request)  # the next frame offered is the event's
            kind = "last" if self._own_frame else "best"
            self._pending_events.append(
                _Event(self._seq, track_id, None if own else request, kind, clip))
            self._cv.notify()
        return media

    def snapshot(self, event_id: str) -> bytes | None:
        """The annotated JPEG of ``event_id``'s snapshot, or ``None`` if not (yet) written."""
        try:
            return (self._store.snapshots / f"{_safe_name(event_id)}.jpg").read_bytes()
        except OSError:
            return None

    @property
    def directory(self) -> Path:
        """The pipeline's media folder (``snapshots/`` and ``clips/`` under it)."""
        return Path(self._store.directory)

    def stats(self) -> dict[str, Any]:
        """Counters: frames kept, queued (or being encoded), encoded and dropped (queue, buffer),
        the ring's frames and encoded bytes, all buffered bytes, files written (``clips_remuxed``
        of them cut from the camera's packets), snapshots missed, disk use, retention and
        low-disk skips, write errors and retries, the clip format, the clip writer's CPU
        seconds for each way, and the camera's packet ring (``packets``) when clips use it."""
        with self._lock:
            s: dict[str, Any] = dict(self._n)
            buf = self._buf
            s.update(queued=len(self._inbox) + self._in_flight, ring_frames=len(buf.ring),
                     ring_bytes=sum(len(e.jpeg) for e in buf.ring), buffer_bytes=buf.bytes,
                     dropped_buffer=buf.dropped, pending_clips=len(buf.clips),
                     best_frames=buf.tracks)
        s.update(bytes_on_disk=self._store.bytes_on_disk, deleted=self._store.deleted,
                 skipped_low_disk=self._store.skipped, write_errors=self._store.errors,
                 write_retries=self._store.retries,
                 clip_format=self._format.name if self._format else None,
                 remux_cpu_s=round(self._cpu["remux"], 4),
                 encode_cpu_s=round(self._cpu["encode"], 4))
        if self._ring is not None:
            s["packets"] = self._ring.stats()
        return s

    def close(self, timeout: float = 10.0) -> None:
        """Encode what is queued, write the snapshots, write clips still waiting for post-roll
        with the frames they have, and join the threads. After ``timeout`` seconds the clip
        being written ends at its next frame and the rest are cut short too: a stop never
        waits long, and no thread is left inside OpenCV when the process exits."""
        if self._state != "running":
            self._state = "closed"
            return
        with self._cv:
            self._state = "closing"
            self._cv.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            logger.warning("pipeline %s: event clips still being written after %.0f s; cutting "
                           "them short", self.pipeline, timeout)
            self._clips.hurry.set()
            for t in self._threads:
                t.join()  # one frame's encoding at most, per clip left
        # The encoder queued its last snapshot before it ended; a snapshot retrying a file
        # that cannot be opened waits 1.5 s at most.
        if not self._snaps.close(max(1.0, deadline - time.monotonic())):
            logger.warning("pipeline %s: event snapshots still being written after %.0f s",
                           self.pipeline, timeout)
            self._snaps.close(_SNAPSHOT_GRACE_S)
        self._state = "closed"

    # -- emit thread ---------------------------------------------------------------------------

    def _clip_for(self, name: str, track_id: int, clock: float) -> PendingClip | None:
        cfg = self.config.clips
        remux = self._ring is not None and self._ring.remuxable
        if cfg is None or (self._format is None and not remux):
            return None
        c = self._open
        if c is not None and not c.done and c.start <= clock <= c.end:
            c.end = min(max(c.end, clock + cfg.post_s), c.start + _MAX_CLIP_S)
            return c
        start = clock - cfg.pre_s
        ext = "mp4" if remux or self._format is None else self._format.ext
        path = self._store.clips / f"{name}.{ext}"
        self._open = PendingClip(name, path, track_id, start,
                                 min(clock + cfg.post_s, start + _MAX_CLIP_S), remux=remux)
        if remux:
            assert self._ring is not None
            self._ring.pin(start)  # unpinned by the writer once the clip is cut
        return self._open

    def _clip_format(self, clip: PendingClip) -> str | None:
        if clip.remux:
            info = self._ring.info if self._ring is not None else None
            return f"{info.codec}/mp4" if info is not None else None
        return self._format.name if self._format is not None else None

    def _drop_one(self) -> None:
        # The oldest frame no event waits for; when events wait for all, the oldest of those
        # past _PINNED, its events then served by the next frame encoded.
        inbox = self._inbox
        for i, item in enumerate(inbox):
            if not item.snaps:
                del inbox[i]
                self._n["dropped_queue"] += 1
                return
        if len(inbox) >= _PINNED:
            item = inbox.popleft()
            self._n["dropped_queue"] += 1
            self._deferred.extend(_Event(item.seq, r.track_id, r, "frame", None)
                                  for r in item.snaps)

    # -- encoder thread ------------------------------------------------------------------------

    def _encode_loop(self) -> None:
        _lower_priority(_ENCODER_NICE)
        while True:
            with self._cv:
                while not (self._inbox or self._pending_events or self._state != "running"):
                    if not self._cv.wait(0.5) and self._buf.clips and (
                            time.monotonic() - self._last_entry > _STALL_S):
                        self._finish_clips()
                ev = item = None
                if self._pending_events and (not self._inbox
                                             or self._pending_events[0].seq < self._inbox[0].seq):
                    ev = self._pending_events.popleft()
                elif self._inbox:
                    item = self._inbox.popleft()
                    self._in_flight = 1
                else:
                    break  # closing, and nothing is left
            try:
                if ev is not None:
                    self._handle_event(ev)
                elif item is not None:
                    self._encode(item)
            except Exception as exc:  # one bad frame or event must not end recording for good
                self._count("errors")
                if self._n["errors"] == 1 or logger.isEnabledFor(logging.DEBUG):
                    logger.warning("pipeline %s: recording a frame failed", self.pipeline,
                                   exc_info=True)
                why = f"recording the event's frame failed: {type(exc).__name__}: {exc}"
                lost = item.snaps if item is not None else ()
                if ev is not None and ev.snapshot is not None:
                    lost = (ev.snapshot,)
                for request in lost:
                    self._snaps.missed(request, why)
            finally:
                self._in_flight = 0
        with self._lock:
            self._finish_clips()
            self._buf.clear()
            deferred, self._deferred = self._deferred, []
            wanted, self._wanted = self._wanted, []
        for ev in deferred:
            if ev.snapshot is not None:
                self._snaps.missed(ev.snapshot, "the recorder stopped before a frame for the "
                                                "snapshot was encoded")
        for request in wanted:
            self._snaps.missed(request, "the recorder stopped before the event's frame came")
        self._clips.finish()

    def _encode(self, item: _Item) -> None:
        frame = item.frame
        image = frame.data
        # Boxes are in frame.width's pixels; data may be a smaller copy (a substream).
        scale = image.shape[1] / frame.width if frame.display is not None else 1.0
        width = self._clip_cfg.max_width
        try:
            if width is not None and image.shape[1] > width:
                import cv2

                shrink = width / image.shape[1]
                size = (width, max(2, round(image.shape[0] * shrink)))
                image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
                scale *= shrink
            jpeg = encode_jpeg(image, self._clip_cfg.quality)
        except EdgeInferError as exc:
            self._count("errors")
            for request in item.snaps:
                self._snaps.missed(request, f"the event's frame could not be encoded: {exc}")
            return
        entry = Entry(jpeg, item.clock, frame.wall, frame.index, item.boxes, scale)
        with self._lock:
            self._n["encoded"] += 1
            for _ in item.snaps:
                self._buf.hold(entry)
            if item.kept:
                self._add(entry)
        for request in item.snaps:
            self._snaps.put(SnapJob(request, entry))

    def _add(self, entry: Entry) -> None:  # under the lock
        self._last_entry = time.monotonic()
        for clip in self._buf.add(entry):
            self._clips.put(clip)
        deferred, self._deferred = self._deferred, []
        for ev in deferred:  # their frames were dropped while the encoder lagged
            if ev.snapshot is None:
                continue
            if ev.kind == "best":
                held = self._buf.best(ev.track_id)
            else:  # the next frame encoded after the event's
                self._buf.hold(entry)
                held = entry
            if held is not None:
                self._snaps.put(SnapJob(ev.snapshot, held))

    def _handle_event(self, ev: _Event) -> None:
        why = ""
        with self._lock:
            if ev.clip is not None and not ev.clip.filled:
                self._buf.open_clip(ev.clip)
            if ev.snapshot is None:
                return
            if ev.kind == "last":
                entry = self._buf.last(ev.track_id)
                if entry is None:
                    why = (f"track #{ev.track_id} was in no kept frame still held (frames are "
                           "kept at clips.fps; the encoder may have dropped them)")
            else:
                entry = self._buf.best(ev.track_id)
                if entry is None:  # no frame kept yet (all dropped): the next one encoded serves
                    self._deferred.append(ev)
                    return
        if entry is None:
            self._snaps.missed(ev.snapshot, why)
            return
        self._snaps.put(SnapJob(ev.snapshot, entry))

    def _finish_clips(self) -> None:
        for clip in self._buf.take_clips():
            self._clips.put(clip)

    # -- writer threads ------------------------------------------------------------------------

    def _release(self, entry: Entry) -> None:
        with self._lock:
            self._buf.release(entry)

    def _release_all(self, entries: Sequence[Entry]) -> None:
        with self._lock:
            self._buf.release_all(entries)

    def _scene(self) -> Geometry:
        return self._geometry() if self._geometry is not None else ()

    def _count(self, key: str) -> None:
        with self._lock:
            self._n[key] += 1

    def _spent(self, way: str, cpu_s: float) -> None:
        with self._lock:
            self._cpu[way] += cpu_s


def _lower_priority(increment: int) -> None:
    # Linux gives each thread its own nice value, and PRIO_PROCESS with a thread id sets it;
    # elsewhere the id may name another process, so it is left alone.
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        nice = min(os.getpriority(os.PRIO_PROCESS, tid) + increment, 19)
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:  # a seccomp filter or a container policy may refuse it
        logger.debug("cannot lower the priority of thread %s: %s",
                     threading.current_thread().name, exc)


def _safe_name(event_id: str) -> str:
    name = _SAFE.sub("_", event_id)[:128]
    return name if name and not name.startswith(".") else f"_{name}"

"""Clip formats and clip writing.

``probe_format`` finds, once per process and preference, the first container and codec this
OpenCV build can both write and read back: H.264 in MP4 (``avc1``, then ``H264``), VP8 in WebM
(``VP80``), MPEG-4 Part 2 in MP4 (``mp4v``), MJPEG in AVI. Browsers (Chromium, Firefox, Home
Assistant's UI) play H.264 and VP8 but not MPEG-4 Part 2 or MJPEG in AVI, so those two come
first; the PyPI OpenCV wheels have no H.264 encoder, which makes VP8 the usual choice. VP8 costs
five to seven times what ``mp4v`` does (measured on an x86 core, JPEG decode and drawing
included: 12 ms against 2 ms per 640x480 frame, 24 against 4 ms at 1280x720), spent on the
writer thread, which runs at a lower priority than inference; ``format: mp4v`` keeps the cheap
one for weak boards.
``write_clip`` decodes a clip's stored JPEG frames, draws the scene on them and writes them with
``cv2.VideoWriter`` at the frames' real rate.
"""

from __future__ import annotations

import threading

import functools
import logging
import re
import tempfile
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._stderr import native_logs_to_debug
from ..errors import StorageError
from .draw import Boxed, Geometry, boxes_shapes, decode_jpeg, draw_scene, draw_shapes

__all__ = ["FORMATS", "ClipFormat", "Entry", "FrameBuffer", "PendingClip", "probe_format",
           "write_clip"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClipFormat:
    """A codec and container OpenCV can write.

    Attributes:
        name: What ``stats`` and events report: ``"h264/mp4"``, ``"vp8/webm"``, ``"mp4v/mp4"``,
            ``"mjpeg/avi"``.
        fourccs: FourCC codes to try, in order.
        ext: The file suffix, without the dot (it picks the container).
    """

    name: str
    fourccs: tuple[str, ...]
    ext: str


FORMATS = {
    "h264": ClipFormat("h264/mp4", ("avc1", "H264"), "mp4"),
    "vp8": ClipFormat("vp8/webm", ("VP80",), "webm"),
    "mp4v": ClipFormat("mp4v/mp4", ("mp4v",), "mp4"),
    "mjpeg": ClipFormat("mjpeg/avi", ("MJPG",), "avi"),
}
# What browsers play first (H.264, VP8), then what is cheap to write (MPEG-4 Part 2, MJPEG).
_AUTO = ("h264", "vp8", "mp4v", "mjpeg")
# FFmpeg prints to fd 2 while OpenCV tries an encoder it lacks ("[h264_v4l2m2m @ 0x...] Could
# not find a valid device"), and each time a WebM file is opened ("OpenCV: FFMPEG: tag
# 0x30385056/'VP80' is not supported ... fallback"): expected, so debug lines.
_PROBE_NOISE = re.compile(rb"^(?:\[[\w.]+ @ 0x[0-9a-f]+\]|\[ ?(?:ERROR|WARN|INFO)[^\]]*\]"
                          rb"|OpenCV: FFMPEG: )")
_MAX_TRACKS = 64
_TRACK_TTL_S = 120.0


@dataclass(slots=True, eq=False)
class Entry:
    """One kept frame, encoded: what the ring buffer, pending clips and best frames hold.

    Attributes:
        jpeg: The (possibly scaled) frame as JPEG.
        clock: The scene clock of the frame, in seconds.
        wall: ``time.time()`` when captured.
        index: The frame's index in its stream.
        boxes: The frame's boxes in original pixels.
        scale: Stored width over original width.
        holds: How many holders (ring, clips, best frames, write jobs) keep it.
    """

    jpeg: bytes
    clock: float
    wall: float
    index: int
    boxes: tuple[Boxed, ...]
    scale: float
    holds: int = 0


@dataclass(slots=True, eq=False)
class PendingClip:
    """A clip collecting frames from ``start`` to ``end`` (scene clock).

    Attributes:
        clip_id: The first event's id; the file's stem.
        path: Where the clip is written.
        track_id: The first event's track (highlighted).
        start: First clock included.
        end: Last clock included; later events extend it up to ``start + max_len``.
        frames: Collected entries, in clock order.
        filled: The ring's earlier frames were added (the encoder thread reached the event).
        done: Complete or cut short; no more events join.
        events: The records of the events in the clip, told when it cannot be written.
        remux: Cut from the camera's own packets (``PacketRing.cut``), not encoded from
            ``frames``.
    """

    clip_id: str
    path: Path
    track_id: int
    start: float
    end: float
    frames: list[Entry] = field(default_factory=list)
    filled: bool = False
    done: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    remux: bool = False


@dataclass(slots=True)
class _Best:
    score: float
    entry: Entry  # the frame the track scored highest in
    seen: float
    last: Entry  # the last frame the track was seen in


class FrameBuffer:
    """The encoded frames held in memory: a ring of the last ``pre_s`` seconds, the frames of
    clips still collecting, and the best-scoring and the last frame of each live track (at most
    64, each forgotten 2 minutes after it was last seen). A frame held by several counts once in
    ``bytes``; over ``budget`` bytes the oldest frame held anywhere is let go. Not locked: the
    recorder calls it under its own lock.

    Args:
        pre_s: Seconds of frames the ring keeps.
        period: Seconds between kept frames.
        budget: Most bytes of encoded frames held.
    """

    def __init__(self, pre_s: float, period: float, budget: float) -> None:
        self.ring: deque[Entry] = deque()
        self.clips: list[PendingClip] = []
        self.bytes = 0
        self.dropped = 0
        self._best: OrderedDict[int, _Best] = OrderedDict()
        self._horizon = pre_s + period
        self._budget = budget

    @property
    def tracks(self) -> int:
        """Tracks whose best frame is held."""
        return len(self._best)

    def add(self, entry: Entry) -> list[PendingClip]:
        """Hold a newly encoded frame; returns the clips it completes (past their end)."""
        if self.ring and entry.clock < self.ring[-1].clock:
            self.release_all(self.ring)  # a new timeline: earlier frames do not precede it
            self.ring.clear()
        self.ring.append(entry)
        self.hold(entry)
        while self.ring[0].clock < entry.clock - self._horizon:
            self.release(self.ring.popleft())
        self._update_best(entry)
        done = [c for c in self.clips if entry.clock > c.end]
        for clip in self.clips:
            if clip.start <= entry.clock <= clip.end:
                clip.frames.append(entry)
                self.hold(entry)
        for clip in done:
            self.clips.remove(clip)
            clip.done = True
        self._fit_budget()
        return done

    def open_clip(self, clip: PendingClip) -> None:
        """Start collecting ``clip`` with the ring's frames in its span."""
        clip.filled = True
        clip.frames = [e for e in self.ring if clip.start <= e.clock <= clip.end]
        for e in clip.frames:
            self.hold(e)
        self.clips.append(clip)

    def take_clips(self) -> list[PendingClip]:
        """Every clip still collecting, marked done and no longer collected."""
        done, self.clips = self.clips, []
        for clip in done:
            clip.done = True
        return done

    def best(self, track_id: int) -> Entry | None:
        """The best frame of ``track_id`` (else the newest frame), held for the caller."""
        best = self._best.get(track_id)
        entry = best.entry if best is not None else (self.ring[-1] if self.ring else None)
        if entry is not None:
            self.hold(entry)
        return entry

    def last(self, track_id: int) -> Entry | None:
        """The last frame ``track_id`` was seen in (``None``: none is held), held for the
        caller."""
        best = self._best.get(track_id)
        if best is None:
            return None
        self.hold(best.last)
        return best.last

    def clear(self) -> None:
        """Let go of the ring and the tracks' frames."""
        self.release_all(self.ring)
        self.ring.clear()
        while self._best:
            self._forget(next(iter(self._best)))

    def hold(self, entry: Entry) -> None:
        """Count one more holder of ``entry``."""
        entry.holds += 1
        if entry.holds == 1:
            self.bytes += len(entry.jpeg)

    def release(self, entry: Entry) -> None:
        """Count one holder less; the last one frees its bytes."""
        entry.holds -= 1
        if entry.holds == 0:
            self.bytes -= len(entry.jpeg)

    def release_all(self, entries: Sequence[Entry]) -> None:
        """``release`` each of ``entries``."""
        for e in entries:
            self.release(e)

    def _update_best(self, entry: Entry) -> None:
        for b in entry.boxes:
            if b.track_id is None:
                continue
            best = self._best.get(b.track_id)
            if best is None:
                self.hold(entry)
                self.hold(entry)
                best = self._best[b.track_id] = _Best(b.score, entry, entry.clock, entry)
            else:
                if b.score > best.score:
                    self.hold(entry)
                    self.release(best.entry)
                    best.score, best.entry = b.score, entry
                if best.last is not entry:
                    self.hold(entry)
                    self.release(best.last)
                    best.last = entry
            best.seen = entry.clock
            self._best.move_to_end(b.track_id)
        while self._best and (len(self._best) > _MAX_TRACKS or next(iter(
                self._best.values())).seen < entry.clock - _TRACK_TTL_S):
            self._forget(next(iter(self._best)))

    def _forget(self, track_id: int) -> None:
        best = self._best.pop(track_id)
        self.release(best.entry)
        self.release(best.last)

    def _fit_budget(self) -> None:
        while self.bytes > self._budget:
            # The oldest frame held anywhere goes first: the ring's, a clip's or a track's.
            oldest: tuple[float, Callable[[], object]] | None = None
            if self.ring:
                oldest = (self.ring[0].clock, self._pop_ring)
            for clip in self.clips:
                if clip.frames and (oldest is None or clip.frames[0].clock < oldest[0]):
                    oldest = (clip.frames[0].clock, functools.partial(self._pop_clip, clip))
            for tid, best in self._best.items():
                if oldest is None or best.entry.clock < oldest[0]:
                    oldest = (best.entry.clock, functools.partial(self._forget, tid))
            if oldest is None:
                return  # only frames being written are left
            oldest[1]()
            self.dropped += 1

    def _pop_ring(self) -> None:
        self.release(self.ring.popleft())

    def _pop_clip(self, clip: PendingClip) -> None:
        self.release(clip.frames.pop(0))


@functools.cache
def probe_format(preference: str = "auto") -> ClipFormat | None:
    """The first format of ``preference`` (``auto``: H.264, VP8, MPEG-4 Part 2, MJPEG) whose
    test file OpenCV writes and reads back, or ``None`` when none works; cached per process.

    An explicit preference that does not work falls back to ``auto`` with a warning.
    """
    names = _AUTO if preference == "auto" else (preference,)
    with tempfile.TemporaryDirectory(prefix="edgeinfer-codec-") as tmp:
        for name in names:
            fmt = FORMATS[name]
            for fourcc in fmt.fourccs:
                if _try(Path(tmp) / f"probe-{fourcc}.{fmt.ext}", fourcc):
                    return ClipFormat(fmt.name, (fourcc,), fmt.ext)
    if preference != "auto":
        logger.warning("clip format %s cannot be written by this OpenCV build; trying others",
                       preference)
        return probe_format("auto")
    return None


def _try(path: Path, fourcc: str) -> bool:
    import cv2

    size, count = (64, 48), 3
    with native_logs_to_debug(_PROBE_NOISE):
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*fourcc), 10.0, size)
        try:
            if not writer.isOpened():
                return False
            for i in range(count):
                writer.write(np.full((size[1], size[0], 3), 60 * i, np.uint8))
        finally:
            writer.release()
        if not path.is_file():
            return False
        cap = cv2.VideoCapture(str(path))
        try:
            read = 0
            while read < count and cap.read()[0]:
                read += 1
        finally:
            cap.release()
    return read == count


def write_clip(path: Path, fmt: ClipFormat, frames: Sequence[Entry], geometry: Geometry,
               highlight: int | None, fallback_fps: float,
               stop: threading.Event | None = None) -> float:
    """Write ``frames`` (annotated) to ``path`` as ``fmt``; returns the frame rate used. When
    ``stop`` is set, the clip ends at the next frame (shorter, still a valid file): a shutdown
    never waits for a long clip.

    The rate is the frames' real one (their count over the clock span), so the clip lasts as
    long as the scene did; a single frame gets ``fallback_fps``. Frames whose size differs from
    the first (or is odd, which MPEG codecs refuse) are resized to the first's even size.

    Raises:
        StorageError: OpenCV cannot open the file for writing.
    """
    import cv2

    span = frames[-1].clock - frames[0].clock
    fps = (len(frames) - 1) / span if len(frames) > 1 and span > 0 else fallback_fps
    writer: cv2.VideoWriter | None = None
    size = (0, 0)
    try:
        for e in frames:
            if stop is not None and stop.is_set() and writer is not None:
                break
            image = decode_jpeg(e.jpeg)
            draw_shapes(image, boxes_shapes(e.boxes), e.scale)  # under the boxes
            draw_scene(image, e.boxes, geometry, scale=e.scale, highlight=highlight)
            if writer is None:
                size = (image.shape[1] & ~1, image.shape[0] & ~1)
                with native_logs_to_debug(_PROBE_NOISE):  # VP8's "tag ... not supported"
                    writer = cv2.VideoWriter(str(path),
                                             cv2.VideoWriter.fourcc(*fmt.fourccs[0]), fps, size)
                if not writer.isOpened():
                    raise StorageError(f"OpenCV cannot write clip {path} as {fmt.name}")
            if (image.shape[1], image.shape[0]) != size:
                image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
            writer.write(image)
    finally:
        if writer is not None:
            writer.release()
    return fps

"""A stream's packets into whole pictures: every slice of a picture goes to the decoder in one
packet, and a picture that did not decode whole is counted ``corrupt``, never handed on.

Why: many cameras send each H.264/H.265 picture in several slices and repeat their parameter
sets (SPS/PPS) before every slice of a keyframe. FFmpeg's RTSP demuxer runs its parser, which
(rightly, by the standard's rules) starts a new access unit at a parameter set, so such a
keyframe comes out as one packet per slice. Decoded packet by packet, each slice is a picture
of its own, the rest of it concealed (flat green); the last one, a keyframe missing its top,
becomes the reference of every P-frame up to the next keyframe, so the top of the picture
stays green for a whole GOP. ``Pictures`` joins a packet whose first slice does not start at
the picture's first macroblock (H.264 ``first_mb_in_slice``, H.265
``first_slice_segment_in_pic_flag``) to the packet before it. To join without adding delay
to every frame, only keyframes wait for the next packet (that is where parameter sets are
repeated); once a stream has split a picture that was not a keyframe, every picture waits.

Broken pictures: the decoder runs in one thread, so FFmpeg's error concealment runs and marks
a picture with slices missing or damaged (``frame.is_corrupt``; slice threading turns both
off, and conceals with garbage). Such a picture, a packet the decoder refuses, and every
picture after one (predicted from it) until the next whole keyframe are counted on
``stats.corrupt`` and not handed on. ``reason`` says what happened, in words, with the fix.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import av

from .base import SourceStats
from .decoders import PROBE_PACKETS

__all__ = ["Pictures"]

logger = logging.getLogger("edgeinfer.sources.camera")

_HEAD = 1024  # bytes looked at for a packet's first slice before the whole packet is
_REMIND_S = 60.0  # broken pictures are logged again at most this often
_START = (b"\0\0\1", b"\0\0\0\1")
if TYPE_CHECKING:
    _Packet = av.Packet[Any]


class Pictures:
    """Decodes one connection's packets (a new connection: a new ``Pictures``).

    Args:
        ctx: The stream's decoder (not yet opened: its threading is set here).
        hardware: A hardware decoder that opened, and what it is (``decoders.py``): on trial
            until its first picture; ``ctx`` decodes if it fails.
        stats: Where broken pictures are counted (``corrupt``, ``last_error``).
        name: The camera's name (password masked), for messages.
    """

    __slots__ = ("_broken", "_codec", "_ctx", "_held", "_hold_all", "_last_pts", "_name",
                 "_software", "_stats", "_told", "_told_count", "_trial", "_trial_name",
                 "decoder", "fell_back", "reason", "since")

    def __init__(self, ctx: av.VideoCodecContext, stats: SourceStats, name: str, *,
                 hardware: tuple[av.VideoCodecContext, str] | None = None) -> None:
        self._software = ctx
        # On trial (``decoders.py``): the hardware decoder's packets are kept until it gives a
        # picture, to be decoded again in software if it gives none or fails.
        self._trial: list[_Packet] | None = None
        self._trial_name = ""  # the hardware decoder's FFmpeg name, while on trial
        self.decoder = f"{ctx.name} (software)"  # what decodes, for stats
        self.fell_back = False  # a hardware decoder failed its trial: software decodes
        if hardware is not None:
            self._trial = []
            self._trial_name = hardware[1].partition(" ")[0]  # "h264_v4l2m2m (V4L2 M2M, ...)"
            self.decoder = hardware[1]
        if not ctx.is_open:
            # Slice threading turns FFmpeg's error concealment (and its corrupt flag) off; one
            # thread costs no more CPU per frame (frame threads: +8 %, and a frame of delay per
            # thread), and a camera with one slice per picture never used the other threads.
            ctx.thread_count = 1
        self._ctx = hardware[0] if hardware is not None else ctx
        self._codec = ctx.name if ctx.name in ("h264", "hevc") else ""
        self._stats, self._name = stats, name
        self._held: _Packet | None = None
        self._hold_all = False
        self._last_pts: int | None = None  # of the last packet decoded
        self._broken = False  # a picture since the last whole keyframe was broken
        self._told = 0.0
        self._told_count = 0
        self.reason = ""  # why the last broken picture was not handed on ("": none yet)
        self.since: float | None = None  # time.monotonic() of the last broken picture

    def decode(self, packet: _Packet) -> Iterator[av.VideoFrame]:
        """The whole pictures ``packet`` completes (none while a keyframe waits for the
        packet after it)."""
        if not self._codec:
            yield from self._decode(packet)
            return
        starts = _starts_picture(packet, self._codec)
        held = self._held
        if held is not None:
            if starts is False and held.pts in (packet.pts, None):  # the held picture's next
                self._held = _join(held, packet)  # slices (None: a stream's first packet)
                return
            self._held = None
            yield from self._decode(held)
        elif starts is False and packet.pts == self._last_pts:
            # Its picture went to the decoder without these slices (it was not held), was
            # concealed and counted; alone they would make another broken picture. From now
            # on every picture waits for the packet after it. (Another pts: the first slices
            # were lost, and the decoder conceals them.)
            if not self._hold_all:
                self._hold_all = True
                logger.info("camera %s: the stream splits pictures into several packets: each "
                            "picture now waits for the next packet before it is decoded (one "
                            "frame of delay)", self._name)
            return
        if starts is not False and (packet.is_keyframe or self._hold_all):
            self._held = packet
            return
        yield from self._decode(packet)

    def flush(self) -> Iterator[av.VideoFrame]:
        """The held picture, at the end of a stream."""
        held, self._held = self._held, None
        if held is not None:
            yield from self._decode(held)

    def _decode(self, packet: _Packet) -> Iterator[av.VideoFrame]:
        self._last_pts = packet.pts
        if self._trial is not None:
            yield from self._try(packet)
            return
        try:
            frames = self._ctx.decode(packet)
        except av.error.FFmpegError as exc:
            self._bad(f"the decoder refused a packet ({exc.strerror})")
            return
        yield from self._whole(frames)

    def _try(self, packet: _Packet) -> Iterator[av.VideoFrame]:
        """A hardware decoder on trial: its first whole picture ends the trial; an error, or
        no picture after ``PROBE_PACKETS``, hands the packets so far to the software decoder."""
        trial = self._trial
        assert trial is not None
        trial.append(packet)
        why = ""
        try:
            frames = [f for f in self._ctx.decode(packet)
                      if not f.is_corrupt and f.width > 0 and f.height > 0]
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            frames, why = [], f"it refused a packet ({exc})"
        if frames:
            self._trial = None
            logger.info("camera %s: decoding with %s: its first picture decoded", self._name,
                        self.decoder)
            yield from self._whole(frames)
            return
        if not why and len(trial) < PROBE_PACKETS:
            return
        why = why or f"no picture after {len(trial)} packets"
        logger.warning("camera %s: %s opened but did not decode the stream (%s); decoding in "
                       "software (FFmpeg's %s)", self._name, self.decoder, why,
                       self._software.name)
        self._trial = None
        self._ctx = self._software
        self.fell_back = True
        self.decoder = f"{self._software.name} (software; {self._trial_name} failed: {why})"
        for held in trial:
            yield from self._decode(held)

    def _whole(self, frames: Any) -> Iterator[av.VideoFrame]:
        for frame in frames:
            if frame.is_corrupt:
                self._bad("a picture arrived with slices missing or damaged (FFmpeg concealed "
                          "them)")
            elif self._broken and not frame.key_frame:
                self._bad(None)  # predicted from a broken picture: the same reason
            else:
                self._broken = False
                yield frame

    def _bad(self, what: str | None) -> None:
        stats = self._stats
        stats.corrupt += 1
        self._broken = True
        now = time.monotonic()
        self.since = now
        if what is None:
            return
        self.reason = (f"{what}; broken pictures are counted corrupt and not detected on, up to "
                       "the next keyframe: check the camera's network link, use transport: tcp "
                       "(UDP loses packets), or a shorter keyframe interval on the camera")
        stats.last_error = f"{self._name}: {self.reason}"
        if now - self._told >= _REMIND_S:
            logger.warning("camera %s: %s (%d corrupt so far, %d since the last warning)",
                           self._name, self.reason, stats.corrupt,
                           stats.corrupt - self._told_count)
            self._told, self._told_count = now, stats.corrupt


def _starts_picture(packet: _Packet, codec: str) -> bool | None:
    """Whether ``packet``'s first slice starts its picture (``False``: it continues the one
    before); ``None`` when the packet has no slice or is not Annex B (start codes)."""
    view = memoryview(packet)
    head = bytes(view[:_HEAD])
    if not head.startswith(_START):
        return None  # length-prefixed (a file's packets): a demuxer that gives whole pictures
    found = _first_slice(head, codec)
    if found is None and len(view) > _HEAD:  # parameter sets and SEI longer than the head
        found = _first_slice(bytes(view), codec)
    return found


def _first_slice(data: bytes, codec: str) -> bool | None:
    i = data.find(b"\0\0\1")
    while 0 <= i < len(data) - 5:
        if codec == "h264":
            kind = data[i + 3] & 0x1F
            if 1 <= kind <= 5:  # a slice: first_mb_in_slice is ue(v), 0 iff its first bit is 1
                return bool(data[i + 4] & 0x80)
        else:
            kind = (data[i + 3] >> 1) & 0x3F
            if kind < 32:  # a slice segment: first_slice_segment_in_pic_flag
                return bool(data[i + 5] & 0x80)
        i = data.find(b"\0\0\1", i + 3)
    return None


def _join(first: _Packet, more: _Packet) -> _Packet:
    """One packet with both packets' bytes (a split picture: copied once)."""
    joined = av.Packet(bytes(first) + bytes(more))
    joined.pts = first.pts if first.pts is not None else more.pts
    joined.dts = first.dts if first.dts is not None else more.dts
    joined.time_base = first.time_base
    joined.is_keyframe = first.is_keyframe or more.is_keyframe
    return joined

"""A camera's own encoded packets, kept for event clips cut without decoding or encoding.

A live source that demuxes a compressed stream (``sources/rtsp.py``: H.264 or H.265 over RTSP
through PyAV) pushes every packet here with its clock: the ``Frame.ts`` convention
(``time.monotonic()`` seconds), mapped from the packet's pts so a frame and its packet carry the
same clock. The ring holds nothing until someone says how much it needs (``keep``: the recorder
asks for its pre-roll when the pipeline is built); then it holds whole GOPs (a keyframe and what
follows it) covering at least that many seconds, under a byte budget, and more while a clip
waits for its post-roll (``pin``).

Every bound holds in constant time per packet (the ring keeps its keyframes' positions, so no
push rescans it): bytes (``max_bytes``; one GOP may reach twice that), time (the first
keyframe at most ``MAX_GOP_S`` before the pre-roll's start or a pin) and packet count
(``max_packets``: by default ``MAX_PACKET_RATE`` a second over that span). A GOP that passes a
bound with no keyframe after it cannot give a decodable start within the bounds: it goes whole
(``overlong`` counts it) and the ring waits for the next keyframe. A camera that sends one
keyframe and then P-frames for ever costs the ring a check per packet, nothing more.

``cut`` remuxes the packets from the keyframe at or before a clip's start to its end into an MP4
(``movflags=+faststart``, timestamps rebased to 0): no decoding, no encoding.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

__all__ = ["MAX_GOP_S", "MAX_PACKET_RATE", "REMUXABLE", "Cut", "Packet", "PacketRing",
           "StreamInfo"]

REMUXABLE = frozenset({"h264", "hevc"})
"""Codecs whose packets are cut into MP4 clips that browsers play."""

MAX_GOP_S = 20.0
"""Longest GOP the ring holds for a decodable start: its keyframe at most this many seconds
before the pre-roll's start (or a pin). Cameras send a keyframe every 1-4 s ("smart" codecs
up to about 10 s)."""

MAX_PACKET_RATE = 240
"""Packets a second the default ``max_packets`` allows over the ring's longest span (a
picture's slices are joined into one packet)."""


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What a cut needs to know about the stream its packets come from.

    Attributes:
        codec: FFmpeg's codec name (``h264``, ``hevc``, ``mjpeg`` ...).
        width, height: Coded size.
        time_base: Seconds per pts tick, as ``(numerator, denominator)``.
        extradata: The codec's parameter sets (SPS/PPS) as the demuxer gave them, or ``b""``.
    """

    codec: str
    width: int
    height: int
    time_base: tuple[int, int]
    extradata: bytes = b""


@dataclass(slots=True)
class Packet:
    """One access unit: every NAL unit of one picture (a camera may send a picture's slices as
    several RTP packets, which FFmpeg hands out one by one; they are joined here)."""

    data: bytes | bytearray  # a bytearray while later slices are joined to it
    pts: int
    dts: int
    clock: float
    keyframe: bool


@dataclass(frozen=True, slots=True)
class Cut:
    """What ``PacketRing.cut`` wrote.

    Attributes:
        codec: The clip's codec (``h264``, ``hevc``).
        start, end: Clocks of its first packet (a keyframe) and last packet.
        packets: Packets written.
        bytes: Bytes of packet data written.
    """

    codec: str
    start: float
    end: float
    packets: int
    bytes: int

    @property
    def duration(self) -> float:
        return self.end - self.start


class PacketRing:
    """The newest packets of one stream; thread-safe (the source pushes from its thread, the
    recorder's clip writer cuts from its own).

    Counters (read them, do not set them): ``pushed`` packets, ``dropped`` packets let go for a
    bound while the pre-roll or a pin wanted them, ``overlong`` GOPs let go whole because they
    passed a bound with no keyframe after them, ``resets`` (a new connection: older packets
    cannot be cut together with newer ones, so they go).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._packets: deque[Packet] = deque()
        # Positions (counted from the first packet ever held) of the keyframes held, oldest
        # first; ``_first`` is the position of ``_packets[0]``, always a keyframe.
        self._keys: deque[int] = deque()
        self._first = 0
        self._info: StreamInfo | None = None
        self._keep_s = 0.0
        self._max_bytes = 0
        self._max_packets = 0
        self._bytes = 0
        self._pins: list[float] = []
        self.pushed = 0
        self.dropped = 0
        self.overlong = 0
        self.resets = 0

    # -- the consumer's side -------------------------------------------------------------------
    def keep(self, seconds: float, max_bytes: int, max_packets: int | None = None) -> None:
        """Hold at least ``seconds`` before the newest packet (from the keyframe at or before
        that), at most ``max_bytes`` and ``max_packets`` (default: ``MAX_PACKET_RATE`` a second
        over ``seconds + MAX_GOP_S``); the largest request made wins."""
        if max_packets is None:
            max_packets = int((seconds + MAX_GOP_S) * MAX_PACKET_RATE)
        with self._lock:
            self._keep_s = max(self._keep_s, seconds)
            self._max_bytes = max(self._max_bytes, max_bytes)
            self._max_packets = max(self._max_packets, max_packets)

    @property
    def info(self) -> StreamInfo | None:
        """The current stream (``None``: none opened yet)."""
        return self._info

    @property
    def wanted(self) -> bool:
        """Whether anyone asked for packets (``keep``): a source copies none before."""
        return self._max_bytes > 0

    @property
    def remuxable(self) -> bool:
        """Whether clips can be cut from this stream (H.264 or H.265, packets held)."""
        info = self._info
        return info is not None and info.codec in REMUXABLE and self._max_bytes > 0

    def pin(self, clock: float) -> None:
        """Keep the packets from ``clock`` on (a clip collecting its post-roll) until
        ``unpin(clock)``, within the byte budget."""
        with self._lock:
            self._pins.append(clock)

    def unpin(self, clock: float) -> None:
        with self._lock:
            if clock in self._pins:
                self._pins.remove(clock)

    def stats(self) -> dict[str, int | float | str | None]:
        with self._lock:
            span = (self._packets[-1].clock - self._packets[0].clock) if self._packets else 0.0
            return {"codec": self._info.codec if self._info else None,
                    "packets": len(self._packets), "bytes": self._bytes, "seconds": round(span, 3),
                    "pushed": self.pushed, "dropped": self.dropped, "overlong": self.overlong,
                    "resets": self.resets}

    def cut(self, start: float, end: float, path: Path) -> Cut | None:
        """Remux the packets from the keyframe at or before clock ``start`` to clock ``end``
        into an MP4 at ``path``; ``None`` (nothing written) when the ring holds no keyframe at
        or before ``start`` still followed by packets up to ``start`` (the pre-roll is gone: a
        reconnect, or the byte budget), or the stream is not H.264/H.265.

        Raises:
            av.error.FFmpegError, OSError: the file cannot be written.
        """
        with self._lock:
            info = self._info
            packets = list(self._packets)
            if packets and isinstance(packets[-1].data, bytearray):  # still being joined
                last = packets[-1]
                packets[-1] = Packet(bytes(last.data), last.pts, last.dts, last.clock,
                                     last.keyframe)
        if info is None or info.codec not in REMUXABLE:
            return None
        first = None
        for i, p in enumerate(packets):
            if p.clock > start:
                break
            if p.keyframe:
                first = i
        if first is None:
            return None
        chosen = [p for p in packets[first:] if p.clock <= end]
        if not chosen:
            return None
        _remux(path, info, chosen)
        return Cut(info.codec, chosen[0].clock, chosen[-1].clock, len(chosen),
                   sum(len(p.data) for p in chosen))

    # -- the source's side ---------------------------------------------------------------------
    def reset(self, info: StreamInfo) -> None:
        """A new connection (its parameters may differ): the packets held go."""
        with self._lock:
            if self._packets:
                self.resets += 1
            self._clear()
            self._info = info

    def push(self, data: bytes, pts: int, dts: int | None, clock: float, keyframe: bool
             ) -> None:
        """Add one packet (or another slice of the last one's picture: same pts)."""
        with self._lock:
            if self._max_bytes <= 0:
                return  # nobody asked for packets: hold none
            self.pushed += 1
            packets = self._packets
            if packets and packets[-1].pts == pts:
                last = packets[-1]
                if isinstance(last.data, bytes):  # joined in place from here: no copy per slice
                    last.data = bytearray(last.data)
                last.data += data
                if keyframe and not last.keyframe:
                    last.keyframe = True
                    self._keys.append(self._first + len(packets) - 1)
            elif not packets and not keyframe:
                return  # a cut starts at a keyframe: nothing before the first one is of use
            else:
                dts = pts if dts is None else dts
                if packets and dts <= packets[-1].dts:
                    dts = packets[-1].dts + 1  # the muxer needs strictly increasing dts
                if packets and isinstance(packets[-1].data, bytearray):
                    packets[-1].data = bytes(packets[-1].data)  # the picture is whole
                if keyframe:
                    self._keys.append(self._first + len(packets))
                packets.append(Packet(data, pts, dts, clock, keyframe))
            self._bytes += len(data)
            self._trim(clock)

    def _clear(self) -> None:  # under the lock
        self._first += len(self._packets)
        self._packets.clear()
        self._keys.clear()
        self._bytes = 0

    def _trim(self, now: float) -> None:  # under the lock
        packets = self._packets
        keys = self._keys
        horizon = now - self._keep_s
        if self._pins:
            horizon = min(horizon, min(self._pins))
        # Whole GOPs go from the front while the next keyframe is still at or before the
        # horizon (a cut from the horizon then starts at that keyframe), or over a bound. Each
        # pass drops a GOP, so a push costs a constant amount of work (amortised).
        while packets:
            long = (len(packets) > self._max_packets
                    or packets[0].clock < horizon - MAX_GOP_S)
            if len(keys) < 2:  # one GOP, no keyframe after it: a cut needs all of it
                if long or self._bytes > 2 * self._max_bytes:
                    self.dropped += len(packets)
                    self.overlong += 1
                    self._clear()
                return
            over = long or self._bytes > self._max_bytes
            nxt = keys[1] - self._first
            if packets[nxt].clock > horizon and not over:
                return
            if over and packets[nxt].clock > horizon:
                self.dropped += nxt
            for _ in range(nxt):
                self._bytes -= len(packets.popleft().data)
            self._first += nxt
            keys.popleft()


def _remux(path: Path, info: StreamInfo, packets: list[Packet]) -> None:
    import av  # the rtsp extra; only sources that made packets got here

    tb = Fraction(*info.time_base)
    dts = _decode_times([p.pts for p in packets])
    base = dts[0]
    with av.open(str(path), "w", format="mp4", options={"movflags": "+faststart"}) as out:
        # A stream without a codec context: ``add_stream`` would open an encoder (libx264)
        # whose own parameter sets would end up in the file's header. The muxer takes the
        # parameter sets from the first packet instead, so the stream's own (the SDP's, Annex
        # B) go in front of it: a camera that sends them only in the SDP still gives a clip.
        stream = out.add_mux_stream(info.codec, width=info.width, height=info.height)
        stream.time_base = tb
        for i, p in enumerate(packets):
            data = p.data if isinstance(p.data, bytes) else bytes(p.data)  # cut made it bytes
            if i == 0 and info.extradata.startswith((b"\0\0\0\1", b"\0\0\1")):
                data = info.extradata + data
            packet = av.Packet(data)
            packet.pts, packet.dts = p.pts - base, dts[i] - base
            nxt = dts[i + 1] if i + 1 < len(packets) else None
            packet.duration = nxt - dts[i] if nxt is not None else (
                dts[i] - dts[i - 1] if i else 0)
            packet.time_base = tb
            packet.is_keyframe = p.keyframe
            packet.stream = stream
            out.mux(packet)


def _decode_times(pts: list[int]) -> list[int]:
    """Decode timestamps for packets in decode order with presentation times ``pts``. RTP
    carries presentation times only, and with B-frames FFmpeg's guesses can pass them; the
    n-th smallest pts, moved back by the largest reordering, increases and never passes a
    packet's own pts."""
    ordered = sorted(pts)
    shift = max(0, *(o - p for o, p in zip(ordered, pts, strict=True)))
    out = [o - shift for o in ordered]
    for i in range(1, len(out)):  # the same pts twice: still strictly increasing
        if out[i] <= out[i - 1]:
            out[i] = out[i - 1] + 1
    return out

"""``camera`` through PyAV: an RTSP (or RTSPS) stream demuxed and decoded by the FFmpeg that
PyAV bundles, keeping the camera's own H.264/H.265 packets for clips (``packets.PacketRing``).

Reconnecting, backoff, health, password masking and timeouts work as in the OpenCV camera
(``sources/camera.py``, the same ``Outage`` and ``Backoff``). With ``detect_uri`` the source
reads two streams: the substream is decoded into the frames the pipeline gets, and the main
stream (``uri``) is only demuxed, in a thread of its own, into the packet ring; frames then say
the main stream's size (``Frame.display``), so boxes come out in main-stream pixels. The two
streams' timestamps are not compared: each packet and frame gets the local monotonic clock its
pts maps to (``_Clock``), so the streams align by wall time.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import av
import msgspec

from ..config.sources import CameraSource as CameraConfig
from ..frames import Frame
from ..health import Health
from .base import Backoff, Outage, RateLimiter, Source, SourceStats
from .camera import redact
from .decoders import hardware_decoder
from .packets import PacketRing, StreamInfo
from .pictures import Pictures
from .reasons import no_rtp_reason, probe_reply, slow_reply_reason, stream_host, stream_reason

__all__ = ["PyAvSource", "RtspStats"]

logger = logging.getLogger("edgeinfer.sources.camera")

_DRIFT_S = 1.0  # a stream clock this far behind arrival is re-anchored
# FFmpeg looks at 5 s of a stream by default before it says what it holds; the SDP's parameter
# sets already give the size, so half a second (2 s -> 0.65 s to open on loopback) is plenty.
_ANALYZE_US = "500000"
_BROKEN_SHOWN_S = 60.0  # health says why frames were left out this long after the last one
_PROBE_S = 2.0  # at most, after an open that timed out: does the camera answer at all?


@dataclasses.dataclass(slots=True)
class RtspStats(SourceStats):
    """``SourceStats`` and, with ``detect_uri``, the main stream's state and the packet ring."""

    main_stream: dict[str, Any] | None = None
    decoder: str | None = None  # what decodes the pictures (``decoders.py``)

    def to_dict(self) -> dict[str, Any]:
        d = SourceStats.to_dict(self)
        d["decoder"] = self.decoder
        if self.main_stream is not None:
            d["main_stream"] = self.main_stream
        return d


class _Clock:
    """A stream's pts -> ``time.monotonic()`` seconds: the earliest arrival seen, so a clock is
    never ahead of when its packet came, re-anchored when it falls ``_DRIFT_S`` behind (a camera
    whose clock runs slow)."""

    __slots__ = ("offset", "tb")

    def __init__(self, time_base: float) -> None:
        self.tb = time_base
        self.offset: float | None = None

    def __call__(self, pts: int, now: float) -> float:
        t = pts * self.tb
        off = self.offset
        if off is None or now - t < off or now - t - off > _DRIFT_S:
            off = self.offset = now - t
        return t + off


class _Stream:
    """One open container: its video stream, clock and demuxer."""

    def __init__(self, uri: str, config: CameraConfig) -> None:
        options = {"rtsp_transport": "udp" if config.transport == "udp" else "tcp",
                   "analyzeduration": _ANALYZE_US} \
            if uri.lower().startswith(("rtsp://", "rtsps://")) else {}
        timeout = config.open_timeout_s
        self.container = av.open(uri, options=options, timeout=(timeout, timeout))
        if not self.container.streams.video:
            self.container.close()
            raise _NoVideo()
        self.video = self.container.streams.video[0]
        ctx = self.video.codec_context
        tb = self.video.time_base
        self.info = StreamInfo(ctx.name, ctx.width, ctx.height,
                               (tb.numerator, tb.denominator) if tb else (1, 90000),
                               bytes(ctx.extradata or b""))
        self.clock = _Clock(float(tb) if tb else 1 / 90000)
        self.packets = self.container.demux(self.video)
        self.pictures: Pictures | None = None  # made by the source that decodes this stream

    def close(self) -> None:
        try:
            self.container.close()
        except av.error.FFmpegError:
            pass


class _NoVideo(Exception):
    pass


class _Reader:
    """Connects to one stream and keeps it open: failures counted and told (``Outage``),
    retried with ``Backoff``."""

    def __init__(self, uri: str, config: CameraConfig, stats: SourceStats,
                 stop: threading.Event, reconnect: Any) -> None:
        self.uri, self.config, self.stop = uri, config, stop
        self.name = redact(uri)
        self.outage = Outage(self.name, stats, logger)
        self.backoff = Backoff(reconnect, stop)
        self.stream: _Stream | None = None
        self.cannot_open = False
        self.flowing = False  # a packet arrived since the stream opened
        self.silent = False  # the last connection was lost before any packet came
        self.opened_at = 0.0

    def connect(self) -> bool:
        started = time.monotonic()
        outage = self.outage
        if not outage.down:  # the first connection: not running until a frame comes
            outage.pending(f"connecting to {stream_host(self.name)}")
        try:
            self.stream = _Stream(self.uri, self.config)
        except _NoVideo:
            self._failed(started, "the stream has no video: check the stream path in the URI")
            return False
        except av.error.FFmpegError as exc:
            took = time.monotonic() - started
            timed_out = took >= 0.9 * self.config.open_timeout_s
            lines = [] if timed_out else [f"[pyav @ 0x0] {exc.strerror}"]
            reason = stream_reason(self.name, lines, timed_out=timed_out)
            if timed_out and not self.stop.is_set():
                reason = self._why_timed_out() or reason
            self._failed(started, reason)
            return False
        self.cannot_open = False
        self.flowing = False
        self.opened_at = time.monotonic()
        if self.silent:  # again no packet, most likely: keep saying so, not "waiting"
            outage.reopened(pending=outage.reason)
        else:
            outage.reopened(pending=f"{stream_host(self.name)} answered PLAY; waiting for its "
                                    f"first video packet (at most "
                                    f"{self.config.open_timeout_s:g} s)")
        return True

    def _why_timed_out(self) -> str | None:
        """After an open that ran into its timeout: whether the camera answers a request of
        ours at all (a trickling or incomplete reply is not a camera missing from the network);
        ``None``: it does not, or this is not plain RTSP."""
        if not self.uri.lower().startswith("rtsp://"):
            return None
        got = probe_reply(self.uri, min(_PROBE_S, self.config.open_timeout_s))
        if got is None or not got[0]:
            return None
        return slow_reply_reason(self.name, got[0], got[1], self.config.open_timeout_s)

    def _failed(self, started: float, reason: str) -> None:
        # Refused at once: the camera is absent and we wait; an open that ran into its timeout
        # is a stall the watchdog should see (as the OpenCV camera).
        self.cannot_open = time.monotonic() - started < 0.5 * self.config.open_timeout_s
        self.silent = False
        self.outage.fail(reason)

    def lost(self, exc: BaseException | None) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()
        self.silent = not self.flowing
        if self.silent:  # PLAY was answered, and then nothing came
            self.outage.fail(no_rtp_reason(self.name, time.monotonic() - self.opened_at))
            return
        why = f" ({exc.strerror})" if isinstance(exc, av.error.FFmpegError) else ""
        self.outage.fail(f"read failed: the stream stopped{why} (camera rebooting, or the network "
                         "down?)")

    def reopen(self) -> bool:
        """After a failure: wait the backoff, try again; ``True`` once open."""
        if not self.backoff.wait():
            return False
        self.outage.retry()
        return self.connect()

    def close(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()


class PyAvSource(Source):
    """Frames decoded by PyAV, the camera's packets kept in ``packets``; a live source.

    Args:
        config: The ``camera`` source config.
        packets: The ring the camera's packets go to (a capture process's, which sends them
            on to the pipeline's: ``isolated.py``); default: a ring of its own.
        **context: Ignored (what other sources need).

    Raises:
        SourceError: while iterating, after ``reconnect.max_attempts`` failures in a row.
    """

    live = True

    def __init__(self, config: CameraConfig, *, packets: PacketRing | None = None,
                 **context: Any) -> None:
        super().__init__(config)
        self.stats: RtspStats = RtspStats()
        self._ring = packets if packets is not None else PacketRing()
        self.packets = self._ring
        self._main_uri = str(config.uri)
        self._split = config.detect_uri is not None
        uri = str(config.detect_uri) if config.detect_uri is not None else self._main_uri
        self._reader = _Reader(uri, config, self.stats, self._stop, config.reconnect)
        self._outage = self._reader.outage
        self._main: _Reader | None = None
        self._main_stats = SourceStats()
        self._main_stop = threading.Event()  # set by stop() and on leaving the with block
        self._main_thread: threading.Thread | None = None
        self._display: tuple[int, int] | None = None
        self._pictures: Pictures | None = None  # the decoded stream's, on this connection
        self._told_decoder = ""  # what decodes, as last logged

    @property
    def name(self) -> str:
        """The URI, with a password in it masked (names end up in logs and stats)."""
        return redact(self.config.uri)

    @property
    def waiting(self) -> bool:
        return self._reader.cannot_open and not self.stopped

    @property
    def display(self) -> tuple[int, int] | None:
        """The main stream's size once known, with ``detect_uri`` (``None`` without)."""
        return self._display

    def health(self) -> Health | None:
        """The decoded stream's outage; with ``detect_uri``, else the main stream's: without
        it no clip can be cut (and, until it first opens, the frames' main-stream size is not
        known, so none are handed on), which must not read as ``running``."""
        health = self._outage.health(self._reader.backoff.next_at)
        main = self._main
        if health is None and main is None:
            return self._broken()
        if health is not None or main is None:
            return health
        down = main.outage.health(main.backoff.next_at)
        if down is None:
            return self._broken()
        then = ("clips wait for it" if self._display is not None
                else "no frame is handed on until it opens (its size is what boxes are in)")
        return dataclasses.replace(
            down, reason=f"main stream {main.name}: {down.reason}; the substream (detect_uri) "
                         f"is read, {then}")

    def _broken(self) -> Health | None:
        """``running``, with the reason, for a minute after a broken picture was left out."""
        pictures = self._pictures
        if pictures is None or pictures.since is None \
                or time.monotonic() - pictures.since > _BROKEN_SHOWN_S:
            return None
        return Health("running", f"{self.stats.corrupt} corrupt: {pictures.reason}",
                      self.stats.retries)

    def stop(self) -> None:
        super().stop()
        self._main_stop.set()

    def _open(self) -> None:
        self._reader.connect()
        if self._split:
            # The main stream retries for ever: detection goes on while clips wait for it.
            forever = msgspec.structs.replace(self.config.reconnect, max_attempts=None)
            self._main_stop.clear()
            self._main = _Reader(self._main_uri, self.config, self._main_stats,
                                 self._main_stop, forever)
            self._main_thread = threading.Thread(target=self._demux_main, daemon=True,
                                                 name=f"rtsp-main-{self._main.name}")
            self._main_thread.start()
        else:
            self._reset_ring()

    def _close(self) -> None:
        self._main_stop.set()
        thread, self._main_thread = self._main_thread, None
        if thread is not None:
            thread.join(self.config.open_timeout_s + 2)
        self._reader.close()
        if self._main is not None:
            self._main.close()

    def _reset_ring(self) -> None:
        stream = (self._main or self._reader).stream
        if stream is not None:
            self._ring.reset(stream.info)

    # -- the main stream (detect_uri): demuxed only --------------------------------------------
    def _demux_main(self) -> None:
        main = self._main
        assert main is not None
        ring = self._ring
        main.connect()
        while not self._main_stop.is_set():
            stream = main.stream
            if stream is None:
                self._main_state(main)
                if not main.reopen():
                    continue
                stream = main.stream
                assert stream is not None
            if ring.info is not stream.info:
                ring.reset(stream.info)
                self._display = (stream.info.width, stream.info.height)
                self._main_state(main)
            try:
                packet = next(stream.packets)
            except (StopIteration, av.error.FFmpegError) as exc:
                if self._main_stop.is_set():
                    return
                main.lost(exc if isinstance(exc, av.error.FFmpegError) else None)
                continue
            main.flowing = True
            if packet.pts is None or packet.size == 0:
                continue
            main.outage.recovered(main.backoff)
            if ring.wanted:  # the packets' bytes are copied only for a recorder
                ring.push(bytes(packet), packet.pts, packet.dts,
                          stream.clock(packet.pts, time.monotonic()), packet.is_keyframe)

    def _main_state(self, main: _Reader) -> None:
        s = self._main_stats
        self.stats.main_stream = {
            "uri": main.name, "open": main.stream is not None,
            "reason": main.outage.reason if main.outage.down else "",
            "reconnects": s.reconnects, "errors": s.errors, "packets": self._ring.stats()}

    # -- the decoded stream --------------------------------------------------------------------
    def _new_pictures(self, stream: _Stream, name: str) -> Pictures:
        """A connection's decoding: a hardware decoder on trial when ``decoder`` allows and one
        opens (``decoders.py``), else software; said once in the log, not at every reconnect.
        A hardware decoder that failed its trial is not tried again."""
        setting = self.config.decoder
        last = self._pictures
        if last is not None and last.fell_back:
            setting = "software"
        ctx = stream.video.codec_context
        found, said = hardware_decoder(ctx, setting, name)
        hw = (found, said) if found is not None else None
        why = said
        if said != self._told_decoder:
            self._told_decoder = said
            if hw is not None:
                logger.info("camera %s: trying %s", name, hw[1])
            elif setting not in ("auto", "software"):
                logger.warning("camera %s: decoding %s in software (FFmpeg's): %s", name,
                               ctx.name, why)
            elif setting == "auto":
                logger.info("camera %s: decoding %s in software (FFmpeg's): %s", name, ctx.name,
                            why)
        return Pictures(ctx, self.stats, name, hardware=hw)


    def _frames(self) -> Iterator[Frame]:
        reader = self._reader
        limiter = RateLimiter(self.config.max_fps)
        max_attempts = self.config.reconnect.max_attempts
        stats = self.stats
        ring = None if self._split else self._ring
        index = 0
        told = 0.0  # when the main stream's state was last put on stats
        while not self._stop.is_set():
            stream = reader.stream
            if stream is None:
                self._outage.check(max_attempts)
                if not reader.reopen():
                    continue
                stream = reader.stream
                assert stream is not None
                if ring is not None:
                    ring.reset(stream.info)
            try:
                packet = next(stream.packets)
            except (StopIteration, av.error.FFmpegError) as exc:
                if self._stop.is_set():
                    return
                reader.lost(exc if isinstance(exc, av.error.FFmpegError) else None)
                continue
            reader.flowing = True
            if packet.size == 0:
                continue
            now = time.monotonic()
            if ring is not None and packet.pts is not None and ring.wanted:
                ring.push(bytes(packet), packet.pts, packet.dts, stream.clock(packet.pts, now),
                          packet.is_keyframe)
            if stream.pictures is None:
                stream.pictures = self._pictures = self._new_pictures(stream, reader.name)
            for image in stream.pictures.decode(packet):
                index += 1
                ts = stream.clock(image.pts, now) if image.pts is not None else now
                self._outage.recovered(reader.backoff)
                if not limiter.admit(ts):
                    stats.skipped += 1
                    continue
                display = self._display
                if self._split and display is None:
                    stats.skipped += 1  # the main stream's size is not known yet
                    continue
                stats.frames += 1
                stats.decoder = stream.pictures.decoder
                yield Frame(index - 1, ts, time.time() - (now - ts),
                            image.to_ndarray(format="bgr24"), display=display)
            if self._main is not None and now - told >= 1.0:
                told = now
                self._main_state(self._main)

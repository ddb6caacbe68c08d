"""``camera``: OpenCV capture of a V4L2 device, an RTSP or HTTP MJPEG stream, or a GStreamer
pipeline, reconnecting with backoff when the device or stream goes away.

A camera that is missing at start does not stop the daemon: ``_open`` logs and counts the
failure and iteration keeps retrying (``reconnect.max_attempts`` failures in a row raise
``SourceError``). Streams are opened through FFmpeg with open and read timeouts of
``open_timeout_s``, so a stalled server costs at most that long per attempt instead of
hanging a read forever.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Iterator
from functools import cache
from typing import Any

import cv2
import numpy as np

from ..config.pipeline import CameraSource as CameraConfig
from ..errors import SourceError
from ..frames import Frame
from ..health import Health
from .._opencv import quiet_opencv
from .._stderr import native_logs_to_debug
from .base import Backoff, Outage, RateLimiter, Source
from .reasons import device_path, device_reason, stream_reason

quiet_opencv()

__all__ = ["CameraSource", "gstreamer_available", "redact"]

logger = logging.getLogger(__name__)

# FFmpeg's own lines (``[tcp @ 0x55d0...] Connection to tcp://... failed: Connection refused``)
# and OpenCV's (``[ WARN:0@0.04] global cap.cpp:212 ...``), printed while a capture opens: they go
# to the debug log, and the reason for a failure is read out of them (sources/reasons.py).
NATIVE_CAPTURE_LINE = re.compile(rb"^(?:\[[\w:./ -]+ @ 0x[0-9a-fA-F]+\] |\[ ?(?:WARN|ERROR|INFO)"
                                 rb"(?::\d+@[\d.]+)?\])")


@cache
def gstreamer_available() -> bool:
    """Whether this OpenCV build can open GStreamer pipelines (pip wheels cannot)."""
    return bool(cv2.videoio_registry.hasBackend(cv2.CAP_GSTREAMER))


def redact(uri: str | int) -> str:
    """``uri`` with the password of ``scheme://user:password@host/...`` replaced by ``***``."""
    text = str(uri)
    scheme, sep, rest = text.partition("://")
    authority = rest.split("/", 1)[0]
    if not sep or "@" not in authority:
        return text
    userinfo, _, host = authority.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{host}{rest[len(authority):]}"


def check_config(config: CameraConfig) -> None:
    """Refuse a config that cannot work on this machine, before anything is opened.

    Raises:
        SourceError: ``backend: gstreamer`` with an OpenCV built without GStreamer.
    """
    if config.backend == "gstreamer" and not gstreamer_available():
        raise SourceError(
            f"camera {redact(config.uri)}: backend gstreamer needs OpenCV built with GStreamer, "
            f"and this one ({cv2.__version__}) is not (pip's opencv-python wheels never are); "
            f"use the distribution's python3-opencv, or backend ffmpeg/v4l2")


class CameraSource(Source):
    """Frames from ``cv2.VideoCapture``; a live source (the pipeline drops its oldest frames).

    Args:
        config: The ``camera`` source config.
        **context: Ignored (what other sources need).

    Raises:
        SourceError: On entering, when the config cannot work on this machine (a GStreamer
            pipeline without GStreamer support in OpenCV); while iterating, after
            ``reconnect.max_attempts`` failures in a row.
    """

    live = True

    def __init__(self, config: CameraConfig, **context: Any) -> None:
        super().__init__(config)
        self._cap: cv2.VideoCapture | None = None
        self._cannot_open = False
        self._outage = Outage(self.name, self.stats, logger)
        self._backoff = Backoff(self.config.reconnect, self._stop)

    @property
    def name(self) -> str:
        """The URI, with a password in it masked (names end up in logs and stats)."""
        return redact(self.config.uri)

    # --- opening -------------------------------------------------------------------------

    @property
    def waiting(self) -> bool:
        return self._cannot_open and not self.stopped

    def health(self) -> Health | None:
        return self._outage.health(self._backoff.next_at)

    def _open_failed(self, started: float) -> None:
        # Refused at once (no device node, nothing listening): the camera is absent and we wait
        # for it. An open that runs into its timeout (a server that accepts and then sends
        # nothing) is a stall the watchdog should see.
        self._cannot_open = time.monotonic() - started < 0.5 * self.config.open_timeout_s

    def _open(self) -> None:
        self._cannot_open = False
        check_config(self.config)
        self._connect()

    def _target(self) -> tuple[str | int, int, list[int]]:
        """What to hand ``cv2.VideoCapture``: source, API preference, open parameters."""
        c = self.config
        uri: str | int = c.uri
        if isinstance(uri, str) and uri.isdigit():
            uri = int(uri)
        if c.backend == "gstreamer":
            return uri, cv2.CAP_GSTREAMER, []
        ms = int(c.open_timeout_s * 1000)
        ffmpeg = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, ms, cv2.CAP_PROP_READ_TIMEOUT_MSEC, ms]
        if c.backend == "ffmpeg":
            return uri, cv2.CAP_FFMPEG, ffmpeg
        if c.backend == "v4l2":
            return uri, cv2.CAP_V4L2, []
        if isinstance(uri, str) and "://" in uri:
            return uri, cv2.CAP_FFMPEG, ffmpeg
        if isinstance(uri, int) or uri.startswith("/dev/"):
            return uri, (cv2.CAP_V4L2 if sys.platform.startswith("linux") else cv2.CAP_ANY), []
        return uri, cv2.CAP_ANY, []

    def _connect(self) -> bool:
        """Open the capture once; on failure count it with the reason in words, log it (rate
        limited: see `Outage`), return False. FFmpeg's and OpenCV's lines go to the debug log."""
        uri, api, params = self._target()
        started = time.monotonic()
        lines: list[str] = []
        try:
            with native_logs_to_debug(NATIVE_CAPTURE_LINE, lines):
                cap = cv2.VideoCapture(uri, api, params)
        except cv2.error as exc:
            self._open_failed(started)
            self._fail(f"cannot open: {exc}")
            return False
        if not cap.isOpened():
            cap.release()
            self._open_failed(started)
            self._fail(self._why_not_opened(lines, time.monotonic() - started))
            return False
        self._cannot_open = False
        if api == cv2.CAP_V4L2:
            self._apply_mode(cap)
        elif not self._outage.down and any(
                v is not None for v in (self.config.width, self.config.height, self.config.fps)):
            logger.info("camera %s: width/height/fps apply to V4L2 devices only; the stream gives "
                        "%dx%d", self.name, cap.get(cv2.CAP_PROP_FRAME_WIDTH),
                        cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        self._cap = cap
        self._outage.reopened()
        return True

    def _why_not_opened(self, lines: list[str], took_s: float) -> str:
        """The reason in words, with the fix (see sources/reasons.py)."""
        uri = self.config.uri
        said = f" ({lines[-1]})" if lines else ""
        if self.config.backend == "gstreamer":
            return f"cannot open the GStreamer pipeline{said}: try it with `gst-launch-1.0`"
        path = device_path(uri)
        if path is not None:
            return device_reason(path)
        if isinstance(uri, str) and "://" in uri:
            return stream_reason(self.name, lines,
                                 timed_out=took_s >= 0.9 * self.config.open_timeout_s)
        return f"cannot open {uri}{said}: no such device, file or stream (check the uri)"

    def _lost(self) -> str:
        """Why a read failed, in words: the device or the stream went away mid-stream."""
        uri = self.config.uri
        if self.config.backend != "gstreamer" and device_path(uri) is not None:
            return (f"read failed: {device_path(uri)} stopped giving frames (unplugged, or its "
                    "USB link reset?)")
        return "read failed: the stream stopped (camera rebooting, or the network down?)"

    def _apply_mode(self, cap: cv2.VideoCapture) -> None:
        """Ask the V4L2 device for the configured mode and log what it actually gave."""
        c = self.config
        if c.fourcc is not None:  # before the size: the size list depends on the format
            cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter.fourcc(*c.fourcc))
        if c.width is not None:
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, c.width)
        if c.height is not None:
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, c.height)
        if c.fps is not None:
            cap.set(cv2.CAP_PROP_FPS, c.fps)
        code = int(cap.get(cv2.CAP_PROP_FOURCC))
        fourcc = "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4)) if code > 0 else "?"
        logger.info("camera %s: %dx%d at %.1f fps, %s (asked %sx%s at %s fps, %s)", self.name,
                    cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT),
                    cap.get(cv2.CAP_PROP_FPS), fourcc, c.width or "-", c.height or "-",
                    c.fps or "-", c.fourcc or "-")

    def _fail(self, reason: str) -> None:
        self._outage.fail(reason)

    def _release(self) -> None:
        cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()

    # --- reading -------------------------------------------------------------------------

    def _frames(self) -> Iterator[Frame]:
        backoff = self._backoff
        limiter = RateLimiter(self.config.max_fps)
        max_attempts = self.config.reconnect.max_attempts
        stats = self.stats
        index = 0
        split: _SplitPictures | None = None
        while not self._stop.is_set():
            cap = self._cap
            if cap is None:
                self._outage.check(max_attempts)
                if not backoff.wait():
                    continue
                self._outage.retry()
                if not self._connect():
                    continue
                cap = self._cap
                assert cap is not None
                split = None
            ok, data = cap.read()
            if not ok:
                if self._stop.is_set():
                    return
                self._release()
                self._fail(self._lost())
                continue
            ts = time.monotonic()
            index += 1
            if data is None or data.size == 0:
                stats.corrupt += 1
                continue
            read = Frame(index - 1, ts, time.time(), _bgr(data))
            if split is None:
                split = _SplitPictures(cap, self.config.uri)
            for frame in split.check(cap, read, self) if split.watch else (read,):
                self._outage.recovered(backoff)
                if not limiter.admit(frame.ts):
                    stats.skipped += 1
                    continue
                stats.frames += 1
                yield frame

    def _close(self) -> None:
        self._release()


_SLICED = frozenset({"h264", "avc1", "hevc", "hev1", "hvc1", "h265"})


class _SplitPictures:
    """Whether OpenCV's FFmpeg decodes an RTSP camera's pictures in pieces. A camera that sends
    a picture in several slices, with its parameter sets before each (many do), comes out of
    FFmpeg's RTSP demuxer as one packet per slice, and OpenCV decodes each as a picture of its
    own (two frames with one pts), the rest concealed; every frame up to the next keyframe is
    predicted from that broken picture. OpenCV can neither join the slices nor say which frames
    were concealed (PyAV can: ``sources/pictures.py``), so such a stream is refused, naming
    PyAV. The first frame of a connection waits for the second, so none of it is handed on."""

    __slots__ = ("_first", "_held", "_pts", "watch")

    def __init__(self, cap: cv2.VideoCapture, uri: str | int) -> None:
        code = int(cap.get(cv2.CAP_PROP_FOURCC))
        fourcc = "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4)).lower()
        self.watch = (isinstance(uri, str) and uri.lower().startswith(("rtsp://", "rtsps://"))
                      and fourcc in _SLICED)
        self._pts = -1.0
        self._held: Frame | None = None
        self._first = True

    def check(self, cap: cv2.VideoCapture, frame: Frame, source: CameraSource
              ) -> tuple[Frame, ...]:
        """The frames to hand on: none for a connection's first frame (held back), both with
        the second.

        Raises:
            SourceError: two frames with one pts: the stream's pictures come in pieces.
        """
        pts = cap.get(cv2.CAP_PROP_PTS)  # no pts (HTTP MJPEG, say): a large negative number
        if pts >= 0 and pts == self._pts:
            source.stats.corrupt += 2 if self._held is not None else 1
            raise SourceError(
                f"camera {source.name}: the camera sends each picture in several slices, which "
                "OpenCV's FFmpeg decodes as separate pictures, the rest of each concealed: "
                "frames would come out partly green or frozen, and OpenCV cannot tell which. "
                "Read it with PyAV: pip install 'edgeinfer[rtsp]' (camera backend auto then "
                "uses it)")
        self._pts = pts
        if self._first:
            self._first = False
            self._held = frame
            return ()
        held, self._held = self._held, None
        return (frame,) if held is None else (held, frame)


def _bgr(data: np.ndarray) -> np.ndarray:
    """OpenCV gives BGR already; a few devices and pipelines give gray or BGRA."""
    if data.ndim == 2:
        return cv2.cvtColor(data, cv2.COLOR_GRAY2BGR)
    if data.shape[2] == 4:
        return cv2.cvtColor(data, cv2.COLOR_BGRA2BGR)
    return data

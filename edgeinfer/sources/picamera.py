"""``picamera2``: the Raspberry Pi CSI camera through picamera2/libcamera.

picamera2 is not on PyPI in a usable form for most boards: Raspberry Pi OS ships it as
``python3-picamera2``, and a virtual environment sees it only when made with
``--system-site-packages``. It is imported when the source opens, never before.

Frames come from the ``main`` stream configured as ``RGB888``, which picamera2 lays out as
``[B, G, R]`` per pixel (the Picamera2 manual, "Image formats": libcamera names formats by
their little-endian word order), so ``capture_array()`` is already OpenCV's BGR, with no
conversion.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..config.pipeline import Picamera2Source as Picamera2Config
from ..errors import SourceError
from ..frames import Frame
from ..health import Health
from .base import Backoff, Outage, RateLimiter, Source

__all__ = ["INSTALL_HINT", "Picamera2Source", "module_problem"]

logger = logging.getLogger(__name__)

INSTALL_HINT = ("picamera2 is not installed: on Raspberry Pi OS `sudo apt install python3-picamera2`, "
                "and make the virtual environment with `python3 -m venv --system-site-packages`")

# A frame that takes longer than this (or 3 frame intervals, if longer) means the camera stalled.
CAPTURE_TIMEOUT_S = 5.0


def module_problem() -> str | None:
    """Why picamera2 cannot be imported here (the install hint), or ``None``; found without
    importing it (``edgeinfer validate-config`` asks the same before ``run`` does)."""
    return INSTALL_HINT if importlib.util.find_spec("picamera2") is None else None


class Picamera2Source(Source):
    """Frames from a CSI camera; a live source that reopens the camera when capture fails.

    Args:
        config: The ``picamera2`` source config.
        **context: Ignored (what other sources need).

    Raises:
        SourceError: On entering, when picamera2 is not installed (with the install hint);
            while iterating, after ``reconnect.max_attempts`` failures in a row.
    """

    live = True

    def __init__(self, config: Picamera2Config, **context: Any) -> None:
        super().__init__(config)
        self._module: Any = None
        self._cam: Any = None
        self._outage = Outage(self.name, self.stats, logger)
        self._backoff = Backoff(self.config.reconnect, self._stop)

    @property
    def name(self) -> str:
        return f"picamera2:{self.config.camera}"

    def health(self) -> Health | None:
        return self._outage.health(self._backoff.next_at)

    def _open(self) -> None:
        try:
            import picamera2
        except ImportError as exc:
            raise SourceError(f"camera {self.name}: {INSTALL_HINT}") from exc
        self._module = picamera2
        self._connect()

    def _connect(self) -> bool:
        c = self.config
        cam = None
        try:
            cam = self._module.Picamera2(c.camera)
            controls: dict[str, Any] = {}
            if c.fps is not None:
                frame_us = int(round(1_000_000 / c.fps))
                controls["FrameDurationLimits"] = (frame_us, frame_us)
            config = cam.create_video_configuration(
                main={"size": (c.width, c.height), "format": "RGB888"}, controls=controls)
            cam.configure(config)
            cam.start()
        except Exception as exc:  # libcamera raises RuntimeError, IndexError (no camera), ...
            if cam is not None:
                _close_quietly(cam)
            self._fail(f"cannot open: {type(exc).__name__}: {exc} (is the camera ribbon "
                       "seated? `rpicam-hello --list-cameras`)")
            return False
        self._cam = cam
        self._outage.reopened()
        return True

    def _fail(self, reason: str) -> None:
        self._outage.fail(reason)

    def _frames(self) -> Iterator[Frame]:
        backoff = self._backoff
        limiter = RateLimiter(self.config.max_fps)
        max_attempts = self.config.reconnect.max_attempts
        timeout = max(CAPTURE_TIMEOUT_S, 3.0 / self.config.fps) if self.config.fps else CAPTURE_TIMEOUT_S
        stats = self.stats
        index = 0
        while not self._stop.is_set():
            cam = self._cam
            if cam is None:
                self._outage.check(max_attempts)
                if not backoff.wait():
                    continue
                self._outage.retry()
                if not self._connect():
                    continue
                cam = self._cam
            try:
                # Asynchronous capture, so that a stalled camera times out instead of hanging.
                data = cam.wait(cam.capture_array("main", wait=False), timeout=timeout)
            except Exception as exc:
                if self._stop.is_set():
                    return
                self._release()
                self._fail(f"capture failed: {type(exc).__name__}: {exc}")
                continue
            ts = time.monotonic()
            index += 1
            if data is None or data.ndim != 3 or data.size == 0:
                stats.corrupt += 1
                continue
            self._outage.recovered(backoff)
            if not limiter.admit(ts):
                stats.skipped += 1
                continue
            if data.shape[2] == 4:  # XRGB8888 on some stacks: drop the padding byte
                data = np.ascontiguousarray(data[:, :, :3])
            stats.frames += 1
            yield Frame(index - 1, ts, time.time(), data)

    def _release(self) -> None:
        cam, self._cam = self._cam, None
        if cam is not None:
            _close_quietly(cam)

    def _close(self) -> None:
        self._release()


def _close_quietly(cam: Any) -> None:
    """Stop and close a camera that may be half-open or already gone."""
    for step in ("stop", "close"):
        try:
            getattr(cam, step)()
        except Exception as exc:
            logger.debug("picamera2 %s failed: %s", step, exc)

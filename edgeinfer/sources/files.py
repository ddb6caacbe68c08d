"""File sources: ``video`` (a file read through OpenCV) and ``images`` (a folder or a glob).

Both are read completely (``live = False``: the pipeline blocks on them rather than dropping
frames), optionally paced to ``fps`` and looped; the frame index keeps counting across loops.

What OpenCV does with damaged video (FFmpeg backend): damaged frames are concealed or dropped
inside FFmpeg, unseen here (``read()`` never returns an empty frame for them), and ``read()``
fails for good where the data ends (a truncation) or where the decoder cannot go on. So the
stream ends at the last frame OpenCV can deliver, and the frames the container announced but
that never came are counted ``corrupt`` with one warning. A truncated mp4 (its ``moov`` index is
written last) cannot be opened at all: ``SourceError``.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..config.pipeline import ImagesSource as ImagesConfig
from ..config.pipeline import VideoSource as VideoConfig
from ..errors import SourceError
from ..frames import Frame
from .._opencv import quiet_opencv
from .base import RateLimiter, Source

quiet_opencv()

__all__ = ["IMAGE_EXTENSIONS", "ImagesSource", "VideoSource"]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".dib", ".tif", ".tiff",
                              ".webp", ".pbm", ".pgm", ".ppm", ".pnm", ".jp2", ".sr", ".ras"})


class VideoSource(Source):
    """Every frame of a video file, in order.

    Args:
        config: The ``video`` source config.
        **context: Ignored (what other sources need).

    Raises:
        SourceError: On entering, when the file does not exist or OpenCV cannot open it.
    """

    live = False

    def __init__(self, config: VideoConfig, **context: Any) -> None:
        super().__init__(config)
        self._cap: cv2.VideoCapture | None = None

    @property
    def name(self) -> str:
        return str(self.config.uri)

    def _open(self) -> None:
        self._cap = self._capture()

    def _capture(self) -> cv2.VideoCapture:
        path = self.config.uri
        if not os.path.isfile(path):
            raise SourceError(f"video {path}: no such file")
        cap = cv2.VideoCapture(path)
        if not cap.isOpened():
            cap.release()
            raise SourceError(f"video {path}: OpenCV cannot open it (not a video, unsupported "
                              f"or truncated)")
        return cap

    def _frames(self) -> Iterator[Frame]:
        pacer = RateLimiter(self.config.fps, self._stop)
        stats = self.stats
        index = 0
        passes = 0
        while self._cap is not None:
            cap = self._cap
            announced = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
            rate = cap.get(cv2.CAP_PROP_FPS)
            period = 1.0 / rate if 0 < rate < 1000 else None  # stream time of frame i: i * period
            read = 0
            while not self._stop.is_set():
                ok, data = cap.read()
                if not ok:
                    break
                read += 1
                index += 1
                if data is None or data.size == 0:
                    stats.corrupt += 1
                    continue
                pacer.pace()
                if self._stop.is_set():
                    return
                stats.frames += 1
                yield Frame(index - 1, time.monotonic(), time.time(), data,
                            start=(index - 1) * period if period is not None else None)
            if self._stop.is_set():
                return
            self._count_missing(announced, read, first_pass=not passes)
            passes += 1
            if not self.config.loop:
                return
            if not read:
                logger.warning("video %s: no frame could be read in a whole pass; not looping",
                               self.name)
                return
            # Reopening is more reliable than seeking to 0 on every container and codec.
            self._release()
            self._cap = self._capture()

    def _count_missing(self, announced: int, read: int, first_pass: bool) -> None:
        """Count the frames the container announced but OpenCV could not deliver as corrupt.

        FFmpeg skips undecodable frames without telling OpenCV, and ``read()`` fails for good at
        a truncation; comparing with the announced count is the one signal left. Seeking past
        the damage is no cure: OpenCV's frame position counts delivered frames, so a seek lands
        on frames already delivered.
        """
        missing = announced - read
        # FRAME_COUNT is an estimate (duration x fps) for some containers: allow a little slack.
        if announced <= 0 or missing <= max(1, announced // 100):
            return
        self.stats.corrupt += missing
        if first_pass or logger.isEnabledFor(logging.DEBUG):
            logger.log(logging.WARNING if first_pass else logging.DEBUG,
                       "video %s: %d of the %d frames the file announces could not be decoded "
                       "(damaged or truncated); counted corrupt", self.name, missing, announced)

    def _release(self) -> None:
        cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()

    def _close(self) -> None:
        self._release()


class ImagesSource(Source):
    """Image files in name order: a folder (its files with an image extension) or a glob.

    A file OpenCV cannot decode (a truncated JPEG, text named ``.jpg``), or a file in the folder
    without an image extension, is counted ``corrupt`` once and skipped with one warning (a
    looping source does not try it again). Hidden files are ignored.

    Args:
        config: The ``images`` source config.
        **context: Ignored (what other sources need).

    Raises:
        SourceError: On entering, when the folder or glob matches no file.
    """

    live = False

    def __init__(self, config: ImagesConfig, **context: Any) -> None:
        super().__init__(config)
        self._files: list[Path] = []
        self._bad: set[Path] = set()

    @property
    def name(self) -> str:
        return str(self.config.uri)

    def _open(self) -> None:
        uri = os.path.expanduser(self.config.uri)
        if os.path.isdir(uri):
            found = sorted(p for p in Path(uri).iterdir() if p.is_file() and not p.name.startswith("."))
        elif glob.has_magic(uri):
            found = sorted(Path(p) for p in glob.glob(uri, recursive=True) if os.path.isfile(p))
        elif os.path.isfile(uri):
            found = [Path(uri)]
        else:
            raise SourceError(f"images {self.config.uri}: no such folder or file")
        self._files = [p for p in found if p.suffix.lower() in IMAGE_EXTENSIONS]
        for p in found:
            if p.suffix.lower() not in IMAGE_EXTENSIONS:
                self._skip(p, "not an image file extension")
        if not self._files:
            raise SourceError(f"images {self.config.uri}: no image files"
                              + (f" (only {len(found)} other files)" if found else ""))

    def _skip(self, path: Path, why: str) -> None:
        # Counted and logged once: a looping source does not read a bad file again.
        self._bad.add(path)
        self.stats.corrupt += 1
        logger.warning("images %s: skipping %s: %s", self.name, path.name, why)

    def _frames(self) -> Iterator[Frame]:
        pacer = RateLimiter(self.config.fps, self._stop)
        index = 0
        while True:
            for path in self._files:
                if self._stop.is_set():
                    return
                if path in self._bad:
                    continue
                index += 1
                data, why = _read_image(path)
                if data is None:
                    self._skip(path, why)
                    continue
                pacer.pace()
                if self._stop.is_set():
                    return
                self.stats.frames += 1
                yield Frame(index - 1, time.monotonic(), time.time(), data)
            if not self.stats.frames:
                raise SourceError(f"images {self.name}: none of the {len(self._files)} image "
                                  f"files could be decoded")
            if not self.config.loop:
                return

    def _close(self) -> None:
        self._files = []
        self._bad = set()


def _read_image(path: Path) -> tuple[np.ndarray | None, str]:
    """Decode an image file to BGR; ``(None, why)`` when it cannot be used."""
    try:
        buf = np.fromfile(path, np.uint8)
    except OSError as exc:
        return None, f"cannot read it: {exc.strerror or exc}"
    # libjpeg decodes a truncated JPEG "successfully", filling the missing part with grey; only
    # the missing end-of-image marker tells. Some writers append data after it, hence the window.
    if buf[:3].tobytes() == b"\xff\xd8\xff" and b"\xff\xd9" not in buf[-65536:].tobytes():
        return None, "truncated JPEG (no end-of-image marker)"
    data = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if data is None:
        return None, "OpenCV cannot decode it"
    return data, ""

"""``synthetic``: a generated moving test pattern, for smoke tests on a device with no camera.

The pattern is a colour gradient with a bright rectangle bouncing across it and the frame index
written in a corner, so consecutive frames differ and a viewer can tell them apart. The
background is drawn once; a frame costs one copy of it plus two small drawing calls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import cv2
import numpy as np

from ..config.pipeline import SyntheticSource as SyntheticConfig
from ..frames import Frame
from .base import RateLimiter, Source

__all__ = ["SyntheticSource", "TestPattern"]


class TestPattern:
    """Draws frame ``i`` of the moving pattern.

    Args:
        width: Frame width in pixels.
        height: Frame height in pixels.
    """

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, width: int, height: int) -> None:
        self.width = width
        self.height = height
        x = np.linspace(0, 255, width, dtype=np.float32)
        y = np.linspace(0, 255, height, dtype=np.float32)
        bg = np.empty((height, width, 3), np.uint8)
        bg[..., 0] = x[None, :]  # blue grows to the right
        bg[..., 1] = y[:, None]  # green grows downwards
        bg[..., 2] = 255 - (x[None, :] + y[:, None]) / 2
        self._background = bg
        self._box = (max(1, width // 6), max(1, height // 6))
        self._font_scale = max(0.3, height / 480)

    def draw(self, index: int) -> np.ndarray:
        """Return a new H x W x 3 uint8 BGR image for frame ``index``."""
        img = self._background.copy()
        bw, bh = self._box
        x = _bounce(index * 7, self.width - bw)
        y = _bounce(index * 5, self.height - bh)
        cv2.rectangle(img, (x, y), (x + bw - 1, y + bh - 1), (255, 255, 255), -1)
        cv2.putText(img, str(index), (4, max(12, int(30 * self._font_scale))),
                    cv2.FONT_HERSHEY_SIMPLEX, self._font_scale, (0, 0, 0), 2, cv2.LINE_AA)
        return img


def _bounce(step: int, span: int) -> int:
    """Position ``step`` pixels along a path that goes back and forth over ``0..span``."""
    if span <= 0:
        return 0
    pos = step % (2 * span)
    return pos if pos <= span else 2 * span - pos


class SyntheticSource(Source):
    """Yields the test pattern at ``fps`` until ``frames`` (or forever, until stopped).

    Args:
        config: The ``synthetic`` source config.
        **context: Ignored (what other sources need).
    """

    live = True

    def __init__(self, config: SyntheticConfig, **context: Any) -> None:
        super().__init__(config)
        self._pattern: TestPattern | None = None

    @property
    def name(self) -> str:
        c = self.config
        return f"synthetic:{c.width}x{c.height}@{c.fps:g}"

    def _open(self) -> None:
        self._pattern = TestPattern(self.config.width, self.config.height)

    def _frames(self) -> Iterator[Frame]:
        pattern = self._pattern
        assert pattern is not None
        limit = self.config.frames
        pacer = RateLimiter(self.config.fps, self._stop)
        index = 0
        while not self._stop.is_set() and (limit is None or index < limit):
            pacer.pace()
            if self._stop.is_set():
                return
            data = pattern.draw(index)
            self.stats.frames += 1
            yield Frame(index, time.monotonic(), time.time(), data)
            index += 1

    def _close(self) -> None:
        self._pattern = None

"""A cheap motion detector: where in a frame something moved, against a learned background.

Per frame (OpenCV on a small copy, under a millisecond at 320 pixels wide): downscale to
``width`` and to grey, blur, take the absolute difference from a running-average background
(``cv2.accumulateWeighted``) and from the previous frame, threshold both, clear the mask
polygons, dilate their union, and keep the connected blobs of at least ``min_area`` of the
frame that changed since the previous frame; their boxes, in source pixels, are merged where
they overlap or nearly touch.

The background difference gives a moving object's whole extent (not just its edges); the
previous frame's says it is moving now. So an object that stopped is no motion although the
background has not learnt it yet (its track can become stationary), and neither is the "ghost"
an object leaves where it stood when the background was seeded; one that moves again, or
leaves, is. The background learns at ``alpha`` per frame where nothing moves and at a quarter of
it inside moving blobs, so an object that stops fades into it over seconds, not at once. A
change over most of the frame (a light switched on, the camera's exposure jumping) is no
object: the background is re-seeded from that frame and no motion is reported for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..config.motion import MotionConfig

__all__ = ["MotionDetector", "MotionResult", "merge_boxes"]

RESEED_FRACTION = 0.5
"""Changed share of the unmasked frame above which the background is re-seeded."""
_MOVING_RATE = 0.25  # of alpha: how fast moving blobs are learnt into the background
_MIN_ALIVE = 2  # pixels changed since the previous frame that make a blob moving now
_ALIVE_SHARE = 0.01  # ... or this share of the blob, if more
_MERGE_GAP = 0.02  # of the frame's larger side: boxes closer than this are merged
_NO_BOXES = np.empty((0, 4), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class MotionResult:
    """The motion of one frame.

    Attributes:
        boxes: ``float64 (M, 4)`` x1, y1, x2, y2 of the merged moving regions, in source
            pixels; empty when nothing moved.
        changed: The share of the unmasked small frame that differs from the background
            (before the minimum area is applied).
        reseeded: The background was re-seeded from this frame (a global change).
    """

    boxes: npt.NDArray[np.float64]
    changed: float
    reseeded: bool = False

    @property
    def moving(self) -> bool:
        return len(self.boxes) > 0


class MotionDetector:
    """Motion regions of a stream's frames (one stream: not thread-safe).

    Args:
        config: Sensitivity, size and mask (``motion:`` of a pipeline).
    """

    def __init__(self, config: MotionConfig) -> None:
        import cv2

        self._cfg = config
        self._key: tuple[int, int, tuple[int, int] | None] | None = None  # image, display
        self._size: tuple[int, int] | None = None  # (width, height) boxes are in
        self._small = (0, 0)
        self._scale = (1.0, 1.0)
        self._background: npt.NDArray[np.float32] | None = None
        self._previous: npt.NDArray[Any] | None = None
        self._mask: npt.NDArray[np.uint8] | None = None
        self._unmasked = 1
        self._kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (5, 5))
        self.reseeds = 0

    def detect(self, image: npt.NDArray[np.uint8],
               display: tuple[int, int] | None = None) -> MotionResult:
        """The moving regions of ``image`` (BGR or grey uint8), and learn it into the
        background. The first frame, and the first after a size change, seeds the background
        and reports no motion.

        Args:
            image: The frame's pixels.
            display: ``(width, height)`` of the picture ``image`` is a scaled copy of
                (``Frame.display``: a substream): boxes and a mask in pixel coordinates are in
                its pixels, as zones and track boxes are; ``None``: ``image``'s own.
        """
        import cv2

        h, w = image.shape[:2]
        if self._key != (w, h, display):
            self._key = (w, h, display)
            self._prepare(w, h, display or (w, h))
        small = cv2.resize(image, self._small, interpolation=cv2.INTER_LINEAR)
        grey = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY) if small.ndim == 3 else small
        grey = cv2.GaussianBlur(grey, (5, 5), 0)
        bg, previous = self._background, self._previous
        self._previous = grey
        if bg is None or previous is None:
            self._background = grey.astype(np.float32)
            return MotionResult(_NO_BOXES, 0.0)
        changed = self._changed(cv2.absdiff(grey, cv2.convertScaleAbs(bg)))
        share = cv2.countNonZero(changed) / self._unmasked
        if share > RESEED_FRACTION:
            self._background = grey.astype(np.float32)
            self.reseeds += 1
            return MotionResult(_NO_BOXES, share, reseeded=True)
        alpha = self._cfg.alpha
        now = self._changed(cv2.absdiff(grey, previous))
        if share == 0.0 and not cv2.countNonZero(now):
            cv2.accumulateWeighted(grey, bg, alpha)
            return MotionResult(_NO_BOXES, share)
        moving = cv2.dilate(cv2.bitwise_or(changed, now), self._kernel, iterations=2)
        cv2.accumulateWeighted(grey, bg, alpha, mask=cv2.bitwise_not(moving))
        cv2.accumulateWeighted(grey, bg, alpha * _MOVING_RATE, mask=moving)
        if not cv2.countNonZero(now):
            return MotionResult(_NO_BOXES, share)
        return MotionResult(self._blobs(moving, now), share)

    def _changed(self, diff: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """The pixels of ``diff`` over the threshold (255), outside the mask."""
        import cv2

        _, changed = cv2.threshold(diff, self._cfg.threshold, 255, cv2.THRESH_BINARY)
        if self._mask is not None:
            cv2.bitwise_and(changed, self._mask, dst=changed)
        return changed

    def _blobs(self, moving: npt.NDArray[Any], now: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        """Boxes of the blobs of ``moving`` big enough and with pixels changed ``now``."""
        import cv2

        n, labels, stats, _ = cv2.connectedComponentsWithStats(moving, connectivity=8)
        if n <= 1:
            return _NO_BOXES
        alive = np.bincount(labels[now > 0], minlength=n)[1:]
        stats = stats[1:]
        min_px = self._cfg.min_area * self._small[0] * self._small[1]
        area = stats[:, cv2.CC_STAT_AREA]
        keep = stats[(area >= min_px) & (alive >= np.maximum(_MIN_ALIVE, _ALIVE_SHARE * area))]
        if not len(keep):
            return _NO_BOXES
        x, y = keep[:, cv2.CC_STAT_LEFT], keep[:, cv2.CC_STAT_TOP]
        boxes = np.stack([x, y, x + keep[:, cv2.CC_STAT_WIDTH],
                          y + keep[:, cv2.CC_STAT_HEIGHT]], axis=1).astype(np.float64)
        sx, sy = self._scale
        boxes *= (sx, sy, sx, sy)
        w, h = self._size or (0, 0)
        np.clip(boxes[:, 0::2], 0, w, out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0, h, out=boxes[:, 1::2])
        return merge_boxes(boxes, _MERGE_GAP * max(w, h))

    def _prepare(self, w: int, h: int, display: tuple[int, int]) -> None:
        import cv2

        cfg = self._cfg
        sw = min(cfg.width, w)
        sh = max(1, round(h * sw / w))
        w, h = display  # from here on: the pixels boxes and pixel masks are in
        self._size, self._small = (w, h), (sw, sh)
        self._scale = (w / sw, h / sh)
        self._background = None
        self._previous = None
        self._mask = None
        self._unmasked = sw * sh
        if cfg.mask:
            mask = np.full((sh, sw), 255, dtype=np.uint8)
            scale = (sw, sh) if cfg.coordinates == "normalized" else (sw / w, sh / h)
            polygons = [np.rint(np.asarray(p, dtype=np.float64) * scale).astype(np.int32)
                        for p in cfg.mask]
            cv2.fillPoly(mask, polygons, 0)
            self._mask = mask
            self._unmasked = max(1, cv2.countNonZero(mask))


def merge_boxes(boxes: npt.NDArray[np.float64], gap: float = 0.0) -> npt.NDArray[np.float64]:
    """``(M, 4)`` xyxy boxes with those that overlap or lie within ``gap`` of each other
    replaced by their union, until none do."""
    out = [list(b) for b in boxes.tolist()]
    merged = True
    while merged and len(out) > 1:
        merged = False
        i = 0
        while i < len(out):
            a = out[i]
            for j in range(len(out) - 1, i, -1):
                b = out[j]
                if (a[0] - gap <= b[2] and b[0] - gap <= a[2]
                        and a[1] - gap <= b[3] and b[1] - gap <= a[3]):
                    a[:] = (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))
                    del out[j]
                    merged = True
            i += 1
    return np.asarray(out, dtype=np.float64).reshape(-1, 4)

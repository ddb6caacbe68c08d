"""Vectorized plane geometry for zones and lines, in pixel coordinates (y grows downwards).

Every function takes many points at once as an ``(N, 2)`` float array, so a frame's detections
are tested against a zone or a line in a few numpy operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["Polygon", "anchor_points", "crosses_segment", "side_of_line"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def anchor_points(boxes: npt.NDArray[np.floating],
                  anchor: Literal["bottom_center", "center", "top_center"]) -> FloatArray:
    """The anchor point of each ``xyxy`` box.

    Args:
        boxes: ``(N, 4)`` boxes ``x1, y1, x2, y2``.
        anchor: ``bottom_center`` (where a standing object touches the ground), ``center`` or
            ``top_center``.

    Returns:
        ``(N, 2)`` float64 points.
    """
    b = np.asarray(boxes, dtype=np.float64)
    out = np.empty((b.shape[0], 2))
    np.add(b[:, 0], b[:, 2], out=out[:, 0])
    out[:, 0] *= 0.5
    if anchor == "bottom_center":
        out[:, 1] = b[:, 3]
    elif anchor == "top_center":
        out[:, 1] = b[:, 1]
    else:
        np.add(b[:, 1], b[:, 3], out=out[:, 1])
        out[:, 1] *= 0.5
    return out


@dataclass(frozen=True, slots=True)
class Polygon:
    """A simple polygon prepared for fast point-in-polygon tests.

    Attributes:
        points: ``(M, 2)`` corners in order.
    """

    points: FloatArray
    _x: FloatArray
    _y: FloatArray
    _y_next: FloatArray
    _slope: FloatArray

    @classmethod
    def of(cls, points: npt.ArrayLike) -> Polygon:
        """Prepare the polygon with corners ``points`` (``(M, 2)``, M >= 3)."""
        p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        x, y = p[:, 0], p[:, 1]
        x_next, y_next = np.roll(x, -1), np.roll(y, -1)
        dy = y_next - y
        # A horizontal edge never straddles a ray's y, so its slope is never used.
        slope = np.divide(x_next - x, dy, out=np.zeros_like(dy), where=dy != 0)
        return cls(p, x.copy(), y.copy(), y_next, slope)

    def contains(self, pts: FloatArray) -> BoolArray:
        """Whether each point lies inside (even-odd rule).

        A point exactly on an edge may count as inside or outside; a zone's ``min_frames``
        debounce absorbs that.

        Args:
            pts: ``(N, 2)`` points.

        Returns:
            ``(N,)`` booleans.
        """
        px = pts[:, 0:1]
        py = pts[:, 1:2]
        straddles = (self._y > py) != (self._y_next > py)
        left_of_edge = px < self._x + (py - self._y) * self._slope
        crossings = np.count_nonzero(straddles & left_of_edge, axis=1)
        inside: BoolArray = (crossings & 1).astype(np.bool_)
        return inside


def side_of_line(pts: FloatArray, a: FloatArray, b: FloatArray) -> FloatArray:
    """The signed side of each point to the line through ``a`` and ``b``.

    Positive on the right of the direction ``a`` -> ``b`` as seen in an image (y down), negative
    on the left, zero on the line; the magnitude is twice the area of the triangle ``a, b, p``.
    For a horizontal line drawn left to right, points below it are positive.

    Args:
        pts: ``(N, 2)`` points.
        a: The line's first point, ``(2,)``.
        b: Its second point, ``(2,)``.

    Returns:
        ``(N,)`` float64.
    """
    dx, dy = b[0] - a[0], b[1] - a[1]
    side: FloatArray = dx * (pts[:, 1] - a[1]) - dy * (pts[:, 0] - a[0])
    return side


def crosses_segment(p: FloatArray, q: FloatArray, a: FloatArray, b: FloatArray) -> BoolArray:
    """Whether each path ``p[i] -> q[i]`` meets the segment ``a``-``b`` between its ends.

    Meant for paths already known to change sides of the (infinite) line through ``a`` and
    ``b``, or to leave it: the point where the path meets that line is computed and kept only
    when it lies on the segment (ends included). A path along the line itself (both ends on
    it) does not cross.

    Args:
        p: ``(N, 2)`` start points.
        q: ``(N, 2)`` end points.
        a: The segment's first end, ``(2,)``.
        b: Its second end, ``(2,)``.

    Returns:
        ``(N,)`` booleans.
    """
    dp = side_of_line(p, a, b)
    dq = side_of_line(q, a, b)
    denom = dp - dq
    ok = denom != 0
    t = np.divide(dp, denom, out=np.zeros_like(dp), where=ok)
    meet = p + t[:, None] * (q - p)
    ab = b - a
    u = ((meet - a) @ ab) / float(ab @ ab)
    eps = 1e-9
    hit: BoolArray = ok & (u >= -eps) & (u <= 1.0 + eps)
    return hit

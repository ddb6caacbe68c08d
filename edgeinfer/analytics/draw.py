"""Annotation of event snapshots and clips: tracked boxes, zones and counting lines drawn on a
frame with OpenCV, and JPEG encoding.

Coordinates are given in the original frame's pixels; ``scale`` maps them onto an image that
was scaled down before it was stored (``clips.max_width``). ``cv2`` is imported inside the
functions so that importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidInputError
from ..frames import DETECTIONS, Detection, Shape

__all__ = ["BOX_COLOR", "Geometry", "HIGHLIGHT_COLOR", "LINE_COLOR", "POINT_COLOR", "TrackBox",
           "ZONE_COLOR", "Boxed", "decode_jpeg", "draw_scene", "draw_shapes", "encode_jpeg"]

# BGR. Pure primaries survive JPEG and video compression well enough to be checked in tests.
BOX_COLOR = (0, 255, 0)
HIGHLIGHT_COLOR = (0, 0, 255)
ZONE_COLOR = (0, 255, 255)
LINE_COLOR = (255, 0, 255)
POINT_COLOR = (255, 255, 0)  # keypoints and mask outlines
_ZONE_ALPHA = 0.2
_FONT = 0  # cv2.FONT_HERSHEY_SIMPLEX


@dataclass(frozen=True, slots=True)
class TrackBox:
    """One box to draw.

    Attributes:
        track_id: The track's id; ``None`` for an untracked detection.
        label: The class label.
        score: The detection's score.
        box: ``(x1, y1, x2, y2)`` in the original frame's pixels.
    """

    track_id: int | None
    label: str
    score: float
    box: tuple[float, float, float, float]


class Boxed(Protocol):
    """What is drawn of a box: a `TrackBox`, or an `edgeinfer.frames.Detection` as it is (the
    pipeline hands its tracked detections over without making new objects)."""

    @property
    def track_id(self) -> int | None: ...
    @property
    def label(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def box(self) -> tuple[float, float, float, float]: ...


Geometry = Sequence[tuple[str, str, np.ndarray]]
"""Zones and lines to draw: ``(name, "zone" | "line", points)`` with integer pixel points of the
original frame (N x 2)."""


def draw_scene(image: np.ndarray, boxes: Sequence[Boxed], geometry: Geometry = (), *,
               scale: float = 1.0, highlight: int | None = None) -> None:
    """Draw zones, lines and boxes on ``image`` in place.

    Zones are outlined polygons over a faint fill, with their name; lines carry their name and
    an arrow towards the side an ``in`` crossing moves to (the right of the line as drawn from
    its first point to its second, see ``LineConfig``); boxes are labelled
    ``"label #id score"``. The ``highlight`` track is drawn thicker in another colour.

    Args:
        image: H x W x 3 uint8 BGR image, changed in place.
        boxes: The frame's boxes.
        geometry: The pipeline's zones and lines.
        scale: This image's size over the original frame's (0.5: half as wide).
        highlight: The track id to make stand out.
    """
    # 2 px at least: a 1 px coloured line does not survive JPEG's halved colour resolution
    thick = max(2, round(2 * max(image.shape[:2]) / 1000))
    for name, kind, points in geometry:
        pts = np.round(np.asarray(points, dtype=np.float64) * scale).astype(np.int32)
        if kind == "zone":
            _draw_zone(image, name, pts, thick)
        else:
            _draw_line(image, name, pts, thick)
    for b in boxes:
        if b.track_id is not None and b.track_id == highlight:
            continue
        _draw_box(image, b, scale, BOX_COLOR, thick)
    for b in boxes:
        if b.track_id is not None and b.track_id == highlight:
            _draw_box(image, b, scale, HIGHLIGHT_COLOR, thick * 2)


def boxes_shapes(boxes: Sequence[Boxed]) -> tuple[Shape, ...]:
    """The keypoints and mask outlines the boxes of an event's frame carry (pose and segment
    detections), for its snapshot and clip as the live view draws them."""
    return DETECTIONS.shapes(tuple(b for b in boxes if isinstance(b, Detection)))


def draw_shapes(image: np.ndarray, shapes: Sequence[Shape], scale: float = 1.0) -> None:
    """Draw a result's ``shapes`` (``PartKind.shapes``: keypoints as dots, mask outlines as
    closed polygons) on ``image`` in place; ``scale`` as in `draw_scene`."""
    import cv2

    thick = max(2, round(2 * max(image.shape[:2]) / 1000))
    for kind, points in shapes:
        if not points:
            continue
        pts = np.round(np.asarray(points, dtype=np.float64) * scale).astype(np.int32)
        if kind == "outline":
            cv2.polylines(image, [pts], True, POINT_COLOR, thick, cv2.LINE_AA)
            continue
        for x, y in pts.tolist():
            cv2.circle(image, (x, y), thick + 1, POINT_COLOR, cv2.FILLED, cv2.LINE_AA)


def _draw_zone(image: np.ndarray, name: str, pts: np.ndarray, thick: int) -> None:
    import cv2

    h, w = image.shape[:2]
    x0, y0 = np.clip(pts.min(axis=0), 0, [w, h])
    x1, y1 = np.clip(pts.max(axis=0) + 1, 0, [w, h])
    if x1 > x0 and y1 > y0:
        # Blend only the polygon's bounding box: a full-frame copy per drawn frame is wasted.
        roi = image[y0:y1, x0:x1]
        mask = np.zeros(roi.shape[:2], np.uint8)
        cv2.fillPoly(mask, [pts - [x0, y0]], 255)
        tinted = cv2.addWeighted(roi, 1 - _ZONE_ALPHA, np.full_like(roi, ZONE_COLOR), _ZONE_ALPHA,
                                 0)
        roi[mask > 0] = tinted[mask > 0]
    cv2.polylines(image, [pts], True, ZONE_COLOR, thick, cv2.LINE_AA)
    _label(image, name, (int(pts[0][0]), int(pts[0][1])), ZONE_COLOR)


def _draw_line(image: np.ndarray, name: str, pts: np.ndarray, thick: int) -> None:
    import cv2

    (ax, ay), (bx, by) = pts[0], pts[1]
    p1, p2 = (int(ax), int(ay)), (int(bx), int(by))
    cv2.line(image, p1, p2, LINE_COLOR, thick, cv2.LINE_AA)
    dx, dy = float(bx - ax), float(by - ay)
    length = max((dx * dx + dy * dy) ** 0.5, 1e-9)
    # (-dy, dx) is the right-hand side in image coordinates (y down): where ``in`` goes.
    nx, ny = -dy / length, dx / length
    mid = ((ax + bx) / 2, (ay + by) / 2)
    reach = max(12.0, min(40.0, length / 4))
    tip = (int(mid[0] + nx * reach), int(mid[1] + ny * reach))
    cv2.arrowedLine(image, (int(mid[0]), int(mid[1])), tip, LINE_COLOR, thick, cv2.LINE_AA,
                    tipLength=0.35)
    _label(image, "in", (tip[0] + 3, tip[1] + 3), LINE_COLOR)
    _label(image, name, p1, LINE_COLOR)


def _draw_box(image: np.ndarray, b: Boxed, scale: float, color: tuple[int, int, int],
              thick: int) -> None:
    import cv2

    x1, y1, x2, y2 = (round(v * scale) for v in b.box)
    cv2.rectangle(image, (x1, y1), (x2, y2), color, thick)
    ident = "" if b.track_id is None else f" #{b.track_id}"
    _label(image, f"{b.label}{ident} {b.score:.2f}", (x1, y1), color, clear_of=thick)


def _label(image: np.ndarray, text: str, at: tuple[int, int], color: tuple[int, int, int],
           clear_of: int | None = None) -> None:
    """``text`` on a black plate at ``at``. With ``clear_of`` (a box's line width), ``at`` is
    the box's top-left corner and the plate stays off the box's line: just above it, or just
    inside it at the top of the image (a plate over the line hid the box's outline)."""
    import cv2

    size = max(0.4, image.shape[0] / 1200)
    (tw, th), base = cv2.getTextSize(text, _FONT, size, 1)
    x = min(max(at[0], 0), max(image.shape[1] - tw, 0))
    if clear_of is None:
        y = max(at[1] - 4, th + 2)
    else:
        gap = clear_of // 2 + 2  # the line's half width, and a pixel of the scene between
        y = at[1] - gap - base + 2  # plate bottom (y + base - 2) just above the line
        if y - th - 2 < 0:  # no room above: just inside, under the line
            y = at[1] + gap + th + 2
    cv2.rectangle(image, (x, y - th - 2), (x + tw, y + base - 2), (0, 0, 0), cv2.FILLED)
    cv2.putText(image, text, (x, y - 2), _FONT, size, color, 1, cv2.LINE_AA)


def encode_jpeg(image: np.ndarray, quality: int) -> bytes:
    """``image`` (H x W x 3 uint8 BGR) as JPEG bytes of ``quality`` (10-100).

    Raises:
        InvalidInputError: OpenCV cannot encode the array (wrong shape or dtype).
    """
    import cv2

    params: list[Any] = [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
    try:
        ok, buf = cv2.imencode(".jpg", image, params)
    except cv2.error as exc:
        raise InvalidInputError(f"cannot encode a {image.shape} {image.dtype} image as JPEG"
                                ) from exc
    if not ok:
        raise InvalidInputError(f"cannot encode a {image.shape} {image.dtype} image as JPEG")
    return bytes(buf)


def decode_jpeg(data: bytes) -> np.ndarray:
    """JPEG ``data`` as an H x W x 3 uint8 BGR array (writable).

    Raises:
        InvalidInputError: The bytes are not an image OpenCV can decode.
    """
    import cv2

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise InvalidInputError("cannot decode JPEG data")
    return np.asarray(image)

"""A scene-analytics test video with exact ground truth, made from real photographs.

The astronaut's face (``edgeinfer.model.samples``), cropped with a margin around the box a face
detector finds on the photograph, is pasted onto the ``coffee`` photograph and moved along a
known path: left to right across a vertical counting line, down into a rectangular zone, a
pause there (dwell), then right to left out of the zone and back across the line. The path is
piecewise linear and the pasted positions are whole pixels, so the face's box in every frame
and the frames at which its centre enters or leaves the zone and crosses the line follow from
the geometry alone. Nothing is random: the same arguments write the same frames.

    truth = make_scene_video(tmp / "scene.avi", face_box=astronaut_face_box(model_path))
    truth.events   # (TruthEvent("cross", "door", 21, "out"), TruthEvent("enter", ...), ...)
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SourceError

__all__ = ["LINE", "ZONE", "SceneTruth", "TruthEvent", "astronaut_face_box", "background",
           "face_patch", "make_background_video", "make_scene_video"]

Box = tuple[float, float, float, float]

ZONE = ((0.625, 0.54), (0.97, 0.54), (0.97, 0.96), (0.625, 0.96))
"""The zone's corners, normalized (x, y): a rectangle in the lower right of the frame."""
LINE = ((0.5, 0.0), (0.5, 1.0))
"""The counting line, normalized: vertical through the middle, drawn top to bottom, so that
``in`` (towards the right of the line as drawn, ``LineConfig``) is right-to-left on screen."""
_PATH = ((0.2, 0.27), (0.8, 0.27), (0.8, 0.73), (0.2, 0.73))  # face centre waypoints
_MARGIN = 0.3  # of the face box, on each side of the pasted crop


@dataclass(frozen=True, slots=True)
class TruthEvent:
    """One event the scene must report.

    Attributes:
        type: ``enter``, ``exit`` or ``cross``.
        name: The zone's or line's name.
        frame: The first frame with the face's centre on the new side (inside the zone,
            outside it, or past the line).
        direction: ``in`` or ``out`` for a crossing, else ``None``.
    """

    type: str
    name: str
    frame: int
    direction: str | None = None


@dataclass(frozen=True, slots=True)
class SceneTruth:
    """What a video made by ``make_scene_video`` shows.

    Attributes:
        path: The video file.
        fps: Its frame rate.
        size: ``(width, height)``.
        boxes: ``(frames, 4)`` float: the face's true ``x1, y1, x2, y2`` in each frame.
        events: The zone and line events in frame order.
        zone: The zone's corners in pixels.
        line: The line's two end points in pixels.
        patch: The pasted BGR crop (to find the face again in a decoded frame).
        face_in_patch: The face's box within ``patch``.
        zone_name: The zone's name in ``events`` and ``scene_config``.
        line_name: The line's name.
    """

    path: Path
    fps: float
    size: tuple[int, int]
    boxes: npt.NDArray[np.float64]
    events: tuple[TruthEvent, ...]
    zone: tuple[tuple[float, float], ...]
    line: tuple[tuple[float, float], tuple[float, float]]
    patch: npt.NDArray[np.uint8]
    face_in_patch: Box
    zone_name: str = "desk"
    line_name: str = "door"

    @property
    def frames(self) -> int:
        """Number of frames in the video."""
        return int(self.boxes.shape[0])

    def centers(self) -> npt.NDArray[np.float64]:
        """``(frames, 2)``: the centre of the face's true box in each frame."""
        b = self.boxes
        return np.stack([(b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2], axis=1)

    def scene_config(self) -> dict[str, Any]:
        """``zones:`` and ``lines:`` of a pipeline config (normalized, anchor ``center``)."""
        return {"zones": [{"name": self.zone_name, "points": [list(p) for p in ZONE],
                           "anchor": "center"}],
                "lines": [{"name": self.line_name, "points": [list(p) for p in LINE],
                           "anchor": "center"}]}

    def frame_at(self, top_left: tuple[float, float]) -> list[int]:
        """Frames whose pasted crop has its top-left corner nearest ``top_left`` (the position
        found by template matching): several when the face stood still there."""
        x0, y0 = self.face_in_patch[:2]
        corners = self.boxes[:, :2] - (x0, y0)
        dist = np.hypot(corners[:, 0] - top_left[0], corners[:, 1] - top_left[1])
        return np.flatnonzero(dist <= dist.min() + 1e-6).tolist()


def astronaut_face_box(model_path: str | os.PathLike[str]) -> Box:
    """The face box a face detector (``blazeface`` decoder) finds on the astronaut photograph.

    Raises:
        InvalidInputError: The model finds no face.
    """
    from ..model import samples
    from ..config.pipeline import DetectTask as DetectConfig
    from ..errors import InvalidInputError
    from ..frames import Frame
    from ..model.load import load_model
    from ..tasks.detect import DetectTask

    image = samples.load_image("astronaut")
    frame = Frame(index=0, ts=0.0, wall=0.0, data=image)
    with load_model(model_path, threads=1, probe=False) as model:
        task = DetectTask(DetectConfig(decoder="blazeface", score_threshold=0.6), model)
        feeds, context = task.preprocess(frame)
        found = task.postprocess(model.run(feeds), frame, context).detections or ()
    if not found:
        raise InvalidInputError("the face detector finds no face on the astronaut photograph")
    best = max(found, key=lambda d: d.score)
    return best.box


def background(size: tuple[int, int] = (640, 480)) -> npt.NDArray[np.uint8]:
    """The ``coffee`` photograph resized to ``size`` (BGR)."""
    import cv2

    from ..model import samples

    path = samples.sample_images()[list(samples.PHOTOS).index("coffee")]
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise SourceError(f"cannot decode sample photograph {path}")
    return np.asarray(cv2.resize(image, size, interpolation=cv2.INTER_AREA), dtype=np.uint8)


def face_patch(face_box: Box, face_px: int) -> tuple[npt.NDArray[np.uint8], Box]:
    """The astronaut's face cropped with a margin around ``face_box`` and scaled so the face
    box is ``face_px`` wide: the BGR patch and the face's box within it."""
    import cv2

    from ..model import samples

    image = samples.load_image("astronaut")
    x1, y1, x2, y2 = face_box
    w, h = x2 - x1, y2 - y1
    cx0, cy0 = max(0, round(x1 - _MARGIN * w)), max(0, round(y1 - _MARGIN * h))
    cx1 = min(image.shape[1], round(x2 + _MARGIN * w))
    cy1 = min(image.shape[0], round(y2 + _MARGIN * h))
    scale = face_px / w
    crop = image[cy0:cy1, cx0:cx1]
    size = (round(crop.shape[1] * scale), round(crop.shape[0] * scale))
    patch = np.asarray(cv2.resize(crop, size, interpolation=cv2.INTER_CUBIC), dtype=np.uint8)
    return patch, ((x1 - cx0) * scale, (y1 - cy0) * scale, (x2 - cx0) * scale,
                   (y2 - cy0) * scale)


def _path(size: tuple[int, int], fps: float, step_px: float, dwell_s: float,
          hold_s: tuple[float, float]) -> npt.NDArray[np.float64]:
    """The face centre in every frame: a still start, three legs, a pause after the second."""
    w, h = size
    points = [np.array((x * w, y * h)) for x, y in _PATH]
    track = [points[0]] * max(1, round(hold_s[0] * fps))
    for leg, (a, b) in enumerate(zip(points, points[1:])):
        n = math.ceil(float(np.hypot(*(b - a))) / step_px)
        track += [a + (b - a) * k / n for k in range(1, n + 1)]
        if leg == 1:
            track += [b] * round(dwell_s * fps)
    track += [points[-1]] * round(hold_s[1] * fps)
    return np.array(track)


def _events(centers: npt.NDArray[np.float64], zone: Sequence[tuple[float, float]],
            line: tuple[tuple[float, float], tuple[float, float]], names: tuple[str, str]
            ) -> tuple[TruthEvent, ...]:
    xs, ys = [p[0] for p in zone], [p[1] for p in zone]
    inside = ((centers[:, 0] > min(xs)) & (centers[:, 0] < max(xs))
              & (centers[:, 1] > min(ys)) & (centers[:, 1] < max(ys)))
    (ax, ay), (bx, by) = line
    # Side of the line's right-hand normal (-dy, dx): positive is where an ``in`` crossing goes.
    side = np.sign((centers[:, 0] - ax) * -(by - ay) + (centers[:, 1] - ay) * (bx - ax))
    out: list[TruthEvent] = []
    for i in range(1, len(centers)):
        if inside[i] != inside[i - 1]:
            out.append(TruthEvent("enter" if inside[i] else "exit", names[0], i))
        if side[i] != side[i - 1]:
            out.append(TruthEvent("cross", names[1], i, "in" if side[i] > 0 else "out"))
    return tuple(out)


def make_scene_video(path: str | os.PathLike[str], face_box: Box, *, fps: float = 15.0,
                     size: tuple[int, int] = (640, 480), face_px: int = 140,
                     step_px: float = 12.0, dwell_s: float = 1.0,
                     hold_s: tuple[float, float] = (0.4, 1.6)) -> SceneTruth:
    """Write the scene video and return its ground truth.

    Args:
        path: Where to write it: ``.mp4`` as MPEG-4 Part 2, anything else as MJPEG (AVI).
        face_box: The face's box on the astronaut photograph (``astronaut_face_box``).
        fps: Frame rate.
        size: ``(width, height)``.
        face_px: Width of the pasted face box in pixels.
        step_px: How far the face moves per frame on each leg.
        dwell_s: The pause inside the zone.
        hold_s: Still time at the start (before any event, for the tracker to confirm the
            face) and at the end (for the post-roll of a clip of the last event).

    Raises:
        SourceError: OpenCV cannot write the file, or the path leaves the frame at this size.
    """
    out = Path(path)
    patch, face = face_patch(face_box, face_px)
    centers = _path(size, fps, step_px, dwell_s, hold_s)
    fcx, fcy = (face[0] + face[2]) / 2, (face[1] + face[3]) / 2
    corners = np.round(centers - (fcx, fcy)).astype(np.int64)
    ph, pw = patch.shape[:2]
    if (corners.min() < 0 or (corners[:, 0] + pw).max() > size[0]
            or (corners[:, 1] + ph).max() > size[1]):
        raise SourceError(f"the face ({pw}x{ph}) leaves a {size[0]}x{size[1]} frame on its path")
    boxes = np.concatenate([corners + face[:2], corners + face[2:]], axis=1).astype(np.float64)
    w, h = size
    zone = tuple((x * w, y * h) for x, y in ZONE)
    line = ((LINE[0][0] * w, LINE[0][1] * h), (LINE[1][0] * w, LINE[1][1] * h))
    truth = SceneTruth(out, fps, size, boxes, (), zone, line, patch, face)
    events = _events(truth.centers(), zone, line, (truth.zone_name, truth.line_name))
    base = background(size)
    writer = _writer(out, fps, size)
    try:
        for x, y in corners.tolist():
            frame = base.copy()
            frame[y:y + ph, x:x + pw] = patch
            writer.write(frame)
    finally:
        writer.release()
    return SceneTruth(out, fps, size, boxes, events, zone, line, patch, face)


def make_background_video(path: str | os.PathLike[str], *, frames: int = 30,
                          fps: float = 15.0, size: tuple[int, int] = (640, 480)) -> Path:
    """The scene's background without the face (no detections, no events).

    Raises:
        SourceError: OpenCV cannot write the file.
    """
    out = Path(path)
    base = background(size)
    writer = _writer(out, fps, size)
    try:
        for _ in range(frames):
            writer.write(base)
    finally:
        writer.release()
    return out


def _writer(out: Path, fps: float, size: tuple[int, int]) -> Any:
    import cv2

    out.parent.mkdir(parents=True, exist_ok=True)
    fourcc = cv2.VideoWriter.fourcc(*("mp4v" if out.suffix.lower() == ".mp4" else "MJPG"))
    writer = cv2.VideoWriter(str(out), fourcc, float(fps), size)
    if not writer.isOpened():
        raise SourceError(f"OpenCV cannot write video {out}")
    return writer

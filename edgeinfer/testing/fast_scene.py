"""A scripted camera scene of fast objects, with sensor noise and exact truth (for
``bench/cameras.py`` and the motion-gated counting tests).

The ``scripted_scene`` background (the ``coffee`` photograph, the flickering lamp in its mask)
crossed by the astronaut's face (160 px wide by default, as in ``Scene``; smaller on request)
on straight horizontal passes across the counting line: each pass moves ``widths`` face widths
per detection interval (``detect.fps`` 5 of a 15 fps stream: 3 frames), one to two, so two
detections of it never overlap. Passes come alone, in pairs going opposite ways on nearby rows
(they pass each other between two detections), and in pairs one after the other. Every frame
gets Gaussian sensor noise (a seeded generator per frame). Positions are whole pixels and
follow from the script: the crossings (frame and direction) and the frames each face is first
wholly in view are exact.

    scene = FastScene.full()                  # 60 s, 1280x720 at 15 fps, faces 160 px
    small = FastScene.full(face_px=85)        # the same passes with 85 px faces
    scene.encode(cache / "fast.mp4")          # H.264, as Scene.encode
    scene.crossings                           # (Crossing(frame=..., direction="out"), ...)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..model.catalog import resolve_model
from .scene_video import astronaut_face_box, background, face_patch
from .scripted_scene import LINE, Crossing, encode_h264, flicker, in_mask, paste, scene_config

__all__ = ["FastScene", "Pass"]

_SIZE = (1280, 720)
_FACE_PX = 160  # nudenet-320n finds it all across a 720p frame: 0.54-0.74 (at 128 0.33-0.69)
_INTERVAL = 3  # frames between detections at detect.fps 5 of 15 fps: the speeds' unit
_NOISE = 4.0  # sensor noise, standard deviation in grey levels


@dataclass(frozen=True, slots=True)
class Pass:
    """One face crossing the frame horizontally.

    Attributes:
        start_s: When its centre is half a patch off the edge it comes from.
        row: Its centre's height, normalized.
        rightward: Left to right (``out`` across ``LINE``), else right to left (``in``).
        widths: Face widths it moves per detection interval (3 frames).
    """

    start_s: float
    row: float
    rightward: bool
    widths: float


@dataclass(frozen=True, slots=True)
class FastScene:
    """The script and its truth at 1280x720.

    Attributes:
        fps: Frame rate.
        frames: Length in frames.
        passes: The crossings of the frame.
        centers: ``(frames, passes, 2)`` each face's centre per frame (NaN: not in view).
        face: A face's box relative to its centre, ``(x1, y1, x2, y2)``.
        face_px: Width of a face's box in pixels.
        noise: Sensor noise, standard deviation in grey levels.
    """

    fps: float
    frames: int
    passes: tuple[Pass, ...]
    centers: npt.NDArray[np.float64]
    face: tuple[float, float, float, float]
    face_px: int = _FACE_PX
    noise: float = _NOISE

    @classmethod
    def full(cls, fps: float = 15.0, face_px: int = _FACE_PX) -> FastScene:
        """60 s: 16 passes at 1 to 2 widths per interval, alone, in opposite pairs on rows
        0.06 apart (they overlap as they pass), and one behind the other."""
        passes: list[Pass] = []
        t = 1.0
        for k, (widths, kind) in enumerate([(1.0, "alone"), (2.0, "alone"), (1.5, "opposite"),
                                            (1.2, "alone"), (1.8, "behind"), (2.0, "opposite"),
                                            (1.0, "opposite"), (1.6, "alone"),
                                            (1.4, "behind"), (1.9, "alone")]):
            row = (0.3, 0.45, 0.62)[k % 3]
            right = k % 2 == 0
            passes.append(Pass(t, row, right, widths))
            if kind == "opposite":
                passes.append(Pass(t, row + 0.06, not right, widths))
            elif kind == "behind":
                passes.append(Pass(t + 0.8, row, right, widths))
            t += 5.5
        return cls.make(60.0, tuple(passes), fps, face_px)

    @classmethod
    def quick(cls, fps: float = 15.0, face_px: int = _FACE_PX) -> FastScene:
        """8 s: one pass each way at 1.5 and 2 widths per interval, then an opposite pair."""
        return cls.make(8.0, (Pass(0.5, 0.35, True, 1.5), Pass(2.5, 0.55, False, 2.0),
                              Pass(4.5, 0.4, True, 1.8), Pass(4.5, 0.46, False, 1.8)), fps,
                        face_px)

    @classmethod
    def make(cls, seconds: float, passes: tuple[Pass, ...], fps: float = 15.0,
             face_px: int = _FACE_PX) -> FastScene:
        """A scene of ``seconds`` with these passes (checked to end inside it)."""
        frames = round(seconds * fps)
        centers = np.full((frames, len(passes), 2), np.nan)
        w, h = _SIZE
        pw, ph = _patch_size(face_px)
        half = pw / 2
        fx1, fy1, fx2, fy2 = _patch_and_face(face_px)[1]
        off, line = (fx1 + fx2 - pw) / 2, LINE[0][0] * w  # face centre - patch centre
        for j, p in enumerate(passes):
            step = p.widths * face_px / _INTERVAL * (1 if p.rightward else -1)
            x0 = -half if p.rightward else w + half
            n = math.ceil((w + 2 * half) / abs(step)) + 1
            first = round(p.start_s * fps)
            if first + n > frames:
                raise ValueError(f"the pass at {p.start_s} s runs past the end")
            xs = np.round(x0 + step * np.arange(n))
            if (np.abs(xs + off - line) < 1).any():  # no frame with the face on the line
                xs += 2
            centers[first:first + n, j, 0] = xs
            centers[first:first + n, j, 1] = round(p.row * h)
        return cls(fps, frames, passes, centers,
                   (fx1 - pw / 2, fy1 - ph / 2, fx2 - pw / 2, fy2 - ph / 2), face_px)

    # -- truth ----------------------------------------------------------------------------
    @property
    def size(self) -> tuple[int, int]:
        return _SIZE

    @property
    def crossings(self) -> tuple[Crossing, ...]:
        """Every crossing of ``LINE`` by a face's centre, in frame order."""
        out = []
        for j in range(len(self.passes)):
            side = np.sign(self.centers[:, j, 0] - LINE[0][0] * _SIZE[0])
            for i in range(1, self.frames):
                if side[i - 1] != 0 and side[i] != 0 and side[i] == -side[i - 1]:
                    out.append(Crossing(i, "out" if side[i] > 0 else "in"))
        return tuple(sorted(out, key=lambda c: c.frame))

    @property
    def entries(self) -> tuple[int, ...]:
        """Frames at which a face's box is first wholly in view, one per pass, in order."""
        box = self.boxes()
        w, h = _SIZE
        inside = (box[..., 0] >= 0) & (box[..., 2] <= w) & (box[..., 1] >= 0) & (box[..., 3] <= h)
        return tuple(sorted(int(np.argmax(inside[:, j])) for j in range(len(self.passes))))

    def boxes(self, size: tuple[int, int] | None = None) -> npt.NDArray[np.float64]:
        """``(frames, passes, 4)`` each face's true box per frame at ``size`` (NaN: none)."""
        s = (size or _SIZE)[0] / _SIZE[0]
        c, f = self.centers, self.face
        return np.stack([c[..., 0] + f[0], c[..., 1] + f[1], c[..., 0] + f[2],
                         c[..., 1] + f[3]], axis=-1) * s

    def widths_per_interval(self) -> npt.NDArray[np.float64]:
        """Per pass: how far its face moves between two detections, in face widths."""
        return np.array([p.widths for p in self.passes])

    def motion_fraction(self) -> float:
        """Share of frames in which a face moves."""
        return float((~np.isnan(self.centers[:, :, 0])).any(axis=1).mean())

    def in_mask(self, box: tuple[float, float, float, float], size: tuple[int, int]) -> bool:
        """Whether a box's centre lies in ``MASK`` (a detection there is a distractor's)."""
        return in_mask(box, size)

    def scene_config(self) -> dict[str, Any]:
        """``zones:``/``lines:`` of a pipeline config (normalized, anchor ``center``)."""
        return scene_config()

    # -- pictures -------------------------------------------------------------------------
    def render(self, size: tuple[int, int] | None = None) -> Iterator[npt.NDArray[np.uint8]]:
        """Every frame, BGR, at ``size`` (default 1280x720), noise included."""
        import cv2

        size = size or _SIZE
        base = background(_SIZE)
        patch = _patch_and_face(self.face_px)[0]
        ph, pw = patch.shape[:2]
        for i in range(self.frames):
            frame = base.copy()
            flicker(frame, base, i / self.fps)
            for cx, cy in self.centers[i]:
                if not math.isnan(cx):
                    paste(frame, patch, round(cx - pw / 2), round(cy - ph / 2))
            noise = np.random.default_rng(i).standard_normal(frame.shape, dtype=np.float32)
            noisy = np.clip(frame + self.noise * noise, 0, 255).astype(np.uint8)
            if size != _SIZE:
                noisy = np.asarray(cv2.resize(noisy, size, interpolation=cv2.INTER_AREA),
                                   dtype=np.uint8)
            yield noisy

    def encode(self, path: str | os.PathLike[str], size: tuple[int, int] | None = None) -> Path:
        """Write the scene as H.264 in MP4 at ``size`` (once: an existing file is kept).

        Raises:
            SourceError: ``gst-launch-1.0`` or ``x264enc`` missing, or encoding failed.
        """
        size = size or _SIZE
        return encode_h264(lambda: self.render(size), self.fps, size, path)


@cache
def _face_box() -> tuple[float, float, float, float]:
    return astronaut_face_box(resolve_model("blazeface"))


@cache
def _patch_and_face(face_px: int) -> tuple[npt.NDArray[np.uint8],
                                           tuple[float, float, float, float]]:
    return face_patch(_face_box(), face_px)


def _patch_size(face_px: int) -> tuple[int, int]:
    h, w = _patch_and_face(face_px)[0].shape[:2]
    return w, h

"""A scripted camera scene with exact truth, encoded once as H.264 (for ``bench/cameras.py``).

A still background (the ``coffee`` photograph) where, at known times, the astronaut's face
(``scene_video``'s patch) walks in from one edge, crosses a vertical counting line, stops in a
zone (dwell: nothing moves), and walks out again; a second visit goes the other way. Moving
takes at most about a fifth of the time. A lamp in the top left flickers for the whole video:
the distractor, inside ``MASK`` (a config masks it; a detector must never be sent there).

Positions are whole pixels of the main stream and follow from the script alone, so the truth
(crossing frames and direction, zone entries, the frames at which the face is first wholly in
view) is exact; a substream is the same frames resized. Encoding pipes raw frames to GStreamer's
``x264enc`` (``gst-launch-1.0``: Debian's ``gstreamer1.0-plugins-ugly``), no B-frames, a key
frame every second, in MP4.

    scene = Scene.full()                         # 60 s, two visits
    main = scene.encode(cache / "main.mp4")      # 1280x720 at 15 fps
    sub = scene.encode(cache / "sub.mp4", size=(640, 360))
    scene.crossings                              # (Crossing(frame=..., direction="out"), ...)
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SourceError
from ..model.catalog import resolve_model
from .scene_video import astronaut_face_box, background, face_patch

__all__ = ["LAMP", "LINE", "MASK", "ZONE", "Crossing", "Scene", "Visit", "encode_h264", "flicker",
           "in_mask", "paste", "scene_config", "x264_available"]

Point = tuple[float, float]

LINE: tuple[Point, Point] = ((0.5, 0.0), (0.5, 1.0))
"""The counting line, normalized, drawn top to bottom: ``in`` is right-to-left on screen."""
ZONE: tuple[Point, ...] = ((0.62, 0.52), (0.97, 0.52), (0.97, 0.97), (0.62, 0.97))
"""The dwell zone (lower right), normalized corners."""
LAMP = (0.05, 0.02, 0.15, 0.12)
"""The flickering lamp's box, normalized ``x1, y1, x2, y2``."""
MASK: tuple[Point, ...] = ((0.03, 0.0), (0.17, 0.0), (0.17, 0.15), (0.03, 0.15))
"""The motion mask over the lamp, normalized (the face's path never comes near it)."""

_SIZE = (1280, 720)  # the main stream; the script is in its pixels
_FACE_PX = 160  # width of the face box at the main size (nudenet-320n finds it: 0.6)
_SPEED = 24.0  # main-stream pixels per frame while walking
_FLICKER_HZ = 2.0


@dataclass(frozen=True, slots=True)
class Visit:
    """One walk through the scene.

    Attributes:
        start_s: When the face starts walking in (its centre one half-patch off screen).
        waypoints: Normalized centres after the entry point, walked in turn at ``_SPEED``; the
            last is off screen.
        dwell_s: The stop at waypoint ``dwell_at`` (inside the zone).
        dwell_at: Index into ``waypoints``.
        enter_from: ``left`` or ``right``: which edge it walks in from, at the first
            waypoint's height.
    """

    start_s: float
    waypoints: tuple[Point, ...]
    dwell_s: float
    dwell_at: int
    enter_from: str


@dataclass(frozen=True, slots=True)
class Crossing:
    """A scripted crossing of ``LINE``: the first frame with the face's centre past it."""

    frame: int
    direction: str


@dataclass(frozen=True, slots=True)
class Scene:
    """The script and its truth, at the main stream's size.

    Attributes:
        fps: Frame rate.
        frames: Length in frames.
        visits: The walks.
        centers: ``(frames, 2)`` face centre per frame in main-stream pixels (NaN: no face).
        face: The face's box relative to its centre, ``(x1, y1, x2, y2)``, main pixels.
    """

    fps: float
    frames: int
    visits: tuple[Visit, ...]
    centers: npt.NDArray[np.float64]
    face: tuple[float, float, float, float]

    # -- scripts --------------------------------------------------------------------------
    @classmethod
    def full(cls, fps: float = 15.0) -> Scene:
        """60 s: left-to-right (``out``) into the zone, 8 s there, out to the right; then in
        from the right into the zone, 6 s there, up and out to the left (``in``)."""
        return cls.make(60.0, (
            Visit(4.0, ((0.78, 0.33), (0.78, 0.74), (1.15, 0.74)), 8.0, 1, "left"),
            Visit(34.0, ((0.78, 0.74), (0.78, 0.33), (-0.15, 0.33)), 6.0, 0, "right"),
        ), fps)

    @classmethod
    def quick(cls, fps: float = 15.0) -> Scene:
        """11 s: the first visit only, a 1 s dwell (the smoke test's scene)."""
        return cls.make(11.0, (
            Visit(3.0, ((0.78, 0.33), (0.78, 0.74), (1.15, 0.74)), 1.0, 1, "left"),), fps)

    @classmethod
    def make(cls, seconds: float, visits: tuple[Visit, ...], fps: float = 15.0) -> Scene:
        """A scene of ``seconds`` with these visits (checked not to overlap or run past)."""
        frames = round(seconds * fps)
        centers = np.full((frames, 2), np.nan)
        w, h = _SIZE
        half = _patch_size()[0] / 2
        for v in visits:
            x0 = -half if v.enter_from == "left" else w + half
            track = [np.array((x0, v.waypoints[0][1] * h))]
            for i, (x, y) in enumerate(v.waypoints):
                a, b = track[-1], np.array((x * w, y * h))
                n = max(1, math.ceil(float(np.hypot(*(b - a))) / _SPEED))
                track += [np.round(a + (b - a) * k / n) for k in range(1, n + 1)]
                if i == v.dwell_at:
                    track += [track[-1]] * round(v.dwell_s * fps)
            first = round(v.start_s * fps)
            if first + len(track) > frames or not np.isnan(centers[first:first + len(track)]).all():
                raise ValueError(f"visit at {v.start_s} s runs past the end or into another")
            centers[first:first + len(track)] = track
        fx1, fy1, fx2, fy2 = _face_in_patch()
        pw, ph = _patch_size()
        face = (fx1 - pw / 2, fy1 - ph / 2, fx2 - pw / 2, fy2 - ph / 2)
        return cls(fps, frames, visits, centers, face)

    # -- truth ----------------------------------------------------------------------------
    @property
    def size(self) -> tuple[int, int]:
        return _SIZE

    @property
    def crossings(self) -> tuple[Crossing, ...]:
        """Every crossing of ``LINE`` by the face's centre (``in``: right to left)."""
        x = self.centers[:, 0]
        side = np.sign(x - LINE[0][0] * _SIZE[0])  # NaN where absent
        out = []
        for i in range(1, self.frames):
            if side[i - 1] != 0 and side[i] != 0 and side[i] == -side[i - 1]:
                out.append(Crossing(i, "out" if side[i] > 0 else "in"))
        return tuple(out)

    @property
    def entries(self) -> tuple[int, ...]:
        """Frames at which the face's box is first wholly in view, one per visit."""
        box = self.boxes()
        w, h = _SIZE
        inside = (box[:, 0] >= 0) & (box[:, 2] <= w) & (box[:, 1] >= 0) & (box[:, 3] <= h)
        return tuple(i for i in range(self.frames) if inside[i] and (i == 0 or not inside[i - 1]))

    def boxes(self, size: tuple[int, int] | None = None) -> npt.NDArray[np.float64]:
        """``(frames, 4)`` the face's true box per frame at ``size`` (NaN: none)."""
        s = (size or _SIZE)[0] / _SIZE[0]
        c = self.centers
        f = self.face
        return np.stack([c[:, 0] + f[0], c[:, 1] + f[1], c[:, 0] + f[2], c[:, 1] + f[3]],
                        axis=1) * s

    def motion_fraction(self) -> float:
        """Share of frames in which the face moves (the lamp is masked, not counted)."""
        c = self.centers
        moved = ~np.isnan(c[1:, 0]) & (np.nan_to_num(np.abs(c[1:] - c[:-1]).sum(axis=1),
                                                    nan=1.0) > 0)
        return float(moved.mean())

    def in_mask(self, box: tuple[float, float, float, float], size: tuple[int, int]) -> bool:
        """Whether a box's centre lies in ``MASK`` (a detection there is a distractor's)."""
        return in_mask(box, size)

    def scene_config(self) -> dict[str, Any]:
        """``zones:``/``lines:`` of a pipeline config (normalized, anchor ``center``)."""
        return scene_config()

    # -- pictures -------------------------------------------------------------------------
    def render(self, size: tuple[int, int] | None = None) -> Iterator[npt.NDArray[np.uint8]]:
        """Every frame, BGR, at ``size`` (default the main stream's)."""
        import cv2

        size = size or _SIZE
        base = background(_SIZE)
        patch = _patch()
        ph, pw = patch.shape[:2]
        for i in range(self.frames):
            frame = base.copy()
            flicker(frame, base, i / self.fps)
            cx, cy = self.centers[i]
            if not math.isnan(cx):
                paste(frame, patch, round(cx - pw / 2), round(cy - ph / 2))
            if size != _SIZE:
                yield np.asarray(cv2.resize(frame, size, interpolation=cv2.INTER_AREA),
                                 dtype=np.uint8)
            else:
                yield frame

    def encode(self, path: str | os.PathLike[str], size: tuple[int, int] | None = None) -> Path:
        """Write the scene as H.264 in MP4 at ``size`` (once: an existing file is kept).

        Raises:
            SourceError: ``gst-launch-1.0`` or ``x264enc`` missing, or encoding failed.
        """
        size = size or _SIZE
        return encode_h264(lambda: self.render(size), self.fps, size, path)


def in_mask(box: tuple[float, float, float, float], size: tuple[int, int]) -> bool:
    """Whether a box's centre (pixels of a ``size`` frame) lies in ``MASK``: a detection there
    is the lamp's, a distractor's."""
    cx, cy = (box[0] + box[2]) / 2 / size[0], (box[1] + box[3]) / 2 / size[1]
    xs, ys = [p[0] for p in MASK], [p[1] for p in MASK]
    return min(xs) <= cx <= max(xs) and min(ys) <= cy <= max(ys)


def scene_config() -> dict[str, Any]:
    """``zones:``/``lines:`` of a pipeline config for the scenes' ``ZONE`` and ``LINE``
    (normalized, anchor ``center``)."""
    return {"zones": [{"name": "desk", "points": [list(p) for p in ZONE], "anchor": "center"}],
            "lines": [{"name": "door", "points": [list(p) for p in LINE], "anchor": "center"}]}


def encode_h264(frames: Callable[[], Iterable[npt.NDArray[np.uint8]]], fps: float,
                size: tuple[int, int], path: str | os.PathLike[str]) -> Path:
    """Write ``frames()`` (BGR at ``size``) as H.264 in MP4 at ``path`` with GStreamer's
    x264enc (no B-frames, a key frame a second), once: an existing file is kept.

    Raises:
        SourceError: ``gst-launch-1.0`` or ``x264enc`` missing, or encoding failed.
    """
    out = Path(path)
    if out.exists():
        return out
    why = x264_available()
    if why:
        raise SourceError(why)
    w, h = size
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(".part.mp4")
    cmd = ["gst-launch-1.0", "-q", "fdsrc", "fd=0", "!", "rawvideoparse", f"width={w}",
           f"height={h}", "format=bgr", f"framerate={round(fps)}/1", "!",
           "videoconvert", "!", "video/x-raw,format=I420", "!", "x264enc",
           "speed-preset=veryfast", "bframes=0", f"key-int-max={round(fps)}",
           "bitrate=2500" if w >= 1000 else "bitrate=800", "!", "h264parse", "!", "mp4mux",
           "!", "filesink", f"location={part}"]
    log = out.with_suffix(".log")
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=err)
        assert proc.stdin is not None
        try:
            for frame in frames():
                proc.stdin.write(frame.tobytes())
            proc.stdin.close()
            proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            proc.kill()
            proc.wait()
            raise SourceError(f"encoding {out.name} failed: {exc}") from exc
    said = log.read_text(errors="replace")[-500:]
    log.unlink()
    if proc.returncode != 0:
        raise SourceError(f"encoding {out.name} failed: {said}")
    part.replace(out)
    return out


def x264_available() -> str | None:
    """``None`` if ``Scene.encode`` can run here, else why not."""
    if shutil.which("gst-launch-1.0") is None:
        return "gst-launch-1.0 not found: apt-get install gstreamer1.0-tools"
    probe = subprocess.run(["gst-inspect-1.0", "x264enc"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return "GStreamer's x264enc not found: apt-get install gstreamer1.0-plugins-ugly"
    return None


def flicker(frame: npt.NDArray[np.uint8], base: npt.NDArray[np.uint8], t: float) -> None:
    """The lamp (``LAMP``) of ``frame`` on or off at ``t`` seconds, from ``base`` (the
    background at the same size)."""
    h, w = frame.shape[:2]
    lx1, ly1, lx2, ly2 = (round(v * d) for v, d in zip(LAMP, (w, h) * 2))
    lamp = base[ly1:ly2, lx1:lx2].astype(np.float32)
    on = math.sin(2 * math.pi * _FLICKER_HZ * t) > 0
    frame[ly1:ly2, lx1:lx2] = np.clip((lamp * 0.3 + 178) if on else lamp * 0.5, 0, 255)


def paste(frame: npt.NDArray[np.uint8], patch: npt.NDArray[np.uint8], x: int, y: int) -> None:
    """``patch`` at top-left ``(x, y)`` of ``frame``, clipped to it (walking in and out)."""
    h, w = frame.shape[:2]
    ph, pw = patch.shape[:2]
    x1, y1, x2, y2 = max(x, 0), max(y, 0), min(x + pw, w), min(y + ph, h)
    if x1 < x2 and y1 < y2:
        frame[y1:y2, x1:x2] = patch[y1 - y:y2 - y, x1 - x:x2 - x]


@cache
def _patch_and_face() -> tuple[npt.NDArray[np.uint8], tuple[float, float, float, float]]:
    return face_patch(astronaut_face_box(resolve_model("blazeface")), _FACE_PX)


def _patch() -> npt.NDArray[np.uint8]:
    return _patch_and_face()[0]


def _face_in_patch() -> tuple[float, float, float, float]:
    return _patch_and_face()[1]


def _patch_size() -> tuple[int, int]:
    h, w = _patch().shape[:2]
    return w, h

"""The detection gate: which frames the model sees (``detect:``), decided in the capture stage
before any preprocessing, so a skipped frame costs its motion check and nothing more.

The model runs on a frame when (there is motion, or a tracked object that is not stationary)
and ``detect.fps`` allows, or when ``keepalive_s`` passed since it last ran (a re-check of the
whole frame); with ``gate: always`` whenever ``detect.fps`` allows. Without a tracker nothing
says whether an object moves: its last detections (`hold`) join a crop but never run the model
by themselves, so a still scene with an object in view rests at one run per ``keepalive_s``.
The gate's clock is the frame's stream time (a file's frame times, a camera's capture times),
so a file read faster than real time is gated as if played. The motion detector looks at
frames at the model's rate (``detect.fps``, and keep-alives): at 5 a second of a 15 fps
camera, a third of them; it compares each with the one it looked at before.

With ``regions`` the model sees one crop: the union of the merged motion boxes and the moving
tracks, with a margin, at least the model's input size and of its aspect where the frame
allows; a crop over most of the frame is the whole frame. One union crop, never several: far
apart regions make a big crop, which is then the whole frame (the model's cost is the same, the
crop only buys resolution). A detection that touches a crop edge inside the frame may be cut:
it is kept, and the next detection frame is the whole frame (`widen`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..config.motion import GateMode, MotionConfig
from ..errors import ConfigError
from ..frames import Frame
from ..tasks.base import Task
from .motion import MotionDetector

if TYPE_CHECKING:
    from ..config import PipelineConfig

__all__ = ["DetectGate", "GateDecision", "crop_region", "make_gate"]

Region = tuple[int, int, int, int]
_NO_BOXES = np.empty((0, 4), dtype=np.float64)
_FPS_SLACK = 0.9  # of the detection period: frames of a camera's jittery clock still qualify
_WHOLE_FRAME = 0.6  # a crop over this share of the frame is the whole frame
_MARGIN = 0.15  # of the union's larger side, on each side of a crop (at least _MIN_MARGIN px)
_MIN_MARGIN = 16
_EDGE_PX = 2.0  # a box within this of an inner crop edge touches it


@dataclass(frozen=True, slots=True)
class GateDecision:
    """What the gate decided for one frame.

    Attributes:
        detect: The model runs on this frame.
        region: ``(x0, y0, x1, y1)`` source pixels of the crop the model sees; ``None``: the
            whole frame.
        motion: ``float64 (M, 4)`` the frame's merged motion boxes (empty without a motion
            detector).
        recheck: A keep-alive run on the whole frame: stationary tracks it misses age.
    """

    detect: bool
    region: Region | None
    motion: npt.NDArray[np.float64]
    recheck: bool = False


_EVERY = GateDecision(True, None, _NO_BOXES, recheck=True)
_SKIP = GateDecision(False, None, _NO_BOXES)


class DetectGate:
    """Decides per frame whether (and on which crop) the model runs.

    Runs in the capture thread (`decide`); the emit thread tells it where the moving tracks are
    (`observe`) and that a crop cut an object (`widen`): each is one reference assignment.

    Args:
        mode: ``motion`` or ``always`` (``PipelineConfig.gate``).
        fps: Most model runs per second of stream time; ``None``: every frame.
        keepalive_s: With ``motion``: the longest time without a model run.
        motion: The motion detector's settings.
        regions: Crop to the moving part of the frame.
        input_size: The model's input ``(width, height)`` (regions are at least this big).
    """

    def __init__(self, mode: GateMode, fps: float | None, keepalive_s: float,
                 motion: MotionConfig, *, regions: bool = False,
                 input_size: tuple[int, int] | None = None) -> None:
        self.mode = mode
        self.period = 1.0 / fps if fps else 0.0
        self.keepalive_s = keepalive_s
        self.regions = regions
        self.input_size = input_size or (0, 0)
        self.detector = MotionDetector(motion) if mode == "motion" else None
        self._last = -math.inf  # stream time of the last model run
        self._looked = -math.inf  # ... and of the last frame the motion detector looked at
        self._tracks: npt.NDArray[np.float64] = _NO_BOXES
        self._held: npt.NDArray[np.float64] = _NO_BOXES  # untracked: the last detections
        self._widen = False
        self.judged = 0  # frames the motion detector looked at
        self.moving = 0  # ... and found motion in
        self.cropped = 0  # model runs on a crop (regions)

    def observe(self, moving_tracks: npt.NDArray[np.float64]) -> None:
        """``(K, 4)`` boxes of the tracked objects that are not stationary (emit thread)."""
        self._tracks = moving_tracks

    def hold(self, detections: npt.NDArray[np.float64]) -> None:
        """``(K, 4)`` boxes of an untracked pipeline's last detections (emit thread): a crop
        keeps them in view, but they do not make the model run (they may be standing still)."""
        self._held = detections

    def widen(self) -> None:
        """The next detection frame is the whole frame (a crop cut an object)."""
        self._widen = True

    def decide(self, frame: Frame) -> GateDecision:
        """Whether the model runs on ``frame``, and on which crop."""
        if frame.kind != "image":
            return _EVERY
        t = frame.start if frame.start is not None else frame.ts
        if t < self._last or t < self._looked:  # a clock that went back (a restart)
            self._last = self._looked = -math.inf
        due = t - self._last >= _FPS_SLACK * self.period
        detector = self.detector
        if detector is None:
            if not due:
                return _SKIP
            self._last = t
            return _EVERY
        keepalive = t - self._last >= self.keepalive_s
        if t - self._looked < _FPS_SLACK * self.period and not keepalive:
            return _SKIP  # motion is looked for at the model's rate, no more often
        self._looked = t
        found = detector.detect(frame.data, frame.display)  # boxes: frame.width's pixels
        self.judged += 1
        self.moving += found.moving
        tracks = self._tracks
        if (found.moving or len(tracks)) and due:
            self._last = t
            held = self._held
            if len(held):
                tracks = np.concatenate((tracks, held)) if len(tracks) else held
            region = self.crop_for(frame, found.boxes, tracks) if self.regions else None
            self.cropped += region is not None
            return GateDecision(True, region, found.boxes)
        if keepalive:
            self._last = t
            self._widen = False
            return GateDecision(True, None, found.boxes, recheck=True)
        return GateDecision(False, None, found.boxes)

    def touches_inner_edge(self, region: Region, width: int, height: int,
                           boxes: npt.NDArray[np.float64]) -> bool:
        """Whether one of ``boxes`` (``(N, 4)`` source pixels) touches an edge of ``region``
        that is not the frame's edge (the crop may have cut it)."""
        if not len(boxes):
            return False
        x0, y0, x1, y1 = region
        e = _EDGE_PX
        cut = (((x0 > 0) & (boxes[:, 0] <= x0 + e)) | ((y0 > 0) & (boxes[:, 1] <= y0 + e))
               | ((x1 < width) & (boxes[:, 2] >= x1 - e))
               | ((y1 < height) & (boxes[:, 3] >= y1 - e)))
        return bool(cut.any())

    def crop_for(self, frame: Frame, motion: npt.NDArray[np.float64],
                 tracks: npt.NDArray[np.float64]) -> Region | None:
        """The crop the model sees for ``motion`` and moving ``tracks`` boxes (`crop_region`);
        ``None``, the whole frame, where there is none, or once after `widen`."""
        if self._widen:
            self._widen = False
            return None
        boxes = np.concatenate((motion, tracks)) if len(tracks) else motion
        if not len(boxes):
            return None
        return crop_region(boxes, frame.width, frame.height, self.input_size)


def make_gate(pc: PipelineConfig, task: Task, where: str = "$.pipelines[0]"
              ) -> DetectGate | None:
    """The gate of a pipeline's ``detect:`` with its task; ``None`` where the model runs on
    every frame (``gate: always`` without ``fps``).

    Raises:
        ConfigError: ``regions`` with a task that cannot look at a crop, or whose
            preprocessing does not resize (``resize: none`` or ``center_crop``).
    """
    mode, fps, detect = pc.gate, pc.detect_fps, pc.detect
    if mode == "always" and fps is None:
        return None
    size: tuple[int, int] | None = None
    if detect.regions:
        pre = getattr(task, "preprocessor", None)
        resize = getattr(pre, "resize", None)
        if type(task).preprocess_region is Task.preprocess_region or pre is None:
            raise ConfigError(f"{where}.detect.regions: the {type(task).__name__} task cannot "
                              "look at a crop of a frame; set regions: false")
        if resize not in ("letterbox", "stretch"):
            raise ConfigError(f"{where}.detect.regions: crops are resized to the model's "
                              f"input, and this task's preprocess.resize is {resize!r}; use "
                              "letterbox or stretch, or regions: false")
        size = pre.size
    return DetectGate(mode, fps, detect.keepalive_s, pc.motion, regions=detect.regions,
                      input_size=size)


def crop_region(boxes: npt.NDArray[np.float64], width: int, height: int,
                input_size: tuple[int, int]) -> Region | None:
    """The crop around ``boxes`` (``(N, 4)``, N >= 1) in a ``width`` x ``height`` frame: their
    union with a margin, grown to at least ``input_size`` and to its aspect where the frame
    allows, moved inside the frame; ``None`` where it would cover most of the frame."""
    x0, y0 = float(boxes[:, 0].min()), float(boxes[:, 1].min())
    x1, y1 = float(boxes[:, 2].max()), float(boxes[:, 3].max())
    margin = max(_MIN_MARGIN, _MARGIN * max(x1 - x0, y1 - y0))
    w, h = x1 - x0 + 2 * margin, y1 - y0 + 2 * margin
    iw, ih = input_size
    w, h = max(w, iw), max(h, ih)
    if iw and ih:  # the model's aspect: no letterbox bars wasting its input
        if w / h < iw / ih:
            w = h * iw / ih
        else:
            h = w * ih / iw
    w, h = min(w, width), min(h, height)
    if w * h >= _WHOLE_FRAME * width * height:
        return None
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    left = min(max(cx - w / 2, 0.0), width - w)
    top = min(max(cy - h / 2, 0.0), height - h)
    return (math.floor(left), math.floor(top), min(width, math.ceil(left + w)),
            min(height, math.ceil(top + h)))

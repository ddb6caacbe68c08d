"""Typed config of motion-gated detection: ``detect:`` (when the model runs) and ``motion:``
(the cheap motion detector that decides it). Field names are a contract (``docs/motion.md``).

Which sources and tasks may be gated is decided here, where the YAML path of the pipeline is
known (`gate_problem`): ``gate: auto`` gates live image sources (a camera) and runs every frame
of a file; ``gate: motion`` on a file is taken as asked; a task or source without images is
refused for ``gate: motion`` and ``regions``, a source without images for ``fps`` too.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ._types import DAY, ConfigStruct, Fps
from .analytics import polygon_problem

__all__ = ["DEFAULT_DETECT_FPS", "FILE_SOURCES", "NON_IMAGE_SOURCES", "DetectGateConfig",
           "GateMode", "MotionConfig", "gate_problem", "resolve_gate"]

DEFAULT_DETECT_FPS = 5.0
"""``detect.fps: auto`` on a motion-gated pipeline."""
FILE_SOURCES = frozenset({"video", "images", "synthetic"})
"""Source types read from files (or made up): ``gate: auto`` runs the model on every frame."""
NON_IMAGE_SOURCES = frozenset({"audio", "serial", "mqtt"})
"""Source types without images: never gated. Every other source type is a live image source."""

GateMode = Literal["motion", "always"]
Coordinate = Annotated[float, Meta(ge=-1e6, le=1e6)]
Point = Annotated[list[Coordinate], Meta(min_length=2, max_length=2)]
MaskPolygon = Annotated[list[Point], Meta(min_length=3, max_length=256)]


class DetectGateConfig(ConfigStruct, frozen=True):
    """When the model runs on a pipeline's frames (``detect:``).

    A frame the model does not see still reaches the tracker (which predicts where its tracks
    are), zones and lines, the recorder and the live view; its result carries the tracked
    positions and ``"detected": false`` (``docs/motion.md``).

    Attributes:
        fps: Run the model at most this often, in frames per second of the stream (a file's
            own timestamps, a camera's capture times); separate from the source's fps, whose
            every frame still feeds clips and the live view. ``auto``: 5 on a motion-gated
            pipeline, else every frame. ``None``: every frame.
        gate: ``motion``: run the model only when something moves or a tracked object is
            moving (at most ``fps``), and every ``keepalive_s`` otherwise. ``always``: every
            frame (at most ``fps``). ``auto``: ``motion`` for live image sources (camera,
            picamera2, rtsp...), ``always`` for files (video, images, synthetic); a file is
            motion-gated only when ``motion`` is written.
        keepalive_s: With no motion and no moving track, still run the model this often (it
            catches an object that entered too slowly to count as motion, and re-checks
            stationary objects).
        regions: The model sees only the part of the frame that moves (the union of the
            merged motion regions and the moving tracks, with a margin), cropped and
            letterboxed to its input: small far objects get more of the model's pixels. A
            region that would cover most of the frame is the whole frame. Detection tasks
            only.
        stationary_after: A track whose box has not moved for this many of its detections is
            stationary: not re-detected until motion touches it, it keeps its id and its zone
            occupancy; ``None``: never stationary.
    """

    fps: Fps | Literal["auto"] | None = "auto"
    gate: Literal["auto", "motion", "always"] = "auto"
    keepalive_s: Annotated[float, Meta(ge=0.1, le=DAY)] = 2.0
    regions: bool = False
    stationary_after: Annotated[int, Meta(ge=1, le=100_000)] | None = 10


class MotionConfig(ConfigStruct, frozen=True):
    """The motion detector of a motion-gated pipeline (``motion:``): a running-average
    background of a small blurred greyscale copy of each frame.

    Attributes:
        width: Width of the greyscale copy in pixels (its height keeps the frame's aspect).
        threshold: Difference from the background (0..255 grey levels) that counts a pixel as
            changed.
        min_area: Smallest moving blob that counts as motion, as a fraction of the frame.
        alpha: How fast the background learns the scene (per frame); inside moving regions it
            learns at a quarter of that, so a person who stops does not vanish at once.
        mask: Polygons where motion is ignored (trees, a clock, the camera's timestamp), each
            at least 3 points ``[x, y]``, not crossing itself.
        coordinates: ``normalized`` (0..1 of the frame's width and height, as zones) or
            ``pixels``.
    """

    width: Annotated[int, Meta(ge=32, le=4096)] = 320
    threshold: Annotated[int, Meta(ge=1, le=255)] = 25
    min_area: Annotated[float, Meta(ge=0.00001, le=1)] = 0.002
    alpha: Annotated[float, Meta(ge=0.0001, le=1)] = 0.05
    mask: Annotated[list[MaskPolygon], Meta(max_length=64)] = msgspec.field(default_factory=list)
    coordinates: Literal["normalized", "pixels"] = "normalized"

    def __post_init__(self) -> None:
        for i, polygon in enumerate(self.mask):
            for j, (x, y) in enumerate(polygon):
                if self.coordinates == "normalized" and not (0 <= x <= 1 and 0 <= y <= 1):
                    raise ValueError(f"mask[{i}]: point {j} ({x:g}, {y:g}) is outside the frame: "
                                     "normalized coordinates are between 0 and 1 (use "
                                     "`coordinates: pixels` for pixel coordinates)")
                if x < 0 or y < 0:
                    raise ValueError(f"mask[{i}]: point {j} ({x:g}, {y:g}) is outside the "
                                     "frame: pixel coordinates are not negative")
            problem = polygon_problem([(p[0], p[1]) for p in polygon])
            if problem:
                raise ValueError(f"mask[{i}]: {problem.replace('zone', 'mask polygon')}")


def resolve_gate(detect: DetectGateConfig, source_type: str, image_task: bool) -> GateMode:
    """``motion`` or ``always`` for a pipeline's ``detect.gate`` (see `DetectGateConfig`)."""
    if detect.gate != "auto":
        return detect.gate
    live_images = source_type not in FILE_SOURCES | NON_IMAGE_SOURCES
    return "motion" if live_images and image_task else "always"


def gate_problem(detect: DetectGateConfig, motion: MotionConfig, source_type: str,
                 task_type: str, image_task: bool, detections: bool) -> str | None:
    """Why a pipeline's ``detect:`` and ``motion:`` do not fit its source and task, or
    ``None``. ``image_task``: the task takes images (it has ``preprocess:``); ``detections``:
    it gives boxes (``regions`` crops need them)."""
    mode = resolve_gate(detect, source_type, image_task)
    if mode == "motion":
        if not image_task:
            return (f"detect.gate: motion needs a task that looks at images (this one is "
                    f"{task_type!r}); use gate: always")
        if source_type in NON_IMAGE_SOURCES:
            return (f"detect.gate: motion needs an image source (this one is {source_type!r});"
                    " use gate: always")
    elif detect.regions:
        return ("detect.regions: crops are made around motion, and this pipeline is not "
                f"motion-gated (gate {detect.gate!r} on a {source_type!r} source); set "
                "detect.gate: motion, or regions: false")
    elif motion != MotionConfig():
        return (f"motion: is set but this pipeline is not motion-gated (gate {detect.gate!r} on "
                f"a {source_type!r} source runs the model on every frame); set detect.gate: "
                "motion, or remove motion:")
    if detect.regions and not detections:
        return (f"detect.regions: needs a task that gives boxes (detect, pose, segment; this "
                f"one is {task_type!r})")
    if detect.fps not in ("auto", None) and source_type in NON_IMAGE_SOURCES:
        return (f"detect.fps: only image frames are kept from the model, and a {source_type!r} "
                "source gives none (its model sees every input); remove detect.fps")
    return None

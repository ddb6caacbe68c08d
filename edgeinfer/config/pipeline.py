"""Typed config of a pipeline's parts: tasks, sinks, emission (sources: ``config.sources``,
re-exported here). Field names are a contract.

Each part is a tagged union on its ``type:`` key (msgspec picks the struct by tag, and an unknown
tag is an error that lists the valid ones). These structs import nothing but msgspec: the modules
that implement them (OpenCV, pyserial, LiteRT, ...) are imported only when a pipeline starts.

The task union is open: a task registered from outside the package
(``edgeinfer.tasks.register_task``) adds its config struct, a `TaskOptions`, to `TASK_CONFIGS`.
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, Literal, TypeVar

import msgspec
from msgspec import Meta

from ._types import (
    FilePath,
    Fraction,
    Interval,
    Milliseconds,
    Size,
    TaggedPart,
)
from .sources import (
    AudioSource,
    CameraSource,
    ImagesSource,
    MqttSource,
    Picamera2Source,
    ReconnectConfig,
    SerialSource,
    SourceConfig,
    SyntheticSource,
    VideoSource,
)

__all__ = [
    "TASK_CONFIGS", "AudioSource", "CameraSource", "ClassifyTask", "DetectTask", "EmitConfig",
    "ImagesSource", "JsonlSink", "MqttSink", "MqttSource", "Picamera2Source", "PoseTask",
    "PreprocessConfig", "RawTask", "ReconnectConfig", "SegmentTask", "SerialSource", "SinkConfig",
    "SourceConfig", "StdoutSink", "SyntheticSource", "TaskConfig", "TaskOptions",
    "VadTask", "VideoSource", "register_task_config",
]

BUILTIN_LABELS = ("coco", "coco91")
"""``labels:`` values naming the label lists shipped in the package (never made a path)."""

Scale = Annotated[float, Meta(ge=1e-6, le=1e6)]
Offset = Annotated[float, Meta(ge=-1e6, le=1e6)]
PerChannel = Meta(min_length=1, max_length=4)


# --- tasks -------------------------------------------------------------------------------------


class PreprocessConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Turning a frame into the model's input. ``None`` fields are read from the model.

    Attributes:
        resize: ``letterbox`` (keep aspect, pad), ``stretch``, ``center_crop`` (scale the
            shorter side to the size over ``crop_fraction``, then take the centre: the
            preprocessing of Ultralytics and torchvision classifiers), or ``none``.
        size: ``[width, height]``; default the model input's.
        color: Channel order the model wants.
        layout: ``nchw`` or ``nhwc``; default from the model input's shape.
        scale: Multiply pixel values (0..255) by this first, e.g. ``1/255`` -> ``0.00392``.
        mean, std: Then subtract ``mean`` and divide by ``std`` per channel.
        pad_value: Letterbox padding, in pixel values.
        crop_fraction: ``center_crop`` only: the share of the scaled shorter side kept
            (``None``: 1, Ultralytics' classifiers; torchvision's resize 256 -> crop 224 is
            0.875).
    """

    resize: Literal["letterbox", "stretch", "center_crop", "none"] = "letterbox"
    size: Annotated[list[Size], Meta(min_length=2, max_length=2)] | None = None
    color: Literal["rgb", "bgr"] = "rgb"
    layout: Literal["nchw", "nhwc"] | None = None
    scale: Scale | None = None
    mean: Annotated[list[Offset], PerChannel] | None = None
    std: Annotated[list[Scale], PerChannel] | None = None
    pad_value: Annotated[int, Meta(ge=0, le=255)] = 114
    crop_fraction: Annotated[float, Meta(ge=0.05, le=1.0)] | None = None


class TaskOptions(TaggedPart, frozen=True):
    """The base of every task's config struct, a plug-in task's too: unknown keys refused,
    keyword-only, immutable, picked by its ``type:`` tag (``class ToyTask(TaskOptions,
    tag="toy", frozen=True)``).

    Attributes:
        scene: Class attribute: the task's answers are detections, so ``track``, ``zones``,
            ``lines`` and ``record`` may be used with it.
    """

    scene: ClassVar[bool] = False


class ClassifyTask(TaskOptions, tag="classify", frozen=True):
    """Top-k classification.

    Attributes:
        labels: A labels file (one per line) or the list itself.
        top_k: How many classes to report.
        softmax: ``auto`` applies it when the outputs are not already probabilities.
        score_threshold: Drop classes scoring below.
    """

    labels: FilePath | list[str] | None = None
    top_k: Annotated[int, Meta(ge=1, le=1000)] = 5
    softmax: Literal["auto", "yes", "no"] = "auto"
    score_threshold: Fraction = 0.0
    preprocess: PreprocessConfig = msgspec.field(default_factory=PreprocessConfig)


class DetectTask(TaskOptions, tag="detect", frozen=True):
    """Object detection.

    Attributes:
        decoder: ``auto`` (picked from the model's metadata and output shapes; two that fit are
            refused), or a registered decoder: ``yolov8`` (1 x (4+classes) x N, or transposed),
            ``yolov5`` (1 x N x (5+classes)), ``yolo-end2end`` (1 x K x 6: YOLOv10, YOLO26,
            nms=True exports), ``ultralytics-rtdetr``, ``ssd`` (boxes, classes, scores, count
            in any order: TFLite post-processing, TF Object Detection API), ``yolox`` (raw
            grid rows; never picked by ``auto`` unless the metadata names YOLOX), ``yolo-nas``
            (with its NMS), ``rtdetr``/``dfine`` (labels, boxes, scores; the
            ``orig_target_sizes`` input is filled), ``rfdetr`` (dets + class logits),
            ``blazeface`` (anchors, regressors + scores). Checked when the task is built.
        score_threshold, iou_threshold: Keep boxes scoring at least this; NMS overlap.
        max_detections: Keep at most this many, best first.
        classes: Report only these labels (or class ids).
        labels: A labels file or list, or built-in names (``coco``: the 80 classes,
            ``coco91``: by COCO category id); ``None``: the model's own (metadata ``names``, a
            packed TFLite label file, ``labels.txt`` beside the model), else class ids.
    """

    scene: ClassVar[bool] = True

    decoder: str = "auto"
    score_threshold: Fraction = 0.25
    iou_threshold: Fraction = 0.45
    max_detections: Annotated[int, Meta(ge=1, le=10_000)] = 100
    classes: list[str | Annotated[int, Meta(ge=0, le=100_000)]] | None = None
    labels: FilePath | list[str] | None = None
    preprocess: PreprocessConfig = msgspec.field(default_factory=PreprocessConfig)


class PoseTask(DetectTask, tag="pose", frozen=True):
    """Pose estimation: detections with keypoints (``x, y, score`` in source pixels).

    Attributes:
        decoder: ``auto``, ``yolov8`` (Ultralytics' ``1 x (4+C+K*D) x N``) or ``yolo-end2end``
            (``1 x K x (6+K*D)``: YOLO26, YOLOv10, ``nms=True`` exports); the keypoint layout
            ``K x D`` comes from the metadata's ``kpt_shape`` (else COCO's 17 x 3).
        The rest: as ``detect``.
    """


class SegmentTask(DetectTask, tag="segment", frozen=True):
    """Instance segmentation: detections with their mask as an outline polygon and its area.

    Attributes:
        decoder: ``auto``, ``yolov8`` (Ultralytics' ``1 x (4+C+M) x N`` beside mask prototypes
            ``1 x M x H x W``) or ``yolo-end2end`` (``1 x K x (6+M)`` beside the prototypes).
        The rest: as ``detect``.
    """


class VadTask(TaskOptions, tag="vad", frozen=True):
    """Voice activity on audio windows with a stateful model (Silero), state carried across.

    Attributes:
        threshold: Probability at or above which a window is speech.
        min_speech_ms, min_silence_ms: Debounce: how long speech/silence must last to start/end
            a segment.
    """

    threshold: Fraction = 0.5
    min_speech_ms: Milliseconds = 250.0
    min_silence_ms: Milliseconds = 300.0


class RawTask(TaskOptions, tag="raw", frozen=True):
    """The output tensors as lists, for models edgeinfer has no decoder for."""

    preprocess: PreprocessConfig | None = None


TaskConfig = ClassifyTask | DetectTask | PoseTask | SegmentTask | VadTask | RawTask
"""The built-in task configs; `TASK_CONFIGS` holds these and the registered ones."""


S = TypeVar("S", bound=msgspec.Struct)


class OpenUnion(Generic[S]):
    """A tagged union that grows at run time: plug-ins add their structs (``add``).

    msgspec fixes a union when it builds a decoder, so the field is declared with the built-in
    members and ``Annotated`` with this union; the loader converts a value of another member
    against ``union()`` itself (``edgeinfer.config.loader``), and reads the members from here
    for its messages (the valid types, the fields of the one named).
    """

    def __init__(self, base: type[S], *members: type[S]) -> None:
        self.base = base
        self.members: dict[str, type[S]] = {}
        for member in members:
            self.add(member)

    def add(self, struct: type[S]) -> None:
        """Add ``struct`` under its tag (again: nothing changes).

        Raises:
            ValueError: ``struct`` is not a tagged subclass of the base, or its tag is
                another struct's.
        """
        if not (isinstance(struct, type) and issubclass(struct, self.base)
                and isinstance(struct.__struct_config__.tag, str)):
            raise ValueError(f"{struct!r} must be a subclass of {self.base.__name__} with a tag "
                             f"(class X({self.base.__name__}, tag=\"name\", frozen=True))")
        tag = struct.__struct_config__.tag
        known = self.members.setdefault(tag, struct)
        if known is not struct:
            raise ValueError(f"type {tag!r} is taken by {known.__qualname__}; give "
                             f"{struct.__qualname__} another tag")

    def union(self) -> Any:
        """The members as one union type (msgspec, typing)."""
        return functools.reduce(operator.or_, self.members.values())


class PendingTask(TaskOptions, tag="<registered task>", frozen=True):
    """Holds the place of a registered task's config while the loader converts the tree around
    it (msgspec knows only the built-in tasks); the loader then puts the task's own struct in
    its place, and the pipeline's checks run again with it. Never in a loaded config."""

    scene: ClassVar[bool] = True  # the real task's own flag is checked when it is put in


TASK_CONFIGS: OpenUnion[TaskOptions] = OpenUnion(TaskOptions, ClassifyTask, DetectTask, PoseTask,
                                                 SegmentTask, VadTask, RawTask)
"""The task config structs by ``type:``: the built-in ones and those registered since."""

BUILT_IN_TASKS = frozenset(TASK_CONFIGS.members)
"""The task types msgspec decodes in the tree (`TaskField`); the loader converts the others."""

if TYPE_CHECKING:
    TaskField = TaskOptions
else:  # what msgspec decodes, and the open union the loader reads
    TaskField = Annotated[TaskConfig | PendingTask, TASK_CONFIGS]


def register_task_config(struct: type[TaskOptions]) -> None:
    """Make ``struct`` a valid ``task:`` of a pipeline config, under its ``type:`` tag (what
    ``edgeinfer.tasks.register_task`` does for a task's ``Config``).

    Raises:
        ValueError: ``struct`` is not a tagged `TaskOptions`, or its tag is another's.
    """
    TASK_CONFIGS.add(struct)


# --- sinks and emission ------------------------------------------------------------------------


class StdoutSink(TaggedPart, tag="stdout", frozen=True):
    """Results on standard output: readable lines, or one JSON object per line."""

    format: Literal["text", "json"] = "text"


class JsonlSink(TaggedPart, tag="jsonl", frozen=True):
    """Results appended to a JSON Lines file, flushed after each line."""

    path: FilePath


class MqttSink(TaggedPart, tag="mqtt", frozen=True):
    """Results published to ``<prefix>/<device>/<pipeline>/result`` (configured under ``mqtt:``)."""

    needs_sections = ("mqtt",)
    qos: Literal[0, 1] = 1


SinkConfig = StdoutSink | JsonlSink | MqttSink


class EmitConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Which results a pipeline emits.

    Attributes:
        mode: ``every`` processed frame, or only on ``change`` (the set of detected labels
            changed, the top class changed, a speech segment started or ended).
        min_interval_s: At most one result per this many seconds (a change still waits for it).
    """

    mode: Literal["every", "change"] = "every"
    min_interval_s: Interval = 0.0

"""The values that flow through a pipeline: ``Frame`` in, ``Result`` out, as frozen slotted
dataclasses (cheap to make per frame, safe to hand between threads). A result's task part is
one ``PartKind`` and its value: detections, a top-k list, voice activity, raw outputs, or a kind
a plug-in task brings.

A ``Result`` serializes to the JSON documented in ``docs/results.md``; the same document is
published on MQTT. ``seq`` counts results per pipeline so a consumer can drop the duplicates
that QoS 1 allows.
"""

# Over 450 lines: one vocabulary, what flows through a pipeline; each result value type sits
# beside the part kind that serializes, compares, draws and reads it back.

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NamedTuple, TypeVar

import numpy as np

FrameKind = Literal["image", "audio", "series"]


class DropFrame(Exception):
    """Raised by a stage to drop the current frame without an error (counted in stats)."""


@dataclass(frozen=True, slots=True, eq=False)
class Frame:
    """One unit of input.

    Attributes:
        index: 0-based position in the source's stream (counts frames read, not kept).
        ts: ``time.monotonic()`` when captured; latency and pacing use it.
        wall: ``time.time()`` when captured; results report it.
        data: ``image``: H x W x 3 uint8, BGR (OpenCV's order); ``audio``: 1-D float32 in
            [-1, 1], mono; ``series``: N x C float32, one row per reading.
        kind: Which of the above.
        sample_rate: Audio samples per second (``audio``).
        fields: Column names of a ``series``.
        start: Stream time in seconds of the first sample of an audio or series window, or of
            a video file's frame (its index over the file's frame rate, counting on across
            loops); ``None`` for live images. Scene analytics time dwell and loitering on it.
        display: ``(width, height)`` of the picture ``data`` stands for, when ``data`` is a
            smaller copy of it: a camera's substream decoded for detection (``detect_uri``)
            while clips come from the main stream. Boxes, keypoints, masks, zones and lines
            are in these pixels, and ``width``/``height`` say this size; ``data.shape`` says
            the decoded one. ``None``: ``data``'s own size.
    """

    index: int
    ts: float
    wall: float
    data: np.ndarray
    kind: FrameKind = "image"
    sample_rate: int | None = None
    fields: tuple[str, ...] = ()
    start: float | None = None
    display: tuple[int, int] | None = None

    @property
    def height(self) -> int:
        """Height of the picture (``display``'s when set), in the pixels of its boxes."""
        return self.display[1] if self.display is not None else int(self.data.shape[0])

    @property
    def width(self) -> int:
        """Width of the picture (``display``'s when set), in the pixels of its boxes."""
        if self.display is not None:
            return self.display[0]
        return int(self.data.shape[1]) if self.kind == "image" else 0


Box = tuple[float, float, float, float]
Keypoint = tuple[float, float, float]
Mark = tuple[Box | None, str]
"""Something to draw on a frame for a result: a box with its text, or (``None``) a caption."""
Shape = tuple[Literal["points", "outline"], tuple[tuple[float, float], ...]]
"""Something else to draw for a result, in source pixels: ``points`` (keypoints, as dots) or an
``outline`` (a closed polygon, a mask's edge)."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Detection:
    """One detected object; ``box`` is ``(x1, y1, x2, y2)`` in source-image pixels.
    ``track_id`` is the object's id across frames on a tracked pipeline (``None``: not tracked,
    or a detection no confirmed track holds). ``keypoints`` (pose) are ``(x, y, score)`` in
    source-image pixels; ``mask`` (segmentation) is the object's outline as a polygon of
    ``(x, y)`` source-image pixels, and ``area`` the mask's area in source pixels (holes and
    the pieces beside the outlined one counted). They are ``None`` for a plain detector and
    are serialized only when set."""

    label: str
    class_id: int
    score: float
    box: Box
    track_id: int | None = None
    keypoints: tuple[Keypoint, ...] | None = None
    mask: tuple[tuple[float, float], ...] | None = None
    area: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"label": self.label, "class_id": self.class_id, "score": round(self.score, 4),
             "box": [round(v, 1) for v in self.box]}
        if self.track_id is not None:
            d["track_id"] = self.track_id
        if self.keypoints is not None:
            d["keypoints"] = [[round(x, 1), round(y, 1), round(s, 4)] for x, y, s in self.keypoints]
        if self.mask is not None:
            d["mask"] = [[round(x, 1), round(y, 1)] for x, y in self.mask]
        if self.area is not None:
            d["area"] = round(self.area, 1)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Detection:
        """A detection back from its JSON form (``to_dict``)."""
        x1, y1, x2, y2 = (float(v) for v in d["box"])
        track = d.get("track_id")
        points = d.get("keypoints")
        mask = d.get("mask")
        area = d.get("area")
        return cls(str(d["label"]), int(d.get("class_id", -1)), float(d["score"]),
                   (x1, y1, x2, y2), int(track) if track is not None else None,
                   tuple((float(x), float(y), float(s)) for x, y, s in points)
                   if points is not None else None,
                   tuple((float(x), float(y)) for x, y in mask) if mask is not None else None,
                   float(area) if area is not None else None)


@dataclass(frozen=True, slots=True)
class Classification:
    """One class of a top-k list."""

    label: str
    class_id: int
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "class_id": self.class_id, "score": round(self.score, 4)}


@dataclass(frozen=True, slots=True)
class VadState:
    """Voice activity after one audio window.

    Attributes:
        speech: Inside a speech segment (after debouncing).
        probability: The model's speech probability for this window.
        start: Stream time (s) the current or just-ended segment started; ``None`` outside one.
        end: Stream time (s) the segment ended, set on the window that ends it.
        event: ``"start"`` or ``"end"`` on the window where a segment starts or ends, else
            ``None``.
    """

    speech: bool
    probability: float
    start: float | None = None
    end: float | None = None
    event: Literal["start", "end"] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"speech": self.speech, "probability": round(self.probability, 4),
                             "start": self.start, "end": self.end}
        if self.event is not None:
            d["event"] = self.event
        return d


# --- result parts: one kind per kind of answer --------------------------------------------------


class PartKind(ABC, Generic[T]):
    """One kind of task answer as a result carries it: the key of its part in the result
    document (``detections``), its JSON form both ways, what ``emit: {mode: change}`` compares,
    whether a value is an event emission must not hold back, and how it reads in a line and on
    a picture. The built-in kinds below are shared by every task whose answers are of that
    kind (pose and segmentation give detections); a task with a new kind of answer defines its
    own in its module, and ``register_part_kind`` (done by ``tasks.register_task``) makes
    ``TaskResult(<key>=...)`` and ``edgeinfer watch`` know it.
    """

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"<part {self.key}>"

    @abstractmethod
    def to_json(self, value: T) -> Any:
        """``value`` as JSON-ready data (the part's value in the result document)."""

    @abstractmethod
    def from_json(self, data: Any) -> T:
        """The value back from its JSON form (``edgeinfer watch`` reads results off MQTT)."""

    def change_key(self, value: T) -> Any:
        """What ``emit: {mode: change}`` compares between results (``None``: never a change)."""
        return None

    def is_event(self, value: T) -> bool:
        """Whether ``value`` marks an event (a speech segment's start or end) that ``change``
        mode emits even when the change key is the same."""
        return False

    def describe(self, value: T) -> str:
        """``value`` in a readable line (the ``stdout`` sink, ``edgeinfer watch``)."""
        return f"{self.key}: {json.dumps(self.to_json(value), default=str)}"

    def marks(self, value: T) -> tuple[Mark, ...]:
        """What to draw on the frame for ``value`` (the web view's annotated snapshot)."""
        return ()

    def shapes(self, value: T) -> tuple[Shape, ...]:
        """What else to draw for ``value`` besides its marks and boxes: keypoints, outlines."""
        return ()


class DetectionsPart(PartKind[tuple[Detection, ...]]):
    """Detected objects (detect, and pose and segmentation with keypoints or masks)."""

    __slots__ = ()

    def to_json(self, value: tuple[Detection, ...]) -> Any:
        return [d.to_dict() for d in value]

    def from_json(self, data: Any) -> tuple[Detection, ...]:
        return tuple(Detection.from_dict(d) for d in data)

    def change_key(self, value: tuple[Detection, ...]) -> Any:
        return tuple(sorted(d.label for d in value))  # the labels detected

    def describe(self, value: tuple[Detection, ...]) -> str:
        if not value:
            return "no detections"
        return "  ".join(f"{d.label}{'' if d.track_id is None else f' #{d.track_id}'} "
                         f"{d.score:.2f} [{','.join(f'{v:.0f}' for v in d.box)}]" for d in value)

    def marks(self, value: tuple[Detection, ...]) -> tuple[Mark, ...]:
        return tuple((d.box, f"{d.label} {d.score:.2f}") for d in value)

    def shapes(self, value: tuple[Detection, ...]) -> tuple[Shape, ...]:
        """Each mask's outline and each pose's keypoints that score 0.5 or more (Ultralytics'
        own drawing threshold: below it a keypoint is hidden or outside the frame)."""
        out: list[Shape] = []
        for d in value:
            if d.mask is not None:
                out.append(("outline", d.mask))
            if d.keypoints is not None:
                out.append(("points", tuple((x, y) for x, y, s in d.keypoints if s >= 0.5)))
        return tuple(out)


class TopPart(PartKind[tuple[Classification, ...]]):
    """A top-k list of classes, best first."""

    __slots__ = ()

    def to_json(self, value: tuple[Classification, ...]) -> Any:
        return [c.to_dict() for c in value]

    def from_json(self, data: Any) -> tuple[Classification, ...]:
        return tuple(Classification(c["label"], int(c.get("class_id", -1)), float(c["score"]))
                     for c in data)

    def change_key(self, value: tuple[Classification, ...]) -> Any:
        return value[0].label if value else None  # the top class

    def describe(self, value: tuple[Classification, ...]) -> str:
        return "  ".join(f"{c.label} {c.score:.2f}" for c in value)

    def marks(self, value: tuple[Classification, ...]) -> tuple[Mark, ...]:
        return ((None, f"{value[0].label} {value[0].score:.2f}"),) if value else ()


class VadPart(PartKind[VadState]):
    """Voice activity: speech or not, and a segment's start and end as events."""

    __slots__ = ()

    def to_json(self, value: VadState) -> Any:
        return value.to_dict()

    def from_json(self, data: Any) -> VadState:
        return VadState(bool(data["speech"]), float(data["probability"]), data.get("start"),
                        data.get("end"), data.get("event"))

    def change_key(self, value: VadState) -> Any:
        return value.speech

    def is_event(self, value: VadState) -> bool:
        return value.event is not None

    def describe(self, value: VadState) -> str:
        state = "speech" if value.speech else "silence"
        at = value.start if value.event == "start" else value.end
        event = f" ({value.event} at {at:.2f} s)" if value.event else ""
        return f"{state} p={value.probability:.2f}{event}"


class OutputsPart(PartKind[dict[str, Any] | None]):
    """The output tensors as lists, by output name (``raw``)."""

    __slots__ = ()

    def to_json(self, value: dict[str, Any] | None) -> Any:
        return value or {}

    def from_json(self, data: Any) -> dict[str, Any] | None:
        return dict(data or {})

    def describe(self, value: dict[str, Any] | None) -> str:
        return f"outputs: {', '.join(value or {})}"


DETECTIONS = DetectionsPart("detections")
TOP = TopPart("top")
VAD = VadPart("vad")
OUTPUTS = OutputsPart("outputs")

PART_KINDS: dict[str, PartKind[Any]] = {k.key: k for k in (DETECTIONS, TOP, VAD, OUTPUTS)}
"""The result part kinds by key: the built-in ones and those registered by plug-in tasks."""

# A part's key sits beside these in the result document.
_RESULT_KEYS = frozenset({"seq", "run_id", "ts", "pipeline", "frame", "model", "provider",
                          "latency_ms", "events"})


def register_part_kind(kind: PartKind[Any]) -> PartKind[Any]:
    """Make ``kind`` known by its key (``TaskResult(<key>=...)``, reading results back).

    Raises:
        ValueError: the key is a result document's own key, or another kind's.
    """
    if kind.key in _RESULT_KEYS or not kind.key.isidentifier():
        raise ValueError(f"a result part's key must be an identifier other than "
                         f"{', '.join(sorted(_RESULT_KEYS))}; got {kind.key!r}")
    known = PART_KINDS.setdefault(kind.key, kind)
    if known is not kind:
        raise ValueError(f"result part key {kind.key!r} is taken by {known!r}; give the new "
                         "kind another key")
    return kind


def part_from_dict(data: Mapping[str, Any]) -> TaskResult:
    """A result document's task part back (``{}`` outputs when it has none known here)."""
    for key, kind in PART_KINDS.items():
        if key in data:
            return TaskResult(kind, kind.from_json(data[key]))
    return TaskResult(OUTPUTS, {})


@dataclass(frozen=True, slots=True, init=False)
class TaskResult:
    """What a task's postprocessing made of one frame: one part, a ``kind`` and its ``value``.

    ``TaskResult(DETECTIONS, dets)``, or by the kind's key: ``TaskResult(detections=dets)``;
    ``TaskResult()`` is empty outputs. ``.detections``, ``.top``, ``.vad`` and ``.outputs`` are
    the value when the part is of that kind, else ``None``.
    """

    kind: PartKind[Any]
    value: Any

    def __init__(self, kind: PartKind[Any] | None = None, value: Any = None, **part: Any
                 ) -> None:
        if part:
            if kind is not None or len(part) != 1:
                raise TypeError(f"a TaskResult holds one part; got {', '.join(part)}")
            ((key, value),) = part.items()
            kind = PART_KINDS.get(key)
            if kind is None:
                raise TypeError(f"no result part kind {key!r}; known: {', '.join(PART_KINDS)}")
        elif kind is None:
            kind = OUTPUTS
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "value", value)

    @property
    def detections(self) -> tuple[Detection, ...] | None:
        return self.value if self.kind is DETECTIONS else None

    @property
    def top(self) -> tuple[Classification, ...] | None:
        return self.value if self.kind is TOP else None

    @property
    def vad(self) -> VadState | None:
        return self.value if self.kind is VAD else None

    @property
    def outputs(self) -> dict[str, Any] | None:
        return self.value if self.kind is OUTPUTS else None

    def change_key(self) -> Any:
        """What ``emit: {mode: change}`` compares: labels detected, top class, speech or not
        (the kind's ``change_key``)."""
        return self.kind.change_key(self.value)

    def is_event(self) -> bool:
        """A part ``change`` mode always emits (a speech segment's start or end)."""
        return self.kind.is_event(self.value)

    def describe(self) -> str:
        return self.kind.describe(self.value)

    def to_dict(self) -> dict[str, Any]:
        return {self.kind.key: self.kind.to_json(self.value)}


@dataclass(frozen=True, slots=True)
class ModelRef:
    """The model that produced a result, as results name it."""

    name: str
    version: str | None
    sha256: str


class Latency(NamedTuple):
    """A result's time per stage, in milliseconds. A tuple (``pre, infer, post = lat`` and
    ``sum(lat)`` work) whose fields have names: ``print`` shows
    ``pre 1.20 ms, infer 8.41 ms, post 0.35 ms``.

    Attributes:
        pre: the frame made into the model's input (resize, letterbox, normalise).
        infer: the model's run (0 when motion gating skipped the model on this frame).
        post: the outputs made into the result (decoding, NMS, tracking, zones).
    """

    pre: float
    infer: float
    post: float

    @property
    def total(self) -> float:
        """``pre + infer + post``."""
        return self.pre + self.infer + self.post

    def __repr__(self) -> str:
        return f"Latency(pre={self.pre:.3f}, infer={self.infer:.3f}, post={self.post:.3f})"

    def __str__(self) -> str:
        return f"pre {self.pre:.2f} ms, infer {self.infer:.2f} ms, post {self.post:.2f} ms"


@dataclass(frozen=True, slots=True)
class Result:
    """One emitted result of a pipeline (the JSON payload of ``.../<pipeline>/result``).

    ``latency_ms`` is a ``Latency`` (a plain ``(pre, infer, post)`` tuple given here becomes
    one).
    """

    seq: int
    ts: float
    pipeline: str
    frame: Frame
    model: ModelRef
    provider: str
    latency_ms: Latency
    task: TaskResult
    events: tuple[dict[str, Any], ...] = ()  # scene analytics events since the last result
    run_id: str = ""  # new at each pipeline start: (device, pipeline, run_id, seq) is unique
    detected: bool = True  # False: the model skipped this frame (motion gating); tracked boxes
    # The JSON, encoded by the first sink that asks (every sink writes the same bytes); not
    # copied by ``dataclasses.replace``, so a changed result is encoded again.
    _json: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.latency_ms) is not Latency:  # a plain tuple from a caller: name its fields
            object.__setattr__(self, "latency_ms", Latency(*self.latency_ms))

    def to_dict(self) -> dict[str, Any]:
        f = self.frame
        frame: dict[str, Any] = {"index": f.index, "ts": round(f.wall, 6)}
        if f.kind == "image":
            frame.update(width=f.width, height=f.height)
        else:
            frame.update(kind=f.kind, start=f.start, samples=int(f.data.shape[0]))
        pre, infer, post = self.latency_ms
        d: dict[str, Any] = {
            "seq": self.seq,
            "run_id": self.run_id,
            "ts": round(self.ts, 6),
            "pipeline": self.pipeline,
            "frame": frame,
            "model": {"name": self.model.name, "version": self.model.version,
                      "sha256": self.model.sha256},
            "provider": self.provider,
            "latency_ms": {"pre": round(pre, 3), "infer": round(infer, 3), "post": round(post, 3)},
        }
        d.update(self.task.to_dict())
        if self.events:
            d["events"] = list(self.events)
        if not self.detected:
            d["detected"] = False
        return d

    def to_json(self) -> bytes:
        """The payload as compact JSON bytes (msgspec: fast, and the same on every sink),
        encoded once per result however many sinks write it."""
        if self._json is None:
            import msgspec

            object.__setattr__(self, "_json", msgspec.json.encode(self.to_dict()))
        assert self._json is not None
        return self._json

"""The values that flow through a pipeline: ``Frame`` in, ``Result`` out, as frozen slotted
dataclasses (cheap to make per frame, safe to hand between threads).

A ``Result`` serializes to the JSON documented in ``docs/results.md``; the same document is
published on MQTT. ``seq`` counts results per pipeline so a consumer can drop the duplicates
that QoS 1 allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

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
    """

    index: int
    ts: float
    wall: float
    data: np.ndarray
    kind: FrameKind = "image"
    sample_rate: int | None = None
    fields: tuple[str, ...] = ()
    start: float | None = None

    @property
    def height(self) -> int:
        return int(self.data.shape[0])

    @property
    def width(self) -> int:
        return int(self.data.shape[1]) if self.kind == "image" else 0


@dataclass(frozen=True, slots=True)
class Detection:
    """One detected object; ``box`` is ``(x1, y1, x2, y2)`` in source-image pixels.
    ``track_id`` is the object's id across frames on a tracked pipeline (``None``: not tracked,
    or a detection no confirmed track holds)."""

    label: str
    class_id: int
    score: float
    box: tuple[float, float, float, float]
    track_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"label": self.label, "class_id": self.class_id, "score": round(self.score, 4),
             "box": [round(v, 1) for v in self.box]}
        if self.track_id is not None:
            d["track_id"] = self.track_id
        return d


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


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What a task's postprocessing made of one frame; exactly one part is set."""

    detections: tuple[Detection, ...] | None = None
    top: tuple[Classification, ...] | None = None
    vad: VadState | None = None
    outputs: dict[str, Any] | None = None

    def change_key(self) -> Any:
        """What ``emit: {mode: change}`` compares: labels detected, top class, speech or not."""
        if self.detections is not None:
            return tuple(sorted(d.label for d in self.detections))
        if self.top is not None:
            return self.top[0].label if self.top else None
        if self.vad is not None:
            return self.vad.speech
        return None

    def to_dict(self) -> dict[str, Any]:
        if self.detections is not None:
            return {"detections": [d.to_dict() for d in self.detections]}
        if self.top is not None:
            return {"top": [c.to_dict() for c in self.top]}
        if self.vad is not None:
            return {"vad": self.vad.to_dict()}
        return {"outputs": self.outputs or {}}


@dataclass(frozen=True, slots=True)
class ModelRef:
    """The model that produced a result, as results name it."""

    name: str
    version: str | None
    sha256: str


@dataclass(frozen=True, slots=True)
class Result:
    """One emitted result of a pipeline (the JSON payload of ``.../<pipeline>/result``)."""

    seq: int
    ts: float
    pipeline: str
    frame: Frame
    model: ModelRef
    provider: str
    latency_ms: tuple[float, float, float]  # pre, infer, post
    task: TaskResult
    events: tuple[dict[str, Any], ...] = ()  # scene analytics events since the last result
    run_id: str = ""  # new at each pipeline start: (device, pipeline, run_id, seq) is unique

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
        return d

    def to_json(self) -> bytes:
        """The payload as compact JSON bytes (msgspec: fast, and the same on every sink)."""
        import msgspec

        return msgspec.json.encode(self.to_dict())

"""Detection decoders: a detector's raw output tensors -> boxes, scores and class ids.

Each decoder checks the model's outputs when it is built and raises ``ConfigError`` naming the
shapes it expected and the ones the model has, so a mismatch is refused at startup. Boxes come
out as x1, y1, x2, y2 in model-input pixels; ``DetectTask`` filters, suppresses and maps them
back to the source image.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from ..errors import ConfigError
from ..runtime.base import TensorSpec, format_shape

__all__ = ["DECODERS", "BlazeFaceDecoder", "Decoded", "Decoder", "SsdDecoder", "YoloV5Decoder",
           "YoloV8Decoder", "blazeface_anchors", "make_decoder"]


@dataclass(frozen=True, slots=True)
class Decoded:
    """Candidate detections of one frame, in model-input pixels.

    Attributes:
        boxes: ``(N, 4)`` x1, y1, x2, y2.
        scores: ``(N,)``.
        class_ids: ``(N,)`` integers.
        keypoints: ``(N, K, 2)`` x, y where the model has them (BlazeFace), else ``None``.
    """

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    keypoints: np.ndarray | None = None


class Decoder(ABC):
    """Reads one detector family's outputs.

    Args:
        outputs: The model's output specs.
        input_size: ``(width, height)`` of the model input, in pixels.

    Attributes:
        num_classes: Classes the outputs score, where the shapes say (else ``None``).
    """

    name: ClassVar[str]
    expects: ClassVar[str]
    suppression: ClassVar[Literal["greedy", "weighted", "none"]] = "greedy"
    default_labels: ClassVar[list[str] | None] = None

    def __init__(self, outputs: Sequence[TensorSpec], input_size: tuple[int, int]) -> None:
        self.input_size = input_size
        self.num_classes: int | None = None
        self._outputs = tuple(outputs)
        self._bind(self._outputs)

    @abstractmethod
    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        """Check ``outputs`` (``self._refuse`` if they do not fit) and remember what to read."""

    @abstractmethod
    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        """Candidates scoring at least ``score_threshold``."""

    def _refuse(self, why: str = "") -> ConfigError:
        have = ", ".join(f"{s.name} {format_shape(s.shape)}" for s in self._outputs) or "none"
        return ConfigError(f"decoder {self.name} expects {self.expects}; the model has "
                           f"{len(self._outputs)} output(s): {have}" + (f" ({why})" if why else ""))


def _xywh_to_xyxy(cx: np.ndarray, cy: np.ndarray, w: np.ndarray, h: np.ndarray) -> np.ndarray:
    hw, hh = w / 2, h / 2
    return np.stack([cx - hw, cy - hh, cx + hw, cy + hh], axis=1)


class YoloV8Decoder(Decoder):
    """YOLOv8/v11 (Ultralytics export): ``1 x (4+C) x N``, cx, cy, w, h then C class scores."""

    name = "yolov8"
    expects = "one output 1 x (4+C) x N (cx, cy, w, h, then C class scores per box)"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        if len(outputs) != 1 or len(outputs[0].shape) != 3:
            raise self._refuse()
        _, rows, n = outputs[0].shape
        if not isinstance(rows, int) or rows < 5:
            raise self._refuse("dim 1 must be a fixed 4 + classes")
        if isinstance(n, int) and n < rows:
            raise self._refuse("fewer boxes than rows: is it the yolov5 layout, 1 x N x (5+C)?")
        self.num_classes = rows - 4
        self._name = outputs[0].name
        self._rows = rows

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        p = outputs[self._name].reshape(self._rows, -1)
        cls = p[4:]
        best = cls.max(axis=0)
        keep = np.flatnonzero(best >= score_threshold)
        ids = cls[:, keep].argmax(axis=0) if len(cls) > 1 else np.zeros(keep.size, np.intp)
        box = p[:4, keep]
        return Decoded(_xywh_to_xyxy(box[0], box[1], box[2], box[3]), best[keep], ids)


class YoloV5Decoder(Decoder):
    """YOLOv5/v7 style: ``1 x N x (5+C)``, cx, cy, w, h, objectness, C class scores; a box
    scores objectness x its best class."""

    name = "yolov5"
    expects = "one output 1 x N x (5+C) (cx, cy, w, h, objectness, then C class scores per box)"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        if len(outputs) != 1 or len(outputs[0].shape) != 3:
            raise self._refuse()
        _, n, cols = outputs[0].shape
        if not isinstance(cols, int) or cols < 6:
            raise self._refuse("dim 2 must be a fixed 5 + classes")
        if isinstance(n, int) and n < cols:
            raise self._refuse("fewer boxes than columns: is it the yolov8 layout, 1 x (4+C) x N?")
        self.num_classes = cols - 5
        self._name = outputs[0].name
        self._cols = cols

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        p = outputs[self._name].reshape(-1, self._cols)
        # Class scores are probabilities, so objectness bounds the score: filter on it first.
        cand = p[p[:, 4] >= score_threshold]
        cls = cand[:, 5:]
        ids = cls.argmax(axis=1)
        scores = cand[:, 4] * cls[np.arange(len(cand)), ids]
        keep = scores >= score_threshold
        c = cand[keep]
        return Decoded(_xywh_to_xyxy(c[:, 0], c[:, 1], c[:, 2], c[:, 3]), scores[keep], ids[keep])


class SsdDecoder(Decoder):
    """TFLite ``TFLite_Detection_PostProcess`` outputs (already suppressed by the model)."""

    name = "ssd"
    expects = ("four outputs (TFLite_Detection_PostProcess): boxes 1 x N x 4 (ymin, xmin, ymax, "
               "xmax, normalized), classes 1 x N, scores 1 x N, count 1")
    suppression = "none"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        if len(outputs) != 4:
            raise self._refuse()
        boxes = [s for s in outputs if len(s.shape) == 3 and s.shape[-1] == 4]
        count = [s for s in outputs if len(s.shape) <= 1 or all(d == 1 for d in s.shape)]
        flat = [s for s in outputs if len(s.shape) == 2 and s not in count]
        if len(boxes) != 1 or len(count) != 1 or len(flat) != 2:
            raise self._refuse()
        # Names when they say which is which; else the op's own order: classes, then scores.
        named = sorted(flat, key=lambda s: "score" in s.name.lower())
        classes, scores = named if any("score" in s.name.lower() for s in flat) else flat
        self._boxes, self._classes, self._scores = boxes[0].name, classes.name, scores.name
        self._count = count[0].name

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        n = int(outputs[self._count].reshape(-1)[0])
        scores = outputs[self._scores].reshape(-1)[:n]
        keep = np.flatnonzero(scores >= score_threshold)
        b = outputs[self._boxes].reshape(-1, 4)[keep]
        w, h = self.input_size
        boxes = np.stack([b[:, 1] * w, b[:, 0] * h, b[:, 3] * w, b[:, 2] * h], axis=1)
        ids = np.rint(outputs[self._classes].reshape(-1)[keep]).astype(np.intp)
        return Decoded(boxes, scores[keep], ids)


# MediaPipe's SSD anchor layouts (SsdAnchorsCalculator, fixed_anchor_size, aspect ratio 1 plus
# the interpolated scale where per_cell is 2): short-range/front 128 and back 256 models, then
# the full-range 192 model. The one whose anchor count matches the model's output is used.
BLAZEFACE_LAYOUTS: tuple[tuple[tuple[int, ...], int], ...] = (
    ((8, 16, 16, 16), 2), ((16, 32, 32, 32), 2), ((4,), 1),
)


def blazeface_anchors(width: int, height: int, strides: Sequence[int], per_layer: int
                      ) -> np.ndarray:
    """``(A, 2)`` anchor centers x, y in [0, 1], in MediaPipe's order (feature map by feature
    map, row by row, all anchors of a cell together)."""
    centers = []
    i = 0
    while i < len(strides):
        j = i
        while j < len(strides) and strides[j] == strides[i]:
            j += 1
        fh, fw = math.ceil(height / strides[i]), math.ceil(width / strides[i])
        xs, ys = np.meshgrid((np.arange(fw) + 0.5) / fw, (np.arange(fh) + 0.5) / fh)
        grid = np.stack([xs.ravel(), ys.ravel()], axis=1)
        centers.append(np.repeat(grid, (j - i) * per_layer, axis=0))
        i = j
    return np.concatenate(centers).astype(np.float32)


class BlazeFaceDecoder(Decoder):
    """MediaPipe BlazeFace: ``regressors 1 x A x 16`` (x, y offsets, w, h in input pixels,
    then 6 keypoints) and ``classificators 1 x A x 1`` logits, decoded against fixed-size SSD
    anchors (``TensorsToDetectionsCalculator`` of ``face_detection_short_range_common.pbtxt``)."""

    name = "blazeface"
    expects = ("two outputs: regressors 1 x A x (4 + 2K) and classificators 1 x A x 1, with A the "
               "SSD anchors of the input size (896 at 128x128)")
    suppression = "weighted"
    default_labels = ["face"]
    score_clip = 100.0  # score_clipping_thresh of the MediaPipe graph

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        if len(outputs) != 2 or any(len(s.shape) != 3 for s in outputs):
            raise self._refuse()
        scores = [s for s in outputs if s.shape[2] == 1]
        regs = [s for s in outputs if s.shape[2] != 1]
        count, coords = regs[0].shape[1:] if len(regs) == 1 else (None, None)
        if len(scores) != 1 or not isinstance(count, int) or count != scores[0].shape[1] \
                or not isinstance(coords, int) or coords < 4 or coords % 2:
            raise self._refuse()
        w, h = self.input_size
        for strides, per_layer in BLAZEFACE_LAYOUTS:
            anchors = blazeface_anchors(w, h, strides, per_layer)
            if len(anchors) == count:
                break
        else:
            raise self._refuse(f"no BlazeFace anchor layout has {count} anchors at {w}x{h}")
        self.num_classes = 1
        self._anchors_px = anchors * np.array([w, h], dtype=np.float32)
        self._regs, self._scores, self._coords = regs[0].name, scores[0].name, coords

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        logits = outputs[self._scores].reshape(-1)
        scores = _sigmoid(np.clip(logits, -self.score_clip, self.score_clip))
        keep = np.flatnonzero(scores >= score_threshold)
        raw = outputs[self._regs].reshape(-1, self._coords)[keep]
        anchors = self._anchors_px[keep]
        valid = (raw[:, 2] > 0) & (raw[:, 3] > 0)
        raw, anchors, keep = raw[valid], anchors[valid], keep[valid]
        # Fixed-size anchors: offsets and sizes are in input pixels (x_scale = input width).
        cx, cy = raw[:, 0] + anchors[:, 0], raw[:, 1] + anchors[:, 1]
        boxes = _xywh_to_xyxy(cx, cy, raw[:, 2], raw[:, 3])
        # explicit keypoint count: with no candidate left, -1 cannot be inferred
        kps = raw[:, 4:].reshape(len(raw), (self._coords - 4) // 2, 2) + anchors[:, None, :]
        return Decoded(boxes, scores[keep], np.zeros(len(keep), np.intp), kps)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # The tanh form cannot overflow, unlike 1 / (1 + exp(-x)) at x = -100 in float32.
    return np.asarray(0.5 * np.tanh(0.5 * x) + 0.5, dtype=np.float32)


DECODERS: dict[str, type[Decoder]] = {
    d.name: d for d in (YoloV8Decoder, YoloV5Decoder, SsdDecoder, BlazeFaceDecoder)
}


def make_decoder(name: str, outputs: Sequence[TensorSpec], input_size: tuple[int, int]
                 ) -> Decoder:
    """The decoder ``name`` bound to a model's outputs.

    Raises:
        ConfigError: unknown decoder, or outputs it cannot read (the shapes are named).
    """
    try:
        cls = DECODERS[name]
    except KeyError:
        raise ConfigError(f"unknown decoder {name!r}; valid: {', '.join(sorted(DECODERS))}"
                          ) from None
    return cls(outputs, input_size)

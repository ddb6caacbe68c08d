"""``yolox``: YOLOX's raw grid output (its ONNX/TFLite export, ``decode_in_inference`` off).

``1 x N x (5+C)``, one row per grid cell over strides 8, 16, 32 (and 64 for P6 models), cells
row by row within each stride: ``tx, ty, tw, th, objectness, C class scores`` (the last two
already sigmoid). A cell ``(gx, gy)`` of stride ``s`` has its box centre at
``((tx + gx) * s, (ty + gy) * s)`` and size ``(exp(tw) * s, exp(th) * s)``; a box scores
objectness x its best class, as YOLOX's ``demo_postprocess`` and Frigate do.

YOLOX's preprocessing letterboxes to the top-left corner (padding right and below, value 114)
and feeds pixel values 0..255 unscaled, in BGR order for the official weights: this decoder
asks the task for the top-left letterbox and ``scale: 1``; set ``preprocess.color: bgr`` for
models trained the official way.

The same shape is also a decoded YOLO output (YOLOv6, anchor-free YOLOv5 variants: decoder
``yolov5``), so ``decoder: auto`` picks this one only when the model's metadata names YOLOX.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import OutputLayoutError
from ...runtime.base import TensorSpec
from .base import FITS_UNCONFIRMED, Decoded, Decoder, Mismatch, xywh_to_xyxy

__all__ = ["YoloxDecoder"]

STRIDES = ((8, 16, 32), (8, 16, 32, 64))

# |tw|, |th| above this are not log-sizes (exp(12) strides is far past any input): the rows hold
# decoded boxes.
MAX_LOG_SIZE = 12.0

# Metadata keys that may name the model's family.
_NAME_KEYS = ("description", "model", "name", "arch", "model_name", "producer_name")


class YoloxDecoder(Decoder):
    """YOLOX raw grid rows (see the module's docstring)."""

    name = "yolox"
    expects = ("one output 1 x N x (5+C): YOLOX's raw rows (tx, ty, tw, th, objectness, C class "
               "scores), one per grid cell over strides 8, 16, 32 of the input")
    hint = "a decoded output (YOLOv6, YOLOv5 variants: decoder: yolov5)"
    letterbox = "top-left"
    input_values = {"scale": 1.0}

    @classmethod
    def matches(cls, outputs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bool | str:
        """Only where the metadata names YOLOX: without it, a grid of ``5+C`` rows may as well
        be a decoded YOLOv6/YOLOv5 output."""
        verdict = super().matches(outputs, metadata)
        if verdict is not True or says_yolox(metadata):
            return verdict
        why = ("one 1 x N x (5+C) row per grid cell is YOLOX's raw output, and also a decoded "
               "one (YOLOv6, anchor-free YOLOv5 variants: decoder: yolov5), and the model's "
               "metadata does not say which: set decoder: yolox or decoder: yolov5")
        return Mismatch(f"decoder yolox: {why}", cls.name, why, FITS_UNCONFIRMED)

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        n, cols = self._rows_with_objectness(outputs)
        grid = yolox_grid(self.input_size, n)
        if grid is None:
            w, h = self.input_size
            raise self._refuse(f"{n} rows are not one per grid cell of strides 8, 16, 32 at "
                               f"{w}x{h} ({yolox_rows(self.input_size, STRIDES[0])}); "
                               "set preprocess.size to the size the model was exported at")
        self._cells, self._strides = grid
        self.num_classes = cols - 5
        self._name, self._cols = outputs[0].name, cols

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        p = outputs[self._name].reshape(-1, self._cols)
        # Class scores are probabilities, so objectness bounds the score: filter on it first.
        rows = np.flatnonzero(p[:, 4] >= score_threshold)
        cls = p[rows, 5:]
        ids = cls.argmax(axis=1)
        scores = p[rows, 4] * cls[np.arange(len(rows)), ids]
        keep = scores >= score_threshold
        rows, ids, scores = rows[keep], ids[keep], scores[keep]
        t = p[rows, :4]
        if len(t) and float(np.abs(t[:, 2:]).max()) > MAX_LOG_SIZE:
            raise OutputLayoutError(
                f"decoder yolox: box sizes up to {float(np.abs(t[:, 2:]).max()):.4g}, where "
                f"YOLOX's raw rows hold log-sizes: the outputs are not {self.expects}; likely "
                f"{self.hint}")
        s = self._strides[rows]
        cx, cy = (t[:, 0] + self._cells[rows, 0]) * s, (t[:, 1] + self._cells[rows, 1]) * s
        w, h = np.exp(t[:, 2]) * s, np.exp(t[:, 3]) * s
        return Decoded(xywh_to_xyxy(cx, cy, w, h), scores, ids)


def says_yolox(metadata: Mapping[str, str]) -> bool:
    """Whether the model's metadata names YOLOX."""
    return any("yolox" in metadata.get(k, "").lower() for k in _NAME_KEYS)


def yolox_rows(input_size: tuple[int, int], strides: Sequence[int]) -> int:
    """Rows of a YOLOX head with ``strides`` at ``input_size``."""
    w, h = input_size
    return sum((w // s) * (h // s) for s in strides)


def yolox_grid_cells(input_size: tuple[int, int], strides: Sequence[int]
                     ) -> list[tuple[int, int, int]]:
    """``(gx, gy, stride)`` per row, in YOLOX's order (stride by stride, row by row)."""
    w, h = input_size
    return [(gx, gy, s) for s in strides
            for gy in range(h // s) for gx in range(w // s)]


def yolox_grid(input_size: tuple[int, int], n: object
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """Cell coordinates ``(N, 2)`` and strides ``(N,)`` for ``n`` rows, or ``None`` when ``n``
    is not YOLOX's row count at ``input_size``."""
    for strides in STRIDES:
        if n == yolox_rows(input_size, strides):
            cells = np.asarray(yolox_grid_cells(input_size, strides), dtype=np.float32)
            return cells[:, :2], cells[:, 2]
    return None

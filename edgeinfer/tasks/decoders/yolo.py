"""Ultralytics-style YOLO decoders: ``yolov8`` (YOLOv8/v11, ``1 x (4+C) x N``) and ``yolov5``
(YOLOv5/v7, ``1 x N x (5+C)``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...runtime.base import TensorSpec
from .base import Decoded, Decoder
from .base import xywh_to_xyxy

__all__ = ["YoloV5Decoder", "YoloV8Decoder"]


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
        return Decoded(xywh_to_xyxy(box[0], box[1], box[2], box[3]), best[keep], ids)


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
        return Decoded(xywh_to_xyxy(c[:, 0], c[:, 1], c[:, 2], c[:, 3]), scores[keep], ids[keep])

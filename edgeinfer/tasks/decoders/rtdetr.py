"""``ultralytics-rtdetr``: RT-DETR as Ultralytics exports it, ``1 x Q x (4+C)`` (cx, cy, w, h as
fractions of the input, then C sigmoid class scores) or ``1 x Q x 6`` (cx, cy, w, h, score,
class). One box per query, no NMS (the original RT-DETR export, with ``labels/boxes/scores``
outputs and an ``orig_target_sizes`` input, is another decoder)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Literal

import numpy as np

from ...runtime.base import TensorSpec
from .base import Decoded, Decoder, xywh_to_xyxy
from .grids import is_grid, other_task
from .meta import read_meta
from .units import BoxUnits

__all__ = ["UltralyticsRtDetrDecoder"]

logger = logging.getLogger(__name__)


class UltralyticsRtDetrDecoder(Decoder):
    """Ultralytics RT-DETR queries; the ``1 x Q x 6`` form is told from a 2-class
    ``1 x Q x (4+2)`` one by the metadata's class count, else by the first frame's values (a
    class column holds whole numbers, a score column does not)."""

    name = "ultralytics-rtdetr"
    expects = ("one output 1 x Q x (4+C) or 1 x Q x 6 (cx, cy, w, h as fractions of the input, "
               "then C class scores, or score and class; Q queries, 300 by default)")
    suppression = "none"
    hint = ("a YOLO grid output (decoder: yolov8 or yolov5), or an end-to-end export's x1, y1, "
            "x2, y2 pixel rows (decoder: yolo-end2end)")

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        meta = read_meta(self.metadata)
        why = other_task(meta)
        if why is None and meta.ultralytics and not meta.rtdetr:
            why = "the model's metadata describes an Ultralytics model that is not an RT-DETR"
        if why is not None:
            raise self._refuse(why)
        if len(outputs) != 1 or len(outputs[0].shape) != 3:
            raise self._refuse()
        _, q, cols = outputs[0].shape
        if not isinstance(cols, int) or cols < 5 or (isinstance(q, int) and q < cols):
            raise self._refuse("dim 2 must be a fixed 4 + classes, fewer than the queries")
        if is_grid(q, self.input_size, 1) or is_grid(q, self.input_size, 3):
            raise self._refuse(f"{q} rows are a YOLO grid, not RT-DETR queries (decoder: yolov8 "
                               "or yolov5)")
        n = len(meta.names) if meta.names is not None else None
        self._form: Literal["scores", "pairs"] | None = "scores" if cols != 6 else (
            "pairs" if n not in (2, None) else None)
        if self._form == "scores" and n not in (None, cols - 4):
            raise self._refuse(f"the model's metadata names {n} classes but the output scores "
                               f"{cols - 4}")
        self.num_classes = n if cols == 6 else cols - 4
        self._name, self._cols = outputs[0].name, cols
        self._units = BoxUnits(self.name, self.input_size, "normalized", self.hint)

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        p = outputs[self._name].reshape(-1, self._cols)
        if self._form is None:
            self._form = _form_of(p)
        if self._form == "pairs":
            scores, ids = p[:, 4], np.rint(p[:, 5]).astype(np.intp)
        else:
            ids = p[:, 4:].argmax(axis=1)
            scores = p[np.arange(len(p)), 4 + ids]
        keep = np.flatnonzero((scores >= score_threshold) & (scores > 0))
        b = p[keep]
        boxes = self._units.to_pixels(xywh_to_xyxy(b[:, 0], b[:, 1], b[:, 2], b[:, 3]))
        return Decoded(boxes, scores[keep], ids[keep])


def _form_of(p: np.ndarray) -> Literal["scores", "pairs"]:
    """``pairs`` when the last column is whole numbers (class ids), ``scores`` otherwise."""
    last = p[:, 5]
    form: Literal["scores", "pairs"] = "pairs" if np.array_equal(last, np.rint(last)) \
        else "scores"
    logger.info("decoder ultralytics-rtdetr: 1 x Q x 6 read as %s (from the first frame's last "
                "column)", "cx, cy, w, h, score, class" if form == "pairs"
                else "cx, cy, w, h and 2 class scores")
    return form

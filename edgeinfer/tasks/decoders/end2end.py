"""``yolo-end2end``: NMS-free exports, ``1 x K x 6`` rows of x1, y1, x2, y2, score, class (YOLOv10,
YOLO26, and Ultralytics' ``nms=True`` exports of any YOLO), zero rows padding the end. The model
has already suppressed overlaps: no NMS here."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...runtime.base import TensorSpec
from .base import Decoded, Decoder
from .grids import is_grid, other_task
from .meta import read_meta
from .units import BoxUnits

__all__ = ["YoloEnd2EndDecoder"]


class YoloEnd2EndDecoder(Decoder):
    """End-to-end YOLO rows; boxes in input pixels or fractions of the input (decided from the
    first boxes when the export does not say)."""

    name = "yolo-end2end"
    expects = ("one output 1 x K x 6 (x1, y1, x2, y2, score, class per row, zero rows padding; "
               "YOLOv10, YOLO26, Ultralytics nms=True)")
    suppression = "none"
    hint = "rows of cx, cy, w, h: an Ultralytics RT-DETR (decoder: ultralytics-rtdetr)"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        meta = read_meta(self.metadata)
        why = other_task(meta)
        if why is not None:
            raise self._refuse(why)
        if len(outputs) != 1 or len(outputs[0].shape) != 3 or outputs[0].shape[2] != 6:
            raise self._refuse()
        if meta.rtdetr:
            raise self._refuse("the model's metadata names RT-DETR, whose rows are cx, cy, w, h "
                               "(decoder: ultralytics-rtdetr)")
        k = outputs[0].shape[1]
        if is_grid(k, self.input_size, 1) or is_grid(k, self.input_size, 3):
            raise self._refuse(f"{k} rows are a YOLO grid at {self.input_size[0]}x"
                               f"{self.input_size[1]}, not an end-to-end head's few hundred: "
                               "the transposed YOLOv8 layout (decoder: yolov8) or YOLOv5's "
                               "(decoder: yolov5)")
        self.num_classes = len(meta.names) if meta.names is not None else None
        self._name = outputs[0].name
        self._units = BoxUnits(self.name, self.input_size)

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        p = outputs[self._name].reshape(-1, 6)
        score = p[:, 4]
        # score > 0 drops the zero padding rows even at score_threshold 0
        rows = p[(score >= score_threshold) & (score > 0)]
        boxes = self._units.to_pixels(rows[:, :4])
        return Decoded(boxes, rows[:, 4], np.rint(rows[:, 5]).astype(np.intp))

"""``ssd``: post-processed SSD-family outputs (already suppressed by the model).

Two exporters write them:

* TFLite's ``TFLite_Detection_PostProcess`` op (TF1 and TF2 TFLite exports, Model Maker's
  EfficientDet-Lite): boxes ``1 x N x 4`` (ymin, xmin, ymax, xmax, fractions of the input),
  classes ``1 x N``, scores ``1 x N``, count ``1``, class ids from 0 (the first real class). The
  outputs' order differs between exports (TF1: boxes, classes, scores, count; TF2 and Model
  Maker: e.g. scores, boxes, count, classes) and their names say nothing
  (``StatefulPartitionedCall:3``), so they are told apart by shape, and classes from scores by
  name where one says, else by the first frame's values (class ids are whole numbers).
* The TF Object Detection API's own graph (TF1 frozen graph, TF2 SavedModel, converted to ONNX):
  ``detection_boxes``, ``detection_classes``, ``detection_scores``, ``num_detections`` (plus
  ``raw_detection_*``, ``detection_multiclass_scores`` and ``detection_anchor_indices`` in the
  8-output TF2 form), found by name; class ids are COCO category ids, from 1.

Class ids come out indexing the labels: a labels list starting with a background entry
(``coco91``, a ``???`` line) is indexed by category id, one without from its first class.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from ...errors import OutputLayoutError
from ...runtime.base import TensorSpec, format_shape
from .base import Decoded, Decoder
from .meta import read_meta
from .tensors import dequantized, is_count, label_shift, named, quant_of

__all__ = ["SsdDecoder"]

logger = logging.getLogger(__name__)

_OD_API = ("detection_boxes", "detection_classes", "detection_scores", "num_detections")


class SsdDecoder(Decoder):
    """SSD-family boxes, classes, scores and count (see the module's docstring)."""

    name = "ssd"
    expects = ("four outputs in any order (TFLite_Detection_PostProcess): boxes 1 x N x 4 (ymin, "
               "xmin, ymax, xmax, normalized), classes 1 x N, scores 1 x N, count 1; or the TF "
               "Object Detection API's detection_boxes, detection_classes, detection_scores, "
               "num_detections (4 or 8 outputs)")
    suppression = "none"
    class_numbering = "tf"
    hint = "YOLO-NAS's pixel x1, y1, x2, y2 boxes (decoder: yolo-nas)"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        if named(outputs, "num_predictions") or named(outputs, "pred_boxes"):
            raise self._refuse("num_predictions and pred_boxes are YOLO-NAS's outputs "
                               "(decoder: yolo-nas)")
        api = [named(outputs, n) for n in _OD_API]
        if all(s is not None for s in api):
            boxes, classes, scores, count = (s for s in api if s is not None)
            self._first_id = 1
            self._pair: tuple[str, str] | None = (classes.name, scores.name)
            flat = [classes, scores]
        else:
            boxes, count, flat = self._by_shape(outputs)
            self._first_id = 0
            self._flat = (flat[0].name, flat[1].name)
            self._pair = _pair_by_name(flat)
        self._check_shapes(boxes, count)
        self._check_rows(boxes, flat)
        self._boxes, self._count = boxes.name, count.name
        self._quant = {s.name: quant_of(s) for s in outputs}
        self._shift = label_shift(self._first_id, read_meta(self.metadata).names)

    def _by_shape(self, outputs: tuple[TensorSpec, ...]
                  ) -> tuple[TensorSpec, TensorSpec, list[TensorSpec]]:
        if len(outputs) != 4:
            raise self._refuse()
        boxes = [s for s in outputs if len(s.shape) == 3 and s.shape[-1] == 4]
        count = [s for s in outputs if is_count(s)]
        flat = [s for s in outputs if len(s.shape) == 2 and s not in count]
        if len(boxes) != 1 or len(count) != 1 or len(flat) != 2:
            raise self._refuse()
        if np.dtype(count[0].dtype).kind in "iu" and count[0].quantization is None:
            raise self._refuse(f"an integer count ({count[0].dtype}) is YOLO-NAS's layout, "
                               "pixel x1, y1, x2, y2 boxes (decoder: yolo-nas)")
        return boxes[0], count[0], flat

    def _check_shapes(self, boxes: TensorSpec, count: TensorSpec) -> None:
        if len(boxes.shape) != 3 or boxes.shape[-1] != 4 or not is_count(count):
            raise self._refuse("detection_boxes must be 1 x N x 4 and num_detections one value")
        if np.dtype(boxes.dtype).kind in "iu" and boxes.quantization is None:
            raise self._refuse(f"{boxes.name} is {boxes.dtype} without a scale and zero point: "
                               "re-export with float outputs")

    def _check_rows(self, boxes: TensorSpec, flat: list[TensorSpec]) -> None:
        """Boxes, classes and scores: one row each per detection, ``1 x N`` beside ``1 x N x 4``."""
        rows = {boxes.shape[1], *(s.shape[-1] for s in flat)}
        if any(len(s.shape) != 2 for s in flat) or len(rows) != 1:
            raise self._refuse("boxes, classes and scores must have the same N rows: "
                               + ", ".join(f"{s.name} {format_shape(s.shape)}"
                                           for s in (boxes, *flat)))

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        n = int(self._read(outputs, self._count).reshape(-1)[0])
        pair = self._pair if self._pair is not None else self._decide(outputs, n)
        if pair is None:
            return _empty()
        classes = self._read(outputs, pair[0]).reshape(-1)[:n]
        scores = self._read(outputs, pair[1]).reshape(-1)[:n]
        keep = np.flatnonzero(scores >= score_threshold)
        b = self._read(outputs, self._boxes).reshape(-1, 4)[keep]
        w, h = self.input_size
        boxes = np.stack([b[:, 1] * w, b[:, 0] * h, b[:, 3] * w, b[:, 2] * h], axis=1)
        ids = np.rint(classes[keep]).astype(np.intp) + self._shift
        return Decoded(boxes, scores[keep], ids)

    def _read(self, outputs: Mapping[str, np.ndarray], name: str) -> np.ndarray:
        return dequantized(outputs[name], self._quant[name])

    def _decide(self, outputs: Mapping[str, np.ndarray], n: int) -> tuple[str, str] | None:
        """Which of the two ``1 x N`` outputs holds the classes, from the first frame with
        detections: class ids are whole numbers, scores are not (or stay within 0..1)."""
        if n <= 0:
            return None
        a, b = self._flat
        va, vb = (self._read(outputs, x).reshape(-1)[:n] for x in (a, b))
        whole_a, whole_b = (bool(np.array_equal(v, np.rint(v))) for v in (va, vb))
        big_a, big_b = bool(va.max() > 1), bool(vb.max() > 1)
        if whole_a != whole_b:
            pair = (a, b) if whole_a else (b, a)
        elif whole_a and big_a != big_b:
            pair = (a, b) if big_a else (b, a)
        elif whole_a and not big_a:
            logger.warning("decoder ssd: %s and %s both hold only 0 and 1 on this frame; which "
                           "are the classes is decided on a later frame", a, b)
            return None
        else:
            raise OutputLayoutError(f"decoder ssd: {a} and {b} cannot be class ids and scores "
                                    "(class ids are whole numbers, scores within 0..1): the "
                                    f"outputs are not {self.expects}; likely {self.hint}")
        logger.info("decoder ssd: classes read from %s, scores from %s (the first frame's "
                    "values: class ids are whole numbers)", *pair)
        self._pair = pair
        return pair


def _pair_by_name(flat: list[TensorSpec]) -> tuple[str, str] | None:
    """``(classes, scores)`` where the names say which is which, else ``None``."""
    scores = [s for s in flat if "score" in s.name.lower()]
    classes = [s for s in flat if "class" in s.name.lower() or "label" in s.name.lower()]
    if len(scores) == 1 and classes != scores:
        other = flat[0] if flat[1] is scores[0] else flat[1]
        return other.name, scores[0].name
    if len(classes) == 1 and not scores:
        other = flat[0] if flat[1] is classes[0] else flat[1]
        return classes[0].name, other.name
    return None


def _empty() -> Decoded:
    return Decoded(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.intp))

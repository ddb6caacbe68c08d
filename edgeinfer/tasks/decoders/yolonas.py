"""``yolo-nas``: YOLO-NAS exported with its NMS (super-gradients ``export(..., postprocessing=
True)``), boxes x1, y1, x2, y2 in input pixels, already suppressed:

* batch format: ``num_predictions [1, 1]``, ``pred_boxes [1, N, 4]``, ``pred_scores [1, N]``,
  ``pred_classes [1, N]`` (rows past ``num_predictions`` are padding);
* flat format: one ``[K, 7]`` output, rows of image index, x1, y1, x2, y2, score, class (the
  form Frigate reads; GPU exports pad with class -1).

The batch format has SSD's shapes (four outputs, a count, two ``1 x N``); it is told apart by
its names, or where they were renamed by its integer count and classes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...runtime.base import TensorSpec
from .base import Decoded, Decoder
from .tensors import is_count, named

__all__ = ["YoloNasDecoder"]

_NAMES = ("num_predictions", "pred_boxes", "pred_scores", "pred_classes")


class YoloNasDecoder(Decoder):
    """YOLO-NAS with NMS, batch or flat format (see the module's docstring)."""

    name = "yolo-nas"
    expects = ("YOLO-NAS with NMS: num_predictions 1 x 1, pred_boxes 1 x N x 4 (x1, y1, x2, y2 "
               "pixels), pred_scores 1 x N, pred_classes 1 x N; or one K x 7 output (image, x1, "
               "y1, x2, y2, score, class)")
    suppression = "none"
    hint = "SSD's normalized ymin, xmin, ymax, xmax boxes (decoder: ssd)"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        if len(outputs) == 1 and len(outputs[0].shape) == 2 and outputs[0].shape[1] == 7:
            self._flat: str | None = outputs[0].name
            return
        self._flat = None
        if len(outputs) != 4:
            raise self._refuse()
        by_name = [named(outputs, n) for n in _NAMES]
        found = [s for s in by_name if s is not None]
        roles = found if len(found) == 4 else self._by_dtype(outputs)
        count, boxes, scores, classes = roles
        if not is_count(count) or len(boxes.shape) != 3 or boxes.shape[2] != 4 \
                or len(scores.shape) != 2 or len(classes.shape) != 2:
            raise self._refuse()
        if len({boxes.shape[1], scores.shape[1], classes.shape[1]}) != 1:
            raise self._refuse("pred_boxes, pred_scores and pred_classes must have the same N "
                               "rows")
        self._count, self._boxes = count.name, boxes.name
        self._scores, self._classes = scores.name, classes.name

    def _by_dtype(self, outputs: tuple[TensorSpec, ...]) -> list[TensorSpec]:
        """Renamed outputs: the count and classes are integers, the boxes and scores floats
        (SSD's are all floats)."""
        ints = [s for s in outputs if np.dtype(s.dtype).kind in "iu"]
        count = [s for s in ints if is_count(s)]
        classes = [s for s in ints if len(s.shape) == 2 and s not in count]
        boxes = [s for s in outputs if len(s.shape) == 3]
        scores = [s for s in outputs if len(s.shape) == 2 and s not in ints and not is_count(s)]
        if len(count) == 1 and len(classes) == 1 and len(boxes) == 1 and len(scores) == 1:
            return [count[0], boxes[0], scores[0], classes[0]]
        raise self._refuse("without YOLO-NAS's output names, its count and classes must be "
                           "integers; all-float outputs like these are SSD's (decoder: ssd)")

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        if self._flat is not None:
            rows = outputs[self._flat]
            rows = rows[(rows[:, 6] >= 0) & (rows[:, 5] >= score_threshold)]
            return Decoded(rows[:, 1:5].astype(np.float32), rows[:, 5].astype(np.float32),
                           np.rint(rows[:, 6]).astype(np.intp))
        n = int(outputs[self._count].reshape(-1)[0])
        scores = outputs[self._scores].reshape(-1)[:n]
        keep = np.flatnonzero(scores >= score_threshold)
        boxes = outputs[self._boxes].reshape(-1, 4)[keep]
        ids = np.rint(outputs[self._classes].reshape(-1)[keep]).astype(np.intp)
        return Decoded(boxes, scores[keep], ids)

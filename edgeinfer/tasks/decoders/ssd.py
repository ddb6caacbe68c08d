"""``ssd``: TFLite ``TFLite_Detection_PostProcess`` outputs (boxes, classes, scores, count)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...runtime.base import TensorSpec
from .base import Decoded, Decoder

__all__ = ["SsdDecoder"]


class SsdDecoder(Decoder):
    """TFLite ``TFLite_Detection_PostProcess`` outputs (already suppressed by the model)."""

    name = "ssd"
    expects = ("four outputs (TFLite_Detection_PostProcess): boxes 1 x N x 4 (ymin, xmin, ymax, "
               "xmax, normalized), classes 1 x N, scores 1 x N, count 1")
    suppression = "none"
    class_numbering = "tf"
    hint = "the TF Object Detection API outputs in another order, or pixel boxes"

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

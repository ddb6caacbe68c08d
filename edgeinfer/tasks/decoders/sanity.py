"""The first frames' candidates checked against what any right layout gives.

A decoder bound to outputs of another layout often still "works": it emits boxes, just wrong
ones (a pose head read as 52 classes scores about 320; cx, cy, w, h rows read as corners give
boxes with x2 < x1). These checks catch that on the first frames with candidates and stop the
pipeline with ``OutputLayoutError`` naming the likely layout; after them they cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import OutputLayoutError
from .base import Decoded, Decoder

__all__ = ["OutputCheck"]

FRAMES = 16  # frames with candidates checked; a wrong layout shows on the first one
SCORE_SLACK = 0.01  # int8 outputs step past 1.0 by a quantum
INVERTED_PX = 1.0  # a right box never has x2 < x1 by more than rounding


class OutputCheck:
    """Checks a decoder's candidates on the first ``FRAMES`` frames that have some.

    Args:
        decoder: The decoder (its name, layout and ``hint`` go into the error).
        labels: The task's labels, where known (class ids must index them).
    """

    __slots__ = ("_decoder", "_labels", "_left")

    def __init__(self, decoder: Decoder, labels: Sequence[str] | None) -> None:
        self._decoder = decoder
        self._labels = labels
        self._left = FRAMES

    def __call__(self, d: Decoded) -> None:
        """Raise ``OutputLayoutError`` when ``d`` cannot come from the decoder's layout."""
        if self._left == 0 or len(d.scores) == 0:
            return
        self._left -= 1
        dec = self._decoder
        problem = self._problem(d)
        if problem is not None:
            likely = f"; likely {dec.hint}" if dec.hint else ""
            raise OutputLayoutError(f"decoder {dec.name}: {problem}: the outputs are not "
                                    f"{dec.expects}{likely}")
        problem = self._class_problem(d.class_ids)
        if problem is not None:
            raise OutputLayoutError(f"decoder {dec.name}: {problem}: give the labels of the "
                                    "dataset this model was trained on")

    def _problem(self, d: Decoded) -> str | None:
        lo, hi = float(d.scores.min()), float(d.scores.max())
        if lo < -SCORE_SLACK or hi > 1 + SCORE_SLACK:
            return f"scores from {lo:.3g} to {hi:.3g}, where a right layout gives 0..1"
        w, h = d.boxes[:, 2] - d.boxes[:, 0], d.boxes[:, 3] - d.boxes[:, 1]
        if float(min(w.min(), h.min())) < -INVERTED_PX:
            return "boxes with x2 < x1 or y2 < y1 (another box format read as corners)"
        if not np.any((w > 0) & (h > 0)):
            return "every box has no area"
        iw, ih = self._decoder.input_size
        b = d.boxes
        if iw > 0 and not np.any((b[:, 2] > 0) & (b[:, 3] > 0) & (b[:, 0] < iw) & (b[:, 1] < ih)):
            return f"every box lies outside the {iw}x{ih} input"
        return None

    def _class_problem(self, ids: np.ndarray) -> str | None:
        top, low = int(ids.max()), int(ids.min())
        n = len(self._labels) if self._labels is not None else self._decoder.num_classes
        if low < 0 or (n is not None and top >= n):
            what = "labels" if self._labels is not None else "classes"
            other = " (labels for another dataset? COCO's 91 ids need labels: coco91)" \
                if n == 80 and top < 91 else ""
            return f"class id {top if low >= 0 else low} but {n} {what}{other}"
        return None

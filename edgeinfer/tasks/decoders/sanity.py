"""The first frames' candidates checked against what any right layout gives.

A decoder bound to outputs of another layout often still "works": it emits boxes, just wrong
ones (a pose head read as 52 classes scores about 320; cx, cy, w, h rows read as corners give
boxes with x2 < x1; YOLOX's raw rows read as YOLOv5's give 1-2 px boxes at the origin; pixel
boxes read as fractions land hundreds of input sizes away). These checks catch that on the
first frames with candidates and stop the pipeline with ``OutputLayoutError`` naming the likely
layout; after them they cost nothing.
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
# No detector finds an object under 2 input pixels across: every candidate that thin is not a
# box (YOLOX's raw cell offsets and log-sizes read as pixels give 1-2 px boxes at the origin).
MIN_SIDE_PX = 2.0
# Every candidate lying wholly this near one corner of the input (a fraction of its shorter
# side, at least CORNER_MIN_PX: less than the finest stride a detector has) is values read as
# pixels that are not pixels (offsets within a grid cell), not a picture's objects.
CORNER_FRACTION = 0.01
CORNER_MIN_PX = 4.0
# A right box may run far past the input's edge (an object cut by it; MediaPipe's person squares
# around a cat reach 7 input sizes out at a threshold of 0.001), never by tens of input sizes
# (pixels read as fractions land hundreds of sizes away).
OUT_OF_RANGE = 20.0

_CORNERS = ("top-left", "top-right", "bottom-left", "bottom-right")


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
            # The doubt the binding had (rows that are not this head's grid) names the layout
            # the shapes do fit: the surest hint there is.
            doubt = f"; when bound: {dec.doubt}" if dec.doubt else ""
            raise OutputLayoutError(f"decoder {dec.name}: {problem}: the outputs are not "
                                    f"{dec.expects}{likely}{doubt}")
        problem = self._class_problem(d.class_ids)
        if problem is not None:
            raise OutputLayoutError(f"decoder {dec.name}: {problem}: give the labels of the "
                                    "dataset this model was trained on")

    def _problem(self, d: Decoded) -> str | None:
        lo, hi = float(d.scores.min()), float(d.scores.max())
        if lo < -SCORE_SLACK or hi > 1 + SCORE_SLACK:
            return f"scores from {lo:.3g} to {hi:.3g}, where a right layout gives 0..1"
        b = d.boxes
        if not np.all(np.isfinite(b)):
            return "boxes with coordinates that are not numbers (inf or nan)"
        w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        if float(min(w.min(), h.min())) < -INVERTED_PX:
            return "boxes with x2 < x1 or y2 < y1 (another box format read as corners)"
        if not np.any((w > 0) & (h > 0)):
            return "every box has no area"
        iw, ih = self._decoder.input_size
        if iw <= 0 or ih <= 0:
            return None
        return self._placement_problem(b, w, h, iw, ih)

    @staticmethod
    def _placement_problem(b: np.ndarray, w: np.ndarray, h: np.ndarray, iw: int, ih: int
                           ) -> str | None:
        """Boxes no picture gives: all outside the input, past it by input sizes, all thinner
        than a detector sees, or all crowded into one corner."""
        if not np.any((b[:, 2] > 0) & (b[:, 3] > 0) & (b[:, 0] < iw) & (b[:, 1] < ih)):
            return f"every box lies outside the {iw}x{ih} input"
        far = OUT_OF_RANGE
        xs, ys = b[:, 0::2], b[:, 1::2]
        past = ((xs < -far * iw) | (xs > (1 + far) * iw)).any(axis=1) \
            | ((ys < -far * ih) | (ys > (1 + far) * ih)).any(axis=1)
        if past.all():
            return (f"every box reaches more than {far:g} input sizes past the {iw}x{ih} input "
                    f"(coordinates from {float(b.min()):.4g} to {float(b.max()):.4g}): values "
                    "in another unit, or another box format")
        thin = np.minimum(w, h)
        if float(thin.max()) < MIN_SIDE_PX:
            return (f"every box is under {MIN_SIDE_PX:g} px wide or tall (the widest "
                    f"{float(w.max()):.3g} x {float(h.max()):.3g} px at {iw}x{ih}): degenerate "
                    "boxes, values that are not box sizes in pixels")
        corner = max(CORNER_MIN_PX, CORNER_FRACTION * min(iw, ih))
        for name, (x0, y0) in zip(_CORNERS, ((0, 0), (iw, 0), (0, ih), (iw, ih))):
            if float(np.abs(b[:, 0::2] - x0).max()) <= corner \
                    and float(np.abs(b[:, 1::2] - y0).max()) <= corner:
                return (f"every box lies within {corner:.3g} px of the {name} corner of the "
                        f"{iw}x{ih} input: values that are not pixel positions (offsets within "
                        "a grid cell?)")
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

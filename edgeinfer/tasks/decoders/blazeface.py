"""``blazeface``: MediaPipe BlazeFace regressors + classificators against SSD anchors."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ...runtime.base import TensorSpec
from .base import Decoded, Decoder, sigmoid, xywh_to_xyxy

__all__ = ["BLAZEFACE_LAYOUTS", "BlazeFaceDecoder", "Layout", "blazeface_anchors"]


Layout = tuple[tuple[int, ...], int, tuple[int, int]]
"""An SSD anchor layout: strides, anchors per cell and layer, and the ``(width, height)`` input
the model it belongs to takes (MediaPipe's anchors are options of the model's graph, made for
that size only)."""

# MediaPipe's SSD anchor layouts (SsdAnchorsCalculator, fixed_anchor_size, aspect ratio 1 plus
# the interpolated scale where per_cell is 2): the short-range/front model (128, 896 anchors),
# the back-camera one (256, 896) and the full-range one (192, 2304). A model is read only at
# its own layout's input size, with exactly that layout's anchor count.
BLAZEFACE_LAYOUTS: tuple[Layout, ...] = (
    ((8, 16, 16, 16), 2, (128, 128)), ((16, 32, 32, 32), 2, (256, 256)), ((4,), 1, (192, 192)),
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
    expects = ("two outputs: regressors 1 x A x 16 (box, then 6 keypoints) and classificators "
               "1 x A x 1, with A the SSD anchors of MediaPipe's face detectors at their input "
               "size (896 at 128x128 or 256x256, 2304 at 192x192)")
    suppression = "weighted"
    default_labels = ["face"]
    score_clip = 100.0  # score_clipping_thresh of the MediaPipe graph
    # MediaPipe's detectors take [-1, 1] pixels, letterboxed on black.
    input_values = {"scale": 1 / 127.5, "mean": [1.0]}
    pad_value = 0
    layouts: tuple[Layout, ...] = BLAZEFACE_LAYOUTS
    """The anchor layouts this family's models use; binding picks the one made for the input
    size and requires its anchor count, so ``decoder: auto`` tells the face and person
    detectors (and MediaPipe detectors of other things) apart by it."""
    keypoints = 6
    """Keypoints per anchor: the regressors are ``4 + 2 x keypoints`` wide."""
    family = "MediaPipe face detector"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        split = _split(outputs)
        if split is None:
            raise self._refuse()
        regs, scores, count, coords = split
        if coords != 4 + 2 * self.keypoints:
            raise self._refuse(f"regressors {coords} wide = 4 + 2 x {(coords - 4) // 2} "
                               f"keypoints, where the {self.family} has 4 + 2 x "
                               f"{self.keypoints} = {4 + 2 * self.keypoints}: a MediaPipe "
                               "detector of something else")
        w, h = self.input_size
        for strides, per_layer, size in self.layouts:
            anchors = blazeface_anchors(w, h, strides, per_layer)
            if size == (w, h) and len(anchors) == count:
                break
        else:
            raise self._refuse(f"{count} anchors at {w}x{h}; the {self.family}'s SSD anchors "
                               f"are {_layouts(self.layouts)}")
        self.num_classes = 1
        self._anchors_px = anchors * np.array([w, h], dtype=np.float32)
        self._regs, self._scores, self._coords = regs.name, scores.name, coords

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        logits = outputs[self._scores].reshape(-1)
        scores = sigmoid(np.clip(logits, -self.score_clip, self.score_clip))
        keep = np.flatnonzero(scores >= score_threshold)
        raw = outputs[self._regs].reshape(-1, self._coords)[keep]
        anchors = self._anchors_px[keep]
        valid = (raw[:, 2] > 0) & (raw[:, 3] > 0)
        raw, anchors, keep = raw[valid], anchors[valid], keep[valid]
        # Fixed-size anchors: offsets and sizes are in input pixels (x_scale = input width).
        cx, cy = raw[:, 0] + anchors[:, 0], raw[:, 1] + anchors[:, 1]
        boxes = xywh_to_xyxy(cx, cy, raw[:, 2], raw[:, 3])
        # explicit keypoint count: with no candidate left, -1 cannot be inferred
        kps = raw[:, 4:].reshape(len(raw), (self._coords - 4) // 2, 2) + anchors[:, None, :]
        return Decoded(boxes, scores[keep], np.zeros(len(keep), np.intp), kps)


def _layouts(layouts: Sequence[Layout]) -> str:
    """``896 at 128x128, 2304 at 192x192``."""
    return ", ".join(f"{len(blazeface_anchors(w, h, st, k))} at {w}x{h}"
                     for st, k, (w, h) in layouts)


def _split(outputs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, TensorSpec, int, int] | None:
    """(regressors, classificators, anchor count, coordinates per anchor) where the outputs
    have BlazeFace's structure, else ``None``."""
    if len(outputs) != 2 or any(len(s.shape) != 3 for s in outputs):
        return None
    scores = [s for s in outputs if s.shape[2] == 1]
    regs = [s for s in outputs if s.shape[2] != 1]
    count, coords = regs[0].shape[1:] if len(regs) == 1 else (None, None)
    if len(scores) != 1 or not isinstance(count, int) or count != scores[0].shape[1] \
            or not isinstance(coords, int) or coords < 4 or coords % 2:
        return None
    return regs[0], scores[0], count, coords

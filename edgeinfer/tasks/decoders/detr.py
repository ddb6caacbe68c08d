"""DETR-style detectors exported with their own post-processing: one box per query, no NMS.

* ``rtdetr``: the original RT-DETR (lyuwenyu's ``export_onnx.py``; RT-DETRv2, D-FINE and DEIM
  export the same way): outputs ``labels [1, Q]``, ``boxes [1, Q, 4]``, ``scores [1, Q]``
  (sigmoid), and a second input ``orig_target_sizes [1, 2]`` (width, height) that the boxes
  (x1, y1, x2, y2 fractions) are multiplied by. This decoder fills it with the model input's
  own size, so the boxes come out in input pixels and the letterbox is undone like any other
  decoder's (feeding the source frame's size instead is right only for a stretched input).
  Class ids are dense (0 is the first class).
* ``dfine``: the same layout under D-FINE's name (as Frigate calls it); ``auto`` says ``rtdetr``.
* ``rfdetr``: Roboflow's RF-DETR: ``dets [1, Q, 4]`` (cx, cy, w, h, fractions of the input) and
  ``labels [1, Q, C]`` class logits (sigmoid, as RF-DETR's own post-processing; Frigate reads
  them with a softmax). Column 0 is no class (COCO category ids and Roboflow exports start at
  1), so each query's best class is taken over the others. Its input is ImageNet-normalized.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import ConfigError
from ...runtime.base import TensorSpec, format_shape
from .base import Decoded, Decoder, sigmoid, xywh_to_xyxy
from .meta import read_meta
from .tensors import label_shift, named
from .units import BoxUnits

__all__ = ["DFineDecoder", "RfDetrDecoder", "RtDetrDecoder"]


class RtDetrDecoder(Decoder):
    """RT-DETR's ``labels, boxes, scores`` with an ``orig_target_sizes`` input."""

    name = "rtdetr"
    expects = ("three outputs: labels 1 x Q, boxes 1 x Q x 4 (x1, y1, x2, y2, scaled by the "
               "orig_target_sizes input), scores 1 x Q (RT-DETR, RT-DETRv2, D-FINE, DEIM)")
    suppression = "none"
    hint = "boxes as cx, cy, w, h (an RF-DETR: decoder: rfdetr)"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        if len(outputs) != 3:
            raise self._refuse()
        found = [s for s in (named(outputs, n) for n in ("label", "box", "score")) if s]
        labels, boxes, scores = found if len(found) == 3 else self._by_dtype(outputs)
        if len(boxes.shape) != 3 or boxes.shape[2] != 4 or len(labels.shape) != 2 \
                or len(scores.shape) != 2:
            raise self._refuse()
        if len({boxes.shape[1], labels.shape[1], scores.shape[1]}) != 1:
            raise self._refuse("labels, boxes and scores must have the same Q queries")
        self._labels, self._boxes, self._scores = labels.name, boxes.name, scores.name
        self._units = BoxUnits(self.name, self.input_size)

    def _by_dtype(self, outputs: tuple[TensorSpec, ...]) -> list[TensorSpec]:
        boxes = [s for s in outputs if len(s.shape) == 3]
        flat = [s for s in outputs if len(s.shape) == 2]
        ints = [s for s in flat if np.dtype(s.dtype).kind in "iu"]
        if len(boxes) != 1 or len(flat) != 2 or len(ints) != 1:
            raise self._refuse("without the names labels, boxes, scores the labels must be the "
                               "one integer 1 x Q output")
        scores = flat[0] if flat[1] is ints[0] else flat[1]
        return [ints[0], boxes[0], scores]

    def fill_inputs(self, inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
        """``orig_target_sizes [1, 2]``: the model input's width and height, so the boxes come
        out in input pixels."""
        sizes = [s for s in inputs if len(s.shape) == 2 and s.shape[-1] == 2]
        if len(inputs) != 1 or len(sizes) != 1:
            if not inputs:  # an export with the sizes baked in: boxes in pixels or fractions
                return {}
            names = ", ".join(f"{s.name} {format_shape(s.shape)}" for s in inputs)
            raise ConfigError(f"decoder {self.name} fills one extra input, orig_target_sizes "
                              f"1 x 2; the model also has {names}")
        self._units = BoxUnits(self.name, self.input_size, "pixels")
        w, h = self.input_size
        return {sizes[0].name: np.array([[w, h]], dtype=np.dtype(sizes[0].dtype))}

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        scores = outputs[self._scores].reshape(-1)
        keep = np.flatnonzero(scores >= score_threshold)
        boxes = self._units.to_pixels(outputs[self._boxes].reshape(-1, 4)[keep])
        ids = np.rint(outputs[self._labels].reshape(-1)[keep]).astype(np.intp)
        return Decoded(boxes, scores[keep], ids)


class DFineDecoder(RtDetrDecoder):
    """D-FINE (and DEIM): RT-DETR's layout under the name Frigate gives it."""

    name = "dfine"

    @classmethod
    def matches(cls, outputs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bool | str:
        """Never for ``auto``: the same outputs are ``rtdetr``'s, which reads them the same."""
        return False


class RfDetrDecoder(Decoder):
    """RF-DETR's ``dets`` boxes and ``labels`` logits."""

    name = "rfdetr"
    expects = ("two outputs: dets 1 x Q x 4 (cx, cy, w, h, fractions of the input) and labels "
               "1 x Q x C class logits (RF-DETR)")
    suppression = "none"
    class_numbering = "tf"
    hint = "boxes as x1, y1, x2, y2 or scores that are not logits"
    input_values = {"scale": 1 / 255, "mean": [0.485, 0.456, 0.406],
                    "std": [0.229, 0.224, 0.225]}

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        if len(outputs) != 2 or any(len(s.shape) != 3 for s in outputs):
            raise self._refuse()
        dets, logits = named(outputs, "dets"), named(outputs, "label")
        if dets is None or logits is None:
            fours = [s for s in outputs if s.shape[2] == 4]
            if len(fours) != 1:
                raise self._refuse("name the outputs dets and labels, or give the logits more "
                                   "than 4 columns")
            dets = fours[0]
            logits = outputs[0] if outputs[1] is dets else outputs[1]
        cols = logits.shape[2]
        if dets.shape[2] != 4 or not isinstance(cols, int) or cols < 2 \
                or dets.shape[1] != logits.shape[1]:
            raise self._refuse("the boxes and logits must have the same queries, and the "
                               "logits a fixed class count")
        self._shift = label_shift(1, read_meta(self.metadata).names)
        self.num_classes = cols + self._shift
        self._dets, self._logits, self._cols = dets.name, logits.name, cols
        self._units = BoxUnits(self.name, self.input_size, "normalized", self.hint)

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        logits = outputs[self._logits].reshape(-1, self._cols)[:, 1:]
        best = logits.max(axis=1)
        # Sigmoid is monotonic: compare logits with the threshold's logit, then convert the few.
        keep = np.flatnonzero(best >= _logit(score_threshold))
        ids = logits[keep].argmax(axis=1) + 1 + self._shift
        b = outputs[self._dets].reshape(-1, 4)[keep]
        boxes = self._units.to_pixels(xywh_to_xyxy(b[:, 0], b[:, 1], b[:, 2], b[:, 3]))
        return Decoded(boxes, sigmoid(best[keep]), ids)


def _logit(p: float) -> float:
    if p <= 0:
        return -math.inf
    if p >= 1:
        return math.inf
    return math.log(p / (1 - p))

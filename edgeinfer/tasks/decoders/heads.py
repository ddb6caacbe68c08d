"""Ultralytics heads whose rows carry more than a box: pose (keypoints) and instance
segmentation (mask coefficients), in the grid form ``1 x (4 + C + E) x N`` and the end-to-end form
``1 x K x (6 + E)`` (x1, y1, x2, y2, score, class, then the E values).

These bases read the boxes, scores and classes as ``yolov8`` and ``yolo-end2end`` do; a task's
decoders (``tasks.pose``, ``tasks.segment``) say how many extra values a row has (``_extras``)
and what they become in ``Decoded`` (``_attach``). They are not in ``DECODERS``: ``detect``
never picks them, and its decoders refuse these heads naming the task to use.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from ...runtime.base import TensorSpec
from .base import Decoded, Decoder, xywh_to_xyxy
from .grids import is_grid, not_a_grid_hint
from .meta import ModelMeta, read_meta
from .units import BoxUnits

__all__ = ["ExtrasDecoder", "ExtrasEnd2EndDecoder", "ExtrasGridDecoder"]


class ExtrasDecoder(Decoder):
    """What both forms share: the task the metadata must name (or not name at all), the head
    output, and the hooks a task's decoder fills in."""

    task: ClassVar[str]
    _units: BoxUnits  # set by _bind; the extra values may come in the boxes' units

    def _meta(self) -> ModelMeta:
        meta = read_meta(self.metadata)
        if meta.task is not None and meta.task != self.task:
            raise self._refuse(f"the model's metadata says task {meta.task}: use task: "
                               f"{{type: {meta.task}}}, not {self.task}")
        return meta

    def _head(self, outputs: tuple[TensorSpec, ...]) -> TensorSpec:
        """The output holding the rows (the only one, by default)."""
        if len(outputs) != 1 or len(outputs[0].shape) != 3:
            raise self._refuse()
        return outputs[0]

    @abstractmethod
    def _extras(self, values: int, meta: ModelMeta, outputs: tuple[TensorSpec, ...],
                scored: bool) -> int:
        """How many of a row's ``values`` (after the box; with ``scored``, the class scores
        come first among them) are the task's own; ``self._refuse`` when they cannot be."""

    @abstractmethod
    def _attach(self, d: Decoded, extras: np.ndarray) -> Decoded:
        """``d`` with the kept rows' extra values (``(N, E)``) in the task's form."""


class ExtrasGridDecoder(ExtrasDecoder):
    """``1 x (4 + C + E) x N``: cx, cy, w, h, C class scores, E values, one box per grid cell."""

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        meta = self._meta()
        head = self._head(outputs)
        _, rows, n = head.shape
        if not isinstance(rows, int) or rows < 6 or (isinstance(n, int) and n < rows):
            raise self._refuse("dim 1 must be a fixed 4 + classes + the task's values, dim 2 "
                               "the boxes")
        extras = self._extras(rows - 4, meta, outputs, True)
        classes = rows - 4 - extras
        if classes < 1:
            raise self._refuse(f"{rows} rows leave no class scores beside {extras} values")
        if meta.names is not None and len(meta.names) != classes:
            raise self._refuse(f"the model's metadata names {len(meta.names)} classes but the "
                               f"output scores {classes}")
        if is_grid(n, self.input_size, 1) is False:
            assert isinstance(n, int)
            self.doubt = not_a_grid_hint(n, rows, self.input_size)
        self.num_classes = classes
        self._name, self._rows = head.name, rows
        self._units = BoxUnits(self.name, self.input_size)

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        p = outputs[self._name].reshape(self._rows, -1)
        end = 4 + (self.num_classes or 1)
        cls = p[4:end]
        best = cls.max(axis=0)
        keep = np.flatnonzero(best >= score_threshold)
        ids = cls[:, keep].argmax(axis=0) if len(cls) > 1 else np.zeros(keep.size, np.intp)
        box = p[:4, keep]
        boxes = self._units.to_pixels(xywh_to_xyxy(box[0], box[1], box[2], box[3]))
        return self._attach(Decoded(boxes, best[keep], ids), p[end:, keep].T)


class ExtrasEnd2EndDecoder(ExtrasDecoder):
    """``1 x K x (6 + E)``: x1, y1, x2, y2, score, class, E values per row, zero rows padding;
    the model has suppressed overlaps (no NMS here)."""

    suppression = "none"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        meta = self._meta()
        head = self._head(outputs)
        _, k, cols = head.shape
        if not isinstance(cols, int) or cols < 7:
            raise self._refuse("dim 2 must be a fixed 6 + the task's values")
        if is_grid(k, self.input_size, 1):
            raise self._refuse(f"{k} rows are a YOLO grid at {self.input_size[0]}x"
                               f"{self.input_size[1]}, not an end-to-end head's few hundred: "
                               "decoder: yolov8")
        extras = self._extras(cols - 6, meta, outputs, False)
        if extras != cols - 6:
            raise self._refuse(f"{cols - 6} values after the class, where the task's are {extras}")
        self.num_classes = len(meta.names) if meta.names is not None else None
        self._name, self._cols = head.name, cols
        self._units = BoxUnits(self.name, self.input_size)

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        p = outputs[self._name].reshape(-1, self._cols)
        score = p[:, 4]
        # score > 0 drops the zero padding rows even at score_threshold 0
        rows = p[(score >= score_threshold) & (score > 0)]
        boxes = self._units.to_pixels(rows[:, :4])
        d = Decoded(boxes, rows[:, 4], np.rint(rows[:, 5]).astype(np.intp))
        return self._attach(d, rows[:, 6:])

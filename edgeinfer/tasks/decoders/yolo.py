"""Ultralytics-style YOLO decoders: ``yolov8`` (YOLOv8/v11 and the default YOLO26/YOLOv10 export,
``1 x (4+C) x N``, or its transpose ``1 x N x (4+C)``) and ``yolov5`` (YOLOv5/v7,
``1 x N x (5+C)``).

Shapes that only look alike are told apart before anything is emitted: the row count must be
the head's grid at the input size (one row per cell, three for YOLOv5's anchors), a transposed
output needs the class count from the metadata or the labels (``1 x N x (4+C)`` is also YOLOv5's
and YOLOX's shape), and pose or segmentation heads are refused with the task to use.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...errors import OutputLayoutError
from ...runtime.base import Dim, TensorSpec
from .base import Decoded, Decoder, xywh_to_xyxy
from .grids import grid_centres, is_grid, not_a_grid_hint, other_task, pose_fit
from .meta import ModelMeta, read_meta
from .units import BoxUnits

__all__ = ["YoloV5Decoder", "YoloV8Decoder"]

# A decoded one-row-per-cell head's box centres follow their cells' nearly exactly (about 0.99);
# offsets within the cells, not at all (about 0).
CELL_CORRELATION = 0.5


class _GridDecoder(Decoder):
    """A YOLO head, one row per grid cell (or per anchor of a cell)."""

    def _not_a_grid(self, why: str, values: int, meta: ModelMeta) -> None:
        """Rows that are not the grid: refused where the shape or the metadata says which other
        layout it is (1 x K x 6 end-to-end rows, an RT-DETR), else a doubt (synthetic and
        unusual heads exist; the first frames' values are checked)."""
        if values == 6 or meta.end2end or meta.rtdetr:
            raise self._refuse(why)
        self.doubt = why


class YoloV8Decoder(_GridDecoder):
    """YOLOv8/v11 (Ultralytics export): ``1 x (4+C) x N`` (or ``1 x N x (4+C)``), cx, cy, w, h
    then C class scores; boxes in input pixels (ONNX) or fractions of the input (TFLite)."""

    name = "yolov8"
    expects = ("one output 1 x (4+C) x N or its transpose 1 x N x (4+C) (cx, cy, w, h, then C "
               "class scores per box, one box per grid cell)")
    hint = "a pose head (task: {type: pose}), or scores the export left as logits"

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        meta = read_meta(self.metadata)
        self._refuse_other_heads(outputs, meta)
        if len(outputs) != 1 or len(outputs[0].shape) != 3:
            raise self._refuse()
        _, a, b = outputs[0].shape
        self._transposed = _transposed(a, b)
        rows, n = (b, a) if self._transposed else (a, b)
        if not isinstance(rows, int) or rows < 5:
            raise self._refuse("dim 1 must be a fixed 4 + classes")
        if is_grid(n, self.input_size, 1) is False:
            assert isinstance(n, int)
            self._not_a_grid(not_a_grid_hint(n, rows, self.input_size), rows, meta)
        if self._transposed:
            self._check_transposed(rows, meta)
        self._check_classes(rows, meta)
        self.num_classes = rows - 4
        self._name = outputs[0].name
        self._rows = rows
        self._units = BoxUnits(self.name, self.input_size)

    def _refuse_other_heads(self, outputs: tuple[TensorSpec, ...], meta: ModelMeta) -> None:
        why = other_task(meta)
        if why is None and len(outputs) == 2 and any(len(s.shape) == 4 for s in outputs):
            why = ("a 1 x (4+C+32) x N output beside 1 x 32 x H x W mask prototypes is an "
                   "instance segmentation model: use task: {type: segment}")
        if why is not None:
            raise self._refuse(why)

    def _check_transposed(self, cols: int, meta: ModelMeta) -> None:
        n = len(meta.names) if meta.names is not None else None
        if n == cols - 4:
            return
        if n == cols - 5:
            raise self._refuse(f"{n} class names and {cols} values per box: the YOLOv5/v7 "
                               "layout 1 x N x (5+C) (decoder: yolov5), or YOLOX's raw one "
                               "(decoder: yolox)")
        raise self._refuse(f"1 x N x {cols} is the transposed YOLOv8 layout only if the model has "
                           f"{cols - 4} classes; it is also YOLOv5/v7's 1 x N x (5+C) (decoder: "
                           f"yolov5) and YOLOX's (decoder: yolox). Give the labels ({cols - 4} "
                           "entries) to read it as YOLOv8, or name the decoder that made it",
                           unconfirmed=n is None)

    def _check_classes(self, rows: int, meta: ModelMeta) -> None:
        n = len(meta.names) if meta.names is not None else None
        if n == rows - 4:
            return
        pose = pose_fit(rows)
        if pose is not None:
            raise self._refuse(f"{rows} rows fit a pose head, 4 + 1 + {pose[0]} keypoints x "
                               f"{pose[1]}: use task: {{type: pose}}; if it is a detector of "
                               f"{rows - 4} classes, give its {rows - 4} labels")
        if n is not None:
            raise self._refuse(f"the model's metadata names {n} classes but the output scores "
                               f"{rows - 4}")

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        out = outputs[self._name]
        p = out.reshape(-1, self._rows).T if self._transposed else out.reshape(self._rows, -1)
        cls = p[4:]
        best = cls.max(axis=0)
        keep = np.flatnonzero(best >= score_threshold)
        ids = cls[:, keep].argmax(axis=0) if len(cls) > 1 else np.zeros(keep.size, np.intp)
        box = p[:4, keep]
        boxes = self._units.to_pixels(xywh_to_xyxy(box[0], box[1], box[2], box[3]))
        return Decoded(boxes, best[keep], ids)


class YoloV5Decoder(_GridDecoder):
    """YOLOv5/v7 style: ``1 x N x (5+C)``, cx, cy, w, h, objectness, C class scores; a box
    scores objectness x its best class."""

    name = "yolov5"
    expects = ("one output 1 x N x (5+C) (cx, cy, w, h, objectness, then C class scores per box, "
               "three boxes per grid cell)")
    hint = ("an end-to-end export (decoder: yolo-end2end), an RT-DETR (decoder: "
            "ultralytics-rtdetr) or YOLOX (decoder: yolox)")

    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        meta = read_meta(self.metadata)
        n, cols = self._rows_with_objectness(outputs)
        if isinstance(n, int) and n < cols:
            raise self._refuse("fewer boxes than columns: is it the yolov8 layout, 1 x (4+C) x N?")
        if meta.names is not None and len(meta.names) == cols - 4:
            raise self._refuse(f"the model's metadata names {cols - 4} classes: the transposed "
                               "YOLOv8 layout 1 x N x (4+C) (decoder: yolov8)")
        if is_grid(n, self.input_size, 3) is False:
            assert isinstance(n, int)
            self._not_a_grid(_v5_hint(n, cols, self.input_size), cols, meta)
        # One row per grid cell, not three: a decoded anchor-free head (YOLOv6) or YOLOX's raw
        # one, told apart on the first frame by whether the boxes sit at their cells.
        self._cells = grid_centres(n, self.input_size) if isinstance(n, int) else None
        self.num_classes = cols - 5
        self._name = outputs[0].name
        self._cols = cols
        self._units = BoxUnits(self.name, self.input_size)

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        p = outputs[self._name].reshape(-1, self._cols)
        if self._cells is not None:
            self._check_cells(p)
        # Class scores are probabilities, so objectness bounds the score: filter on it first.
        cand = p[p[:, 4] >= score_threshold]
        cls = cand[:, 5:]
        ids = cls.argmax(axis=1)
        scores = cand[:, 4] * cls[np.arange(len(cand)), ids]
        keep = scores >= score_threshold
        c = cand[keep]
        boxes = self._units.to_pixels(xywh_to_xyxy(c[:, 0], c[:, 1], c[:, 2], c[:, 3]))
        return Decoded(boxes, scores[keep], ids[keep])


    def _check_cells(self, p: np.ndarray) -> None:
        """Once: a decoded head's every row, scoring or not, has its box centre at its own cell
        (x, y follow the cells' with a correlation near 1, in pixels or fractions alike); YOLOX's
        raw rows hold offsets within the cell, which do not."""
        cells, self._cells = self._cells, None
        assert cells is not None
        r = min(_correlation(p[:, 0], cells[:, 0]), _correlation(p[:, 1], cells[:, 1]))
        if r < CELL_CORRELATION:
            raise OutputLayoutError(
                f"decoder yolov5: the rows' box centres do not follow their grid cells "
                f"(correlation {r:.2f}, where decoded boxes give about 1): they are offsets "
                "within each cell, YOLOX's raw rows (decoder: yolox); the outputs are not "
                f"{self.expects}")


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's correlation; 0 where either does not vary."""
    a, b = a.astype(np.float64) - a.mean(), b.astype(np.float64) - b.mean()
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum()) / den if den > 0 else 0.0


def _transposed(a: Dim, b: Dim) -> bool:
    """Whether ``1 x a x b`` has its boxes along dim 1: the box count is the larger dim (or the
    dynamic one)."""
    if isinstance(a, int) and isinstance(b, int):
        return a > b
    return isinstance(b, int)


def _v5_hint(n: int, cols: int, input_size: tuple[int, int]) -> str:
    if is_grid(n, input_size, 1):
        w, h = input_size
        return (f"{n} rows are one per grid cell at {w}x{h}, not YOLOv5's three: YOLOX "
                f"(decoder: yolox), or the transposed YOLOv8 layout with {cols - 4} classes "
                "(decoder: yolov8 with its labels)")
    return not_a_grid_hint(n, cols, input_size)

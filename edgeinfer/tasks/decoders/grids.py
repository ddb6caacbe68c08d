"""What an output's row count says about its layout: YOLO heads emit one row per grid cell (or
three, with YOLOv5/v7's anchors) over strides 8, 16, 32 (and 64 for P6, 4 for P2 models); an
end-to-end or DETR head emits a fixed few hundred. Also the Ultralytics tasks that are not
detection, which no detect decoder may read as boxes."""

from __future__ import annotations

import math

import numpy as np

from ...runtime.base import Dim
from .meta import OTHER_TASKS, ModelMeta

__all__ = ["grid_centres", "grid_counts", "not_a_grid_hint", "other_task", "pose_fit"]

STRIDE_SETS = ((8, 16, 32), (8, 16, 32, 64), (4, 8, 16, 32))

# (keypoints, values per keypoint) of Ultralytics' pose datasets: COCO (with and without
# visibility), hands, dogs, tigers.
POSE_LAYOUTS = ((17, 3), (17, 2), (21, 3), (24, 3), (12, 2))


def grid_counts(input_size: tuple[int, int], per_cell: int) -> set[int]:
    """Rows a YOLO head has at ``input_size`` (``(width, height)``) with ``per_cell`` anchors."""
    w, h = input_size
    return {per_cell * sum(math.ceil(w / s) * math.ceil(h / s) for s in strides)
            for strides in STRIDE_SETS}


def grid_centres(n: int, input_size: tuple[int, int]) -> np.ndarray | None:
    """``(n, 2)`` pixel centres of the cells of a one-row-per-cell head with ``n`` rows, in the
    order anchor-free heads (YOLOv6, YOLOX, YOLOv8's transpose) write them: stride by stride,
    row by row; ``None`` when ``n`` is no such head's row count."""
    w, h = input_size
    for strides in STRIDE_SETS:
        if n == sum(math.ceil(w / s) * math.ceil(h / s) for s in strides):
            cells = []
            for s in strides:
                ys, xs = np.mgrid[0:math.ceil(h / s), 0:math.ceil(w / s)]
                cells.append(np.stack([xs.ravel(), ys.ravel()], axis=1) * s + s / 2)
            return np.concatenate(cells).astype(np.float32)
    return None


def is_grid(n: Dim, input_size: tuple[int, int], per_cell: int) -> bool | None:
    """Whether ``n`` rows fit a YOLO grid (``None``: ``n`` or the input size is not known)."""
    if not isinstance(n, int) or min(input_size) <= 0:
        return None
    return n in grid_counts(input_size, per_cell)


def not_a_grid_hint(n: int, cols: int, input_size: tuple[int, int]) -> str:
    """Why ``n`` rows of ``cols`` values are not a YOLO head's grid, and what they likely are."""
    w, h = input_size
    expected = min(grid_counts(input_size, 1))
    if n in grid_counts(input_size, 3):
        return (f"{n} rows are three anchors per grid cell at {w}x{h}: the YOLOv5/v7 layout "
                "1 x N x (5+C) (decoder: yolov5)")
    if n > expected:
        return f"{n} rows are not a YOLO grid at {w}x{h} (one per cell: {expected})"
    if cols == 6:
        return (f"{n} rows of 6 are not a YOLO grid at {w}x{h} (one per cell: {expected}): an "
                "end-to-end export, x1, y1, x2, y2, score, class per row (YOLOv10, YOLO26, "
                "Ultralytics nms=True: decoder: yolo-end2end), or an Ultralytics RT-DETR "
                "(decoder: ultralytics-rtdetr)")
    return (f"{n} rows are not a YOLO grid at {w}x{h} (one per cell: {expected}): {n} queries of "
            "an Ultralytics RT-DETR, 1 x Q x (4+C) (decoder: ultralytics-rtdetr)")


def other_task(meta: ModelMeta) -> str | None:
    """The refusal for a model whose metadata names a task other than detection."""
    kind = OTHER_TASKS.get(meta.task or "")
    if kind is None:
        return None
    return (f"the model's metadata says task {meta.task}: use task: {{type: {kind}}}, "
            "not detect")


def pose_fit(rows: int) -> tuple[int, int] | None:
    """The pose layout (keypoints, values each) whose ``4 + 1 + K*D`` rows are ``rows``."""
    for k, d in POSE_LAYOUTS:
        if rows == 5 + k * d:
            return k, d
    return None

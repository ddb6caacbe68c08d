"""The measures of how far one model's answers are from another's: used by a task to say how
much quantization changed its answers (``Task.accuracy_metrics``) and by ``edgeinfer quantize``'s
report.

- detections: mAP@0.5, one model's detections taken as ground truth; AP per class with all-point
  interpolation (the area under the precision envelope, VOC 2010+ / COCO style), averaged over
  the classes that have truth boxes;
- score vectors and tensors: cosine similarity (and the largest absolute error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["PRED_THRESHOLD", "Dets", "OutputPair", "average_precision", "box_iou", "cosine",
           "fmt_metric", "mean_ap"]

PRED_THRESHOLD = 0.001
"""Score threshold of the compared detections for ``map50`` (as COCO evaluation decodes at
0.001): low-scoring extra boxes only extend the precision-recall curve, they never lower AP."""

OutputPair = tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]
"""One input's outputs from the reference (float) model and from the compared one."""


def fmt_metric(value: Any, digits: int = 4) -> str:
    """A measure as the quantization report prints it (``n/a`` when not measured)."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors, flattened (1.0 when both are all zeros)."""
    x = np.asarray(a, np.float64).ravel()
    y = np.asarray(b, np.float64).ravel()
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        return 1.0 if nx == ny else 0.0
    return float(np.dot(x, y) / (nx * ny))


def box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one ``x1, y1, x2, y2`` box with each row of ``boxes``."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    w = np.clip(np.minimum(box[2], b[:, 2]) - np.maximum(box[0], b[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], b[:, 3]) - np.maximum(box[1], b[:, 1]), 0, None)
    inter = w * h
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """All-point interpolated AP: precision made non-increasing from the right, summed over
    the recall steps."""
    r = np.concatenate(([0.0], recall, [1.0]))
    p = np.concatenate(([0.0], precision, [0.0]))
    p = np.maximum.accumulate(p[::-1])[::-1]
    steps = np.nonzero(r[1:] != r[:-1])[0]
    return float(np.sum((r[steps + 1] - r[steps]) * p[steps + 1]))


Dets = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes (N, 4), scores (N,), class ids (N,)


def mean_ap(truth: Sequence[Dets], preds: Sequence[Dets], iou: float = 0.5
            ) -> tuple[float | None, dict[int, float]]:
    """mAP over images: ``truth[i]`` and ``preds[i]`` are one image's boxes, scores, classes.

    Each prediction, best score first, matches the unmatched truth box of its class with the
    highest IoU at or above ``iou`` (a true positive), else it is a false positive.

    Returns:
        The mean AP over classes with truth boxes (``None`` when there are none) and the AP per
        class.
    """
    classes = sorted({int(c) for _, _, ids in truth for c in ids})
    per_class: dict[int, float] = {}
    for c in classes:
        n_truth = 0
        scored: list[tuple[float, bool]] = []
        for (tb, _, tc), (pb, ps, pc) in zip(truth, preds):
            gt = np.asarray(tb)[np.asarray(tc) == c]
            n_truth += len(gt)
            used = np.zeros(len(gt), bool)
            mine = np.nonzero(np.asarray(pc) == c)[0]
            for k in mine[np.argsort(-np.asarray(ps)[mine], kind="stable")]:
                hit = False
                if len(gt):
                    ious = np.where(used, -1.0, box_iou(np.asarray(pb[k], np.float64), gt))
                    best = int(np.argmax(ious))
                    if ious[best] >= iou:
                        used[best] = hit = True
                scored.append((float(ps[k]), hit))
        scored.sort(key=lambda t: -t[0])
        tp = np.cumsum([h for _, h in scored], dtype=np.float64)
        fp = np.cumsum([not h for _, h in scored], dtype=np.float64)
        recall = tp / n_truth if len(scored) else np.zeros(0)
        precision = tp / np.maximum(tp + fp, 1e-12) if len(scored) else np.zeros(0)
        per_class[c] = average_precision(recall, precision)
    if not per_class:
        return None, per_class
    return float(np.mean(list(per_class.values()))), per_class

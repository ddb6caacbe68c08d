"""Non-maximum suppression: greedy (per class or class-agnostic; OpenCV's or numpy's) and
MediaPipe's weighted variant.

Boxes are ``(N, 4)`` x1, y1, x2, y2 in any consistent unit. A box is suppressed by a kept one
when their IoU is greater than the threshold (torchvision's, OpenCV's and MediaPipe's
convention); ties in score keep the input order. In the numpy loops each iteration keeps one box
and handles all the others at once: (kept boxes) iterations, not a Python double loop.
"""

from __future__ import annotations

import cv2
import numpy as np

__all__ = ["iou_one", "nms", "nms_numpy", "weighted_nms"]


def iou_one(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one box with each of ``boxes`` (0 where the union is empty)."""
    xx1 = np.maximum(box[0], boxes[:, 0])
    yy1 = np.maximum(box[1], boxes[:, 1])
    xx2 = np.minimum(box[2], boxes[:, 2])
    yy2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(xx2 - xx1, 0, None) * np.clip(yy2 - yy1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float,
        class_ids: np.ndarray | None = None, max_output: int | None = None) -> np.ndarray:
    """Greedy NMS: OpenCV's ``NMSBoxesBatched`` where this OpenCV has it (the same result as
    ``nms_numpy``, checked by the tests, and 10-30x faster), else ``nms_numpy``.

    Args:
        boxes: ``(N, 4)`` x1, y1, x2, y2. Boxes with no area are dropped.
        scores: ``(N,)``.
        iou_threshold: Suppress boxes overlapping a kept one by more than this.
        class_ids: ``(N,)`` ints for per-class NMS (boxes of different classes never suppress
            each other); ``None`` for class-agnostic.
        max_output: Keep at most this many.

    Returns:
        Indices into ``boxes`` of the kept boxes, best score first.
    """
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    valid = np.flatnonzero((b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1]))
    if valid.size == 0:
        return np.empty(0, dtype=np.intp)
    b, s = b[valid], np.asarray(scores)[valid]
    ids = None if class_ids is None else np.asarray(class_ids)[valid]
    batched = getattr(getattr(cv2, "dnn", None), "NMSBoxesBatched", None)
    if batched is None:
        kept: np.ndarray = valid[nms_numpy(b, s, iou_threshold, ids, max_output)]
        return kept
    xywh = np.concatenate([b[:, :2], b[:, 2:] - b[:, :2]], axis=1)
    groups = np.zeros(len(s), np.int32) if ids is None else ids.astype(np.int32)
    # score_threshold -1 keeps every box (thresholds are the decoder's job); top_k would cut
    # candidates *before* suppression, so the count is cut after.
    keep = np.asarray(batched(xywh, s.astype(np.float32), groups, -1.0, float(iou_threshold)),
                      dtype=np.intp).reshape(-1)
    return valid[keep[:max_output]]


def nms_numpy(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float,
              class_ids: np.ndarray | None = None, max_output: int | None = None) -> np.ndarray:
    """Greedy NMS in numpy; arguments and result as ``nms`` (boxes with no area are kept and
    neither suppress nor get suppressed)."""
    n = len(scores)
    if n == 0:
        return np.empty(0, dtype=np.intp)
    order = np.argsort(-np.asarray(scores), kind="stable")
    b = np.asarray(boxes, dtype=np.float64)[order]
    if class_ids is not None:
        # Shift each class to its own region so one agnostic pass is a per-class NMS; float64
        # keeps the shifted coordinates exact enough that IoUs do not change.
        span = float(max(b.max(), 0.0) - min(b.min(), 0.0)) + 1.0
        b = b + (np.asarray(class_ids)[order].astype(np.float64) * span)[:, None]
    limit = n if max_output is None else max_output
    keep: list[int] = []
    idx = np.arange(n)
    while idx.size and len(keep) < limit:
        i = int(idx[0])
        keep.append(i)
        rest = idx[1:]
        idx = rest[iou_one(b[i], b[rest]) <= iou_threshold]
    return order[np.asarray(keep, dtype=np.intp)]


def weighted_nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float,
                 extra: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """MediaPipe's weighted NMS (``NonMaxSuppressionCalculator``, ``algorithm: WEIGHTED``).

    The best remaining box and every remaining box overlapping it by more than the threshold
    (itself included) form a cluster; the cluster is replaced by the score-weighted mean of its
    boxes (and ``extra`` rows, e.g. keypoints), keeping the best box's score.

    Returns:
        ``(boxes, scores, extra)`` of the merged detections, best score first.
    """
    order = np.argsort(-np.asarray(scores), kind="stable")
    b = np.asarray(boxes, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    data = b if extra is None else np.concatenate([b, np.asarray(extra, np.float64)], axis=1)
    merged: list[np.ndarray] = []
    kept_scores: list[float] = []
    remaining = order
    while remaining.size:
        top = remaining[0]
        close = iou_one(b[top], b[remaining]) > iou_threshold
        cluster = remaining[close]
        if cluster.size == 0:  # an empty box overlaps nothing, not even itself
            cluster, close = remaining[:1], np.arange(remaining.size) == 0
        w = s[cluster] if s[cluster].sum() > 0 else np.ones(cluster.size)
        merged.append((data[cluster] * w[:, None]).sum(axis=0) / w.sum())
        kept_scores.append(float(s[top]))
        remaining = remaining[~close]
    out = np.asarray(merged).reshape(-1, data.shape[1])
    return (out[:, :4], np.asarray(kept_scores),
            None if extra is None else out[:, 4:])

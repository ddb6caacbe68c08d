"""The measures of how far one model's answers are from another's: used by a task to say how
much quantization changed its answers (``Task.accuracy_metrics``) and by ``edgeinfer quantize``'s
report.

- detections: mAP@0.5, one model's detections taken as ground truth; AP per class with all-point
  interpolation (the area under the precision envelope, VOC 2010+ / COCO style), averaged over
  the classes that have truth boxes;
- detections, beyond ranking: recall at the task's own score threshold and how far the compared
  scores drift from the reference's (`score_checks`): mAP only ranks, so scores clipped at 0.85
  or halved keep it at 1.0 while a pipeline at threshold 0.9 reports nothing;
- score vectors and tensors: cosine similarity (and the largest absolute error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["MAX_SCORE_DRIFT", "MAX_SCORE_KS", "MIN_BOXES", "MIN_RECALL", "PRED_THRESHOLD",
           "SCORE_TOLERANCE",
           "Dets", "OutputPair", "average_precision", "box_iou", "cosine", "fmt_metric", "mean_ap",
           "score_checks"]

PRED_THRESHOLD = 0.001
"""Score threshold of the compared detections for ``map50`` (as COCO evaluation decodes at
0.001): low-scoring extra boxes only extend the precision-recall curve, they never lower AP."""

MIN_RECALL = 0.9
"""Least share of the reference's boxes (at the task's threshold) the compared model must find
at that same threshold (IoU >= 0.5, same class) to pass."""

MAX_SCORE_DRIFT = 0.1
"""Largest 95th percentile of |compared score - reference score| over the reference's boxes
(a box the compared model misses scores 0) that passes."""

MAX_SCORE_KS = 0.15
"""Largest Kolmogorov-Smirnov distance (with `SCORE_TOLERANCE`) between the two models' score
distributions over the reference's boxes that passes (scores clipped at 0.85 where a fifth of
the float ones are above 0.87: 0.2)."""

SCORE_TOLERANCE = 0.02
"""Score differences the distribution check ignores: rounding, not drift."""

MIN_BOXES = 20
"""Fewest reference boxes (at the task's threshold) the checks judge on: below it no single box
may decide the verdict, and on fewer one does: a missed box is 1/n of recall (over
1 - `MIN_RECALL` below 10 boxes), a moved score 1/n of the KS distance (over `MAX_SCORE_KS`
below 7), and under 20 values the 95th percentile of the drift is the largest one's."""

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


def score_checks(truth: Sequence[Dets], same: Sequence[Dets], lowered: Sequence[Dets],
                 threshold: float) -> dict[str, Any]:
    """Recall at ``threshold`` and the score drift of the compared detections against
    ``truth`` (the reference's at ``threshold``), with the failures they make.

    Args:
        truth: Per image, the reference model's detections at ``threshold``.
        same: The compared model's at ``threshold``.
        lowered: The compared model's at a low threshold (to find the score of a box that fell
            below ``threshold``).
        threshold: The task's score threshold.

    Returns:
        ``recall_at_threshold``, ``score_drift`` (``boxes``, ``mean_abs``, ``p95_abs``,
        ``max_abs``, ``ks``, ``quantiles`` of both score sets at 10/50/90 % and max) and
        ``failures``: one sentence per check failed (`MIN_RECALL`, `MAX_SCORE_DRIFT`,
        `MAX_SCORE_KS`); empty when it passes or there are no reference boxes; ``evidence``:
        the reference boxes the checks rest on (``count``, ``unit``) and the ``minimum``
        (`MIN_BOXES`) a verdict needs.
    """
    found = sum(int(np.count_nonzero(_matched(t, s) >= 0)) for t, s in zip(truth, same))
    ref, got = [], []
    for t, low in zip(truth, lowered):
        idx = _matched(t, low)
        ref.append(np.asarray(t[1], np.float64))
        got.append(np.where(idx >= 0, np.asarray(low[1], np.float64)[np.maximum(idx, 0)], 0.0))
    a = np.concatenate(ref) if ref else np.zeros(0)
    b = np.concatenate(got) if got else np.zeros(0)
    evidence = {"count": len(a), "unit": f"float boxes at score >= {threshold:g}",
                "minimum": MIN_BOXES}
    if not len(a):
        return {"recall_at_threshold": None, "score_drift": None, "failures": [],
                "evidence": evidence}
    recall = found / len(a)
    diff = np.abs(b - a)
    drift = {"boxes": len(a), "mean_abs": round(float(diff.mean()), 4),
             "p95_abs": round(float(np.percentile(diff, 95)), 4),
             "max_abs": round(float(diff.max()), 4), "ks": round(_ks(a, b), 4),
             "quantiles": {"float": _quantiles(a), "compared": _quantiles(b)}}
    return {"recall_at_threshold": round(recall, 4), "score_drift": drift,
            "failures": _failures(recall, drift, threshold), "evidence": evidence}


def _matched(truth: Dets, preds: Dets, iou: float = 0.5) -> np.ndarray:
    """For each truth box, best score first, the index of the unmatched prediction of its
    class with the highest IoU >= ``iou``; -1 where none."""
    tb, ts, tc = (np.asarray(v) for v in truth)
    pb, pc = np.asarray(preds[0], np.float64).reshape(-1, 4), np.asarray(preds[2])
    out = np.full(len(tb), -1, np.intp)
    used = np.zeros(len(pb), bool)
    for k in np.argsort(-ts, kind="stable"):
        ious = np.where(used | (pc != tc[k]), -1.0, box_iou(np.asarray(tb[k], np.float64), pb))
        if len(ious) and ious.max() >= iou:
            out[k] = int(np.argmax(ious))
            used[out[k]] = True
    return out


def _ks(a: np.ndarray, b: np.ndarray, tol: float = SCORE_TOLERANCE) -> float:
    """The Kolmogorov-Smirnov distance with a tolerance: the largest share of scores of one set
    that the other's CDF puts more than ``tol`` higher. Plain KS would call a drift of 0.0001
    on a cluster of equal scores (0.9929 on every clear object) a distance of 1."""
    def cdf(x: np.ndarray, at: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.sort(x), at, side="right") / len(x)

    up = cdf(b, b) - cdf(a, b + tol)  # b's mass sits more than tol below a's
    down = cdf(a, a) - cdf(b, a + tol)
    return float(max(up.max(), down.max(), 0.0))


def _quantiles(x: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in (*np.percentile(x, [10, 50, 90]), x.max())]


def _failures(recall: float, drift: dict[str, Any], threshold: float) -> list[str]:
    out = []
    if recall < MIN_RECALL:
        out.append(f"recall at score >= {threshold:g} is {recall:.2f} (< {MIN_RECALL}): the "
                   "pipeline would miss that share of the float model's detections")
    if drift["p95_abs"] > MAX_SCORE_DRIFT:
        out.append(f"scores drift: 95th percentile of |INT8 - float| is {drift['p95_abs']:.3f} "
                   f"(> {MAX_SCORE_DRIFT}); top float score {drift['quantiles']['float'][-1]:.3f}"
                   f", top INT8 {drift['quantiles']['compared'][-1]:.3f}")
    if drift["ks"] > MAX_SCORE_KS:
        out.append(f"score distributions differ: Kolmogorov-Smirnov distance {drift['ks']:.3f} "
                   f"(> {MAX_SCORE_KS}, differences under {SCORE_TOLERANCE} ignored)")
    return out

"""Real Ultralytics exports decoded by edgeinfer, compared with Ultralytics' own ``predict``.

``scripts/check-ultralytics-exports`` builds YOLO models from their yaml in a side virtual
environment (torch + ultralytics, never a dependency of this project), exports them to ONNX and
runs Ultralytics' ``predict`` on sample photographs; it writes the ONNX files, the photographs
and ``manifest.json`` (one case per export and image: the detections Ultralytics found, with
keypoints and mask areas) into one folder. Here, in the project's own environment, each case's
model runs through the edgeinfer task its type names (``decoder: auto``, labels from the
metadata, the same thresholds) and the two sets of detections are matched box for box.

A detection matches one of the other side's with the same class and IoU > 0.9 (the best such
one, by score and then keypoints: random weights give near-duplicates). Then the label, score
(within 0.01), keypoints (within 2 px, their scores within 0.01) and mask area (within 10 %)
must agree. A box missing
on one side counts unless its score is within the score tolerance of the threshold (it may fall
on either side of it).

Two differences are known and listed apart (``Comparison.known``), not counted as problems, on
a photograph the letterbox pads: Ultralytics' ``predict`` (``retina_masks=True``) then upsamples
the prototypes' product 4x, crops the padding and resizes that to the photograph, two bilinear
steps, where edgeinfer samples the product bilinearly once, straight at the photograph's pixels
(on an unpadded photograph both are that one step, and the areas agree to 0.01 %). Masks of
random weights are textured at the prototype's pixel scale, so the two steps change their areas
by tens of percent there; and Ultralytics drops a detection whose resampled mask is empty, which
edgeinfer keeps with an empty mask (``docs/results.md``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.config.pipeline import PoseTask as PoseConfig
from edgeinfer.config.pipeline import SegmentTask as SegmentConfig
from edgeinfer.frames import Detection, Frame
from edgeinfer.model.load import load_model
from edgeinfer.tasks import make_task

__all__ = ["Case", "Comparison", "Tolerance", "compare", "edgeinfer_detections", "load_cases"]

MANIFEST = "manifest.json"
CONFIGS: dict[str, type[DetectConfig]] = {"detect": DetectConfig, "pose": PoseConfig,
                                          "segment": SegmentConfig}


@dataclass(frozen=True)
class Tolerance:
    """How close edgeinfer's detections must be to Ultralytics' (see the module doc)."""

    iou: float = 0.9
    score: float = 0.01
    keypoint_px: float = 2.0
    keypoint_score: float = 0.01
    area: float = 0.10


@dataclass(frozen=True)
class Case:
    """One export on one photograph, as the export side wrote it to the manifest.

    Attributes:
        name: ``<export>@<image>``.
        model: The ONNX file.
        task: ``detect``, ``pose`` or ``segment``.
        image: The photograph.
        padded: Whether the letterbox pads it (see the module doc).
        conf, iou: The thresholds ``predict`` ran with (edgeinfer's score and IoU thresholds).
        max_det: ``predict``'s detection cap.
        expected: Ultralytics' detections: ``box`` (x1, y1, x2, y2 source pixels), ``class_id``,
            ``label``, ``score``; ``keypoints`` (K x 3) and ``area`` (mask pixels) where the
            task has them.
    """

    name: str
    model: Path
    task: str
    image: Path
    padded: bool
    conf: float
    iou: float
    max_det: int
    expected: list[dict[str, Any]]


@dataclass
class Comparison:
    """How one case's detections compared (``problems`` empty: they agree)."""

    case: str
    expected: int
    got: int
    matched: int = 0
    borderline: int = 0
    min_iou: float = 1.0
    max_score_diff: float = 0.0
    max_keypoint_px: float = 0.0
    max_area_diff: float = 0.0
    problems: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line for the script's table."""
        verdict = "ok" if not self.problems else f"{len(self.problems)} problem(s)"
        if self.known:
            verdict += f", {len(self.known)} known difference(s)"
        return (f"{self.case:32s} ultralytics {self.expected:3d}  edgeinfer {self.got:3d}  "
                f"matched {self.matched:3d}  borderline {self.borderline}  min IoU "
                f"{self.min_iou:.4f}  max |score| {self.max_score_diff:.5f}  max kpt "
                f"{self.max_keypoint_px:.2f} px  max area {100 * self.max_area_diff:.2f} %  "
                f"{verdict}")


def load_cases(folder: Path) -> list[Case]:
    """The cases of ``folder/manifest.json`` (paths made absolute)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    return [Case(name=c["name"], model=folder / c["model"], task=c["task"],
                 image=folder / c["image"], padded=c["padded"], conf=c["conf"], iou=c["iou"],
                 max_det=c["max_det"],
                 expected=c["detections"]) for c in manifest["cases"]]


def edgeinfer_detections(case: Case) -> list[Detection]:
    """edgeinfer's detections on ``case``: ``decoder: auto``, labels from the metadata."""
    import cv2

    image = cv2.imread(str(case.image), cv2.IMREAD_COLOR)
    if image is None:
        raise FileNotFoundError(f"cannot read {case.image}")
    config = CONFIGS[case.task](score_threshold=case.conf, iou_threshold=case.iou,
                                max_detections=case.max_det)
    with load_model(case.model, probe=False) as model:
        task = make_task(config, model)
        frame = Frame(index=0, ts=0.0, wall=0.0, data=np.asarray(image))
        feeds, transform = task.preprocess(frame)
        result = task.postprocess(model.run(feeds), frame, transform)
    return list(result.detections or ())


def compare(case: Case, got: Sequence[Detection], tol: Tolerance = Tolerance()) -> Comparison:
    """Match ``got`` (edgeinfer's) against the case's expected detections, box for box."""
    out = Comparison(case.name, len(case.expected), len(got))
    free = list(range(len(got)))
    boxes = np.array([d.box for d in got], np.float64).reshape(-1, 4)
    for want in sorted(case.expected, key=lambda d: -float(d["score"])):
        j = _best_match(want, got, boxes, free, tol)
        if j is None:
            _unmatched(out, case, tol, "Ultralytics", want["label"], want["score"], want["box"])
            continue
        free.remove(j)
        _check_pair(out, want, got[j], tol, case.padded)
    for j in free:
        d = got[j]
        if case.padded and d.area is not None:  # Ultralytics drops it if its mask resamples empty
            out.known.append(f"only edgeinfer has {d.label} {d.score:.4f} (mask area "
                             f"{d.area:.0f} px) at {[round(v, 1) for v in d.box]}")
            continue
        _unmatched(out, case, tol, "edgeinfer", d.label, d.score, d.box)
    return out


def _best_match(want: dict[str, Any], got: Sequence[Detection], boxes: np.ndarray,
                free: list[int], tol: Tolerance) -> int | None:
    """The free detection of ``want``'s class overlapping it most (IoU above the tolerance),
    the closest score breaking ties."""
    if not free:
        return None
    ious = _iou(np.asarray(want["box"], np.float64), boxes[free])
    best: tuple[float, float, float] | None = None
    pick = None
    for k, j in enumerate(free):
        if got[j].class_id != want["class_id"] or ious[k] <= tol.iou:
            continue
        key = (-abs(got[j].score - float(want["score"])), -_keypoint_gap(want, got[j]),
               float(ious[k]))
        if best is None or key > best:
            best, pick = key, j
    return pick


def _keypoint_gap(want: dict[str, Any], d: Detection) -> float:
    """How far apart two detections' keypoints are (0 without): near-duplicate boxes of random
    weights differ only there."""
    if "keypoints" not in want or d.keypoints is None or len(d.keypoints) != len(want["keypoints"]):
        return 0.0
    have = np.asarray(d.keypoints, np.float64)[:, :2]
    return float(np.abs(have - np.asarray(want["keypoints"], np.float64)[:, :2]).max())


def _check_pair(out: Comparison, want: dict[str, Any], d: Detection, tol: Tolerance,
                case_padded: bool) -> None:
    out.matched += 1
    where = f"{want['label']} {[round(v, 1) for v in want['box']]}"
    iou = float(_iou(np.asarray(want["box"], np.float64), np.asarray([d.box], np.float64))[0])
    out.min_iou = min(out.min_iou, iou)
    if d.label != want["label"]:
        out.problems.append(f"{where}: edgeinfer labels it {d.label!r}")
    diff = abs(d.score - float(want["score"]))
    out.max_score_diff = max(out.max_score_diff, diff)
    if diff > tol.score:
        out.problems.append(f"{where}: score {d.score:.4f} vs {want['score']:.4f}")
    if "keypoints" in want:
        _check_keypoints(out, where, np.asarray(want["keypoints"]), d, tol)
    if "area" in want:
        _check_area(out, where, float(want["area"]), d, tol, case_padded)


def _check_keypoints(out: Comparison, where: str, want: np.ndarray, d: Detection,
                     tol: Tolerance) -> None:
    if d.keypoints is None or len(d.keypoints) != len(want):
        out.problems.append(f"{where}: {len(want)} keypoints expected, edgeinfer has "
                            f"{0 if d.keypoints is None else len(d.keypoints)}")
        return
    have = np.asarray(d.keypoints, np.float64)
    px = float(np.abs(have[:, :2] - want[:, :2]).max())
    out.max_keypoint_px = max(out.max_keypoint_px, px)
    if px > tol.keypoint_px:
        out.problems.append(f"{where}: keypoints off by up to {px:.2f} px")
    if want.shape[1] > 2:
        ds = float(np.abs(have[:, 2] - want[:, 2]).max())
        if ds > tol.keypoint_score:
            out.problems.append(f"{where}: keypoint scores off by up to {ds:.4f}")


def _check_area(out: Comparison, where: str, want: float, d: Detection, tol: Tolerance,
                padded: bool) -> None:
    have = d.area or 0.0
    rel = abs(have - want) / max(want, 1.0)
    out.max_area_diff = max(out.max_area_diff, rel)
    if rel > tol.area:
        (out.known if padded else out.problems).append(
            f"{where}: mask area {have:.0f} vs {want:.0f} px")


def _unmatched(out: Comparison, case: Case, tol: Tolerance, side: str, label: str,
               score: float, box: Sequence[float]) -> None:
    """A detection only one side has: fine at the threshold's edge, else a problem."""
    if score < case.conf + tol.score:
        out.borderline += 1
        return
    out.problems.append(f"only {side} has {label} {score:.4f} at "
                        f"{[round(float(v), 1) for v in box]}")


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    iw = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    ih = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = iw * ih
    union = ((box[2] - box[0]) * (box[3] - box[1])
             + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) - inter)
    result: np.ndarray = inter / np.maximum(union, 1e-9)
    # Boxes clipped flat against the image's edge have no area: the same flat box still matches.
    same = np.all(np.abs(boxes - box) < 1e-3, axis=1)
    return np.where(same, 1.0, result)

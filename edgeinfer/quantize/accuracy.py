"""Inputs for quantization (calibration and held-out samples) and the accuracy of a quantized
model against its float original on the held-out ones.

Samples come from a folder of images or a video, read by the pipeline's own sources and turned
into tensors by the task's ``preprocess``, or from an ``.npz`` of ready tensors.

Which report depends on the task the model serves:

- ``detect``: mAP@0.5 of the INT8 detections, the float model's detections (at the task's
  score threshold, after its NMS) taken as ground truth; AP per class with all-point
  interpolation (the area under the precision envelope, VOC 2010+ / COCO style), averaged over
  the classes that have float boxes; recall at the task's threshold and the score drift, which
  give the report its ``verdict``.
- ``classify``: top-1 agreement and the cosine similarity of the score vectors.
- anything else: per output, cosine similarity and the largest absolute error.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config.pipeline import ImagesSource as ImagesConfig
from ..config.pipeline import VideoSource as VideoConfig
from ..errors import ConfigError, EdgeInferError, ModelLoadError
from ..frames import DropFrame
from ..model.model import Model
from ..model.load import load_model
from ..sources.files import IMAGE_EXTENSIONS, ImagesSource, VideoSource
from ..tasks.metrics import PRED_THRESHOLD, average_precision, box_iou, cosine, mean_ap

if TYPE_CHECKING:
    from ..tasks.base import Task

__all__ = ["MIN_SAMPLES", "PRED_THRESHOLD", "Samples", "accuracy_report", "average_precision",
           "box_iou", "collect", "cosine", "mean_ap", "measure", "read_samples",
           "split_held_out"]

logger = logging.getLogger("edgeinfer._accuracy")  # its name before the package

MIN_SAMPLES = 20
"""Fewer calibration samples than this give a warning: ranges from a handful of inputs rarely
cover what a camera sees."""

Feeds = dict[str, np.ndarray]


@dataclass(slots=True)
class Samples:
    """Model feeds read from one source.

    Attributes:
        source: The path given.
        kind: ``images``, ``video`` or ``npz``.
        feeds: One dict of input tensors per sample.
        skipped: Files that were not readable images (skipped, counted).
    """

    source: str
    kind: str
    feeds: list[Feeds] = field(default_factory=list)
    skipped: int = 0


def read_samples(source: Any, task: Task, model: Model, limit: int, what: str) -> Samples:
    """Up to ``limit`` samples of ``source`` as feeds for ``model``.

    Images and video frames are ``Frame``s from the pipeline's ``images``/``video`` sources,
    preprocessed by ``task``, as a pipeline would. A video is sampled evenly over its length.

    Raises:
        ConfigError: ``source`` does not exist, is not readable, or yields no sample.
    """
    path = Path(source)
    if not path.exists():
        raise ConfigError(f"{what} data {path}: no such file or folder")
    if path.suffix.lower() == ".npz" and path.is_file():
        return _read_npz(path, model, limit, what)
    kind = "images" if path.is_dir() or path.suffix.lower() in IMAGE_EXTENSIONS else "video"
    samples = Samples(str(path), kind)
    try:
        _read_frames(samples, path, task, limit)
    except EdgeInferError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{what} data {path}: {exc}") from exc
    if not samples.feeds:
        raise ConfigError(f"{what} data {path}: no usable {kind} samples"
                          + (f" ({samples.skipped} unreadable files skipped)"
                             if samples.skipped else ""))
    return samples


def _read_frames(samples: Samples, path: Path, task: Task, limit: int) -> None:
    stride = 1
    if samples.kind == "video":
        source: ImagesSource | VideoSource = VideoSource(VideoConfig(uri=str(path)))
        stride = max(1, _frame_count(path) // max(limit, 1))
    else:
        source = ImagesSource(ImagesConfig(uri=str(path)))
    # The sources log each file they skip; quantization reports the count once.
    quiet = logging.getLogger("edgeinfer.sources.files")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with source:
            for frame in source:
                if frame.index % stride:
                    continue
                try:
                    feeds, _ = task.preprocess(frame)
                except DropFrame:
                    continue
                samples.feeds.append(feeds)
                if len(samples.feeds) >= limit:
                    break
    finally:
        quiet.setLevel(level)
        samples.skipped = source.stats.corrupt


def _frame_count(path: Path) -> int:
    import cv2

    cap = cv2.VideoCapture(str(path))
    try:
        return max(int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), 0)
    finally:
        cap.release()


def _read_npz(path: Path, model: Model, limit: int, what: str) -> Samples:
    names = [s.name for s in model.inputs]
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # zipfile, pickle and format errors all mean "not readable"
        raise ConfigError(f"{what} data {path}: not a readable .npz: {exc}") from exc
    missing = [n for n in names if n not in arrays]
    if missing:
        raise ConfigError(f"{what} data {path}: no array for input(s) {', '.join(missing)} "
                          f"(keys: {', '.join(arrays) or 'none'}; keys must be input names)")
    counts = {len(arrays[n]) if arrays[n].ndim else 0 for n in names}
    if len(counts) != 1:
        raise ConfigError(f"{what} data {path}: arrays differ in sample count (first axis)")
    n = counts.pop()
    if n == 0:
        raise ConfigError(f"{what} data {path}: no samples (first axis is empty)")
    specs = {s.name: s for s in model.inputs}
    feeds = []
    for i in range(min(n, limit)):
        sample = {}
        for name in names:
            a, rank = arrays[name], len(specs[name].shape)
            x = a[i] if a.ndim == rank + 1 else a[i:i + 1]
            sample[name] = np.array(x, dtype=np.dtype(specs[name].dtype), order="C")
        feeds.append(sample)
    return Samples(str(path), "npz", feeds)


def split_held_out(feeds: Sequence[Feeds], samples: int) -> tuple[list[Feeds], list[Feeds]]:
    """Calibration and held-out feeds, disjoint: a fifth of ``feeds`` (at most a quarter of
    ``samples``, at least one when there are two or more) is held out, spread evenly."""
    n = len(feeds)
    if n < 2:
        return list(feeds), []
    h = min(math.ceil(samples / 4), max(1, n // 5))
    step = n / h
    held = {int(step * k + step / 2) for k in range(h)}
    calib = [f for i, f in enumerate(feeds) if i not in held][:samples]
    return calib, [feeds[i] for i in sorted(held)]


def _outputs(model: Model, task: Task, feeds: Feeds) -> dict[str, np.ndarray]:
    # A stateful task (VAD) adds its state; each held-out input starts from a fresh one.
    task.reset()
    return model.run(task.inject_state(dict(feeds)))


def accuracy_report(float_model: Model, int8_model: Model, task: Task,
                    feeds: Sequence[Feeds]) -> dict[str, Any]:
    """Compare the two models on ``feeds`` (held-out inputs, preprocessed by ``task``).

    Args:
        float_model, int8_model: The original and the quantized model.
        task: The task built on the float model: its ``gate_key`` names the report's kind and
            its ``accuracy_metrics`` give the task's own measures (mAP, top-1 agreement...).
        feeds: The held-out inputs.

    Returns:
        The report: ``kind``, ``samples``, the task's metrics and ``outputs`` (per tensor); and
        ``verdict`` (``pass`` or ``fail``) where the task's metrics judge (they give
        ``failures``, the reasons to fail: detect does).
    """
    pairs = [(_outputs(float_model, task, f), _outputs(int8_model, task, f)) for f in feeds]
    report: dict[str, Any] = {"kind": task.gate_key, "samples": len(pairs)}
    report.update(task.accuracy_metrics(pairs))
    if "failures" in report:
        report["verdict"] = "fail" if report["failures"] else "pass"
    report["outputs"] = _output_report(pairs)
    return report


def _output_report(pairs: Sequence[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]]
                   ) -> dict[str, dict[str, float | None]]:
    names = list(pairs[0][0]) if pairs else []
    result: dict[str, dict[str, float | None]] = {}
    for name in names:
        cos = [cosine(ref[name], q[name]) for ref, q in pairs]
        err = [float(np.max(np.abs(np.asarray(ref[name], np.float64)
                                    - np.asarray(q[name], np.float64)), initial=0.0))
               for ref, q in pairs]
        span = [float(np.max(np.abs(np.asarray(ref[name], np.float64)), initial=0.0))
                for ref, _ in pairs]
        result[name] = {"cosine_mean": float(np.mean(cos)), "cosine_min": float(np.min(cos)),
                        "max_abs_error": max(err), "float_max_abs": max(span)}
    return result


def collect(task: Task, model: Model, calibration: Any, held_out: Any, samples: int,
             mode: str, warnings: list[str]) -> tuple[list[Feeds], list[Feeds], dict[str, Any]]:
    """Calibration and held-out feeds (disjoint) and what the model card says about them.

    Static mode calibrates on up to ``samples`` and measures on ``held_out``, or on a part of
    ``calibration`` split off (``split_held_out``). Dynamic mode needs no calibration: all it is
    given measures accuracy. Skipped files and too few calibration samples add to ``warnings``.
    """
    calib: Samples | None = None
    held: Samples | None = None
    card: dict[str, Any] = {"calibration": None, "held_out": None}
    if calibration is not None:
        want = samples if held_out is not None or mode == "dynamic" \
            else samples + math.ceil(samples / 4)
        calib = read_samples(calibration, task, model, want, "calibration")
    if held_out is not None:
        held = read_samples(held_out, task, model, samples, "held-out")
    for s in (calib, held):
        if s is not None and s.skipped:
            msg = f"{s.source}: skipped {s.skipped} file(s) that are not readable images"
            warnings.append(msg)
            logger.warning("%s", msg)
    calib_feeds: list[Feeds] = []
    held_feeds: list[Feeds] = []
    split = "separate"
    if mode == "dynamic":  # no calibration: everything given can measure accuracy
        given = held if held is not None else calib
        held_feeds = given.feeds if given is not None else []
        split = "separate" if held is not None else "calibration data (unused by dynamic mode)"
    elif calib is not None:
        if held is not None:
            calib_feeds, held_feeds = calib.feeds[:samples], held.feeds
        else:
            calib_feeds, held_feeds = split_held_out(calib.feeds, samples)
            split = "split off the calibration data (disjoint)"
        if len(calib_feeds) < MIN_SAMPLES:
            msg = (f"only {len(calib_feeds)} calibration samples (fewer than {MIN_SAMPLES}): "
                   "activation ranges may not cover real inputs")
            warnings.append(msg)
            logger.warning("%s", msg)
    if calib is not None and mode == "static":
        card["calibration"] = {"source": calib.source, "kind": calib.kind,
                               "count": len(calib_feeds), "skipped": calib.skipped}
    if held_feeds:
        src = held if held is not None else calib
        assert src is not None
        card["held_out"] = {"source": src.source, "kind": src.kind, "count": len(held_feeds),
                            "from": split}
    return calib_feeds, held_feeds, card


def measure(path: Path, float_model: Model, task: Task, held: Sequence[Feeds],
            load_opts: Mapping[str, Any]) -> dict[str, Any]:
    """Load the quantized model at ``path`` as a pipeline would and compare it with
    ``float_model`` on ``held`` (a report with ``samples: 0`` and a note when there is none).

    Raises:
        ModelLoadError: the quantized model does not load (or its warm-up fails).
    """
    try:
        with load_model(path, optimized_model_cache=False, **load_opts) as q_model:
            if held:
                report = accuracy_report(float_model, q_model, task, held)
            else:
                report = {"kind": task.gate_key, "samples": 0,
                          "note": "no held-out inputs (give held_out or calibration data)"}
    except ModelLoadError as exc:
        raise ModelLoadError(f"the quantized model does not load: {exc}") from exc
    return report

"""Inputs for quantization (calibration and held-out samples) and the accuracy of a quantized
model against its float original on the held-out ones.

Samples come from a folder of images or a video, read by the pipeline's own sources and turned
into tensors by the task's ``preprocess``, or from an ``.npz`` of ready tensors. Each sample is
written to a file of its own in the run's work folder as it is made (`Spool`) and read back one
at a time by the calibration and the evaluation: memory holds one sample, not the set (125
letterboxed 320x320 images are 150 MB of float32 tensors).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

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

__all__ = ["MIN_HELD_OUT", "MIN_SAMPLES", "PRED_THRESHOLD", "Samples", "Spool", "Stages",
           "accuracy_report", "average_precision", "box_iou", "collect", "cosine", "load_feeds",
           "mean_ap", "measure", "no_stages", "read_samples", "split_held_out"]

logger = logging.getLogger("edgeinfer._accuracy")  # its name before the package

MIN_SAMPLES = 20
"""Fewer calibration samples than this give a warning: ranges from a handful of inputs rarely
cover what a camera sees."""

MIN_HELD_OUT = 10
"""Fewer held-out samples than this give a warning: the report's figures rest on them."""

Feeds = dict[str, np.ndarray]

Stages = Callable[[str, int, int], None]
"""Called as ``stages(stage, done, total)``: at the start of each stage with ``done`` 0 (``total``
0 where the stage is not counted), then after each counted step."""


def no_stages(stage: str, done: int, total: int) -> None:
    """`Stages` that hears nothing."""


class Spool:
    """Samples written one file each (an uncompressed ``.npz`` of the feeds) to a folder, so a
    set of any size costs one sample of memory; `load_feeds` reads one back."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._count = 0

    def add(self, feeds: Feeds) -> Path:
        """Write ``feeds`` to a new file and return its path."""
        path = self.folder / f"{self._count:06d}.npz"
        self._count += 1
        np.savez(path, **cast("dict[str, Any]", feeds))
        return path


def load_feeds(path: Path) -> Feeds:
    """The feeds of one spooled sample."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@dataclass(slots=True)
class Samples:
    """Model feeds read from one source.

    Attributes:
        source: The path given.
        kind: ``images``, ``video`` or ``npz``.
        feeds: One spooled file per sample (`load_feeds` reads it).
        skipped: Files that were not readable images (skipped, counted).
    """

    source: str
    kind: str
    feeds: list[Path] = field(default_factory=list)
    skipped: int = 0


def read_samples(source: Any, task: Task, model: Model, limit: int, what: str, spool: Spool,
                 stages: Stages = no_stages) -> Samples:
    """Up to ``limit`` samples of ``source`` as feeds for ``model``, written to ``spool``.

    Images and video frames are ``Frame``s from the pipeline's ``images``/``video`` sources,
    preprocessed by ``task``, as a pipeline would. A video is sampled evenly over its length.
    ``stages`` hears ``reading {what} data`` and each sample read.

    Raises:
        ConfigError: ``source`` does not exist, is not readable, or yields no sample.
    """
    path = Path(source)
    if not path.exists():
        raise ConfigError(f"{what} data {path}: no such file or folder")
    stage = f"reading {what} data"
    if path.suffix.lower() == ".npz" and path.is_file():
        return _read_npz(path, model, limit, what, spool, stage, stages)
    kind = "images" if path.is_dir() or path.suffix.lower() in IMAGE_EXTENSIONS else "video"
    samples = Samples(str(path), kind)
    try:
        _read_frames(samples, path, task, limit, spool, stage, stages)
    except EdgeInferError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{what} data {path}: {exc}") from exc
    if not samples.feeds:
        raise ConfigError(f"{what} data {path}: no usable {kind} samples"
                          + (f" ({samples.skipped} unreadable files skipped)"
                             if samples.skipped else ""))
    return samples


def _read_frames(samples: Samples, path: Path, task: Task, limit: int, spool: Spool,
                 stage: str, stages: Stages) -> None:
    stride = 1
    total = limit
    if samples.kind == "video":
        source: ImagesSource | VideoSource = VideoSource(VideoConfig(uri=str(path)))
        frames = _frame_count(path)
        stride = max(1, frames // max(limit, 1))
        total = min(limit, -(-frames // stride)) if frames else limit
    else:
        source = ImagesSource(ImagesConfig(uri=str(path)))
        if path.is_dir():
            total = min(limit, sum(1 for p in path.iterdir() if p.suffix.lower()
                                   in IMAGE_EXTENSIONS and not p.name.startswith(".")))
    stages(stage, 0, total)
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
                samples.feeds.append(spool.add(feeds))
                stages(stage, len(samples.feeds), max(total, len(samples.feeds)))
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


def _read_npz(path: Path, model: Model, limit: int, what: str, spool: Spool, stage: str,
              stages: Stages) -> Samples:
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
    samples = Samples(str(path), "npz")
    total = min(n, limit)
    stages(stage, 0, total)
    for i in range(total):
        sample = {}
        for name in names:
            a, rank = arrays[name], len(specs[name].shape)
            x = a[i] if a.ndim == rank + 1 else a[i:i + 1]
            sample[name] = np.array(x, dtype=np.dtype(specs[name].dtype), order="C")
        samples.feeds.append(spool.add(sample))
        stages(stage, i + 1, total)
    return samples


def split_held_out(feeds: Sequence[Path], samples: int) -> tuple[list[Path], list[Path]]:
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
                    feeds: Sequence[Path], stages: Stages = no_stages) -> dict[str, Any]:
    """Compare the two models on ``feeds`` (held-out inputs, preprocessed by ``task``).

    Args:
        float_model, int8_model: The original and the quantized model.
        task: The task built on the float model: its ``gate_key`` names the report's kind and
            its ``accuracy_metrics`` give the task's own measures (mAP, top-1 agreement...).
        feeds: The held-out inputs (spooled files, read one at a time).
        stages: Hears ``evaluating`` and each input compared.

    Returns:
        The report: ``kind``, ``samples``, the task's metrics and ``outputs`` (per tensor); and
        ``verdict`` where the task's metrics judge (they give ``failures``, the reasons to
        fail, and ``evidence``, what the checks rest on: detect does): ``pass``, ``fail``, or
        ``insufficient`` when the evidence is below the task's minimum (``more_data`` says what
        to give).
    """
    pairs = []
    stages("evaluating", 0, len(feeds))
    for i, path in enumerate(feeds):
        f = load_feeds(path)
        pairs.append((_outputs(float_model, task, f), _outputs(int8_model, task, f)))
        stages("evaluating", i + 1, len(feeds))
    report: dict[str, Any] = {"kind": task.gate_key, "samples": len(pairs)}
    report.update(task.accuracy_metrics(pairs))
    if "failures" in report:
        report["verdict"] = _verdict(report)
    report["outputs"] = _output_report(pairs)
    return report


def _verdict(report: dict[str, Any]) -> str:
    """``insufficient`` below the task's evidence minimum (and ``more_data`` saying what to
    give), else ``fail`` or ``pass``."""
    evidence = report.get("evidence") or {}
    if evidence.get("count", 0) < evidence.get("minimum", 0):
        report["more_data"] = (
            f"the accuracy check rests on {evidence['count']} {evidence['unit']} in "
            f"{report['samples']} held-out inputs; it needs at least {evidence['minimum']}: "
            "give more held-out inputs in which the float model finds what it should "
            "(--held-out DIR, or a larger --calibration folder and --samples N; "
            "held_out= / samples= in Python)")
        return "insufficient"
    return "fail" if report["failures"] else "pass"


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
            mode: str, warnings: list[str], work: Path, stages: Stages = no_stages
            ) -> tuple[list[Path], list[Path], dict[str, Any]]:
    """Calibration and held-out feeds (disjoint, spooled to files under ``work``) and what the
    model card says about them.

    Static mode calibrates on up to ``samples`` and measures on ``held_out``, or on a part of
    ``calibration`` split off (``split_held_out``). Dynamic mode needs no calibration: all it is
    given measures accuracy. Skipped files, too few calibration or held-out samples add to
    ``warnings`` (logged at info: the card carries them, and the CLI prints them once).
    """
    calib: Samples | None = None
    held: Samples | None = None
    card: dict[str, Any] = {"calibration": None, "held_out": None}
    if calibration is not None:
        want = samples if held_out is not None or mode == "dynamic" \
            else samples + math.ceil(samples / 4)
        calib = read_samples(calibration, task, model, want, "calibration",
                             Spool(work / "calibration"), stages)
    if held_out is not None:
        held = read_samples(held_out, task, model, samples, "held-out", Spool(work / "held-out"),
                            stages)
    for s in (calib, held):
        if s is not None and s.skipped:
            _warn(warnings, f"{s.source}: skipped {s.skipped} file(s) that are not readable "
                            "images")
    calib_feeds: list[Path] = []
    held_feeds: list[Path] = []
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
            _warn(warnings, f"only {len(calib_feeds)} calibration samples (fewer than "
                            f"{MIN_SAMPLES}): activation ranges may not cover real inputs; give "
                            "more (--calibration, --samples)")
    if held_feeds and len(held_feeds) < MIN_HELD_OUT:
        _warn(warnings, f"the accuracy report rests on {len(held_feeds)} held-out inputs "
                        f"(fewer than {MIN_HELD_OUT}); give more (--held-out DIR)")
    if calib is not None and mode == "static":
        card["calibration"] = {"source": calib.source, "kind": calib.kind,
                               "count": len(calib_feeds), "skipped": calib.skipped}
    if held_feeds:
        src = held if held is not None else calib
        assert src is not None
        card["held_out"] = {"source": src.source, "kind": src.kind, "count": len(held_feeds),
                            "from": split}
    return calib_feeds, held_feeds, card


def _warn(warnings: list[str], msg: str) -> None:
    warnings.append(msg)
    logger.info("%s", msg)


def measure(path: Path, float_model: Model, task: Task, held: Sequence[Path],
            load_opts: Mapping[str, Any], stages: Stages = no_stages) -> dict[str, Any]:
    """Load the quantized model at ``path`` as a pipeline would and compare it with
    ``float_model`` on ``held`` (a report with ``samples: 0`` and a note when there is none).

    Raises:
        ModelLoadError: the quantized model does not load (or its warm-up fails).
    """
    try:
        with load_model(path, optimized_model_cache=False, **load_opts) as q_model:
            if held:
                report = accuracy_report(float_model, q_model, task, held, stages)
            else:
                report = {"kind": task.gate_key, "samples": 0,
                          "note": "no held-out inputs (give held_out or calibration data)"}
    except ModelLoadError as exc:
        raise ModelLoadError(f"the quantized model does not load: {exc}") from exc
    return report
